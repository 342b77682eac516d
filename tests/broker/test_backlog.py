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
from amqlite.broker import backlog as backlog_module
from amqlite.broker import queue as queue_module
from amqlite.broker.backlog import Backlog, Paging, _Flat
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


class DictChunks:
    """The shell's chunk store, in a dict; checks every chunk is dropped once."""

    def __init__(self) -> None:
        self.chunks: dict[int, bytes] = {}
        self.last = 0
        self.written = 0

    def put_chunk(self, data: bytes) -> int:
        self.last += 1
        self.written += 1
        self.chunks[self.last] = bytes(data)
        return self.last

    def get_chunk(self, ref: int) -> bytes:
        return self.chunks[ref]

    def drop_chunk(self, ref: int) -> None:
        del self.chunks[ref]


def make(paging: bool) -> tuple[Broker, list[Record], DictSource]:
    records: list[Record] = []
    broker = Broker(record=records.append)
    source = DictSource(records)
    assert broker.recorder is not None
    if paging:
        broker.recorder.source = source
        broker.paging.pager = DictPager()
        broker.paging.chunks = DictChunks()
    return broker, records, source


@pytest.fixture(autouse=True)
def small_head(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module, "HEAD", 3)
    monkeypatch.setattr(queue_module, "READ_AHEAD", 2)
    monkeypatch.setattr(queue_module, "KEEP", 2)
    monkeypatch.setattr(backlog_module, "CHUNK", 3)


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
    chunks = broker.paging.chunks
    assert chunks is None or not chunks.chunks  # type: ignore[attr-defined]
    return seen


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_a_queue_with_a_backlog_hands_out_what_an_in_memory_one_does(
    ops: list[tuple[str, object]],
) -> None:
    assert run(ops, paging=True) == run(ops, paging=False)


def test_a_long_queue_keeps_journaled_messages_by_id_and_reads_them_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backlog_module, "CHUNK", 1000)  # one stretch: one load a batch
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


def test_a_held_message_marked_redelivered_comes_out_flagged() -> None:
    """A message kept in memory (one the journal cannot give back) that is marked, or
    flagged with the rest, comes out flagged: its entry's own flag is only where it
    started (the chunked backlog's hypothesis test found ``flag_all`` leaving a marked
    held entry unflagged when its stretch had nothing else to flag)."""
    for flag in (lambda b: b.mark(9), lambda b: b.flag_all()):
        backlog = Backlog()
        message = Message("", "q", b"held")
        message.journal_id = 9
        backlog.push_entry((message, float("inf"), False))
        flag(backlog)
        assert backlog.flag_all() == 0  # nothing left to flag
        ((got, _, redelivered),) = backlog.pop(1, None)
        assert got is message and redelivered is True


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
    paging = Paging()
    paging.chunks = DictChunks()
    backlog = Backlog(paging)
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
            other = Backlog(paging)
            for _ in range(n % 8):
                other.push(next_id, 1, expires, False)
                next_id += 1
            next_id += 1
            backlog.extend(other)
        assert backlog.earliest() == min(expiries(backlog), default=float("inf"))


def stretches(backlog: Backlog) -> list[_Flat]:
    """A backlog's stretches in order, its chunks read back (without taking them)."""
    store = backlog._store()
    chunks = []
    for chunk in backlog._chunks:
        assert store is not None
        chunks.append(_Flat.load(chunk, store.get_chunk(chunk.ref)))
    return [backlog._front, *chunks, backlog._tail]


def expiries(backlog: Backlog) -> list[float]:
    return [e for flat in stretches(backlog) for e in flat._expires[flat._head :]]


class IdSource:
    """A source that gives every journal id a message whose body is the id."""

    def load(self, journal_ids: Sequence[int]) -> list[Message | None]:
        out: list[Message | None] = []
        for i in journal_ids:
            m = Message("", "q", b"%d" % i)
            m.journal_id = i
            out.append(m)
        return out


BACKLOG_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "push",
                "push",
                "push",
                "run",
                "entry",
                "paged",
                "pop",
                "mark",
                "remove",
                "flag_all",
                "page_held",
                "clear",
                "extend",
            ]
        ),
        st.integers(0, 40),
        st.sampled_from([1.0, 5.0, float("inf")]),
    ),
    max_size=80,
)


def _seen(entries: list[tuple[Message, float, bool]]) -> list[object]:
    return [(m.body, m.journal_id, e, r) for m, e, r in entries]


def _step(
    b: Backlog, p: DictPager, op: str, n: int, expires: float, next_id: int
) -> tuple[object, Backlog, int]:
    """One op on one backlog: (what it returned, the backlog now, the next id)."""
    source = IdSource()
    if op == "push":
        b.push(next_id, n, expires, n % 3 == 0)
        return None, b, next_id + 1
    if op == "run":
        ids = array("q", range(next_id - 2, next_id + n % 9 + 2))
        sizes, flags = array("I", [7] * len(ids)), bytearray(k % 2 for k in range(len(ids)))
        every = iter([expires + k for k in range(2, len(ids))])
        b.push_run(ids, sizes, flags, 2, len(ids) - 2, every if n % 2 else expires)
        return None, b, next_id + len(ids) - 4
    if op == "entry":
        message = Message("", "q", b"held%d" % n)
        message.journal_id = next_id if n % 2 else 0
        b.push_entry((message, expires, n % 3 == 0))
        return None, b, next_id + 1
    if op == "paged":
        body = b"paged%d" % n
        (ref,) = p.page_out([Message("", "q", body)])
        b.push_paged(ref, len(body), expires, False)
        return None, b, next_id
    if op == "pop":
        return _seen(b.pop(n % 7, source, p)), b, next_id
    if op == "mark":
        return b.mark(n % (next_id + 1)), b, next_id
    if op == "remove":
        return b.remove(n % (next_id + 1)), b, next_id
    if op == "flag_all":
        return b.flag_all(), b, next_id
    if op == "page_held":
        return b.page_held(p), b, next_id
    if op == "clear":
        return b.clear(p), b, next_id
    other = Backlog(b._paging)
    for i in range(n % 12):
        other.push(next_id + i, 1, expires, False)
    if n % 2:
        other.pop(n % 5, source)
        b.extend(other)
        return None, b, next_id + n % 12
    other.extend(b)  # Queue.page_out: the head goes in front of the backlog
    return None, other, next_id + n % 12


@settings(max_examples=300, deadline=None)
@given(BACKLOG_OPS)
def test_a_backlog_written_out_in_chunks_gives_what_one_in_memory_does(
    ops: list[tuple[str, int, float]],
) -> None:
    """The same pushes, pops, marks, removes, flags, pages, clears and extends (both
    ways: a queue paging out puts its head in front of its backlog) on a backlog
    whose middle goes to a chunk store (chunks of 3) and on one kept in memory: the
    same messages in the same order with the same flags and expiries, the same
    counts, bytes, journal ids and earliest expiry at every step; and the store
    holds nothing once the backlog is empty."""
    paging = Paging()
    store = DictChunks()
    paging.chunks = store
    chunked, plain = Backlog(paging), Backlog()
    pagers = [DictPager(), DictPager()]
    next_id = 1
    for op, n, expires in ops:
        got_chunked, chunked, _ = _step(chunked, pagers[0], op, n, expires, next_id)
        got_plain, plain, next_id = _step(plain, pagers[1], op, n, expires, next_id)
        assert got_chunked == got_plain
        assert len(chunked) == len(plain) and chunked.bytes == plain.bytes
        assert chunked.journal_ids() == plain.journal_ids()
        assert chunked.earliest() == plain.earliest()
        assert chunked.held_bytes() == plain.held_bytes()
        assert bool(chunked) == bool(plain)
    source = IdSource()
    rest_chunked = _seen(chunked.pop(len(chunked) + 1, source, pagers[0]))
    assert rest_chunked == _seen(plain.pop(len(plain) + 1, source, pagers[1]))
    assert not store.chunks
    assert all(not p.pages for p in pagers)


def test_a_backlog_keeps_only_its_ends_in_memory() -> None:
    """A backlog of 20 chunks of 3: the front and the tail in memory, the rest in the
    store; drained in order, each chunk read back once."""
    paging = Paging()
    store = DictChunks()
    paging.chunks = store
    backlog = Backlog(paging)
    for i in range(1, 61):
        backlog.push(i, 1, float("inf"), False)
    assert len(backlog._front) == 3 and len(backlog._tail) == 0 and backlog.spilled == 57
    assert len(store.chunks) == 19 and backlog.bytes == 60
    out = backlog.pop(100, IdSource())
    assert [m.journal_id for m, _, _ in out] == list(range(1, 61))
    assert not store.chunks and store.written == 19 and not backlog
