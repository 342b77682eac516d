"""Consumers with selectors (JMS semantics): a consumer gets only what its selector
accepts, in queue order; what nobody with credit accepts stays for a later consumer;
a bad selector is refused at consume time; journal replay does not care that
selectors take messages from the middle of a queue."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker, Delivery, Message, Session
from amqlite.broker.selector import SelectorError, compile_selector
from amqlite.errors import PreconditionFailed

from .support import bodies, drain, publish
from .test_recording import recording_broker, restored


def _publish_colors(s: Session, queue: str, colors: str) -> None:
    """One message per letter: body ``<index><letter>``, header ``c`` = the letter."""
    for i, c in enumerate(colors):
        publish(s, "", queue, f"{i}{c}".encode(), {"c": c})


def test_a_selector_consumer_gets_only_what_it_selects(s: Session, t: Session) -> None:
    s.declare_queue("q")
    _publish_colors(s, "q", "rgrbr")
    t.consume("q", selector="c = 'r'", now=0)
    assert bodies(t.take_deliveries()) == [b"0r", b"2r", b"4r"]
    publish(s, "", "q", b"5g", {"c": "g"})
    publish(s, "", "q", b"6r", {"c": "r"})
    assert bodies(t.take_deliveries()) == [b"6r"]
    assert s.declare_queue("q", passive=True).messages == 3
    assert drain(s, "q") == [b"1g", b"3b", b"5g"]  # still there, in order


def test_what_nobody_selects_waits_for_a_consumer_that_does(s: Session, t: Session) -> None:
    s.declare_queue("q")
    t.consume("q", selector="c = 'r'", now=0)
    _publish_colors(s, "q", "gbgr")
    assert bodies(t.take_deliveries()) == [b"3r"]
    s.consume("q", selector="c IN ('g', 'x')", now=0)
    assert bodies(s.take_deliveries()) == [b"0g", b"2g"]
    s.consume("q", now=0)  # no selector: everything
    assert bodies(s.take_deliveries()) == [b"1b"]


def test_each_consumer_sees_its_messages_in_order_under_credit(
    s: Session, t: Session, broker: Broker
) -> None:
    s.declare_queue("q")
    u = broker.open_session("/", owner="u")
    t.consume("q", prefetch=1, selector="c = 'r'", now=0)
    u.consume("q", prefetch=2, selector="c <> 'r'", now=0)
    _publish_colors(s, "q", "rrgrgbgr")
    got: dict[str, list[bytes]] = {"t": [], "u": []}
    for _ in range(10):
        for name, session in (("t", t), ("u", u)):
            for d in session.take_deliveries():
                got[name].append(d.message.body)
                session.ack(d.dtag)
    assert got == {"t": [b"0r", b"1r", b"3r", b"7r"], "u": [b"2g", b"4g", b"5b", b"6g"]}


def test_a_selector_sees_properties_and_routing_key(s: Session, t: Session) -> None:
    s.declare_queue("q")
    t.consume("q", selector="priority > 5 AND routing_key = 'q'", now=0)
    publish(s, "", "q", b"low", priority=1)
    publish(s, "", "q", b"none")
    publish(s, "", "q", b"high", priority=9)
    assert bodies(t.take_deliveries()) == [b"high"]


def test_round_robin_among_consumers_that_accept(s: Session, t: Session, broker: Broker) -> None:
    s.declare_queue("q")
    u = broker.open_session("/", owner="u")
    t.consume("q", selector="c = 'r'", now=0)
    u.consume("q", selector="c IN ('r', 'g')", now=0)
    _publish_colors(s, "q", "rrrrgg")
    assert bodies(t.take_deliveries()) == [b"0r", b"2r"]
    assert bodies(u.take_deliveries()) == [b"1r", b"3r", b"4g", b"5g"]


def test_requeued_messages_go_back_in_order(s: Session, t: Session, broker: Broker) -> None:
    s.declare_queue("q")
    _publish_colors(s, "q", "rgrg")
    t.consume("q", selector="c = 'r'", now=0)
    deliveries = t.take_deliveries()
    assert bodies(deliveries) == [b"0r", b"2r"]
    t.nack(0, multiple=True, requeue=True)
    again = t.take_deliveries()
    assert bodies(again) == [b"0r", b"2r"]
    assert all(d.redelivered for d in again)
    t.close()
    u = broker.open_session("/", owner="u")
    u.consume("q", now=0)
    # given back at the head, as every requeue is (queue.py)
    assert bodies(u.take_deliveries()) == [b"0r", b"2r", b"1g", b"3g"]


def test_expired_messages_are_not_handed_out_by_a_selecting_dispatch(s: Session) -> None:
    s.declare_queue("q", arguments={"x-message-ttl": 1000})
    publish(s, "", "q", b"old", {"c": "r"}, now=0.0)
    publish(s, "", "q", b"new", {"c": "r"}, now=5.0)
    s.consume("q", selector="c = 'r'", now=5.5)
    assert bodies(s.take_deliveries()) == [b"new"]
    assert s.declare_queue("q", passive=True).messages == 0


def test_cancelling_the_last_selector_consumer_returns_to_the_plain_path(
    s: Session, t: Session
) -> None:
    s.declare_queue("q")
    q = s._vhost.queues["q"]
    tag = t.consume("q", selector="c = 'r'", now=0)
    assert q.selecting == 1
    _publish_colors(s, "q", "gr")
    assert bodies(t.take_deliveries()) == [b"1r"]
    t.cancel(tag)
    assert q.selecting == 0
    t.consume("q", now=0)
    assert bodies(t.take_deliveries()) == [b"0g"]
    publish(s, "", "q", b"2")
    assert bodies(t.take_deliveries()) == [b"2"]


@pytest.mark.parametrize(
    ("selector", "position"),
    [("c = ", 4), ("c == 'r'", 3), ("c = 'r", 4), ("JMSReplyTo IS NULL", 0)],
)
def test_a_bad_selector_is_refused_at_consume_time(
    s: Session, selector: str, position: int
) -> None:
    s.declare_queue("q")
    with pytest.raises(SelectorError) as info:
        s.consume("q", selector=selector, now=0)
    assert info.value.code == 406
    assert info.value.position == position
    assert f"position {position}" in str(info.value)
    assert s.declare_queue("q", passive=True).consumers == 0


@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_selector_is_no_selector(s: Session, blank: str) -> None:
    s.declare_queue("q")
    _publish_colors(s, "q", "rg")
    s.consume("q", selector=blank, now=0)
    assert bodies(s.take_deliveries()) == [b"0r", b"1g"]


def test_stream_queues_refuse_selectors(s: Session) -> None:
    s.declare_queue("st", durable=True, arguments={"x-queue-type": "stream"})
    with pytest.raises(PreconditionFailed, match="stream"):
        s.consume("st", selector="c = 'r'", now=0)


# --- the property: order per consumer, nothing wanted left behind ------------------------

SELECTORS = [None, "k = 0", "k <> 0", "k IN (1, 2)", "k >= 2", "k IS NULL", "NOT (k = 3)"]


@settings(max_examples=150, deadline=None)
@given(
    consumers=st.lists(
        st.tuples(st.sampled_from(SELECTORS), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=4,
    ),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("publish"), st.one_of(st.none(), st.integers(0, 3))),
            st.tuples(st.just("ack"), st.integers(0, 3)),
            st.tuples(st.just("nack"), st.integers(0, 3)),
        ),
        max_size=40,
    ),
)
def test_selected_order_and_no_message_left_behind(
    consumers: list[tuple[str | None, int, bool]], steps: list[tuple[str, int | None]]
) -> None:
    """Every delivery is one its consumer's selector accepts; each consumer sees its
    first deliveries in publish order; and once everyone has settled everything, no
    ready message is one some consumer would accept."""
    broker = Broker()
    pub = broker.open_session("/", owner="pub")
    pub.declare_queue("q")
    sessions: list[tuple[Session, Any]] = []
    for i, (selector, prefetch, no_ack) in enumerate(consumers):
        session = broker.open_session("/", owner=f"c{i}")
        session.consume("q", prefetch=prefetch, no_ack=no_ack, selector=selector, now=0)
        accepts = compile_selector(selector).accepts if selector else (lambda m: True)
        sessions.append((session, accepts))
    seen: list[list[int]] = [[] for _ in sessions]
    held: list[list[Delivery]] = [[] for _ in sessions]
    serial = 0

    def collect() -> None:
        for i, (session, accepts) in enumerate(sessions):
            for d in session.take_deliveries():
                assert accepts(d.message)
                if not d.redelivered:
                    seen[i].append(int(d.message.body))
                if not consumers[i][2]:
                    held[i].append(d)

    for op, arg in steps:
        if op == "publish":
            headers = {} if arg is None else {"k": arg}
            pub.publish(Message("", "q", str(serial).encode(), headers), now=0)
            serial += 1
        else:
            assert arg is not None
            i = arg % len(sessions)
            if held[i]:
                d = held[i].pop(0)
                if op == "ack":
                    sessions[i][0].ack(d.dtag)
                else:
                    sessions[i][0].nack(d.dtag, requeue=True)
        collect()
    for _ in range(serial + 1):  # settle everything, as often as it takes
        for i, (session, _) in enumerate(sessions):
            for d in held[i]:
                session.ack(d.dtag)
            held[i] = []
        collect()
    for order in seen:
        assert order == sorted(order)
    queue = broker.vhost("/").queues["q"]  # type: ignore[union-attr]
    for message, _, _ in queue.ready:
        assert not any(accepts(message) for _, accepts in sessions)


# --- journal replay after selectors took messages from the middle --------------------------


def test_replay_after_selectors_took_from_the_middle() -> None:
    broker, records = recording_broker()
    s = broker.open_session("/", owner="s")
    s.declare_queue("dq", durable=True)
    for i, c in enumerate("rgrgbr"):
        s.publish(Message("", "dq", f"{i}{c}".encode(), {"c": c}, {"persistent": True}), now=0)
    t = broker.open_session("/", owner="t")
    t.consume("dq", selector="c = 'r'", now=0)
    deliveries = t.take_deliveries()
    assert bodies(deliveries) == [b"0r", b"2r", b"5r"]
    t.ack(deliveries[1].dtag)  # the middle one
    again = restored(records)
    u = again.open_session("/", owner="u")
    u.consume("dq", now=0)
    got = u.take_deliveries()
    assert bodies(got) == [b"0r", b"1g", b"3g", b"4b", b"5r"]
    assert [d.redelivered for d in got] == [True, False, False, False, True]


def test_a_pass_goes_on_while_another_consumer_has_credit(s: Session, t: Session) -> None:
    """One consumer running out of credit does not end the pass: the next message
    another consumer accepts still goes to it, before anything published later."""
    s.declare_queue("q")
    t.set_writable(False)
    red = t.consume("q", prefetch=1, selector="c = 'r'", now=0)
    green = t.consume("q", prefetch=5, selector="c = 'g'", now=0)
    _publish_colors(s, "q", "rrgg")
    t.set_writable(True, now=0)
    publish(s, "", "q", b"4g", {"c": "g"})
    got = [(d.ctag, d.message.body) for d in t.take_deliveries()]
    assert got == [(red, b"0r"), (green, b"2g"), (green, b"3g"), (green, b"4g")]
