"""Closing, losing and keeping a connection alive; declarations and status."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import amqlite
from amqlite.client import connect_stream
from amqlite.errors import ConnectionClosed, NotFound, PreconditionFailed, ReplyCode
from amqlite.protocol import events as ev

from .fakeserver import FakeBroker


async def test_server_close_320_fails_waiters_and_consumers(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await conn.declare_queue("q")
        consumer = await conn.consume("q")
        await fake.close_all(ReplyCode.CONNECTION_FORCED, "server shutting down")
        with trio.fail_after(5), pytest.raises(ConnectionClosed) as info:
            async for _ in consumer:
                pass  # pragma: no cover
        assert info.value.code == ReplyCode.CONNECTION_FORCED
        assert "server shutting down" in str(info.value)
        assert not conn.is_open
        with pytest.raises(ConnectionClosed):
            await conn.declare_queue("r")
    await fake.wait_for(lambda: fake.frames_of(ev.CloseOk))  # we answered the close


async def test_server_close_with_error_code(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await fake.close_all(ReplyCode.FRAME_ERROR, "bad frame")
        with (
            trio.fail_after(5),
            pytest.raises(ConnectionClosed, match="501 FRAME_ERROR: bad frame"),
        ):
            await conn.status()


async def test_dropped_socket_is_connection_closed(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        consumer = await conn.consume((await conn.declare_queue("q")).name)
        await fake.drop_all()
        with (
            trio.fail_after(5),
            pytest.raises(ConnectionClosed, match=r"closed the connection|lost"),
        ):
            await consumer.__anext__()


async def test_our_close_ends_consumers_cleanly(fake: FakeBroker, addr: str) -> None:
    ended = trio.Event()
    async with amqlite.connect(addr) as conn:
        await conn.declare_queue("q")
        consumer = await conn.consume("q")

        async def iterate() -> None:
            async for _ in consumer:
                pass  # pragma: no cover
            ended.set()

        async with trio.open_nursery() as n:
            n.start_soon(iterate)
            await trio.testing.wait_all_tasks_blocked()
            await conn.aclose()
        assert ended.is_set()
        with pytest.raises(ConnectionClosed, match="closed by the client"):
            await conn.status()
    assert type(fake.frames[-1]) is ev.Close


async def test_declarations_and_status(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr, client_name="decl") as conn:
        await conn.declare_exchange("logs", "fanout", durable=True)
        await conn.declare_exchange("logs", "fanout", passive=True)
        with pytest.raises(PreconditionFailed):
            await conn.declare_exchange("logs", "direct")
        info = await conn.declare_queue()
        assert info.name.startswith("amq.gen-") and info.messages == 0
        await conn.bind(info.name, "logs", "k")
        await conn.publish("logs", "any", b"1", confirm=True)
        assert (await conn.declare_queue(info.name, passive=True)).messages == 1
        status = await conn.status()
        assert status["node_id"] == "fake"
        assert status["connections"][0]["client"] == "decl"
        assert await conn.purge_queue(info.name) == 1
        await conn.unbind(info.name, "logs", "k")
        await conn.publish("logs", "any", b"2")
        assert await conn.delete_queue(info.name) == 0
        await conn.delete_exchange("logs")
        with pytest.raises(NotFound):
            await conn.declare_queue("nope", passive=True)
        with pytest.raises(NotFound):
            await conn.bind("nope", "amq.direct")
    decl = fake.frames_of(ev.ExchangeDeclare)[0]
    assert (decl.exchange, decl.type, decl.durable) == ("logs", "fanout", True)


async def test_cancelled_request_leaves_the_connection_usable(nursery: trio.Nursery) -> None:
    broker = FakeBroker(hold_confirms=True)
    await nursery.start(broker.serve)
    async with amqlite.connect(f"127.0.0.1:{broker.port}") as conn:
        await conn.declare_queue("q")
        with trio.move_on_after(0.05):
            await conn.publish("", "q", b"x", confirm=True)
        broker.release_confirms()
        await conn.publish("", "q", b"plain")
        assert (await conn.declare_queue("q", passive=True)).messages == 2


# --- heartbeats, on an in-memory stream with a virtual clock -------------------------


async def test_silent_server_is_declared_dead(autojump_clock: trio.testing.MockClock) -> None:
    broker = FakeBroker(heartbeat=1.0, silent=True)
    client_end, server_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.handle_stream, server_end)
        start = trio.current_time()
        async with connect_stream(client_end, heartbeat=1.0, close_timeout=1.0) as conn:
            assert conn.welcome.heartbeat == 1.0
            with trio.fail_after(10), pytest.raises(ConnectionClosed, match="heartbeat timeout"):
                await conn.status()
            assert 3.0 <= trio.current_time() - start < 4.5
        nursery.cancel_scope.cancel()


async def test_quiet_client_sends_heartbeats(autojump_clock: trio.testing.MockClock) -> None:
    broker = FakeBroker(heartbeat=1.0)
    client_end, server_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.handle_stream, server_end)
        async with connect_stream(client_end, heartbeat=5.0) as conn:
            await trio.sleep(10)  # virtual time: the fake's 1s heartbeats keep us alive
            assert conn.is_open
            await conn.status()
        beats = broker.frames_of(ev.Heartbeat)
        assert 8 <= len(beats) <= 11  # one a second while quiet
        nursery.cancel_scope.cancel()


async def test_heartbeats_off(autojump_clock: trio.testing.MockClock) -> None:
    broker = FakeBroker(heartbeat=0.0, silent=False)
    client_end, server_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.handle_stream, server_end)
        async with connect_stream(client_end, heartbeat=0) as conn:
            await trio.sleep(100)
            assert conn.is_open
        assert broker.frames_of(ev.Heartbeat) == []
        nursery.cancel_scope.cancel()
