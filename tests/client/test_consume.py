"""Consuming: the iterator, prefetch, ack coalescing on the wire, get, cancels."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from trio.testing import assert_checkpoints, assert_no_checkpoints

import amqlite
from amqlite.client.consumer import YIELD_SHARE, YIELD_UNLIMITED, Consumer
from amqlite.errors import NotFound
from amqlite.protocol import events as ev

from .fakeserver import FakeBroker


async def _fill(conn: amqlite.Connection, queue: str, n: int) -> None:
    await conn.declare_queue(queue)
    for i in range(1, n + 1):
        await conn.publish("", queue, f"m{i}", headers={"i": i})
    await conn.wait_for_confirms()
    await conn.status()  # round trip: all routed


async def test_iterate_in_order_with_fields(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 20)
        consumer = await conn.consume("q", prefetch=5)
        assert consumer.tag.startswith("ctag-")
        got = []
        with trio.fail_after(5):
            async for d in consumer:
                got.append(d)
                await d.ack()
                if len(got) == 20:
                    break
        assert [d.text() for d in got] == [f"m{i}" for i in range(1, 21)]
        d = got[3]
        assert (d.exchange, d.routing_key, d.queue, d.consumer_tag) == ("", "q", "q", consumer.tag)
        assert d.headers == {"i": 4}
        assert d.properties == {}
        assert d.redelivered is False
        assert d.settled
        assert [g.delivery_tag for g in got] == list(range(1, 21))
    assert fake.unacked_count() == 0


async def test_prefetch_bounds_unacked(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 10)
        consumer = await conn.consume("q", prefetch=3)
        await fake.wait_for(lambda: fake.unacked_count() == 3)
        await conn.status()
        assert consumer.buffered == 3
        d = await consumer.__anext__()
        await d.ack()
        await fake.wait_for(lambda: len(fake.queues["q"].messages) == 6)
        assert fake.unacked_count() == 3


async def test_acks_are_coalesced_on_the_wire(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 200)
        consumer = await conn.consume("q", prefetch=0)
        n = 0
        with trio.fail_after(5):
            async for d in consumer:
                await d.ack()
                n += 1
                if n == 200:
                    break
        await fake.wait_for(lambda: fake.unacked_count() == 0)
    acks = fake.frames_of(ev.Ack)
    assert len(acks) < 20  # 200 acks, a handful of frames
    assert acks[-1].multiple and acks[-1].dtag == 200


async def test_out_of_order_settlement(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 4)
        consumer = await conn.consume("q", prefetch=4)
        await fake.wait_for(lambda: fake.unacked_count() == 4)
        await conn.status()
        d1, d2, d3, d4 = [await consumer.__anext__() for _ in range(4)]
        await d2.ack()
        await d4.ack()
        await conn.status()  # the writer has flushed: 2 and 4 went out one by one
        await d3.nack(requeue=False)
        await d1.ack()
        await fake.wait_for(lambda: fake.unacked_count() == 0)
        assert len(fake.queues["q"].messages) == 0  # 3 was dropped, not requeued
    frames = [
        (type(f).__name__, f.dtag, getattr(f, "multiple", False))
        for f in fake.frames
        if isinstance(f, ev.Ack | ev.Nack)
    ]
    assert frames == [("Ack", 2, False), ("Ack", 4, False), ("Nack", 3, False), ("Ack", 1, False)]


async def test_nack_requeue_redelivers(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 1)
        consumer = await conn.consume("q", prefetch=1)
        first = await consumer.__anext__()
        assert not first.redelivered
        await first.nack(requeue=True)
        with trio.fail_after(5):
            again = await consumer.__anext__()
        assert again.redelivered and again.body == b"m1"
        assert again.delivery_tag > first.delivery_tag
        await again.reject(requeue=False)
        await again.ack()  # already settled: a no-op, nothing sent
    assert len(fake.frames_of(ev.Ack)) == 0


async def test_ack_then_nack_keeps_wire_order(fake: FakeBroker, addr: str) -> None:
    """A nack is never overtaken by an ack marked before it (acks are coalesced)."""
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 3)
        consumer = await conn.consume("q", prefetch=3)
        await fake.wait_for(lambda: fake.unacked_count() == 3)
        await conn.status()
        ds = [await consumer.__anext__() for _ in range(3)]
        await ds[0].ack()
        await ds[1].ack()
        await conn.nack(ds[2].delivery_tag, multiple=True, requeue=False)
        await fake.wait_for(lambda: fake.unacked_count() == 0)
    settles = [f for f in fake.frames if isinstance(f, ev.Ack | ev.Nack)]
    assert settles == [ev.Ack(settles[0].id, 2, True), ev.Nack(settles[1].id, 3, True, False)]


async def test_no_ack_consumer(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 3)
        consumer = await conn.consume("q", no_ack=True)
        for _ in range(3):
            d = await consumer.__anext__()
            assert d.settled
            await d.ack()  # no-op
    assert fake.frames_of(ev.Ack) == []
    assert fake.frames_of(ev.Consume)[0].no_ack


async def test_get(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 2)
        d = await conn.get("q")
        assert d is not None and d.body == b"m1" and d.consumer_tag == "" and d.queue == "q"
        await d.ack()
        d2 = await conn.get("q", no_ack=True)
        assert d2 is not None and d2.settled
        assert await conn.get("q") is None
        with pytest.raises(NotFound):
            await conn.get("missing")
        await fake.wait_for(lambda: fake.unacked_count() == 0)


async def test_cancel_ends_iteration_and_requeues_the_buffer(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 5)
        consumer = await conn.consume("q", prefetch=5)
        await fake.wait_for(lambda: fake.unacked_count() == 5)
        await conn.status()
        first = await consumer.__anext__()
        await first.ack()
        await consumer.cancel()
        assert not consumer.active
        assert [d async for d in consumer] == []
        await fake.wait_for(lambda: len(fake.queues["q"].messages) == 4)
        assert fake.unacked_count() == 0
        assert conn.consumers == []


async def test_consumer_context_manager_cancels(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 1)
        async with await conn.consume("q") as consumer:
            d = await consumer.__anext__()
            await d.ack()
        assert not consumer.active
        assert len(fake.frames_of(ev.Cancel)) == 1


async def test_server_cancel_raises_after_the_buffer(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 2)
        consumer = await conn.consume("q", prefetch=10)
        await fake.wait_for(lambda: fake.unacked_count() == 2)
        await conn.delete_queue("q")
        got = []
        with trio.fail_after(5), pytest.raises(NotFound, match="queue deleted"):
            async for d in consumer:
                got.append(d.body)
        assert got == [b"m1", b"m2"]


async def test_consume_missing_queue(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        with pytest.raises(NotFound):
            await conn.consume("missing")
        assert conn.consumers == []


async def test_many_consumers_one_connection(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "a", 30)
        await _fill(conn, "b", 30)
        results: dict[str, list[bytes]] = {"a": [], "b": []}

        async def drain(q: str) -> None:
            consumer = await conn.consume(q, prefetch=4)
            async for d in consumer:
                results[q].append(d.body)
                await d.ack()
                if len(results[q]) == 30:
                    return

        with trio.fail_after(5):
            async with trio.open_nursery() as n:
                n.start_soon(drain, "a")
                n.start_soon(drain, "b")
        assert results["a"] == results["b"] == [f"m{i}".encode() for i in range(1, 31)]


async def test_a_full_window_sends_acks_before_the_buffer_is_empty(
    fake: FakeBroker, addr: str
) -> None:
    """The iterator yields once per eighth of the prefetch window handed out in a
    row, so the acks of the first deliveries of a full buffer reach the broker
    while the rest is still buffered (the broker refills meanwhile): without it
    the whole window's acks go out in one frame after the buffer is empty."""
    async with amqlite.connect(addr) as conn:
        await _fill(conn, "q", 16)
        consumer = await conn.consume("q", prefetch=16)
        await fake.wait_for(lambda: fake.unacked_count() == 16)
        await conn.status()
        assert consumer.buffered == 16
        n = 0
        with trio.fail_after(5):
            async for d in consumer:  # nothing else here awaits: only the iterator yields
                await d.ack()
                n += 1
                if n == 16:
                    break
        await fake.wait_for(lambda: fake.unacked_count() == 0)
    acks = fake.frames_of(ev.Ack)
    assert len(acks) >= 2
    assert acks[0].multiple and acks[0].dtag < 16
    assert acks[-1].dtag == 16


class _Host:
    is_open = True
    close_timeout = 1.0


class _Item:
    offset = None


async def test_iterator_checkpoints_once_per_share_of_the_window() -> None:
    """After ``prefetch // YIELD_SHARE`` deliveries handed out in a row, the next
    one comes after a checkpoint; a wait for an empty buffer starts a new run."""

    async def cancel(c: Consumer) -> None:
        return None

    def make(prefetch: int) -> Consumer:
        return Consumer(
            _Host(), cancel, "q", tag="t", prefetch=prefetch, no_ack=False, exclusive=False,
            arguments={},
        )  # fmt: skip

    share = 5
    c = make(share * YIELD_SHARE)
    for _ in range(2 * share + 2):
        c.push(_Item())  # type: ignore[arg-type]
    with assert_no_checkpoints():
        for _ in range(share):
            await c.__anext__()
    with assert_checkpoints():
        await c.__anext__()
    with assert_no_checkpoints():
        for _ in range(share - 1):
            await c.__anext__()
    with assert_checkpoints():
        await c.__anext__()
    with assert_no_checkpoints():
        await c.__anext__()
    assert c.buffered == 0
    async with trio.open_nursery() as nursery:  # it waits: the next run starts here
        nursery.start_soon(c.__anext__)
        await trio.testing.wait_all_tasks_blocked()
        c.push(_Item())  # type: ignore[arg-type]
    for _ in range(share):
        c.push(_Item())  # type: ignore[arg-type]
    with assert_no_checkpoints():
        for _ in range(share - 1):
            await c.__anext__()
    with assert_checkpoints():
        await c.__anext__()
    assert make(0)._yield_after == YIELD_UNLIMITED
    assert make(3)._yield_after == 1
