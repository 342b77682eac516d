"""Exactly once across cuts: a hypothesis model of a link under random faults.

A sender publishes; frames move one at a time in any interleaving; connections
are cut (frames in flight lost), the network partitions and heals, time passes
(backoff, heartbeats), the receiver confirms late, and the receiver crashes and
restarts from its persisted snapshot. After healing, every message the sender's
log accepted has been made safe at the receiver exactly once, in order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.peering import LinkState, PeeringLink, PeeringMode

from .sim import SIM_LINK, Net, SimNode

STEP = st.tuples(st.just("step"), st.integers(1, 12))
OPS = st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 4)),
    STEP,
    STEP,
    STEP,
    st.tuples(st.just("cut"), st.just(0)),
    st.tuples(st.just("partition"), st.just(0)),
    st.tuples(st.just("heal"), st.just(0)),
    st.tuples(st.just("advance"), st.integers(1, 40)),
    st.tuples(st.just("confirm"), st.just(0)),
    st.tuples(st.just("restart"), st.just(0)),
)


def _sender_link(sender: SimNode) -> PeeringLink:
    (link,) = sender.px.links.values()
    assert link.sends
    return link


def _settle(net: Net, receiver: SimNode, sender: SimNode, horizon: float) -> None:
    net.partitioned.clear()
    for _ in range(100):
        net.run(horizon=horizon)
        receiver.confirm_all()
        net.run(horizon=horizon)
        link = _sender_link(sender)
        caught_up = link.log is not None and link.log.unacked == 0
        if link.state is LinkState.UP and caught_up and not net.pending():
            return
        net.advance(6.0)  # past any backoff
    raise AssertionError("the link never caught up")


def run_model(
    mode: PeeringMode,
    ops: list[tuple[str, int]],
    *,
    seed: int,
    ack_every: int,
    confirm_at_once: bool,
    heartbeat: float,
) -> None:
    net = Net(seed)
    template = replace(SIM_LINK, ack_every=ack_every, ack_delay=0.5, heartbeat=heartbeat)
    a = net.node("A", acceptor=template, confirm_at_once=confirm_at_once)
    b = net.node("B", acceptor=template, confirm_at_once=confirm_at_once)
    sender, receiver = (a, b) if mode is PeeringMode.PUBLISH else (b, a)
    receiver.bind("q", "#")
    a.dial(b, mode, ack_every=ack_every, ack_delay=0.5, heartbeat=heartbeat)
    horizon = 20.0 if heartbeat else 600.0
    net.run(horizon=horizon)  # the acceptor end exists from the first hello on
    published: list[bytes] = []
    for op, n in ops:
        if op == "publish":
            for _ in range(n):
                body = b"m%04d" % len(published)
                published.append(body)
                sender.publish("k", body)
        elif op == "step":
            for _ in range(n):
                net.step(net.rng.randrange(1 << 30))
        elif op == "cut":
            net.cut_all()
        elif op == "partition":
            net.partitioned.add(frozenset(("A", "B")))
        elif op == "heal":
            net.partitioned.clear()
        elif op == "advance":
            net.advance(n / 10)
        elif op == "confirm":
            receiver.confirm_all()
        elif op == "restart":
            receiver.restart(receiver.px.snapshot())
    _settle(net, receiver, sender, horizon)
    assert _sender_link(sender).counters["accepted"] == len(published)
    assert receiver.confirmed == published
    # one path: every duplicate was a resend, caught by the high-water mark
    for link in receiver.px.links.values():
        assert link.counters["duplicates_other_path"] == 0


@pytest.mark.parametrize("mode", [PeeringMode.PUBLISH, PeeringMode.SUBSCRIBE])
@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(OPS, min_size=6, max_size=40),
    seed=st.integers(0, 2**16),
    ack_every=st.sampled_from([1, 3]),
    confirm_at_once=st.booleans(),
)
def test_every_accepted_message_arrives_exactly_once_in_order(
    mode: PeeringMode, ops: list[tuple[str, int]], seed: int, ack_every: int, confirm_at_once: bool
) -> None:
    run_model(
        mode, ops, seed=seed, ack_every=ack_every, confirm_at_once=confirm_at_once, heartbeat=0.0
    )


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(OPS, max_size=30), seed=st.integers(0, 2**16))
def test_with_heartbeats_declaring_silent_remotes_dead(
    ops: list[tuple[str, int]], seed: int
) -> None:
    run_model(
        PeeringMode.PUBLISH, ops, seed=seed, ack_every=2, confirm_at_once=False, heartbeat=1.0
    )


def test_a_fixed_nasty_sequence() -> None:
    """Publish, deliver without acking, cut, restart the receiver, publish more."""
    ops: list[tuple[str, Any]] = [
        ("publish", 4),
        ("step", 12),
        ("cut", 0),
        ("publish", 2),
        ("advance", 3),
        ("step", 5),
        ("restart", 0),
        ("publish", 3),
        ("advance", 40),
        ("step", 12),
        ("cut", 0),
    ]
    for mode in (PeeringMode.PUBLISH, PeeringMode.SUBSCRIBE):
        for confirm in (True, False):
            run_model(mode, ops, seed=1, ack_every=3, confirm_at_once=confirm, heartbeat=0.0)


def test_resend_after_a_cut_is_dropped_as_duplicate_and_counted() -> None:
    net = Net(0)
    a, b = net.node("A"), net.node("B")
    b.bind("q", "#")
    a.dial(b, PeeringMode.PUBLISH)
    net.run()
    for i in range(3):
        a.publish("k", b"%d" % i)
    # deliver the three forwards but lose the acks
    conn = net.conns[0]
    while conn.to_acceptor:
        net.step(0)
    conn.to_dialer.clear()
    net.cut(conn)
    net.run()
    assert b.confirmed == [b"0", b"1", b"2"]
    link = a.link("A->B")
    assert link.stats(net.now)["lag_messages"] == 0
    # the hello told the sender what arrived, so nothing had to be resent
    assert link.stats(net.now)["resent"] == 0


def test_a_restarted_subscriber_resumes_from_its_snapshot_without_resends() -> None:
    net = Net(0)
    a, b = net.node("A"), net.node("B")
    a.bind("q", "#")
    a.dial(b, PeeringMode.SUBSCRIBE)
    net.run()
    for i in range(5):
        b.publish("k", b"%d" % i)
    (conn,) = net.conns
    while conn.to_dialer:  # the forwards arrive; the acks are lost with the crash
        conn.to_acceptor.clear()
        net.step(0)
    conn.to_acceptor.clear()
    assert b.link("A/A->B").stats(net.now)["lag_messages"] == 5
    a.restart(a.px.snapshot())
    for i in range(5, 8):
        b.publish("k", b"%d" % i)
    net.run()
    assert a.confirmed == [b"%d" % i for i in range(8)]
    sender = b.link("A/A->B")
    assert sender.stats(net.now)["resent"] == 0 and sender.stats(net.now)["lag_messages"] == 0
