"""Server-side flow control over a FramedLink: a client that does not read stops
getting pushes past HIGH_WATER, and gets the rest once it reads again."""

from __future__ import annotations

import trio
import trio.testing

from amqlite.config import load_config
from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode
from amqlite.server.connection import NativeConnection
from amqlite.server.endpoints.client import HIGH_WATER

BODY = b"x" * 4096
COUNT = 3000  # ~12 MiB of deliveries: three times HIGH_WATER


async def _next(stream: trio.abc.Stream, proto: Connection) -> ev.Event:
    while True:
        event = proto.next_event()
        if event is not NEED_DATA:
            assert isinstance(event, ev.Event)
            return event
        proto.receive_data(await stream.receive_some(1 << 20))


def _ready(node: BrokerNode, queue: str) -> int:
    (vhost,) = node.broker.status()["vhosts"]
    return next(q["messages"] for q in vhost["queues"] if q["name"] == queue)


async def test_a_client_that_does_not_read_is_paused_then_resumed(
    nursery: trio.Nursery,
) -> None:
    node = BrokerNode(load_config(overrides={"server.port": 0}))
    # lockstep: the server's send_all waits until the client reads
    client, server_side = trio.testing.lockstep_stream_pair()
    conn = NativeConnection(node, server_side, "memory:1", "127.0.0.1")  # type: ignore[arg-type]
    nursery.start_soon(conn.run)
    proto = Connection(Role.CLIENT)
    with trio.fail_after(30):
        await client.send_all(proto.send(ev.Hello(1)))
        assert isinstance(await _next(client, proto), ev.Welcome)
        await client.send_all(proto.send(ev.QueueDeclare(2, "q")))
        assert isinstance(await _next(client, proto), ev.Ok)
        await client.send_all(proto.send(ev.Consume(3, "q", tag="c", no_ack=True)))
        assert isinstance(await _next(client, proto), ev.Ok)
        for i in range(COUNT):  # the server reads them all while we read nothing
            await client.send_all(proto.send(ev.Publish(10 + i, "", "q", BODY)))
        await trio.testing.wait_all_tasks_blocked()

        # paused: the writer is stuck, what waits for it is bounded, the rest stays queued
        assert conn.link.pending > HIGH_WATER
        assert conn.link.pending < HIGH_WATER + 2 * 64 * (len(BODY) + 256)
        assert _ready(node, "q") > COUNT // 2

        delivered = 0
        while delivered < COUNT:
            event = await _next(client, proto)
            if isinstance(event, ev.Heartbeat):
                continue
            assert isinstance(event, ev.Deliver), event
            delivered += 1
        assert _ready(node, "q") == 0
