"""Message groups: a group's messages go to one consumer at a time, in order; it
moves when that consumer goes, once its deliveries are settled, and the next message
is flagged ``JMSXGroupFirstForConsumer``; groups and selectors combine."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker, Delivery, Message, Session
from amqlite.broker.groups import FIRST_FOR_CONSUMER
from amqlite.store.records import GroupOwner, Record

from .support import bodies, publish
from .test_recording import recording_broker, restored


def _grouped(s: Session, queue: str, groups: str, start: int = 0) -> None:
    """One message per letter, body ``<index><letter>``, group = the letter
    (``-``: no group)."""
    for i, g in enumerate(groups, start):
        props: dict[str, Any] = {} if g == "-" else {"group_id": g}
        publish(s, "", queue, f"{i}{g}".encode(), **props)


def _flags(deliveries: list[Delivery]) -> list[tuple[bytes, bool]]:
    return [(d.message.body, FIRST_FOR_CONSUMER in d.message.headers) for d in deliveries]


def test_a_group_sticks_to_one_consumer_and_its_first_message_is_flagged(
    s: Session, t: Session, broker: Broker
) -> None:
    s.declare_queue("q")
    u = broker.open_session("/", owner="u")
    t.consume("q", now=0)
    u.consume("q", now=0)
    _grouped(s, "q", "aabbab-")
    assert _flags(t.take_deliveries()) == [
        (b"0a", True),
        (b"1a", False),
        (b"4a", False),
        (b"6-", False),
    ]
    assert _flags(u.take_deliveries()) == [(b"2b", True), (b"3b", False), (b"5b", False)]


def test_a_group_waits_for_its_consumer_while_others_pass(
    s: Session, t: Session, broker: Broker
) -> None:
    s.declare_queue("q")
    u = broker.open_session("/", owner="u")
    t.consume("q", prefetch=1, now=0)
    _grouped(s, "q", "a")
    [first] = t.take_deliveries()
    u.consume("q", prefetch=10, now=0)
    _grouped(s, "q", "abab", start=1)
    assert bodies(u.take_deliveries()) == [b"2b", b"4b"]  # the a's wait for t
    t.ack(first.dtag)
    assert bodies(t.take_deliveries()) == [b"1a"]


def test_a_cancelled_consumers_group_moves_once_its_deliveries_are_settled(
    s: Session, t: Session, broker: Broker
) -> None:
    s.declare_queue("q")
    u = broker.open_session("/", owner="u")
    tag = t.consume("q", now=0)
    _grouped(s, "q", "aa")
    held = t.take_deliveries()
    u.consume("q", now=0)
    t.cancel(tag)
    _grouped(s, "q", "a", start=2)
    assert u.take_deliveries() == []  # t still holds 0a and 1a
    t.ack(held[0].dtag)
    assert u.take_deliveries() == []
    t.ack(held[1].dtag)
    assert _flags(u.take_deliveries()) == [(b"2a", True)]


def test_a_closed_session_gives_its_groups_and_messages_to_another(
    s: Session, t: Session, broker: Broker
) -> None:
    s.declare_queue("q")
    u = broker.open_session("/", owner="u")
    t.consume("q", now=0)
    _grouped(s, "q", "aa")
    assert len(t.take_deliveries()) == 2
    u.consume("q", now=0)
    _grouped(s, "q", "a", start=2)
    t.close()  # a crash: the unacked come back, the group moves
    got = u.take_deliveries()
    assert _flags(got) == [(b"0a", True), (b"1a", False), (b"2a", False)]
    assert [d.redelivered for d in got] == [True, True, False]


def test_the_flag_belongs_to_one_delivery_not_to_the_queued_message(
    s: Session, t: Session, broker: Broker
) -> None:
    s.declare_queue("q")
    t.consume("q", now=0)
    _grouped(s, "q", "a")
    [d] = t.take_deliveries()
    assert d.message.headers == {FIRST_FOR_CONSUMER: True}
    t.nack(d.dtag, requeue=True)  # back to the same consumer, which holds the group
    [again] = t.take_deliveries()
    assert again.message.headers == {}
    t.close()
    queued = broker.vhost("/").queues["q"].ready  # type: ignore[union-attr]
    assert [m.headers for m, _, _ in queued] == [{}]


def test_groups_and_selectors_combine(s: Session, t: Session, broker: Broker) -> None:
    s.declare_queue("q")
    u = broker.open_session("/", owner="u")
    t.consume("q", selector="JMSXGroupID IN ('a', 'b')", now=0)
    u.consume("q", selector="group_id <> 'a'", now=0)
    _grouped(s, "q", "abcbac")
    # round robin gives b to u (both select it); a can only go to t, c only to u
    assert _flags(t.take_deliveries()) == [(b"0a", True), (b"4a", False)]
    assert _flags(u.take_deliveries()) == [(b"1b", True), (b"2c", True), (b"3b", False),
                                          (b"5c", False)]  # fmt: skip


def test_peering_queues_forward_grouped_messages_unflagged(s: Session) -> None:
    s.declare_queue("amq.peering.x", reserved=True)
    s.consume("amq.peering.x", now=0)
    _grouped(s, "amq.peering.x", "aa")
    assert _flags(s.take_deliveries()) == [(b"0a", False), (b"1a", False)]


def test_groups_hold_after_a_restart() -> None:
    broker, records = recording_broker()
    s = broker.open_session("/", owner="s")
    s.declare_queue("dq", durable=True)
    for i, g in enumerate("abab"):
        s.publish(Message("", "dq", f"{i}{g}".encode(), None, {"persistent": True,
                                                               "group_id": g}), now=0)  # fmt: skip
    again = restored(records)
    t = again.open_session("/", owner="t")
    u = again.open_session("/", owner="u")
    t.consume("dq", prefetch=1, now=0)
    [first] = t.take_deliveries()
    u.consume("dq", now=0)
    assert _flags(u.take_deliveries()) == [(b"1b", True), (b"3b", False)]  # 2a waits for t
    t.ack(first.dtag)
    assert _flags([first, *t.take_deliveries()]) == [(b"0a", True), (b"2a", False)]


def _persistent_groups(s: Session, queue: str, groups: str, start: int = 0) -> None:
    for i, g in enumerate(groups, start):
        props = {"persistent": True, "group_id": g}
        s.publish(Message("", queue, f"{i}{g}".encode(), None, props), now=0)


def _owners(records: list[Record]) -> list[tuple[str, str]]:
    return [(r.group, r.owner) for r in records if isinstance(r, GroupOwner)]


def test_a_recorded_queue_journals_each_change_of_owner() -> None:
    broker, records = recording_broker()
    s = broker.open_session("/", owner="s")
    s.instance = "abc"
    s.declare_queue("dq", durable=True)
    s.declare_queue("tq")
    tag = s.consume("dq", now=0)
    s.consume("tq", now=0)
    _persistent_groups(s, "dq", "aab")
    _grouped(s, "tq", "c")  # not recorded: the queue is not
    assert _owners(records) == [("a", "i:abc/ctag-1"), ("b", "i:abc/ctag-1")]
    held = s.take_deliveries()
    s.cancel(tag)
    assert _owners(records)[2:] == []  # its deliveries are not settled yet
    for d in held:
        if d.queue == "dq":
            s.ack(d.dtag)
    assert sorted(_owners(records)[2:]) == [("a", ""), ("b", "")]


def _taken_over(
    records: list[Record], owner_instance: str = "abc"
) -> tuple[Broker, Session, Session]:
    """The broker rebuilt from ``records`` (as after a restart or a failover) and two
    sessions: ``back`` (the client that had the groups, reconnected) and ``other``."""
    again = restored(records)
    back = again.open_session("/", owner="back")
    back.instance = owner_instance
    other = again.open_session("/", owner="other")
    other.instance = "xyz"
    return again, back, other


def _held_by_ctag_1(groups: str) -> list[Record]:
    broker, records = recording_broker()
    s = broker.open_session("/", owner="s")
    s.instance = "abc"
    s.declare_queue("dq", durable=True)
    s.consume("dq", prefetch=1, now=0)  # ctag-1
    _persistent_groups(s, "dq", groups)
    return records


def test_after_a_takeover_a_group_waits_for_its_consumer_which_gets_it_back_flagged() -> None:
    records = _held_by_ctag_1("aab")  # ctag-1 holds a (0a delivered), b waits
    _, back, other = _taken_over(records)
    other.consume("dq", now=1)
    # a is reserved for abc/ctag-1; b had no owner yet: it goes at once
    assert _flags(other.take_deliveries()) == [(b"2b", True)]
    back.consume("dq", tag="ctag-1", now=2)
    got = back.take_deliveries()
    assert _flags(got) == [(b"0a", True), (b"1a", False)]
    assert [d.redelivered for d in got] == [True, False]


def test_a_reservation_lapses_once_a_consumer_has_waited_the_resume_timeout() -> None:
    records = _held_by_ctag_1("aa")
    again, back, other = _taken_over(records)
    again.vhost("/").group_resume_timeout = 5.0  # type: ignore[union-attr]
    other.consume("dq", now=100)
    assert other.take_deliveries() == []
    again.tick(104.9)
    assert other.take_deliveries() == []
    again.tick(105)
    got = other.take_deliveries()
    assert _flags(got) == [(b"0a", True), (b"1a", False)]
    back.consume("dq", tag="ctag-1", now=106)  # too late: the group has moved
    assert back.take_deliveries() == []


def test_a_returned_owner_without_credit_keeps_its_reservation() -> None:
    broker, records = recording_broker()
    s = broker.open_session("/", owner="s")
    s.instance = "abc"
    s.declare_queue("dq", durable=True)
    s.consume("dq", prefetch=2, now=0)  # ctag-1: takes 0- and 1a (so it owns a)
    s.publish(Message("", "dq", b"0-", None, {"persistent": True}), now=0)
    _persistent_groups(s, "dq", "aa", start=1)
    again, back, other = _taken_over(records)
    again.vhost("/").group_resume_timeout = 5.0  # type: ignore[union-attr]
    back.consume("dq", tag="ctag-1", prefetch=1, now=0)
    [plain] = back.take_deliveries()  # 0- (no group) uses its one credit
    assert plain.message.body == b"0-"
    other.consume("dq", now=1)  # wants a, which waits for ctag-1: it is back
    again.tick(100)
    assert other.take_deliveries() == []
    back.ack(plain.dtag)
    assert _flags(back.take_deliveries()) == [(b"1a", True)]


def test_an_owner_without_an_instance_is_never_recognised() -> None:
    broker, records = recording_broker()
    s = broker.open_session("/", owner="s")  # no instance (an AMQP channel)
    s.declare_queue("dq", durable=True)
    s.consume("dq", now=0)
    _persistent_groups(s, "dq", "a")
    assert _owners(records) == [("a", "-")]
    again, back, _ = _taken_over(records, owner_instance="")
    back.consume("dq", tag="ctag-1", now=0)
    assert back.take_deliveries() == []  # same tag, no instance: not the same consumer
    again.tick(10)
    assert _flags(back.take_deliveries()) == [(b"0a", True)]


def test_a_freed_group_is_not_reserved_after_a_takeover() -> None:
    broker, records = recording_broker()
    s = broker.open_session("/", owner="s")
    s.instance = "abc"
    s.declare_queue("dq", durable=True)
    tag = s.consume("dq", now=0)
    _persistent_groups(s, "dq", "a")
    [d] = s.take_deliveries()
    s.ack(d.dtag)
    s.cancel(tag)
    _persistent_groups(s, "dq", "a", start=1)
    _, _, other = _taken_over(records)
    other.consume("dq", now=0)
    assert _flags(other.take_deliveries()) == [(b"1a", True)]


# --- the property: one consumer per group at a time, order, flags ----------------------------


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("publish"), st.sampled_from("abc-")),
            st.tuples(
                st.sampled_from(
                    ["ack", "nack", "cancel", "close", "join", "also", "pause", "resume"]
                ),
                st.integers(0, 3),
            ),
        ),
        max_size=50,
    ),
    prefetch=st.integers(0, 3),
    no_acks=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_never_two_consumers_hold_one_group(
    steps: list[tuple[str, Any]], prefetch: int, no_acks: list[bool]
) -> None:
    """At every step each group's unsettled deliveries are on one consumer; each
    consumer sees a group's fresh messages in publish order; the first delivery of a
    group to a consumer is flagged and no other is; and no message is lost."""
    broker = Broker()
    pub = broker.open_session("/", owner="pub")
    pub.declare_queue("q")
    consumers: list[tuple[Session, str]] = []
    held: dict[tuple[Session, str], list[Delivery]] = {}
    seen: dict[tuple[Session, str], set[str]] = {}
    fresh: dict[tuple[Session, str, str], list[int]] = {}
    done: list[int] = []  # acked, or taken by a no-ack consumer
    serial = 0

    def join(session: Session | None = None) -> None:
        no_ack = no_acks[len(consumers) % len(no_acks)]
        if session is None:
            session = broker.open_session("/", owner=f"c{len(consumers)}")
        key = (session, session.consume("q", prefetch=prefetch, no_ack=no_ack, now=0))
        consumers.append(key)
        held[key] = []
        seen[key] = set()

    def collect() -> None:
        for session, _ in consumers:
            for d in session.take_deliveries():
                key = (session, d.ctag)
                group = d.message.properties.get("group_id")
                flagged = FIRST_FOR_CONSUMER in d.message.headers
                if group is not None:
                    assert flagged == (group not in seen[key])
                    seen[key].add(group)
                    if not d.redelivered:
                        fresh.setdefault((session, d.ctag, group), []).append(int(d.message.body))
                else:
                    assert not flagged
                if no_acks[consumers.index(key) % len(no_acks)]:
                    done.append(int(d.message.body))
                else:
                    held[key].append(d)
        holders: dict[str, set[tuple[Session, str]]] = {}
        for key, deliveries in held.items():
            for d in deliveries:
                group = d.message.properties.get("group_id")
                if group is not None:
                    holders.setdefault(group, set()).add(key)
        assert all(len(keys) == 1 for keys in holders.values()), holders

    join()
    join()
    for op, arg in steps:
        if op == "publish":
            props = {} if arg == "-" else {"group_id": arg}
            pub.publish(Message("", "q", str(serial).encode(), None, props), now=0)
            serial += 1
        elif op == "join":
            join()
        else:
            live = [k for k in consumers if k in held]
            if not live:
                continue
            key = live[arg % len(live)]
            session, tag = key
            if op in ("ack", "nack") and held[key]:
                d = held[key].pop(0)
                if op == "ack":
                    session.ack(d.dtag)
                    done.append(int(d.message.body))
                else:
                    session.nack(d.dtag, requeue=True)
            elif op == "also" and not session.closed:
                join(session)  # a second consumer on the same session
            elif op == "cancel" and not session.closed:
                session.cancel(tag)  # its deliveries stay held until settled
            elif op in ("pause", "resume"):
                session.set_writable(op == "resume", now=0)
            elif op == "close":
                session.close()  # requeues what its consumers held
                for other in [k for k in held if k[0] is session]:
                    del held[other]
        collect()
    for numbers in fresh.values():
        assert numbers == sorted(numbers)
    for _ in range(serial + 1):  # settle everything, as often as it takes
        for key in list(held):
            for d in held[key]:
                key[0].ack(d.dtag)
                done.append(int(d.message.body))
            held[key] = []
        collect()
    ready = [int(m.body) for m, _, _ in broker.vhost("/").queues["q"].ready]  # type: ignore[union-attr]
    assert sorted(done + ready) == list(range(serial))


def test_cancelling_a_consumer_moves_its_settled_groups_at_once(
    s: Session, t: Session, broker: Broker
) -> None:
    s.declare_queue("q")
    u = broker.open_session("/", owner="u")
    tag = t.consume("q", no_ack=True, now=0)
    _grouped(s, "q", "a")
    assert len(t.take_deliveries()) == 1
    t.set_writable(False)  # flow control: t's group waits
    u.consume("q", now=0)
    _grouped(s, "q", "aa", start=1)
    assert u.take_deliveries() == []
    t.cancel(tag)
    assert _flags(u.take_deliveries()) == [(b"1a", True), (b"2a", False)]


def test_closing_a_session_loses_no_group_message_to_its_own_consumers(
    s: Session, t: Session, broker: Broker
) -> None:
    """Closing t frees A's group a while t's other consumer B still has credit: the
    freed message must not be pushed to B (t is going), but stay for u."""
    s.declare_queue("q")
    t.consume("q", prefetch=1, now=0)  # A
    _grouped(s, "q", "a")
    [a0] = t.take_deliveries()
    t.ack(a0.dtag)
    _grouped(s, "q", "b", start=1)
    [_b1] = t.take_deliveries()  # A holds it: no credit, and owns a and b
    t.consume("q", no_ack=True, selector="JMSXGroupID = 'a'", now=0)  # B
    _grouped(s, "q", "a", start=2)  # waits for A
    assert t.take_deliveries() == []
    t.close()
    u = broker.open_session("/", owner="u")
    u.consume("q", now=0)
    assert _flags(u.take_deliveries()) == [(b"1b", True), (b"2a", True)]


def test_publishes_to_a_constrained_queue_are_counted(
    s: Session, t: Session, broker: Broker
) -> None:
    """A message a grouped (or selecting) queue hands straight to a consumer counts in
    its publish rate, as on a plain queue."""
    s.declare_queue("q")
    s.declare_queue("p")
    t.consume("q", now=0)
    t.consume("p", selector="k = 1", now=0)
    _grouped(s, "q", "ab-")
    publish(s, "", "p", b"x", {"k": 1})
    publish(s, "", "p", b"y", {"k": 2})  # waits
    vhost = broker.vhost("/")
    assert vhost is not None
    assert vhost.queues["q"].stat_publish == 3
    assert vhost.queues["p"].stat_publish == 2
    assert len(t.take_deliveries()) == 4
