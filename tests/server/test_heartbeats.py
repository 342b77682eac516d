"""Server-side heartbeats over in-memory streams, on trio's mock clock."""

from __future__ import annotations

import trio
import trio.testing

from amqlite.config import load_config
from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode
from amqlite.server.connection import NativeConnection


async def _handshake(stream: trio.abc.Stream, proto: Connection, heartbeat: float) -> ev.Welcome:
    await stream.send_all(proto.send(ev.Hello(1, heartbeat=heartbeat)))
    while True:
        event = proto.next_event()
        if event is NEED_DATA:
            proto.receive_data(await stream.receive_some(65536))
            continue
        assert isinstance(event, ev.Welcome), event
        return event


async def _collect_until_eof(
    stream: trio.abc.Stream, proto: Connection, events: list[ev.Event] | None = None
) -> list[ev.Event]:
    """Every event until the server closes; appended to ``events`` as they come."""
    events = [] if events is None else events
    while True:
        event = proto.next_event()
        if event is NEED_DATA:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            proto.receive_data(data)
            continue
        assert isinstance(event, ev.Event)
        if isinstance(event, ev.EndOfStream):
            return events
        events.append(event)


def _serve_in_memory(nursery: trio.Nursery) -> tuple[trio.abc.Stream, NativeConnection]:
    node = BrokerNode(load_config(overrides={"server.port": 0, "server.heartbeat": 5.0}))
    client_side, server_side = trio.testing.memory_stream_pair()
    conn = NativeConnection(node, server_side, "memory:1", "127.0.0.1")  # type: ignore[arg-type]
    nursery.start_soon(conn.run)
    return client_side, conn


async def test_silent_client_is_dropped_after_three_intervals(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    stream, _ = _serve_in_memory(nursery)
    proto = Connection(Role.CLIENT)
    welcome = await _handshake(stream, proto, heartbeat=1.0)
    assert welcome.heartbeat == 1.0  # the lower of the two offers
    start = trio.current_time()
    events = await _collect_until_eof(stream, proto)
    silent_for = trio.current_time() - start
    assert 3.0 <= silent_for < 4.0
    assert sum(isinstance(e, ev.Heartbeat) for e in events) >= 2  # the server kept talking


async def test_client_that_heartbeats_stays_connected(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    stream, conn = _serve_in_memory(nursery)
    proto = Connection(Role.CLIENT)
    await _handshake(stream, proto, heartbeat=1.0)
    received: list[ev.Event] = []

    async def drain() -> None:
        await _collect_until_eof(stream, proto, received)

    nursery.start_soon(drain)
    for _ in range(40):  # 40 virtual seconds, a heartbeat every 0.9 s
        await stream.send_all(proto.send(ev.Heartbeat()))
        await trio.sleep(0.9)
    assert conn.info() is not None  # still open: its client session is there
    assert sum(isinstance(e, ev.Heartbeat) for e in received) >= 30


async def test_handshake_timeout_drops_a_mute_socket(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    stream, _ = _serve_in_memory(nursery)
    start = trio.current_time()
    with trio.fail_after(60):
        data = await stream.receive_some(65536)
    assert data == b""
    assert trio.current_time() - start >= 10.0
