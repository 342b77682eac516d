"""Stream queues: append-only, read by offset without removing, retained by count,
bytes and age, named offsets, and journal records that rebuild them exactly."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker, Delivery, Message, Session
from amqlite.broker.stream import StreamQueue
from amqlite.errors import NotFound, PreconditionFailed
from amqlite.store import StoreState
from amqlite.store.records import Record, StreamAppend, StreamTrack, StreamTruncate

from .support import queue_status

STREAM = {"x-queue-type": "stream"}


def declare(s: Session, name: str = "events", **arguments: Any) -> None:
    s.declare_queue(name, durable=True, arguments={**STREAM, **arguments})


def fill(s: Session, n: int, name: str = "events", now: float = 0.0) -> None:
    for i in range(n):
        s.publish(Message("", name, b"m%d" % i), now=now)


def read(session: Session, offset: Any, *, prefetch: int = 0, queue: str = "events") -> list[Any]:
    session.consume(queue, prefetch=prefetch, arguments={"x-stream-offset": offset}, now=0)
    return [(d.offset, d.message.body) for d in session.take_deliveries()]


def stream_of(broker: Broker, name: str = "events") -> StreamQueue:
    q = broker.vhost("/").queues[name]  # type: ignore[union-attr]
    assert isinstance(q, StreamQueue)
    return q


@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        ("first", [0, 1, 2, 3, 4]),
        ("last", [4]),
        ("next", []),
        (None, []),
        (2, [2, 3, 4]),
        (99, []),
    ],
)
def test_attach_at(s: Session, t: Session, spec: Any, expect: list[int]) -> None:
    declare(s)
    fill(s, 5)
    if spec is None:
        t.consume("events", now=0)
        got = [d.offset for d in t.take_deliveries()]
    else:
        got = [o for o, _ in read(t, spec)]
    assert got == expect


def test_reading_removes_nothing_and_every_consumer_gets_everything(
    s: Session, t: Session, broker: Broker
) -> None:
    declare(s)
    fill(s, 3)
    assert read(s, "first") == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
    assert read(t, "first") == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
    fill(s, 1)
    assert [d.offset for d in s.take_deliveries()] == [3]  # live tail for both
    assert [d.offset for d in t.take_deliveries()] == [3]
    assert queue_status(broker, "events")["messages"] == 4


def test_prefetch_is_credit_and_acks_return_it(s: Session) -> None:
    declare(s)
    fill(s, 5)
    first = read(s, "first", prefetch=2)
    assert [o for o, _ in first] == [0, 1]
    s.ack(2, multiple=True)  # dtags 1 and 2
    assert [d.offset for d in s.take_deliveries()] == [2, 3]
    s.nack(3, requeue=True)  # credit back, nothing requeued into a stream
    assert [d.offset for d in s.take_deliveries()] == [4]


def test_attach_by_time(s: Session, t: Session, broker: Broker) -> None:
    broker.wall_offset = 1_000_000.0
    declare(s)
    for i in range(4):
        s.publish(Message("", "events", b"%d" % i), now=float(i * 10))  # wall 1e6 + 0,10,20,30
    assert [o for o, _ in read(t, 1_000_015.0)] == [2, 3]
    u = broker.open_session()
    iso = "1970-01-12T13:47:05+00:00"  # 1_000_025 s after the epoch
    assert [o for o, _ in read(u, iso)] == [3]


@pytest.mark.parametrize("bad", [-1, "yesterday", True, [1]])
def test_bad_offset_specs(s: Session, bad: Any) -> None:
    declare(s)
    with pytest.raises(PreconditionFailed, match="x-stream-offset"):
        s.consume("events", arguments={"x-stream-offset": bad}, now=0)


def test_retention_by_count_bytes_and_age(s: Session, t: Session, broker: Broker) -> None:
    declare(s, "by-count", **{"x-max-length": 3})
    fill(s, 5, "by-count")
    assert [o for o, _ in read(t, "first", queue="by-count")] == [2, 3, 4]
    declare(s, "by-bytes", **{"x-max-length-bytes": 4})
    fill(s, 5, "by-bytes")  # 2-byte bodies
    q = stream_of(broker, "by-bytes")
    assert (q.first, q.next, q.bytes) == (3, 5, 4)
    declare(s, "by-age", **{"x-max-age": "10s"})
    fill(s, 2, "by-age", now=0.0)
    fill(s, 1, "by-age", now=8.0)
    broker.tick(12.0)
    assert stream_of(broker, "by-age").first == 2
    broker.tick(30.0)
    aged = stream_of(broker, "by-age")
    assert (len(aged), aged.first, aged.next) == (0, 3, 3)
    fill(s, 1, "by-age", now=30.0)  # offsets are never reused
    assert stream_of(broker, "by-age").first == 3


def test_a_consumer_overtaken_by_retention_continues_at_the_head(s: Session, t: Session) -> None:
    declare(s, **{"x-max-length": 2})
    t.consume("events", prefetch=1, arguments={"x-stream-offset": "first"}, now=0)
    fill(s, 5)
    (d,) = t.take_deliveries()
    assert d.offset == 0
    t.ack(d.dtag)
    assert [x.offset for x in t.take_deliveries()] == [3]


def test_get_and_purge_are_refused(s: Session) -> None:
    declare(s)
    with pytest.raises(PreconditionFailed, match="stream"):
        s.get("events", now=0)
    with pytest.raises(PreconditionFailed, match="stream"):
        s.purge_queue("events")


def test_named_offsets(s: Session) -> None:
    declare(s)
    with pytest.raises(NotFound):
        s.query_offset("events", "audit")
    s.store_offset("events", "audit", 41)
    s.store_offset("events", "audit", 42)
    assert s.query_offset("events", "audit") == 42
    s.declare_queue("classic")
    with pytest.raises(PreconditionFailed, match="not a stream"):
        s.store_offset("classic", "audit", 1)


def test_status_shows_offsets(s: Session, broker: Broker) -> None:
    declare(s, **{"x-max-length": 2})
    fill(s, 3)
    q = queue_status(broker, "events")
    assert (q["type"], q["messages"], q["first_offset"], q["next_offset"]) == ("stream", 2, 1, 3)


def test_deliveries_from_classic_queues_carry_no_offset(s: Session) -> None:
    s.declare_queue("classic")
    s.publish(Message("", "classic", b"x"), now=0)
    s.consume("classic", now=0)
    (d,) = s.take_deliveries()
    assert isinstance(d, Delivery) and d.offset is None


# --- journal -----------------------------------------------------------------------


def test_streams_record_every_message_and_replay_exactly() -> None:
    records: list[Record] = []
    broker = Broker(record=records.append)
    broker.wall_offset = 500.0
    s = broker.open_session()
    declare(s, **{"x-max-length": 3})
    s.declare_exchange("fan", "fanout", durable=True)
    s.declare_queue("classic", durable=True)
    s.bind("events", "fan")
    s.bind("classic", "fan")
    for i in range(5):  # persistent or not, the stream keeps them
        s.publish(Message("fan", "", b"%d" % i, None, {"persistent": i % 2 == 0}), now=float(i))
    s.store_offset("events", "reader", 3)
    appends = [r for r in records if isinstance(r, StreamAppend)]
    assert [(r.offset, r.body, r.enqueued_at) for r in appends] == [
        (i, b"%d" % i, 500.0 + i) for i in range(5)
    ]
    assert [r.before for r in records if isinstance(r, StreamTruncate)] == [1, 2]
    assert StreamTrack(vhost="/", queue="events", name="reader", offset=3) in records
    state = StoreState.fold(records)
    assert state.message_counts()[("/", "events")] == 3
    assert state.message_counts()[("/", "classic")] == 3  # the persistent ones
    back = Broker(record=lambda r: None)
    back.apply(state.snapshot(), 0.0)
    q = stream_of(back)
    assert (q.first, q.next, q.tracked) == (2, 5, {"reader": 3})
    t = back.open_session()
    assert read(t, "first") == [(2, b"2"), (3, b"3"), (4, b"4")]
    t.publish(Message("", "events", b"new"), now=0.0)
    assert [(d.offset, d.message.body) for d in t.take_deliveries()] == [(5, b"new")]


def test_an_emptied_stream_keeps_counting_after_a_restart() -> None:
    records: list[Record] = []
    broker = Broker(record=records.append)
    s = broker.open_session()
    declare(s, **{"x-max-age": "1s"})
    fill(s, 4)
    broker.tick(5.0)
    back = Broker(record=lambda r: None)
    back.apply(StoreState.fold(records).snapshot(), 0.0)
    q = stream_of(back)
    assert (len(q), q.first, q.next) == (0, 4, 4)


def test_read_by_range_budget_retention_and_visibility(s: Session, broker: Broker) -> None:
    declare(s, **{"x-max-length": 6})
    fill(s, 10)  # offsets 4..9 kept
    q = stream_of(broker)
    first, msgs, dropped = q.read(0, None, 1 << 20)
    assert (first, len(msgs), dropped) == (4, 6, 4)
    assert q.read(5, 8, 1 << 20)[1] == q._log[q._head + 1 : q._head + 4]
    assert q.read(0, 3, 1 << 20) == (4, [], 3)  # all of it removed by retention
    assert len(q.read(4, None, 1)[1]) == 1  # at least one, whatever the budget
    assert len(q.read(4, None, 1, visible=7)[1]) == 1
    assert q.read(4, None, 1 << 20, visible=7)[0:2] == (4, q._log[q._head : q._head + 3])
    assert q.read(10, None, 1 << 20) == (10, [], 0)  # nothing stored from there yet
    with pytest.raises(PreconditionFailed):
        q.read(6, 5, 100)
    with pytest.raises(PreconditionFailed):
        q.read(-1, None, 100)
    assert (q.first, q.next, len(q.consumers)) == (4, 10, 0)


# --- publish_batch: the batch path agrees with publish one by one -------------------

_BATCH_KEYS = ("a", "b", "c", "q")
_batch_message = st.tuples(
    st.sampled_from(_BATCH_KEYS),  # routing key
    st.binary(max_size=6),  # body
    st.booleans(),  # persistent
    st.integers(0, 12),  # publish key (0: none; repeats are sends again)
)


def _batch_broker(
    exchange: str, length: int | None, overflow: str
) -> tuple[Broker, Session, list[Record]]:
    records: list[Record] = []
    broker = Broker(record=records.append)
    broker.wall_offset = 100.0
    s = broker.open_session("/", owner="s")
    limit = {} if length is None else {"x-max-length": length}
    declare(s, "s1", **limit)
    declare(s, "s2")
    s.declare_queue("q", durable=True, arguments={"x-max-length": 2, "x-overflow": overflow})
    s.declare_exchange("direct", "direct", durable=True)
    s.declare_exchange("topic", "topic", durable=True)
    s.declare_exchange("fan", "fanout", durable=True)
    s.declare_exchange("hdr", "headers", durable=True)
    for ex in ("direct", "topic"):
        s.bind("s1", ex, "a")
        s.bind("s2", ex, "a")
        s.bind("s2", ex, "b")
        s.bind("q", ex, "q")
    s.bind("s1", "fan")
    s.bind("s1", "hdr", "", {"x-match": "any", "h": 1})
    s.consume("s1", prefetch=3, arguments={"x-stream-offset": "first"}, now=0)
    return broker, s, records


def _stream_view(broker: Broker, name: str) -> tuple[Any, ...]:
    q = stream_of(broker, name)
    log = q._log[q._head :]
    return (q.first, q.next, q.bytes, [(m.routing_key, m.body, m.publish_key) for m in log])


def _drain(s: Session, queue: str) -> list[Delivery]:
    out = []
    while (got := s.get(queue, no_ack=True, now=10.0)) is not None:
        out.append(got[0])
    return out


@given(
    exchange=st.sampled_from(["", "direct", "topic", "fan", "hdr"]),
    length=st.one_of(st.none(), st.integers(0, 4)),
    overflow=st.sampled_from(["drop-head", "reject-publish"]),
    batches=st.lists(st.lists(_batch_message, max_size=8), max_size=4),
)
@settings(max_examples=150, deadline=None)
def test_publish_batch_agrees_with_publish_one_by_one(
    exchange: str, length: int | None, overflow: str, batches: list[list[Any]]
) -> None:
    """Outcomes, every queue's messages in order, the stream consumer's deliveries,
    the publish keys and what the journal rebuilds are the same either way."""
    one, s1, rec1 = _batch_broker(exchange, length, overflow)
    many, s2, rec2 = _batch_broker(exchange, length, overflow)

    def messages(batch: list[Any]) -> list[Message]:
        out = []
        for key, body, persistent, pk in batch:
            headers = {"h": 1} if key == "a" else {}
            m = Message(
                exchange,
                key if exchange or key != "c" else "s2",
                body,
                headers,
                {"persistent": True} if persistent else {},
            )
            m.publish_key = f"i:{pk}" if pk else ""
            out.append(m)
        return out

    for n, batch in enumerate(batches):
        now = float(n)
        s1.new_span()
        s2.new_span()
        assert [s1.publish(m, now=now, span=False) for m in messages(batch)] == (
            s2.publish_batch(exchange, messages(batch), now=now)
        )
        assert (one.recorder.span_first > 0) == (many.recorder.span_first > 0)  # type: ignore[union-attr]
        assert (one.recorder.span_last > 0) == (many.recorder.span_last > 0)  # type: ignore[union-attr]
    for name in ("s1", "s2"):
        assert _stream_view(one, name) == _stream_view(many, name)
    assert queue_status(one, "q") == queue_status(many, "q")
    assert [d.message.body for d in _drain(s1, "q")] == [d.message.body for d in _drain(s2, "q")]
    deliveries = [[(d.offset, d.message.body) for d in x.take_deliveries()] for x in (s1, s2)]
    assert deliveries[0] == deliveries[1]
    keys1, keys2 = one.vhost("/").publish_keys, many.vhost("/").publish_keys  # type: ignore[union-attr]
    assert list(keys1._keys) == list(keys2._keys)
    assert keys1.duplicates == keys2.duplicates
    snap1 = StoreState.fold(rec1).snapshot()
    snap2 = StoreState.fold(rec2).snapshot()
    assert sorted(map(repr, snap1)) == sorted(map(repr, snap2))
    appends = [
        [(r.queue, r.offset, r.body, r.enqueued_at) for r in rec if isinstance(r, StreamAppend)]
        for rec in (rec1, rec2)
    ]
    assert sorted(appends[0]) == sorted(appends[1])
    for name in ("s1", "s2"):  # each stream's records in offset order
        assert [a for a in appends[1] if a[0] == name] == sorted(
            a for a in appends[1] if a[0] == name
        )
