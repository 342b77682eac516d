"""The channel-wide prefetch (AMQP ``basic.qos`` global=true): one limit shared by
every consumer of a session, beside each consumer's own, as RabbitMQ 3.x applies it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker, Session
from amqlite.errors import PreconditionFailed

from .support import bodies, publish


def _fill(s: Session, queue: str, n: int, prefix: str = "") -> None:
    for i in range(n):
        publish(s, "", queue, f"{prefix}{i}".encode())


def test_consumers_on_two_queues_share_the_limit(s: Session) -> None:
    s.declare_queue("a")
    s.declare_queue("b")
    _fill(s, "a", 5, "a")
    _fill(s, "b", 5, "b")
    s.set_channel_prefetch(3, now=0)
    s.consume("a", now=0)
    s.consume("b", now=0)
    pushed = s.take_deliveries()
    assert bodies(pushed) == [b"a0", b"a1", b"a2"]  # the first consumer took the whole pool


def test_an_ack_frees_credit_for_any_queue_of_the_session(s: Session) -> None:
    s.declare_queue("a")
    s.declare_queue("b")
    s.set_channel_prefetch(2, now=0)
    s.consume("a", now=0)
    s.consume("b", now=0)
    _fill(s, "a", 2, "a")
    _fill(s, "b", 3, "b")
    first = s.take_deliveries()
    assert bodies(first) == [b"a0", b"a1"]
    s.ack(first[0].dtag, now=0)  # a has nothing ready: b must get the credit
    assert bodies(s.take_deliveries()) == [b"b0"]
    s.ack(0, multiple=True, now=0)
    assert bodies(s.take_deliveries()) == [b"b1", b"b2"]


def test_per_consumer_and_channel_limits_both_hold(s: Session) -> None:
    s.declare_queue("a")
    s.declare_queue("b")
    _fill(s, "a", 5, "a")
    _fill(s, "b", 5, "b")
    s.set_channel_prefetch(4, now=0)
    s.consume("a", prefetch=1, now=0)
    s.consume("b", prefetch=10, now=0)
    assert bodies(s.take_deliveries()) == [b"a0", b"b0", b"b1", b"b2"]


def test_raising_and_lifting_the_limit_dispatches(s: Session) -> None:
    s.declare_queue("q")
    _fill(s, "q", 6)
    s.set_channel_prefetch(1, now=0)
    s.consume("q", now=0)
    assert bodies(s.take_deliveries()) == [b"0"]
    s.set_channel_prefetch(3, now=0)
    assert bodies(s.take_deliveries()) == [b"1", b"2"]
    s.set_channel_prefetch(0, now=0)
    assert bodies(s.take_deliveries()) == [b"3", b"4", b"5"]


def test_lowering_the_limit_holds_further_pushes(s: Session) -> None:
    s.declare_queue("q")
    _fill(s, "q", 5)
    s.consume("q", now=0)  # no limit yet: everything goes
    first = s.take_deliveries()
    assert len(first) == 5
    s.set_channel_prefetch(3, now=0)  # 5 unacked already: the pool is used up
    _fill(s, "q", 2, "x")
    s.ack(first[0].dtag, now=0)
    s.ack(first[1].dtag, now=0)
    assert bodies(s.take_deliveries()) == []  # 3 unacked: still no room
    s.ack(first[2].dtag, now=0)
    assert bodies(s.take_deliveries()) == [b"x0"]


def test_no_ack_consumers_are_not_limited(s: Session) -> None:
    s.declare_queue("a")
    s.declare_queue("b")
    _fill(s, "a", 3, "a")
    s.set_channel_prefetch(1, now=0)
    s.consume("a", now=0)
    assert bodies(s.take_deliveries()) == [b"a0"]
    s.consume("b", no_ack=True, now=0)
    _fill(s, "b", 3, "b")
    assert bodies(s.take_deliveries()) == [b"b0", b"b1", b"b2"]


def test_unacked_of_a_cancelled_consumer_still_count(s: Session) -> None:
    s.declare_queue("a")
    s.declare_queue("b")
    _fill(s, "a", 2, "a")
    _fill(s, "b", 2, "b")
    s.set_channel_prefetch(1, now=0)
    tag = s.consume("a", now=0)
    [held] = s.take_deliveries()
    s.cancel(tag)
    s.consume("b", now=0)
    assert s.take_deliveries() == []
    s.ack(held.dtag, now=0)
    assert bodies(s.take_deliveries()) == [b"b0"]


def test_flow_control_and_the_pool_combine(s: Session) -> None:
    s.declare_queue("q")
    _fill(s, "q", 4)
    s.set_channel_prefetch(2, now=0)
    s.consume("q", now=0)
    first = s.take_deliveries()
    s.set_writable(False, now=0)
    s.ack(0, multiple=True, now=0)  # credit back, but the shell cannot write
    assert s.take_deliveries() == []
    s.set_writable(True, now=0)
    assert bodies(s.take_deliveries()) == [b"2", b"3"]
    assert bodies(first) == [b"0", b"1"]


def test_other_sessions_take_what_the_pool_leaves(s: Session, t: Session) -> None:
    s.declare_queue("q")
    s.set_channel_prefetch(1, now=0)
    s.consume("q", now=0)
    t.consume("q", now=0)
    _fill(s, "q", 4)
    assert bodies(s.take_deliveries()) == [b"0"]
    assert bodies(t.take_deliveries()) == [b"1", b"2", b"3"]


def test_a_bad_limit_is_refused(s: Session) -> None:
    with pytest.raises(PreconditionFailed):
        s.set_channel_prefetch(-1, now=0)


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 6),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("publish"), st.sampled_from("abc")),
            st.tuples(st.just("ack"), st.integers(0, 10)),
            st.tuples(st.just("nack"), st.integers(0, 10)),
        ),
        max_size=40,
    ),
)
def test_never_more_unacked_than_the_limit_and_never_idle_with_credit(
    limit: int, ops: list[tuple[str, object]]
) -> None:
    broker = Broker()
    s = broker.open_session()
    for name in "abc":
        s.declare_queue(name)
    s.set_channel_prefetch(limit, now=0)
    for name in "abc":
        s.consume(name, now=0)
    held: list[int] = []
    for op, arg in ops:
        if op == "publish":
            publish(s, "", str(arg), b"m")
        elif held:
            dtag = held.pop(int(arg) % len(held))  # type: ignore[call-overload]
            if op == "ack":
                s.ack(dtag, now=0)
            else:
                s.nack(dtag, requeue=True, now=0)
        held.extend(d.dtag for d in s.take_deliveries())
        assert len(held) <= limit
        ready = sum(s.declare_queue(name, passive=True).messages for name in "abc")
        assert len(held) == limit or ready == 0  # credit left means nothing waits
