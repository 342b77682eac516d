"""The outbound log: sequence numbers, cumulative acks, resend, and the byte cap with
its three overflow policies (alone and on a live link)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqlite.peering import (
    Blocked,
    Entry,
    Envelope,
    MemorySpill,
    MeshId,
    OutboundLog,
    OverflowPolicy,
    PeeringMode,
)

from .sim import Net


def env(n: int, size: int = 100) -> Envelope:
    e = Envelope(MeshId("A", 1, n), "k", b"")
    return Envelope(MeshId("A", 1, n), "k", b"x" * (size - e.size()))


def seqs(entries: list[Entry]) -> list[int]:
    return [e.seq for e in entries]


def test_seq_on_accept_ack_and_rewind() -> None:
    log = OutboundLog(epoch=4, buffer_bytes=10_000)
    assert [log.accept(env(i), float(i)) for i in range(1, 6)] == [1, 2, 3, 4, 5]
    assert seqs(log.take_unsent(2)) == [1, 2]
    assert log.in_flight == 2 and log.unsent == 3 and log.unacked == 5
    assert seqs(log.take_unsent(10)) == [3, 4, 5]
    assert log.ack(2) == 2 and log.in_flight == 3
    assert log.oldest_accepted_at == 3.0
    assert log.ack(2) == 0  # acks are cumulative and idempotent
    assert log.rewind() == 3 and log.in_flight == 0
    assert seqs(log.take_unsent(10)) == [3, 4, 5]  # resent, in order
    log.ack(5)
    assert log.unacked == 0 and log.buffered_bytes == 0 and log.oldest_accepted_at is None
    assert log.accept(env(6), 6.0) == 6  # never reused


def test_block_refuses_past_the_cap_but_always_takes_one() -> None:
    log = OutboundLog(epoch=1, buffer_bytes=300, overflow=OverflowPolicy.BLOCK)
    assert [log.accept(env(i), 0) for i in range(1, 4)] == [1, 2, 3]
    assert not log.has_room(100)
    assert log.accept(env(4), 0) is None and log.blocked == 1
    assert log.next_seq == 4  # no seq spent on a refusal
    log.ack(3)
    assert log.accept(env(5, size=1000), 0) == 4  # bigger than the cap: alone, it fits
    assert log.accept(env(6), 0) is None


def test_drop_oldest_forgets_and_counts() -> None:
    log = OutboundLog(epoch=1, buffer_bytes=300, overflow=OverflowPolicy.DROP_OLDEST)
    for i in range(1, 4):
        log.accept(env(i), 0)
    assert seqs(log.take_unsent(1)) == [1]  # in flight, still droppable
    assert log.accept(env(4), 0) == 4
    assert log.accept(env(5, size=200), 0) == 5
    assert log.dropped == 3 and log.buffered_bytes == 300
    assert log.in_flight == 0
    assert seqs(log.take_unsent(10)) == [4, 5]


def test_spill_keeps_order_and_comes_back_as_acks_make_room() -> None:
    spill = MemorySpill()
    log = OutboundLog(epoch=1, buffer_bytes=300, overflow=OverflowPolicy.SPILL, spill=spill)
    for i in range(1, 8):
        assert log.accept(env(i), float(i)) == i
    assert log.buffered_bytes == 300 and len(spill) == 4 and log.spilled_bytes == 400
    assert log.spilled == 4 and log.unacked == 7
    assert seqs(log.take_unsent(10)) == [1, 2, 3]
    log.ack(2)  # room for two: 4 and 5 come back
    assert seqs(log.take_unsent(10)) == [4, 5]
    assert len(spill) == 2
    log.ack(5)
    assert seqs(log.take_unsent(10)) == [6, 7]
    assert len(spill) == 0
    with pytest.raises(ValueError, match="spill store"):
        OutboundLog(epoch=1, buffer_bytes=1, overflow=OverflowPolicy.SPILL)


def test_entries_map_for_a_disk_spill() -> None:
    entry = Entry(9, env(3).onward("A"), env(3).onward("A").size(), 12.5)
    assert Entry.from_map(entry.to_map()) == entry


@given(
    st.sampled_from(list(OverflowPolicy)),
    st.lists(st.tuples(st.sampled_from(["accept", "send", "ack", "cut"]), st.integers(1, 400))),
)
def test_the_cap_holds_and_order_is_kept(
    policy: OverflowPolicy, steps: list[tuple[str, int]]
) -> None:
    """Whatever happens, memory stays within the cap (save one lone message), the
    sent sequence numbers only grow on a connection, and nothing but drop-oldest
    loses a message that was accepted."""
    spill = MemorySpill() if policy is OverflowPolicy.SPILL else None
    log = OutboundLog(epoch=1, buffer_bytes=500, overflow=policy, spill=spill)
    accepted: list[int] = []
    acked = 0
    last_sent = 0
    at: dict[int, float] = {}  # when each was accepted (the log keeps it as stamps)
    for i, (op, n) in enumerate(steps):
        if op == "accept":
            now = float(i // 3)  # some accepted at the same time, some not
            seq = log.accept(env(n, size=50 + n), now)
            if seq is not None:
                accepted.append(seq)
                at[seq] = now
        elif op == "send":
            for e in log.take_unsent(n % 5 + 1):
                assert e.seq > last_sent
                assert e.accepted_at == at[e.seq] and e.size == e.envelope.size()
                last_sent = e.seq
        elif op == "ack" and last_sent:
            acked = max(acked, min(last_sent, acked + n % 4))
            log.ack(acked)
        elif op == "cut":
            log.rewind()
            last_sent = acked
        assert log.buffered_bytes <= 500 or log.unacked - len(log.spill or ()) == 1
        in_memory = log.unacked - len(log.spill or ())
        assert log.buffered_bytes == sum(e.size() for e in log._envelopes())
        assert log.oldest_accepted_at == (at[log.gone_upto + 1] if in_memory else None)
    log.rewind()
    rest = seqs(log.take_unsent(10**6))
    while log.unsent:
        log.ack(rest[-1] if rest else acked)
        rest += seqs(log.take_unsent(10**6))
    expected = [s for s in accepted if s > acked]
    if policy is OverflowPolicy.DROP_OLDEST:
        assert set(rest) <= set(expected) and rest == sorted(rest)
        assert len(expected) - len(rest) <= log.dropped
    else:
        assert rest == expected


# --- on a live link ---------------------------------------------------------------------


def _pair(policy: OverflowPolicy) -> tuple[Net, object, object]:
    net = Net(11)
    a, b = net.node("A"), net.node("B")
    b.bind("q", "#")
    a.dial(b, PeeringMode.PUBLISH, overflow=policy, buffer_bytes=1000)
    net.run()
    return net, a, b


def test_block_on_a_cut_link_tells_the_shell_and_frees_up_later() -> None:
    net, a, b = _pair(OverflowPolicy.BLOCK)
    net.partitioned.add(frozenset(("A", "B")))
    net.cut_all()
    for i in range(30):
        a.publish("k", b"m%02d" % i)
    link = a.link("A->B")
    stats = link.stats(net.now)
    assert a.blocked and stats["overflow_blocked"] == len(a.blocked)
    assert stats["buffered_bytes"] <= 1000
    assert not a.px.has_room(a.blocked[0].envelope)
    net.partitioned.clear()
    net.run()
    assert a.available == ["A->B"]
    held = [blocked.envelope for blocked in a.blocked]
    while held:  # the shell offers them again, in order, to that link only
        actions = link.offer(held[0], routed_locally=False, now=net.now)
        if any(isinstance(x, Blocked) for x in actions):
            net.run()  # acks come back and make room
            continue
        held.pop(0)
        net.apply(a, actions)
    net.run()
    assert b.drain("q") == [b"m%02d" % i for i in range(30)]


def test_drop_oldest_on_a_cut_link_counts_what_it_dropped() -> None:
    net, a, b = _pair(OverflowPolicy.DROP_OLDEST)
    net.partitioned.add(frozenset(("A", "B")))
    net.cut_all()
    for i in range(30):
        a.publish("k", b"m%02d" % i)
    dropped = a.link("A->B").stats(net.now)["overflow_dropped"]
    assert dropped > 0
    net.partitioned.clear()
    net.run()
    got = b.drain("q")
    assert len(got) == 30 - dropped
    assert got == [b"m%02d" % i for i in range(dropped, 30)]  # the newest survive, in order


def test_spill_on_a_cut_link_loses_nothing() -> None:
    net, a, b = _pair(OverflowPolicy.SPILL)
    net.partitioned.add(frozenset(("A", "B")))
    net.cut_all()
    for i in range(30):
        a.publish("k", b"m%02d" % i)
    stats = a.link("A->B").stats(net.now)
    assert stats["spilled"] > 0 and stats["buffered_bytes"] <= 1000
    assert stats["lag_messages"] == 30
    net.partitioned.clear()
    net.run()
    assert b.drain("q") == [b"m%02d" % i for i in range(30)]
