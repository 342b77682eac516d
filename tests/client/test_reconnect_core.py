"""The pure parts of reconnecting: backoff arithmetic, the link state table, and the
topology record a reconnect replays."""

from __future__ import annotations

import math

import pytest

from amqlite.client import ReconnectPolicy
from amqlite.client.link import TRANSITIONS, LinkEvent, LinkState, next_state
from amqlite.client.policy import resolve_policy
from amqlite.client.topology import Topology
from amqlite.protocol import events as ev

# --- ReconnectPolicy ---------------------------------------------------------------


def test_first_pass_is_immediate_then_doubling_up_to_the_cap() -> None:
    p = ReconnectPolicy(initial_delay=0.05, max_delay=2.0)
    assert [p.cap(n) for n in range(8)] == [0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert p.cap(10_000) == 2.0  # no overflow however long the outage


@pytest.mark.parametrize("attempt", [1, 2, 5, 9, 50])
def test_jitter_stays_in_half_cap_to_cap(attempt: int) -> None:
    p = ReconnectPolicy()
    cap = p.cap(attempt)
    assert p.delay(attempt, 0.0) == cap / 2
    assert p.delay(attempt, 0.999999) == pytest.approx(cap, rel=1e-5)
    assert cap / 2 <= p.delay(attempt, 0.37) <= cap


def test_deadline() -> None:
    assert ReconnectPolicy(give_up_after=5).deadline(100.0) == 105.0
    assert ReconnectPolicy(give_up_after=None).deadline(100.0) == math.inf


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial_delay": 0}, "initial_delay"),
        ({"initial_delay": math.inf}, "initial_delay"),
        ({"initial_delay": 1.0, "max_delay": 0.5}, "max_delay"),
        ({"give_up_after": 0}, "give_up_after"),
        ({"give_up_after": -1}, "give_up_after"),
    ],
)
def test_bad_policy_is_a_value_error(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ReconnectPolicy(**kwargs)


def test_reconnect_defaults_on_for_a_server_list_only() -> None:
    assert resolve_policy(None, 1) is None
    assert resolve_policy(None, 2) == ReconnectPolicy()
    assert resolve_policy(True, 1) == ReconnectPolicy()
    assert resolve_policy(False, 2) is None
    mine = ReconnectPolicy(give_up_after=3)
    assert resolve_policy(mine, 1) is mine


# --- the link state table -------------------------------------------------------------


def test_every_state_event_pair_is_in_the_table_or_raises() -> None:
    for state in LinkState:
        for event in LinkEvent:
            if (state, event) in TRANSITIONS:
                assert next_state(state, event) is TRANSITIONS[state, event]
            else:
                with pytest.raises(RuntimeError, match="no transition"):
                    next_state(state, event)


def test_the_paths_through_the_table() -> None:
    S, E = LinkState, LinkEvent
    assert next_state(S.OPEN, E.LOST) is S.RECONNECTING
    assert next_state(S.RECONNECTING, E.LOST) is S.RECONNECTING
    assert next_state(S.RECONNECTING, E.RESTORED) is S.OPEN
    assert next_state(S.RECONNECTING, E.ENDED) is S.CLOSED
    assert next_state(S.RECONNECTING, E.CLOSE) is S.CLOSING
    assert next_state(S.CLOSING, E.ENDED) is S.CLOSED
    assert not [pair for pair in TRANSITIONS if pair[0] is S.CLOSED]  # closed is final


# --- the topology record ----------------------------------------------------------------


def _replayed(t: Topology) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for d in t:
        e = d.event
        if isinstance(e, ev.ExchangeDeclare):
            out.append(("exchange", e.exchange))
        elif isinstance(e, ev.QueueDeclare):
            out.append(("queue", e.queue) + (("server-named",) if d.server_named else ()))
        else:
            out.append(("bind", e.queue, e.exchange, e.key))
    return out


def test_declarations_replay_in_order_without_repeats() -> None:
    t = Topology()
    t.exchange_declared(ev.ExchangeDeclare(1, "logs", "topic"))
    t.queue_declared(ev.QueueDeclare(2, "jobs"), "jobs")
    t.queue_declared(ev.QueueDeclare(3, ""), "amq.gen-1")
    t.bound(ev.QueueBind(4, "amq.gen-1", "logs", "a.#"))
    t.exchange_declared(ev.ExchangeDeclare(5, "logs", "topic"))  # again: same entry
    t.queue_declared(ev.QueueDeclare(6, "jobs"), "jobs")
    t.bound(ev.QueueBind(7, "amq.gen-1", "logs", "a.#"))
    assert _replayed(t) == [
        ("exchange", "logs"),
        ("queue", "jobs"),
        ("queue", "amq.gen-1", "server-named"),
        ("bind", "amq.gen-1", "logs", "a.#"),
    ]


def test_deletes_and_unbinds_are_not_replayed() -> None:
    t = Topology()
    t.exchange_declared(ev.ExchangeDeclare(1, "x", "direct"))
    t.exchange_declared(ev.ExchangeDeclare(2, "y", "direct"))
    t.queue_declared(ev.QueueDeclare(3, "q1"), "q1")
    t.queue_declared(ev.QueueDeclare(4, "q2"), "q2")
    t.bound(ev.QueueBind(5, "q1", "x", "k"))
    t.bound(ev.QueueBind(6, "q2", "y", "k"))
    t.bound(ev.QueueBind(7, "q2", "x", "k", {"a": 1}))
    t.bound(ev.QueueBind(8, "q2", "x", "k", {"a": 2}))
    t.exchange_deleted("y")  # takes its bindings
    t.queue_deleted("q1")  # takes its bindings
    t.unbound("q2", "x", "k", {"a": 1})
    assert _replayed(t) == [("exchange", "x"), ("queue", "q2"), ("bind", "q2", "x", "k")]
    assert [d.event.arguments for d in t if isinstance(d.event, ev.QueueBind)] == [{"a": 2}]


def test_auto_delete_queue_is_forgotten_with_its_last_consumer() -> None:
    t = Topology()
    t.queue_declared(ev.QueueDeclare(1, "keep"), "keep")
    t.queue_declared(ev.QueueDeclare(2, "temp", auto_delete=True), "temp")
    t.bound(ev.QueueBind(3, "temp", "amq.direct", "k"))
    t.queue_auto_deleted("keep")
    t.queue_auto_deleted("temp")
    assert _replayed(t) == [("queue", "keep")]


def test_rename_rewrites_the_queue_and_its_bindings() -> None:
    t = Topology()
    t.queue_declared(ev.QueueDeclare(1, "", exclusive=True), "amq.gen-1")
    t.bound(ev.QueueBind(2, "amq.gen-1", "amq.topic", "#"))
    t.renamed("amq.gen-1", "amq.gen-2")
    assert _replayed(t) == [
        ("queue", "amq.gen-2", "server-named"),
        ("bind", "amq.gen-2", "amq.topic", "#"),
    ]
    assert t.queues == ["amq.gen-2"]
    first = next(iter(t)).event
    assert isinstance(first, ev.QueueDeclare) and first.exclusive
