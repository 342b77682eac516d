"""Consumers: credit, round robin, no-ack, exclusivity, tags, flow control, cancel."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker, Message, Session
from amqlite.errors import AccessRefused, NotAllowed, NotFound, PreconditionFailed, ResourceLocked

from .support import bodies, drain, publish, queue_status


def _fill(s: Session, queue: str, n: int) -> None:
    for i in range(n):
        publish(s, "", queue, str(i).encode())


@pytest.mark.parametrize(("prefetch", "pushed"), [(0, 5), (1, 1), (2, 2), (5, 5), (9, 5)])
def test_prefetch_bounds_unacked_pushes(s: Session, prefetch: int, pushed: int) -> None:
    s.declare_queue("q")
    _fill(s, "q", 5)
    s.consume("q", prefetch=prefetch, now=0)
    assert len(s.take_deliveries()) == pushed


def test_ack_frees_credit_for_the_next_message(s: Session) -> None:
    s.declare_queue("q")
    _fill(s, "q", 3)
    s.consume("q", prefetch=1, now=0)
    order = []
    for _ in range(3):
        [d] = s.take_deliveries()
        order.append(d.message.body)
        assert s.take_deliveries() == []
        s.ack(d.dtag)
    assert order == [b"0", b"1", b"2"]


def test_publish_to_consumer_with_credit_is_immediate(s: Session, t: Session) -> None:
    s.declare_queue("q")
    t.consume("q", prefetch=2, now=0)
    publish(s, "", "q", b"a")
    [d] = t.take_deliveries()
    assert (d.ctag, d.dtag, d.redelivered, d.queue, d.message.body) == (
        "ctag-1",
        1,
        False,
        "q",
        b"a",
    )
    publish(s, "", "q", b"b")
    publish(s, "", "q", b"c")
    assert bodies(t.take_deliveries()) == [b"b"]
    assert queue_status_messages(s, "q") == 1


def queue_status_messages(s: Session, name: str) -> int:
    return s.declare_queue(name, passive=True).messages


def test_round_robin_over_consumers_with_credit(s: Session, t: Session, broker: Broker) -> None:
    u = broker.open_session()
    s.declare_queue("q")
    for session in (s, t, u):
        session.consume("q", no_ack=True, now=0)
    _fill(s, "q", 7)
    assert bodies(s.take_deliveries()) == [b"0", b"3", b"6"]
    assert bodies(t.take_deliveries()) == [b"1", b"4"]
    assert bodies(u.take_deliveries()) == [b"2", b"5"]


def test_round_robin_skips_consumers_without_credit(s: Session, t: Session) -> None:
    s.declare_queue("q")
    s.consume("q", prefetch=1, now=0)
    t.consume("q", prefetch=0, now=0)
    _fill(s, "q", 4)
    assert bodies(s.take_deliveries()) == [b"0"]
    assert bodies(t.take_deliveries()) == [b"1", b"2", b"3"]


def test_no_ack_deliveries_are_settled_at_once(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    s.consume("q", prefetch=1, no_ack=True, now=0)
    _fill(s, "q", 3)
    deliveries = s.take_deliveries()
    assert bodies(deliveries) == [b"0", b"1", b"2"]
    assert queue_status(broker, "q")["unacked"] == 0
    with pytest.raises(PreconditionFailed, match="unknown delivery tag 1"):
        s.ack(deliveries[0].dtag)


def test_delivery_tags_start_at_one_and_increase_across_consumers(s: Session) -> None:
    s.declare_queue("q1")
    s.declare_queue("q2")
    s.consume("q1", now=0)
    s.consume("q2", now=0)
    for q in ("q1", "q2", "q1", "q2"):
        publish(s, "", q)
    got = s.get("q1", now=0)
    assert got is None
    assert [d.dtag for d in s.take_deliveries()] == [1, 2, 3, 4]
    publish(s, "", "q1")
    assert [d.dtag for d in s.take_deliveries()] == [5]


def test_consumer_tags_are_generated_and_unique_per_session(s: Session) -> None:
    s.declare_queue("q")
    assert s.consume("q", tag="ctag-2", now=0) == "ctag-2"
    assert s.consume("q", now=0) == "ctag-1"
    assert s.consume("q", now=0) == "ctag-3"
    with pytest.raises(NotAllowed):
        s.consume("q", tag="ctag-1", now=0)


def test_same_tag_in_two_sessions_is_fine(s: Session, t: Session) -> None:
    s.declare_queue("q")
    assert s.consume("q", tag="c", now=0) == t.consume("q", tag="c", now=0) == "c"


def test_consume_errors(s: Session) -> None:
    with pytest.raises(NotFound):
        s.consume("missing", now=0)
    s.declare_queue("q")
    with pytest.raises(PreconditionFailed):
        s.consume("q", prefetch=-1, now=0)


def test_exclusive_consumer_needs_an_idle_queue(s: Session, t: Session) -> None:
    s.declare_queue("q")
    s.consume("q", now=0)
    with pytest.raises(AccessRefused):
        t.consume("q", exclusive=True, now=0)


def test_exclusive_consumer_keeps_others_out(s: Session, t: Session) -> None:
    s.declare_queue("q")
    tag = s.consume("q", exclusive=True, now=0)
    for session in (s, t):
        with pytest.raises(AccessRefused):
            session.consume("q", now=0)
    s.cancel(tag)
    t.consume("q", now=0)


def test_exclusive_queue_is_locked_to_its_session(s: Session, t: Session) -> None:
    s.declare_queue("x", exclusive=True)
    s.declare_queue("plain")
    calls: list[Callable[[], object]] = [
        lambda: t.declare_queue("x"),
        lambda: t.declare_queue("x", passive=True),
        lambda: t.consume("x", now=0),
        lambda: t.get("x", now=0),
        lambda: t.bind("x", "amq.fanout"),
        lambda: t.unbind("x", "amq.fanout"),
        lambda: t.purge_queue("x"),
        lambda: t.delete_queue("x"),
    ]
    for call in calls:
        with pytest.raises(ResourceLocked):
            call()
    publish(t, "", "x", b"others may publish")
    assert drain(s, "x") == [b"others may publish"]


def test_cancel_stops_pushes_and_keeps_unacked(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    tag = s.consume("q", now=0)
    publish(s, "", "q", b"a")
    [d] = s.take_deliveries()
    s.cancel(tag)
    publish(s, "", "q", b"b")
    assert s.take_deliveries() == []
    assert queue_status(broker, "q")["unacked"] == 1
    s.ack(d.dtag)
    assert queue_status(broker, "q")["unacked"] == 0
    s.cancel("no-such-tag")


def test_set_writable_pauses_and_resumes_pushes(s: Session, t: Session) -> None:
    s.declare_queue("q")
    s.consume("q", now=0)
    s.set_writable(False)
    publish(t, "", "q", b"a")
    publish(t, "", "q", b"b")
    assert s.take_deliveries() == []
    assert queue_status_messages(t, "q") == 2
    s.set_writable(True)
    assert bodies(s.take_deliveries()) == [b"a", b"b"]


def test_unwritable_session_leaves_messages_to_others(s: Session, t: Session) -> None:
    s.declare_queue("q")
    s.consume("q", now=0)
    t.consume("q", now=0)
    s.set_writable(False)
    _fill(s, "q", 3)
    assert s.take_deliveries() == []
    assert bodies(t.take_deliveries()) == [b"0", b"1", b"2"]


def test_consumer_added_while_unwritable_waits(s: Session) -> None:
    s.declare_queue("q")
    _fill(s, "q", 1)
    s.set_writable(False)
    s.consume("q", now=0)
    assert s.take_deliveries() == []
    s.set_writable(True)
    assert bodies(s.take_deliveries()) == [b"0"]


def test_take_ready_lists_sessions_with_output_once(s: Session, t: Session, broker: Broker) -> None:
    s.declare_queue("q")
    t.consume("q", no_ack=True, now=0)
    assert broker.take_ready() == []
    publish(s, "", "q")
    publish(s, "", "q")
    assert broker.take_ready() == [t]
    assert broker.take_ready() == []
    assert len(t.take_deliveries()) == 2


def test_settling_can_dispatch_to_another_session(s: Session, t: Session, broker: Broker) -> None:
    s.declare_queue("q")
    tag = s.consume("q", prefetch=1, now=0)
    _fill(s, "q", 1)
    [d] = s.take_deliveries()
    s.cancel(tag)
    t.consume("q", prefetch=1, now=0)
    broker.take_ready()
    s.nack(d.dtag)
    assert broker.take_ready() == [t]
    [again] = t.take_deliveries()
    assert (again.message.body, again.redelivered) == (b"0", True)


@settings(max_examples=100, deadline=None)
@given(
    writable=st.booleans(),
    inflight=st.integers(0, 4),
    limit=st.integers(1, 4),
    rr=st.integers(0, 2),
)
def test_an_offer_to_one_consumer_chooses_as_next_consumer_does(
    writable: bool, inflight: int, limit: int, rr: int
) -> None:
    """Queue.offer inlines next_consumer() for a queue with one consumer: it takes
    the consumer exactly when next_consumer() would (writable, credit left) and
    leaves the round-robin position where next_consumer() leaves it."""
    broker = Broker()
    s = broker.open_session("/")
    s.declare_queue("q")
    s.consume("q", prefetch=limit, now=0)
    host = broker.vhost("/")
    assert host is not None
    q = host.queues["q"]
    [c] = q.consumers
    c.writable, c.inflight = writable, inflight
    q._rr = rr
    expected = q.next_consumer()
    expected_rr = q._rr
    q._rr = rr
    assert q.offer(Message("", "q", b"m"), 0.0, None)
    delivered = s.take_deliveries()
    assert [d.message.body for d in delivered] == ([b"m"] if expected is c else [])
    assert len(q.ready) == (0 if expected is c else 1)
    assert q._rr == expected_rr
