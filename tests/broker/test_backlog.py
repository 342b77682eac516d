"""A queue's backlog (amqlite/broker/backlog.py): journaled messages behind the head
kept by journal id, read back through the shell's source a batch at a time.

The backlog is a fast path beside the plain in-memory queue, so the main check
is that they agree: the same random publishes, gets, acks, requeues, consumers,
purges, replayed marks and acks, applied to a broker whose queues page to a
backlog and to one whose queues keep everything in memory, hand out the same
messages, in the same order, with the same ``redelivered`` flags and counts.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker, Message
from amqlite.broker import queue as queue_module
from amqlite.broker.backlog import Backlog
from amqlite.broker.replay import message_from_record
from amqlite.store.records import MessageEnqueue, Record


class DictSource:
    """The shell's source, from the records the broker made (no journal)."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.loads = 0

    def load(self, journal_ids: Sequence[int]) -> list[Message | None]:
        self.loads += 1
        by_id = {r.id: r for r in self.records if isinstance(r, MessageEnqueue)}
        return [message_from_record(by_id[i]) if i in by_id else None for i in journal_ids]


class DictPager:
    """The shell's page file, in a dict; checks every reference is used once."""

    def __init__(self) -> None:
        self.pages: dict[int, Message] = {}
        self.last = 0
        self.discarded = 0

    def page_out(self, messages: Sequence[Message]) -> list[int]:
        refs = []
        for m in messages:
            self.last += 1
            copy = Message(m.exchange, m.routing_key, m.body, dict(m.headers), dict(m.properties))
            self.pages[self.last] = copy
            refs.append(self.last)
        return refs

    def page_in(self, refs: Sequence[int]) -> list[Message]:
        return [self.pages.pop(r) for r in refs]

    def discard(self, refs: Sequence[int]) -> None:
        for r in refs:
            del self.pages[r]
            self.discarded += 1


def make(paging: bool) -> tuple[Broker, list[Record], DictSource]:
    records: list[Record] = []
    broker = Broker(record=records.append)
    source = DictSource(records)
    assert broker.recorder is not None
    if paging:
        broker.recorder.source = source
        broker.paging.pager = DictPager()
    return broker, records, source


@pytest.fixture(autouse=True)
def small_head(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module, "HEAD", 3)
    monkeypatch.setattr(queue_module, "READ_AHEAD", 2)
    monkeypatch.setattr(queue_module, "KEEP", 2)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.booleans()),
        st.tuples(st.just("get"), st.booleans()),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("nack"), st.integers(0, 5)),
        st.tuples(st.just("consume"), st.integers(1, 3)),
        st.tuples(st.just("cancel"), st.just(0)),
        st.tuples(st.just("purge"), st.just(0)),
        st.tuples(st.just("redeliver_all"), st.just(0)),
        st.tuples(st.just("page_out"), st.just(0)),
        st.tuples(st.just("stop_paging"), st.just(0)),
    ),
    max_size=60,
)


def run(ops: list[tuple[str, object]], paging: bool) -> list[object]:
    broker, _, _ = make(paging)
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    s.declare_queue("t")  # not durable: transient messages only, paged when short
    s.bind("t", "amq.fanout")
    s.bind("q", "amq.fanout")
    seen: list[object] = []
    tags: list[int] = []
    consumer: str | None = None
    counter = 0
    for op, arg in ops:
        if op == "publish":
            counter += 1
            props = {"persistent": True} if arg else {}
            s.publish(Message("amq.fanout", "", str(counter).encode(), None, props), now=0.0)
        elif op == "get":
            got = s.get("q", no_ack=bool(arg), now=0.0)
            if got is None:
                seen.append(None)
            else:
                delivery, left = got
                seen.append((delivery.message.body, delivery.redelivered, left))
                if not arg:
                    tags.append(delivery.dtag)
        elif op in ("ack", "nack") and tags:
            assert isinstance(arg, int)
            dtag = tags.pop(arg % len(tags))
            if op == "ack":
                s.ack(dtag, now=0.0)
            else:
                s.nack(dtag, requeue=True, now=0.0)
        elif op == "consume" and consumer is None:
            assert isinstance(arg, int)
            consumer = s.consume("q", prefetch=arg, now=0.0)
        elif op == "cancel" and consumer is not None:
            s.cancel(consumer)
            consumer = None
        elif op == "purge":
            seen.append(("purged", s.purge_queue("q")))
        elif op == "redeliver_all":
            seen.append(("flagged", broker.flag_redelivered()))
        elif op == "page_out":
            broker.page_out()
        elif op == "stop_paging":
            broker.stop_paging()
        for delivery in s.take_deliveries():
            seen.append(("pushed", delivery.message.body, delivery.redelivered))
            tags.append(delivery.dtag)
        for name in ("q", "t"):
            queue = broker.vhost("/").queues[name]  # type: ignore[union-attr]
            seen.append(("count", name, queue.count(), queue.waiting_bytes()))
    for name in ("q", "t"):
        queue = broker.vhost("/").queues[name]  # type: ignore[union-attr]
        while queue.count():
            entry = queue.take(0.0)
            assert entry is not None
            seen.append((name, entry[0].body, entry[2]))
    pager = broker.paging.pager
    assert pager is None or not pager.pages  # type: ignore[attr-defined]
    return seen


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_a_queue_with_a_backlog_hands_out_what_an_in_memory_one_does(
    ops: list[tuple[str, object]],
) -> None:
    assert run(ops, paging=True) == run(ops, paging=False)


def test_a_long_queue_keeps_journaled_messages_by_id_and_reads_them_ahead() -> None:
    broker, _, source = make(paging=True)
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    for i in range(10):
        s.publish(Message("", "q", b"%d" % i, None, {"persistent": True}), now=0.0)
    queue = broker.vhost("/").queues["q"]  # type: ignore[union-attr]
    assert len(queue.ready) == 3 and queue.backlog is not None and len(queue.backlog) == 7
    assert queue.count() == 10 and queue.waiting_bytes() == 10
    bodies = []
    while (got := s.get("q", no_ack=True, now=0.0)) is not None:
        bodies.append(got[0].message.body)
    assert bodies == [b"%d" % i for i in range(10)]
    assert source.loads == 4  # 7 messages, two at a time
    assert queue.backlog is None


def test_transient_messages_behind_a_backlog_keep_their_place() -> None:
    broker, _, _ = make(paging=True)
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    for i in range(8):
        props = {"persistent": True} if i % 2 == 0 or i < 4 else {}
        s.publish(Message("", "q", b"%d" % i, None, props), now=0.0)
    bodies = []
    while (got := s.get("q", no_ack=True, now=0.0)) is not None:
        bodies.append(got[0].message.body)
    assert bodies == [b"%d" % i for i in range(8)]


def test_backlog_marks_removes_and_clears_by_journal_id() -> None:
    backlog = Backlog()
    for i in range(1, 6):
        backlog.push(i, 10, float("inf"), False)
    message = Message("", "q", b"held")
    message.journal_id = 9
    backlog.push_entry((message, float("inf"), False))
    assert len(backlog) == 6 and backlog.bytes == 54
    assert backlog.mark(3) and backlog.mark(9) and not backlog.mark(7)
    assert backlog.remove(2) and not backlog.remove(2) and backlog.bytes == 44
    assert backlog.journal_ids() == [1, 3, 4, 5, 9]
    loaded = backlog.pop(2, DictSource([]))  # ids 1 and 3: the source lost them
    assert loaded == []
    assert backlog.flag_all() == 2  # 4 and 5 (9 was marked)
    assert backlog.clear() == [4, 5, 9] and not backlog and backlog.bytes == 0


def test_transient_messages_page_out_while_memory_is_short_and_come_back_intact() -> None:
    broker, _, _ = make(paging=True)
    pager = broker.paging.pager
    assert isinstance(pager, DictPager)
    s = broker.open_session()
    s.declare_queue("t")
    for i in range(5):
        s.publish(Message("", "t", b"%d" % i), now=0.0)
    assert broker.page_out() == 3  # all but the first KEEP
    queue = broker.vhost("/").queues["t"]  # type: ignore[union-attr]
    assert len(queue.ready) == 2 and len(pager.pages) == 3
    for i in range(5, 9):  # paging: new messages go straight to the page file
        s.publish(Message("", "t", b"%d" % i), now=0.0)
    assert len(pager.pages) == 7 and len(queue.ready) == 2 and queue.count() == 9
    broker.stop_paging()
    s.publish(Message("", "t", b"9"), now=0.0)  # held in memory, behind the others
    assert len(pager.pages) == 7
    bodies = []
    while (got := s.get("t", no_ack=True, now=0.0)) is not None:
        bodies.append(got[0].message.body)
    assert bodies == [b"%d" % i for i in range(10)] and not pager.pages
    for i in range(6):
        s.publish(Message("", "t", b"%d" % i), now=0.0)
    broker.page_out()
    assert s.purge_queue("t") == 6 and not pager.pages and pager.discarded == 4


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["push", "run", "entry", "pop", "remove", "clear", "extend"]),
            st.integers(0, 40),
            st.sampled_from([1.0, 5.0, 9.0, float("inf")]),
        ),
        max_size=60,
    )
)
def test_the_earliest_expiry_is_kept_exactly(ops: list[tuple[str, int, float]]) -> None:
    """``earliest`` is cached (a queue asks at every tick); it is always the minimum."""
    backlog = Backlog()
    source = DictSource([])
    next_id = 1
    for op, n, expires in ops:
        if op == "push":
            backlog.push(next_id, 1, expires, False)
            next_id += 1
        elif op == "run":
            # a run is part of the arrays it is in (the state's index, in a restart)
            ids = array("q", range(next_id - 2, next_id + n % 5 + 2))
            sizes, flags = array("I", [1] * len(ids)), bytearray(len(ids))
            every = [expires + k for k in range(len(ids))] if n % 2 else expires
            backlog.push_run(ids, sizes, flags, 2, len(ids) - 2, every)
            next_id += len(ids) - 4
        elif op == "entry":
            message = Message("", "q", b"m", None, {})
            backlog.push_entry((message, expires, False))
        elif op == "pop":
            backlog.pop(n % 4, source)
        elif op == "remove":
            backlog.remove(n % (next_id + 1))
        elif op == "clear":
            backlog.clear()
        else:
            other = Backlog()
            other.push(next_id, 1, expires, False)
            next_id += 1
            backlog.extend(other)
        expected = min(backlog._expires[backlog._head :], default=float("inf"))
        assert backlog.earliest() == expected
