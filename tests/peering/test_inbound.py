"""Receive-side marks: per-sender high-water marks and the mesh's seen-message window,
their epochs, and snapshot/restore."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqlite.peering import HighWaterMarks, MeshId, PeeredExchange, SeenMessages


def test_marks_per_sender_and_epoch() -> None:
    marks = HighWaterMarks()
    m = marks.mark("A", "l", 3)
    assert m is not None and (m.epoch, m.accepted, m.settled) == (3, 0, 0)
    m.accepted = m.settled = 10
    assert marks.mark("A", "l", 3) is m
    assert marks.mark("A", "l", 2) is None  # an older incarnation: stale
    newer = marks.mark("A", "l", 4)  # the sender restarted: a new log
    assert newer is not None and newer.accepted == 0
    assert marks.mark("A", "other", 1) is not None
    assert marks.position("A", "l") == (4, 0)
    assert marks.position("Z", "l") is None


def test_marks_snapshot_keeps_only_what_was_settled() -> None:
    marks = HighWaterMarks()
    m = marks.mark("A", "l", 3)
    assert m is not None
    m.accepted, m.settled = 10, 7
    snap = marks.snapshot()
    assert snap == [["A", "l", 3, 7]]
    back = HighWaterMarks.restore(snap)
    r = back.mark("A", "l", 3)
    assert r is not None and (r.accepted, r.settled) == (7, 7)  # 8-10 will come again
    for bad in ([["A", "l", 3]], [["A", 1, 3, 4]], [["A", "l", -1, 4]], ["x"]):
        with pytest.raises(ValueError):
            HighWaterMarks.restore(bad)


def test_seen_claims_once_and_pending_counts_as_seen() -> None:
    seen = SeenMessages(window=4)
    a1 = MeshId("A", 1, 1)
    assert seen.claim(a1)
    assert not seen.claim(a1)  # a second copy before the first settled
    seen.settle(a1)
    assert not seen.claim(a1)
    assert seen.claim(MeshId("A", 2, 1))  # another epoch, another origin
    assert seen.claim(MeshId("B", 1, 1))


@given(st.lists(st.integers(1, 60), max_size=120))
def test_seen_within_the_window_is_exact(arrivals: list[int]) -> None:
    """While fewer than ``window`` ids are held above the floor, dedup is exact:
    every id is claimed once, whatever the order and the repeats."""
    seen = SeenMessages(window=64)
    claimed: set[int] = set()
    for seq in arrivals:
        first = seen.claim(MeshId("A", 1, seq))
        assert first is (seq not in claimed)
        if first:
            claimed.add(seq)
            seen.settle(MeshId("A", 1, seq))


def test_the_window_moves_the_floor_past_the_oldest() -> None:
    seen = SeenMessages(window=3)
    for seq in (2, 4, 6, 8):  # gaps: 1, 3, 5, 7 went elsewhere
        assert seen.claim(MeshId("A", 1, seq))
        seen.settle(MeshId("A", 1, seq))
    assert not seen.claim(MeshId("A", 1, 1))  # below the floor (2): assumed seen
    assert seen.claim(MeshId("A", 1, 5))  # within the window: still exact
    assert seen.snapshot() == [["A", 1, 2, [4, 6, 8]]]


def test_only_the_latest_epochs_are_kept() -> None:
    seen = SeenMessages(epochs_kept=2)
    for epoch in (1, 2, 3):
        assert seen.claim(MeshId("A", epoch, 1))
    assert not seen.claim(MeshId("A", 1, 2))  # epoch 1 forgotten: stale
    assert seen.claim(MeshId("A", 2, 2))


def test_seen_snapshot_round_trip_skips_pending() -> None:
    seen = SeenMessages()
    for seq in (1, 2, 3, 5, 9):
        seen.claim(MeshId("A", 1, seq))
        if seq != 9:
            seen.settle(MeshId("A", 1, seq))
    snap = seen.snapshot()
    assert snap == [["A", 1, 3, [5]]]
    back = SeenMessages.restore(snap)
    assert not back.claim(MeshId("A", 1, 2)) and not back.claim(MeshId("A", 1, 5))
    assert back.claim(MeshId("A", 1, 9)) and back.claim(MeshId("A", 1, 4))
    with pytest.raises(ValueError):
        SeenMessages.restore([["A", 1, 3, [0]]])


def test_exchange_snapshot_is_plain_data_and_checked() -> None:
    px = PeeredExchange(node_id="B", epoch=1, exchange="x", exchange_type="topic", rand=lambda: 0.5)
    snap = px.snapshot()
    assert snap == {"version": 1, "marks": [], "seen": []}
    px.restore({"version": 1, "marks": [["A", "l", 2, 5]], "seen": [["A", 2, 5, []]]})
    assert px.ctx.marks.position("A", "l") == (2, 5)
    with pytest.raises(ValueError):
        px.restore({"version": 9})
    with pytest.raises(ValueError):
        px.restore({"version": 1, "marks": [[1, 2]]})
