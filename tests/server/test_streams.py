"""Stream queues over the wire: offsets on deliveries, attaching by offset, named
offsets, and a stream that survives a restart with its offsets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from amqlite.config import load_config
from amqlite.errors import ReplyCode
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode

from .rawclient import RawClient

STREAM = {"x-queue-type": "stream"}


async def start(nursery: trio.Nursery, data_dir: Path) -> BrokerNode:
    config = load_config(
        overrides={"server.host": "127.0.0.1", "server.port": 0, "server.data_dir": str(data_dir)}
    )
    node = BrokerNode(config)
    await nursery.start(node.run)
    return node


async def client(node: BrokerNode) -> RawClient:
    c = await RawClient.connect(node.port)
    assert isinstance(await c.handshake(), ev.Welcome)
    return c


async def consume(c: RawClient, queue: str, count: int, **arguments: Any) -> list[ev.Deliver]:
    reply = await c.request(ev.Consume, queue=queue, prefetch=100, arguments=arguments)
    assert isinstance(reply, ev.Ok), reply
    got = []
    with trio.fail_after(10):
        while len(got) < count:
            e = await c.receive()
            if isinstance(e, ev.Deliver):
                got.append(e)
    return got


async def test_a_stream_over_the_wire_and_across_a_restart(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        node = await start(nursery, tmp_path)
        c = await client(node)
        ok = await c.request(ev.QueueDeclare, queue="events", durable=True, arguments=STREAM)
        assert isinstance(ok, ev.Ok)
        for i in range(5):
            reply = await c.request(ev.Publish, exchange="", key="events", body=b"e%d" % i,
                                    confirm=True)  # fmt: skip
            assert isinstance(reply, ev.Ok)
        got = await consume(c, "events", 3, **{"x-stream-offset": 2})
        assert [(d.offset, d.body) for d in got] == [(2, b"e2"), (3, b"e3"), (4, b"e4")]
        stored = await c.request(ev.OffsetStore, queue="events", name="audit", offset=4)
        assert isinstance(stored, ev.Ok)
        refused = await c.request(ev.Get, queue="events")
        assert isinstance(refused, ev.Error) and refused.code == ReplyCode.PRECONDITION_FAILED
        missing = await c.request(ev.OffsetQuery, queue="events", name="nobody")
        assert isinstance(missing, ev.Error) and missing.code == ReplyCode.NOT_FOUND
        await c.aclose()
        node.stop()
        await node.stopped.wait()

        node = await start(nursery, tmp_path)
        c = await client(node)
        query = await c.request(ev.OffsetQuery, queue="events", name="audit")
        assert isinstance(query, ev.Ok) and query.info == {"offset": 4}
        got = await consume(c, "events", 5, **{"x-stream-offset": "first"})
        assert [(d.offset, d.body) for d in got] == [(i, b"e%d" % i) for i in range(5)]
        # (the push may overtake the confirm, which waits for the disk)
        await c.send(ev.Publish(id=c.next_id(), exchange="", key="events", body=b"e5"))
        with trio.fail_after(10):
            tail = await c.receive_until(ev.Deliver)
        assert isinstance(tail, ev.Deliver) and (tail.offset, tail.body) == (5, b"e5")
        await c.aclose()
        node.stop()
