"""The client against the real broker (amqlite.server), served in-process on 127.0.0.1:0."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

import amqlite
from amqlite.config import load_config
from amqlite.errors import (
    BrokerError,
    ConnectionClosed,
    ConnectionRefused,
    NotFound,
    PreconditionFailed,
    PublishNacked,
    PublishReturned,
    ReplyCode,
)
from amqlite.server import BrokerNode, serve


def _config(**overrides: Any) -> Any:
    return load_config(overrides={"server.host": "127.0.0.1", "server.port": 0, **overrides})


@pytest.fixture
async def server(nursery: trio.Nursery) -> str:
    port = await nursery.start(serve, _config())
    return f"127.0.0.1:{port}"


@pytest.fixture
async def stoppable(nursery: trio.Nursery) -> AsyncIterator[BrokerNode]:
    node = BrokerNode(_config())
    await nursery.start(node.run)
    yield node
    node.stop()


async def test_welcome(server: str) -> None:
    async with amqlite.connect(server, heartbeat=2.0, client_name="it") as conn:
        assert conn.server_name == server  # node id defaults to host:port
        assert conn.welcome.version == amqlite.__version__
        assert conn.server_state == "standalone"
        assert conn.welcome.heartbeat == 2.0
        assert conn.max_frame == 4 * 1024 * 1024
        status = await conn.status()
        assert [c["client"] for c in status["connections"]] == ["it"]


async def test_bad_login_and_unknown_vhost_are_refused(server: str) -> None:
    with pytest.raises(ConnectionRefused) as info:
        async with amqlite.connect(server, login="guest", password="wrong"):
            pass  # pragma: no cover
    assert info.value.code == ReplyCode.ACCESS_REFUSED
    with pytest.raises(ConnectionRefused):
        async with amqlite.connect(server, vhost="/nope"):
            pass  # pragma: no cover


async def test_publish_consume_ack_end_to_end(server: str) -> None:
    n = 3000
    async with amqlite.connect(server) as conn:
        q = (await conn.declare_queue("", exclusive=True)).name
        consumer = await conn.consume(q, prefetch=50)
        for i in range(n):
            await conn.publish("", q, b"%d" % i, headers={"i": i})
        got = []
        with trio.fail_after(20):
            async for d in consumer:
                got.append(int(d.body))
                assert d.headers == {"i": got[-1]}
                await d.ack()
                if len(got) == n:
                    break
        assert got == list(range(n))
        # acks marked before a request go out before it: the status sees them all
        (qs,) = [x for x in (await conn.status())["vhosts"][0]["queues"] if x["name"] == q]
        assert (qs["messages"], qs["unacked"]) == (0, 0)


async def test_confirms_returns_and_errors(server: str) -> None:
    async with amqlite.connect(server) as conn:
        q = (await conn.declare_queue("", exclusive=True)).name
        await conn.publish("", q, b"a", confirm=True, persistent=True)
        with pytest.raises(PublishReturned) as returned:
            await conn.publish("amq.direct", "no-such-key", b"b", mandatory=True, confirm=True)
        assert returned.value.code == ReplyCode.NO_ROUTE
        with pytest.raises(NotFound, match="nosuch"):
            await conn.publish("nosuch", "k", b"c", confirm=True)
        await conn.publish("nosuch", "k", b"d")  # no confirm: reported by the next call
        await conn.status()
        with pytest.raises(NotFound, match="nosuch"):
            await conn.publish("", q, b"e")
        assert (await conn.declare_queue(q, passive=True)).messages == 1


async def test_nacked_when_the_queue_is_full(server: str) -> None:
    async with amqlite.connect(server) as conn:
        q = "bounded"
        await conn.declare_queue(
            q, exclusive=True, arguments={"x-max-length": 2, "x-overflow": "reject-publish"}
        )
        pending = [await conn.publish_nowait("", q, b"%d" % i) for i in range(4)]
        with pytest.raises(PublishNacked):
            await conn.wait_for_confirms()
        assert [p.error is None for p in pending] == [True, True, False, False]


async def test_get_nack_requeue_and_redelivery(server: str) -> None:
    async with amqlite.connect(server) as conn:
        q = (await conn.declare_queue("", exclusive=True)).name
        await conn.publish("", q, b"x", confirm=True)
        d = await conn.get(q)
        assert d is not None and not d.redelivered
        await d.nack(requeue=True)
        d2 = await conn.get(q)
        assert d2 is not None and d2.redelivered and d2.body == b"x"
        await d2.ack()
        assert await conn.get(q) is None


async def test_declarations(server: str) -> None:
    async with amqlite.connect(server) as conn:
        await conn.declare_exchange("ev", "topic")
        with pytest.raises(PreconditionFailed):
            await conn.declare_exchange("ev", "fanout")
        q = (await conn.declare_queue("", exclusive=True)).name
        await conn.bind(q, "ev", "orders.#")
        await conn.publish("ev", "orders.eu.new", b"1", confirm=True)
        await conn.publish("ev", "other", b"2", confirm=True)
        assert await conn.purge_queue(q) == 1
        await conn.unbind(q, "ev", "orders.#")
        await conn.delete_exchange("ev")
        with pytest.raises(NotFound):
            await conn.declare_exchange("ev", "topic", passive=True)


async def test_server_cancel_when_queue_deleted(server: str) -> None:
    async with amqlite.connect(server) as conn, amqlite.connect(server) as other:
        await conn.declare_queue("doomed")
        consumer = await conn.consume("doomed")
        await other.delete_queue("doomed")
        with trio.fail_after(5), pytest.raises(BrokerError):
            async for _ in consumer:
                pass  # pragma: no cover
        assert not consumer.active


async def test_too_large_for_the_server(nursery: trio.Nursery) -> None:
    port = await nursery.start(serve, _config(**{"server.max_frame_bytes": 4096}))
    async with amqlite.connect(f"127.0.0.1:{port}") as conn:
        assert conn.max_frame == 4096
        with pytest.raises(BrokerError) as info:
            await conn.publish("", "q", b"x" * 5000)
        assert info.value.code == ReplyCode.CONTENT_TOO_LARGE
        await conn.status()  # still open


async def test_shutdown_is_connection_closed_320(stoppable: BrokerNode) -> None:
    async with amqlite.connect(f"127.0.0.1:{stoppable.port}") as conn:
        q = (await conn.declare_queue("", exclusive=True)).name
        consumer = await conn.consume(q)
        stoppable.stop()
        with trio.fail_after(10), pytest.raises(ConnectionClosed) as info:
            async for _ in consumer:
                pass  # pragma: no cover
        assert info.value.code == ReplyCode.CONNECTION_FORCED
        with pytest.raises(ConnectionClosed):
            await conn.status()


async def test_failover_to_the_real_server(server: str) -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    dead = sock.getsockname()[1]
    sock.close()
    async with amqlite.connect(f"127.0.0.1:{dead},{server}") as conn:
        assert str(conn.address) == server
