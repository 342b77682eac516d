"""Stream queues through the client, against the real broker served in-process:
offsets on deliveries, where a consumer starts, named offsets, and a reconnect
that resumes a stream where the application left off."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import pytest
import trio

import amqlite
from amqlite.client import Consumer, Delivery, Reconnected, ReconnectPolicy
from amqlite.client.streams import offset_argument
from amqlite.config import load_config
from amqlite.errors import NotFound, PreconditionFailed
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode

STREAM = {"x-queue-type": "stream"}


def _address(node: BrokerNode) -> str:
    return f"127.0.0.1:{node.port}"


async def _stream(conn: amqlite.Connection, name: str, n: int, first: int = 0) -> None:
    await conn.declare_queue(name, durable=True, arguments=STREAM)
    for i in range(first, first + n):
        await conn.publish("", name, b"e%d" % i, confirm=True)


async def _take(consumer: Consumer, n: int) -> list[Delivery]:
    got = []
    with trio.fail_after(10):
        while len(got) < n:
            got.append(await consumer.__anext__())
    return got


async def _nothing_more(consumer: Consumer, conn: amqlite.Connection) -> None:
    """A status round trip after the server's last push: nothing else was sent."""
    await conn.status()
    assert consumer.buffered == 0


async def test_deliveries_carry_their_offsets(node: BrokerNode) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await _stream(conn, "events", 5)
        consumer = await conn.consume("events", offset="first")
        got = await _take(consumer, 5)
        assert [(d.offset, d.body) for d in got] == [(i, b"e%d" % i) for i in range(5)]
        assert "offset=4" in repr(got[-1])
        for d in got:
            await d.ack()  # gives credit back; the stream keeps the messages
        q = (await conn.declare_queue("", exclusive=True)).name
        await conn.publish("", q, b"plain", confirm=True)
        (plain,) = await _take(await conn.consume(q), 1)
        assert plain.offset is None and "offset" not in repr(plain)


@pytest.mark.parametrize(
    ("start", "offsets"),
    [("first", [0, 1, 2, 3]), ("last", [2, 3]), ("next", [3]), (1, [1, 2, 3]), (99, [3])],
)
async def test_where_a_consumer_starts(
    node: BrokerNode, start: amqlite.client.StreamOffset, offsets: list[int]
) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await _stream(conn, "s", 3)
        consumer = await conn.consume("s", offset=start)
        assert consumer.arguments == {"x-stream-offset": start}
        await conn.publish("", "s", b"e3", confirm=True)
        got = await _take(consumer, len(offsets))
        assert [d.offset for d in got] == offsets
        await _nothing_more(consumer, conn)


@pytest.mark.parametrize("form", ["float", "datetime", "naive-datetime", "iso", "iso-z"])
async def test_starting_at_a_time(node: BrokerNode, form: str) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await _stream(conn, "s", 3)
        # the in-process server's wall clock, read between the two batches
        t = trio.current_time() + node.broker.wall_offset
        await _stream(conn, "s", 2, first=3)
        when = datetime.datetime.fromtimestamp(t, datetime.UTC)
        start: amqlite.client.StreamOffset = {
            "float": t,
            "datetime": when,
            "naive-datetime": when.replace(tzinfo=None),  # UTC, like ISO text without zone
            "iso": when.isoformat(),
            "iso-z": when.isoformat().replace("+00:00", "Z"),
        }[form]
        consumer = await conn.consume("s", offset=start)
        got = await _take(consumer, 2)
        assert [d.offset for d in got] == [3, 4]
        await _nothing_more(consumer, conn)
        past = await conn.consume("s", offset=datetime.datetime(2000, 1, 1))
        assert [d.offset for d in await _take(past, 5)] == [0, 1, 2, 3, 4]


async def test_the_arguments_parameter_still_works(node: BrokerNode) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await _stream(conn, "s", 3)
        consumer = await conn.consume("s", arguments={"x-stream-offset": 1})
        assert [d.offset for d in await _take(consumer, 2)] == [1, 2]
        with pytest.raises(ValueError, match="either offset or"):
            await conn.consume("s", offset="first", arguments={"x-stream-offset": 1})


@pytest.mark.parametrize(
    ("given", "wire"),
    [
        ("first", "first"),
        ("last", "last"),
        ("next", "next"),
        (0, 0),
        (12, 12),
        (1.5e9, 1.5e9),
        ("2026-11-22T10:00:00Z", "2026-11-22T10:00:00Z"),
        (datetime.datetime(2026, 11, 22, 10, 0), "2026-11-22T10:00:00"),
        (
            datetime.datetime(2026, 11, 22, 10, 0, 0, 500, tzinfo=datetime.UTC),
            "2026-11-22T10:00:00.000500+00:00",
        ),
    ],
)
def test_offset_argument_on_the_wire(given: amqlite.client.StreamOffset, wire: object) -> None:
    value = offset_argument(given)
    assert value == wire and type(value) is type(wire)


@pytest.mark.parametrize(
    ("given", "error"),
    [
        (-1, ValueError),
        (True, TypeError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("yesterday", ValueError),
        ("", ValueError),
        (b"first", TypeError),
    ],
)
def test_bad_offsets_are_refused_before_sending(given: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        offset_argument(given)


async def test_a_bad_offset_raises_in_consume(node: BrokerNode) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await _stream(conn, "s", 1)
        with pytest.raises(ValueError, match="yesterday"):
            await conn.consume("s", offset="yesterday")
        assert conn.consumers == []


async def test_store_and_query_offsets(node: BrokerNode) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await _stream(conn, "s", 3)
        assert await conn.query_offset("s", "billing") is None
        await conn.store_offset("s", "billing", 2)
        await conn.store_offset("s", "audit", 0)
        assert await conn.query_offset("s", "billing") == 2
        await conn.store_offset("s", "billing", 7)  # overwrites (beyond the end is fine)
        assert await conn.query_offset("s", "billing") == 7
        assert await conn.query_offset("s", "audit") == 0
        with pytest.raises(NotFound, match="no queue"):
            await conn.query_offset("nosuch", "billing")
        with pytest.raises(NotFound):
            await conn.store_offset("nosuch", "billing", 1)
        await conn.declare_queue("classic")
        with pytest.raises(PreconditionFailed, match="not a stream"):
            await conn.query_offset("classic", "billing")
        with pytest.raises(PreconditionFailed):
            await conn.store_offset("s", "billing", -1)
    async with amqlite.connect(_address(node)) as other:  # kept on the server
        assert await other.query_offset("s", "billing") == 7


def test_offsets_reach_the_delivery() -> None:
    """A stream deliver's offset is the Delivery's; a plain queue's is None."""
    e = ev.Deliver("c", 1, "", "s", b"x", offset=41)
    d = Delivery(None, e, 1, "c", "s", True)
    assert d.offset == 41
    assert Delivery(None, ev.Deliver("c", 2, "", "q", b"y"), 2, "c", "q", True).offset is None


# --- reconnecting -------------------------------------------------------------------


class _Restartable:
    """A node with a journal in ``data_dir`` that can stop and start again on the
    same port and data directory: the stream and its offsets survive."""

    def __init__(self, nursery: trio.Nursery, data_dir: Path) -> None:
        self.nursery = nursery
        self.data_dir = data_dir
        self.port = 0
        self.node: BrokerNode | None = None

    async def start(self) -> None:
        config = load_config(
            overrides={
                "server.host": "127.0.0.1",
                "server.port": self.port,
                "server.data_dir": str(self.data_dir),
            }
        )
        self.node = BrokerNode(config)
        await self.nursery.start(self.node.run)
        self.port = self.node.port

    async def stop(self) -> None:
        assert self.node is not None
        self.node.stop()
        with trio.fail_after(10):
            await self.node.stopped.wait()


class _Back:
    def __init__(self) -> None:
        self.event = trio.Event()

    def __call__(self, _: Reconnected) -> None:
        self.event.set()

    async def wait(self) -> None:
        with trio.fail_after(20):
            await self.event.wait()


@pytest.mark.parametrize("no_ack", [False, True])
async def test_a_reconnect_resumes_the_stream_without_repeats_or_gaps(
    nursery: trio.Nursery, tmp_path: Path, no_ack: bool
) -> None:
    server = _Restartable(nursery, tmp_path / "data")
    await server.start()
    back = _Back()
    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.2, give_up_after=20)
    async with amqlite.connect(
        f"127.0.0.1:{server.port}", reconnect=policy, on_reconnect=back
    ) as conn:
        await _stream(conn, "s", 10)
        consumer = await conn.consume("s", offset="first", prefetch=5, no_ack=no_ack)
        got = await _take(consumer, 4)
        for d in got[:3]:
            await d.ack()  # the fourth stays unacked across the cut
        await conn.status()  # the acks are out: more pushes follow into the buffer
        assert consumer.arguments["x-stream-offset"] == 4
        assert consumer.buffered > 0  # received, not yet handed out
        await server.stop()
        await server.start()
        await back.wait()
        await got[3].ack()  # stale: a no-op
        for i in range(10, 15):
            await conn.publish("", "s", b"e%d" % i, confirm=True)
        with trio.fail_after(10):
            async for d in consumer:
                got.append(d)
                await d.ack()
                if d.offset == 14:
                    break
        assert [d.offset for d in got] == list(range(15))
        assert [d.body for d in got] == [b"e%d" % i for i in range(15)]
        assert not any(d.redelivered for d in got)
        assert conn.reconnects == 1
        await _nothing_more(consumer, conn)


async def test_a_consumer_with_no_delivery_yet_resumes_with_its_start(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = _Restartable(nursery, tmp_path / "data")
    await server.start()
    back = _Back()
    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.2, give_up_after=20)
    async with amqlite.connect(
        f"127.0.0.1:{server.port}", reconnect=policy, on_reconnect=back
    ) as conn:
        await _stream(conn, "s", 2)
        consumer = await conn.consume("s", offset=2)
        await server.stop()
        await server.start()
        await back.wait()
        await conn.publish("", "s", b"e2", confirm=True)
        (d,) = await _take(consumer, 1)
        assert d.offset == 2
