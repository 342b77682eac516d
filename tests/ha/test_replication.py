"""The replicator (active node) and the follower (passive node), sans-IO: chunking,
the window, snapshot then tail, acknowledgements, stop and restart, and what the
passive node holds (``ReplicaProgress``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.ha import (
    FOLLOWED_LINKS,
    SYNC_CHUNK,
    SYNC_WINDOW,
    AckAfterCommit,
    ApplySync,
    Follower,
    HaError,
    HaState,
    Promise,
    ReplicaApplied,
    ReplicaProgress,
    ReplicaSynced,
    ReplicationStarted,
    ReplicationStopped,
    Replicator,
    SendSync,
    SendSynced,
    replication_wanted,
)

from .support import B, P, asks, exchange, grant, hb, machine

EPOCH = 3
KB = 1024


def frames(count: int, size: int, tag: bytes = b"r") -> list[bytes]:
    """``count`` distinct frames of ``size`` bytes each."""
    return [(tag + b"%08d" % i).ljust(size, b".") for i in range(count)]


def sends(actions: list[object]) -> list[SendSync]:
    return [a for a in actions if isinstance(a, SendSync)]


def started(snapshot: list[bytes] | None = None, position: int = 100) -> Replicator:
    r = Replicator()
    r.start(EPOCH, [] if snapshot is None else snapshot, position)
    return r


# --- the snapshot ---------------------------------------------------------------------------


def test_a_small_snapshot_goes_in_one_sync_flagged_reset() -> None:
    snapshot = frames(3, 100)
    actions = Replicator().start(EPOCH, snapshot, 42)
    assert actions == [
        ReplicationStarted(position=42, records=3),
        SendSync(upto=42, data=b"".join(snapshot), reset=True, epoch=EPOCH),
    ]


def test_an_empty_journal_still_sends_a_snapshot_to_acknowledge() -> None:
    assert sends(Replicator().start(EPOCH, [], 0)) == [SendSync(0, b"", True, EPOCH)]


@pytest.mark.parametrize(
    ("count", "size", "chunks"),
    [
        (12, 100 * KB, [6, 6, 0]),  # 6 x 100 KB reach SYNC_CHUNK: cut; the last is empty
        (13, 100 * KB, [6, 6, 1]),
        (2, SYNC_CHUNK, [1, 1, 0]),  # a frame as big as a chunk is a chunk
        (1, 3 * SYNC_CHUNK, [1, 0]),  # a record is never split
        (5, 100 * KB, [5]),
    ],
)
def test_the_snapshot_is_cut_in_chunks_the_first_reset_only_the_last_with_upto(
    count: int, size: int, chunks: list[int]
) -> None:
    snapshot = frames(count, size)
    got = sends(Replicator().start(EPOCH, snapshot, 77))
    assert [len(s.data) // size for s in got] == chunks
    assert [s.reset for s in got] == [True] + [False] * (len(got) - 1)
    assert [s.upto for s in got] == [0] * (len(got) - 1) + [77]
    assert b"".join(s.data for s in got) == b"".join(snapshot)
    assert all(s.epoch == EPOCH for s in got)


def test_the_snapshot_is_not_held_by_the_window() -> None:
    """Its chunks before the last are never acknowledged (upto 0): if they waited for
    room in the window, a snapshot bigger than the window would never finish."""
    snapshot = frames(40, 512 * KB)  # 20 MB > SYNC_WINDOW
    r = Replicator()
    got = sends(r.start(EPOCH, snapshot, 9))
    assert b"".join(s.data for s in got) == b"".join(snapshot)
    assert r.in_flight == 20 * 1024 * KB > SYNC_WINDOW
    r.appended(10, b"tail")
    assert r.take() == []  # the tail waits for the window
    assert r.synced(9) == [ReplicaSynced(9)]
    assert r.in_flight == 0
    assert r.take() == [SendSync(10, b"tail", False, EPOCH)]


# --- the tail -------------------------------------------------------------------------------


def test_the_tail_goes_in_order_batched_into_one_sync() -> None:
    r = started(position=10)
    for position, frame in enumerate(frames(4, 50), start=11):
        r.appended(position, frame)
    assert r.take() == [SendSync(14, b"".join(frames(4, 50)), False, EPOCH)]
    assert r.take() == []
    assert r.sent_upto == 14


def test_the_tail_is_cut_at_the_chunk_size() -> None:
    r = started(position=0)
    tail = frames(13, 100 * KB)
    for position, frame in enumerate(tail, start=1):
        r.appended(position, frame)
    got = r.take()
    assert [(s.upto, len(s.data) // (100 * KB)) for s in got] == [(6, 6), (12, 6), (13, 1)]
    assert b"".join(s.data for s in got) == b"".join(tail)
    assert not any(s.reset for s in got)


def test_the_window_stops_the_tail_and_an_ack_resumes_it() -> None:
    r = started(position=0)
    r.synced(0)
    tail = frames(40, 512 * KB)  # one chunk each, 20 MB
    for position, frame in enumerate(tail, start=1):
        r.appended(position, frame)
    first = r.take()
    assert [s.upto for s in first] == list(range(1, 17))  # 16 x 512 KB = SYNC_WINDOW
    assert r.in_flight == SYNC_WINDOW
    assert r.take() == []
    assert r.synced(3) == [ReplicaSynced(3)]  # frees three chunks
    assert [s.upto for s in r.take()] == [17, 18, 19]
    assert r.take() == []
    r.synced(19)
    assert [s.upto for s in r.take()] == list(range(20, 36))
    r.synced(40)
    assert [s.upto for s in r.take()] == list(range(36, 41))
    assert r.in_flight == 5 * 512 * KB  # sent after the ack that covered them: still counted


def test_coalescing_the_tail_waits_while_a_sync_is_not_applied() -> None:
    """What is appended while the last sync sent is on its way goes, all of it, when
    the passive node has applied that sync (or committed it)."""
    r = Replicator(coalesce=True)
    r.start(EPOCH, frames(1, 10), 5)  # the snapshot, upto 5, is on its way
    r.appended(6, b"a")
    assert r.take() == []
    assert r.applied(5) == [ReplicaApplied(5)]
    assert r.take() == [SendSync(6, b"a", False, EPOCH)]
    r.appended(7, b"b")
    r.appended(8, b"c")
    assert r.take() == []  # 6 is not applied yet
    r.synced(6)  # a commit ack covers it as well
    assert r.take() == [SendSync(8, b"bc", False, EPOCH)]
    r.appended(9, b"d")
    r.applied(7)  # not far enough
    assert r.take() == []
    r.applied(8)
    assert r.take() == [SendSync(9, b"d", False, EPOCH)]


def test_coalescing_does_not_wait_for_an_empty_snapshot_nor_an_old_replication() -> None:
    """An empty journal's snapshot (upto 0) is not acknowledged until later: the tail
    goes at once; and a restart forgets what the last replication had sent."""
    r = Replicator(coalesce=True)
    r.start(EPOCH, [], 0)
    r.appended(1, b"a")
    assert r.take() == [SendSync(1, b"a", False, EPOCH)]
    r.stop()
    r.start(EPOCH, [], 0)  # (positions as a test may give them: not from one journal)
    r.appended(1, b"b")
    assert r.take() == [SendSync(1, b"b", False, EPOCH)]


def test_coalescing_sends_a_gathered_tail_in_chunks_within_the_window() -> None:
    r = Replicator(chunk=10, window=25, coalesce=True)
    r.start(EPOCH, [], 0)
    r.appended(1, b"12345")
    assert [s.upto for s in r.take()] == [1]
    for position in range(2, 12):
        r.appended(position, b"12345")
    assert r.take() == []
    r.applied(1)  # applied, not committed: in the window still
    assert [s.upto for s in r.take()] == [3, 5]  # chunks of two records, up to the window
    assert r.take() == []
    r.synced(5)
    assert [s.upto for s in r.take()] == [7, 9, 11]


def test_a_small_window_and_chunk_can_be_chosen() -> None:
    r = Replicator(chunk=10, window=25)
    r.start(EPOCH, [], 0)
    r.synced(0)
    for position in range(1, 11):
        r.appended(position, b"12345")
    assert [s.upto for s in r.take()] == [2, 4, 6]  # 3 x 10 bytes: the window is passed
    r.synced(4)
    assert [s.upto for s in r.take()] == [8, 10]
    with pytest.raises(HaError):
        Replicator(chunk=0)


# --- acknowledgements -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acks", "expected", "synced_upto", "applied_upto"),
    [
        ([("synced", 5)], [ReplicaSynced(5)], 5, 5),
        ([("synced", 5), ("synced", 5)], [ReplicaSynced(5)], 5, 5),  # repeated
        ([("synced", 7), ("synced", 5)], [ReplicaSynced(7)], 7, 7),  # out of order
        ([("applied", 4), ("synced", 3)], [ReplicaApplied(4), ReplicaSynced(3)], 3, 4),
        ([("applied", 6), ("applied", 2)], [ReplicaApplied(6)], 0, 6),
        ([("synced", 6), ("applied", 5)], [ReplicaSynced(6)], 6, 6),  # applied was implied
        ([("synced", 6), ("applied", 8)], [ReplicaSynced(6), ReplicaApplied(8)], 6, 8),
    ],
)
def test_acks_are_cumulative_so_repeated_or_late_ones_change_nothing(
    acks: list[tuple[str, int]],
    expected: list[object],
    synced_upto: int,
    applied_upto: int,
) -> None:
    r = started(position=2)
    got: list[object] = []
    for kind, upto in acks:
        got += r.synced(upto) if kind == "synced" else r.applied(upto)
    assert got == expected
    assert (r.synced_upto, r.applied_upto) == (synced_upto, applied_upto)


def test_an_ack_frees_the_window_up_to_its_position_only() -> None:
    r = started(frames(2, 10), position=2)
    assert r.in_flight == 20
    for position in (3, 4):
        r.appended(position, b"x" * 100)
        r.take()
    assert r.in_flight == 220
    r.synced(3)
    assert r.in_flight == 100
    r.synced(3)
    assert r.in_flight == 100
    assert r.lag(4) == 1


# --- stop and restart -----------------------------------------------------------------------


def test_stop_drops_the_unsent_tail_and_the_window_and_ignores_what_follows() -> None:
    r = started(frames(2, 10), position=2)
    r.appended(3, b"sent")
    r.take()
    r.appended(4, b"never sent")
    r.synced(2)
    assert r.stop() == [ReplicationStopped(synced_upto=2)]
    assert (r.replicating, r.in_flight, r.lag(4)) == (False, 0, None)
    assert r.stop() == []
    r.appended(5, b"ignored")
    assert r.take() == []
    assert r.synced(3) == [] and r.applied(3) == []
    assert r.synced_upto == 2


def test_a_restart_sends_a_new_snapshot_and_forgets_the_old_acks() -> None:
    r = started(frames(2, 10), position=2)
    r.synced(2)
    r.appended(3, b"lost")
    r.stop()
    actions = r.start(EPOCH + 2, frames(3, 10, b"s"), 5)
    assert actions[0] == ReplicationStarted(5, 3)
    assert sends(actions) == [SendSync(5, b"".join(frames(3, 10, b"s")), True, EPOCH + 2)]
    assert (r.synced_upto, r.applied_upto, r.in_flight) == (0, 0, 30)
    assert r.take() == []  # the old tail is gone: the snapshot covers it
    assert r.start(EPOCH, [], 9) == []  # already replicating


def test_nothing_happens_before_the_first_start() -> None:
    r = Replicator()
    r.appended(1, b"x")
    assert r.take() == [] and r.synced(1) == [] and r.applied(1) == [] and r.stop() == []
    assert r.lag(10) is None


# --- the follower ---------------------------------------------------------------------------


def test_the_follower_applies_and_acks_applied_at_once_and_synced_after_commit() -> None:
    f = Follower()
    assert f.on_sync("link", b"snapshot", 6, True, EPOCH) == [
        ApplySync((b"snapshot",)),
        SendSynced(6, applied=True),
        AckAfterCommit(6),
    ]
    assert f.on_sync("link", b"tail", 7, False, EPOCH) == [
        ApplySync((b"tail",)),
        SendSynced(7, applied=True),
        AckAfterCommit(7),
    ]
    assert f.synced_upto == 0  # not committed yet
    assert f.committed(6) == [SendSynced(6, applied=False)]
    assert f.committed(7) == [SendSynced(7, applied=False)]
    assert (f.synced_upto, f.holds_upto, f.syncs_received) == (7, 7, 2)


def test_a_snapshot_in_chunks_is_staged_and_applied_whole_with_its_last_chunk() -> None:
    """The snapshot's first record clears the durable state: applied chunk by chunk,
    a passive node taking over mid-way would hold half of it."""
    f = Follower()
    assert f.on_sync("link", b"a", 0, True, EPOCH) == []
    assert f.on_sync("link", b"b", 0, False, EPOCH) == []
    assert f.on_sync("link", b"c", 9, False, EPOCH) == [
        ApplySync((b"a", b"b", b"c")),
        SendSynced(9, applied=True),
        AckAfterCommit(9),
    ]
    assert f.on_sync("link", b"tail", 10, False, EPOCH)[0] == ApplySync((b"tail",))
    assert f.syncs_received == 4


def test_a_new_snapshot_on_a_link_drops_its_unfinished_one() -> None:
    f = Follower()
    f.on_sync("link", b"a", 0, True, EPOCH)
    f.on_sync("link", b"b", 0, False, EPOCH)  # replication restarted here
    assert f.on_sync("link", b"x", 0, True, EPOCH) == []
    assert f.on_sync("link", b"y", 4, False, EPOCH)[0] == ApplySync((b"x", b"y"))


def test_what_is_left_of_an_old_link_neither_mixes_with_nor_undoes_a_new_snapshot() -> None:
    """The old link's remains, read late, after the new link's snapshot began: its
    own snapshot (taken earlier, at a lower position) must not clear the newer one,
    nor its chunks join it."""
    f = Follower()
    f.on_sync("old", b"s1", 3, True, EPOCH)
    f.on_sync("old", b"t4", 4, False, EPOCH)
    f.on_sync("new", b"x", 0, True, EPOCH)  # the new link's snapshot, at 6
    assert f.on_sync("old", b"t5", 5, False, EPOCH)[0] == ApplySync((b"t5",))  # contiguous
    assert f.on_sync("new", b"y", 6, False, EPOCH)[0] == ApplySync((b"x", b"y"))
    f.on_sync("old", b"a", 0, True, EPOCH)  # an old snapshot, read very late
    assert f.on_sync("old", b"b", 5, False, EPOCH) == [  # held already: acked only
        SendSynced(5, applied=True),
        AckAfterCommit(5),
    ]
    assert f.holds_upto == 6


def test_a_snapshot_at_a_position_already_held_is_acknowledged_not_applied() -> None:
    """Replication restarted on the same link with nothing appended meanwhile."""
    f = Follower()
    f.on_sync("link", b"s", 5, True, EPOCH)
    assert f.on_sync("link", b"s again", 5, True, EPOCH) == [
        SendSynced(5, applied=True),
        AckAfterCommit(5),
    ]
    assert f.on_sync("link", b"t", 6, False, EPOCH)[0] == ApplySync((b"t",))


def test_a_new_term_starts_its_positions_over_and_an_older_term_is_ignored() -> None:
    f = Follower()
    f.on_sync("a", b"s", 50, True, EPOCH)
    f.on_sync("a", b"half", 0, True, EPOCH)
    assert f.on_sync("b", b"s", 2, True, EPOCH + 2)[0] == ApplySync((b"s",))
    assert f.on_sync("a", b"rest", 51, False, EPOCH) == []  # the older term's remains
    assert f.holds_upto == 2 and f.epoch == EPOCH + 2


def test_after_taking_over_the_follower_ignores_the_terms_before_its_own() -> None:
    f = Follower()
    f.on_sync("link", b"a", 0, True, EPOCH)
    f.stop(EPOCH + 1)  # this node took over mid-snapshot, in EPOCH + 1
    assert f.on_sync("link", b"b", 0, False, EPOCH) == []
    assert f.on_sync("link", b"c", 5, False, EPOCH) == []  # never applied alone
    assert f.on_sync("peer", b"s", 1, True, EPOCH + 3)[0] == ApplySync((b"s",))


def test_nothing_is_applied_from_a_link_whose_snapshot_was_not_seen_to_start() -> None:
    """The last chunk of a snapshot looks like a tail sync: applied without the
    chunks before it, the passive node would acknowledge a state it lacks."""
    f = Follower()
    assert f.on_sync("link", b"b", 0, False, EPOCH) == []
    assert f.on_sync("link", b"c", 5, False, EPOCH) == []
    assert f.on_sync("link", b"s", 6, True, EPOCH)[0] == ApplySync((b"s",))
    assert f.on_sync("link", b"?", 0, False, EPOCH) == []  # not a tail sync: ignored
    assert f.on_sync("link", b"t", 7, False, EPOCH)[0] == ApplySync((b"t",))


def test_a_handover_counts_only_while_the_follower_holds_exactly_what_was_announced() -> None:
    """``ha.handover`` {upto, epoch}: a takeover need not flag messages redelivered
    only if this node holds exactly the records the master had when it handed over,
    in that term: one more (appended after the announcement, perhaps a delivery's
    mark) or one fewer (not received yet) and it must flag them all."""
    f = Follower()
    assert not f.handed_over
    f.on_sync("link", b"s", 5, True, EPOCH)
    f.on_handover(6, EPOCH)
    assert not f.handed_over  # record 6 not here yet
    f.on_sync("link", b"t6", 6, False, EPOCH)
    assert f.handed_over
    f.on_sync("link", b"t7", 7, False, EPOCH)
    assert not f.handed_over  # the master journaled more after it announced
    f.on_handover(7, EPOCH - 1)
    assert not f.handed_over  # another term's positions
    f.on_handover(7, EPOCH)
    assert f.handed_over
    f.on_sync("other", b"s", 7, True, EPOCH + 1)  # a new term, same position
    assert not f.handed_over
    f.on_handover(7, EPOCH + 1)
    assert f.handed_over
    f.stop(EPOCH + 2)  # took over: the announcement is spent
    assert not f.handed_over
    f.on_sync("peer", b"s", 0, True, EPOCH + 2)
    assert f.on_sync("peer", b"t", 0, False, EPOCH + 2) == []
    assert not f.handed_over  # (holds 0 of a term whose handover it never heard)


def test_a_follower_remembers_the_links_it_heard_last() -> None:
    f = Follower()
    for n in range(FOLLOWED_LINKS + 1):  # link 0 stages a snapshot, then goes quiet
        f.on_sync(n, b"a", 0, True, EPOCH)
    assert f.on_sync(0, b"z", 9, False, EPOCH) == []  # forgotten: its end is not applied
    assert f.on_sync(FOLLOWED_LINKS, b"z", 9, False, EPOCH)[0] == ApplySync((b"a", b"z"))


def test_the_follower_receives_exactly_what_the_replicator_sent() -> None:
    """Snapshot then tail, through the window, in memory: the follower applies every
    byte once, in order, and its acks drive the replicator to the last position."""
    r, f = Replicator(chunk=1000, window=3000), Follower()
    snapshot, tail = frames(30, 150, b"s"), frames(60, 150, b"t")
    wire = sends(r.start(EPOCH, snapshot, 30))
    applied: list[bytes] = []
    position = 30
    while wire or position < 90:
        if position < 90:
            position += 1
            r.appended(position, tail[position - 31])
            wire += r.take()
        if wire:
            s = wire.pop(0)
            for action in f.on_sync("link", s.data, s.upto, s.reset, s.epoch):
                if isinstance(action, ApplySync):
                    applied += action.chunks
                elif isinstance(action, AckAfterCommit):
                    for ack in f.committed(action.upto):
                        assert isinstance(ack, SendSynced)
                        r.synced(ack.upto)
                    wire += r.take()
    assert b"".join(applied) == b"".join(snapshot + tail)
    assert r.synced_upto == f.synced_upto == 90
    assert r.in_flight == 0


# --- when to replicate ----------------------------------------------------------------------


def test_an_active_node_replicates_to_a_live_passive_peer_over_an_up_link() -> None:
    primary, backup = machine(P), machine(B)
    exchange(primary, backup, 0.0)
    assert (primary.state, backup.state) == (HaState.ACTIVE, HaState.PASSIVE)
    assert replication_wanted(primary, link_up=True, now=0.5)
    assert not replication_wanted(primary, link_up=False, now=0.5)
    assert not replication_wanted(primary, link_up=True, now=5.0)  # the peer is silent
    assert not replication_wanted(backup, link_up=True, now=0.5)  # not active
    primary.on_heartbeat(hb(B, HaState.ACTIVE, epoch=0), 0.6)  # an active peer: a fence is near
    assert primary.state is HaState.ACTIVE
    assert not replication_wanted(primary, link_up=True, now=0.6)


@pytest.mark.parametrize("promise", list(Promise))
def test_a_stale_master_does_not_replicate_to_a_peer_of_a_newer_epoch(promise: Promise) -> None:
    """With a witness, an active node whose starting peer holds a newer epoch (it was
    master since, maybe confirming alone) is about to be fenced: its snapshot would
    replace what that peer confirmed. Without a witness it replicates as before."""
    primary = machine(P, promise=promise)
    heard = primary.on_heartbeat(hb(B), 0.0)  # the backup starting: the first master
    if promise is Promise.WITNESS:
        (ask,) = asks(heard)
        grant(primary, ask, 0.0)
    assert (primary.state, primary.epoch) == (HaState.ACTIVE, 1)
    primary.on_heartbeat(hb(B, epoch=1), 0.1)
    assert replication_wanted(primary, link_up=True, now=0.2)
    primary.on_heartbeat(hb(B, epoch=2), 0.3)  # the backup restarted with epoch 2
    assert primary.state is HaState.ACTIVE
    wanted = replication_wanted(primary, link_up=True, now=0.4)
    assert wanted is (promise is not Promise.WITNESS)


# --- what the passive node holds ------------------------------------------------------------


def test_progress_holds_nothing_back_while_not_required() -> None:
    p = ReplicaProgress()
    assert not p.required
    assert p.releasable(10) == 10
    assert p.replicated(1) and p.stream_replicated("/", "s", 0)
    assert p.stream_unreplicated("/", "s") is None
    assert not p.peer_synced(5) and not p.peer_applied(5)
    assert p.upto is None


def test_progress_holds_replies_until_synced_and_pushes_until_applied() -> None:
    p = ReplicaProgress()
    p.start(since_id=7)  # ids 1-6 were journaled before: they come in the snapshot
    p.sent(3, last_id=7)  # message 7's enqueue at position 3
    p.offset_appended("/", "s", 0, position=4)
    p.offset_appended("/", "s", 1, position=5)
    p.sent(5, last_id=7)  # nothing new for messages: not tracked
    assert p.releasable(5) == 0
    assert not p.replicated(7) and not p.replicated(8)  # 8: not even sent
    assert p.replicated(6)  # before the start
    assert not p.stream_replicated("/", "s", 0) and p.stream_replicated("/", "other", 0)
    # a stream.fetch reads below the first offset the passive node lacks
    assert p.stream_unreplicated("/", "s") == 0 and p.stream_unreplicated("/", "other") is None
    assert p.peer_applied(4)  # pushes may go now
    assert p.stream_unreplicated("/", "s") == 1
    assert p.replicated(7) and p.stream_replicated("/", "s", 0)
    assert not p.stream_replicated("/", "s", 1)
    assert p.releasable(5) == 0  # applied is not committed
    assert not p.peer_applied(3)  # backwards: nothing moves
    assert p.peer_synced(5)
    assert p.releasable(5) == 5 and p.releasable(9) == 5
    assert p.stream_replicated("/", "s", 1)
    assert not p.peer_synced(6)  # nothing tracked is left: no push to wake
    assert p.upto == 6 and p.applied == 6


def test_progress_wakes_a_push_held_for_a_position_once_the_peer_applied_it() -> None:
    p = ReplicaProgress()
    assert p.holds(9)  # not required: nothing waits
    p.start()
    assert not p.holds(4)  # a group's first delivery waits for its group.owner record
    assert p.peer_applied(3)  # nothing else tracked: still the held push must look again
    assert not p.holds(4)
    assert p.peer_applied(4)
    assert p.holds(4)
    assert not p.peer_applied(5)  # nothing waits any more


def test_progress_holds_a_message_until_the_sync_carrying_it_is_applied() -> None:
    p = ReplicaProgress()
    p.start(since_id=10)
    p.sent(20, last_id=12)
    p.sent(25, last_id=12)  # no new message: not tracked
    p.sent(30, last_id=15)
    assert not any(p.replicated(i) for i in range(10, 16))
    assert p.peer_applied(19) and not p.replicated(10)  # before the sync's end: no
    assert p.peer_applied(27)
    assert all(p.replicated(i) for i in (10, 11, 12)) and not p.replicated(13)
    assert p.peer_synced(30)
    assert p.replicated(15) and not p.replicated(16)
    assert not p.peer_applied(31)  # nothing tracked is left: no push to wake


def test_progress_stop_forgets_everything_and_start_begins_at_nothing() -> None:
    p = ReplicaProgress()
    p.start(since_id=1)
    p.peer_synced(5)
    p.sent(6, last_id=1)
    p.stop()
    assert p.replicated(1) and p.releasable(9) == 9
    p.start(since_id=2)
    assert p.releasable(9) == 0 and p.applied == 0
    assert p.replicated(1)  # appended before this start: it comes with the snapshot
    assert not p.replicated(2)


# --- journal turns ----------------------------------------------------------------------------


def test_a_turn_is_never_cut_at_the_chunk_size() -> None:
    r = Replicator(chunk=10, window=10_000)
    r.start(EPOCH, [], 0)
    r.appended(1, b"12345")
    r.hold()
    for position in range(2, 6):  # a turn of 20 bytes: twice the chunk
        r.appended(position, b"abcde")
    r.release()
    r.appended(6, b"67890")
    # the first chunk would end at 2 (10 bytes): inside the turn, so it ends at 5
    assert [s.upto for s in r.take()] == [5, 6]


def test_an_open_turn_waits_for_its_release() -> None:
    r = started(position=0)
    r.appended(1, b"before")
    r.hold()
    r.appended(2, b"in the turn")
    r.hold()  # nested: the outermost release counts
    r.appended(3, b"nested")
    r.release()
    assert [s.upto for s in r.take()] == [1]
    r.release()
    assert [(s.upto, s.data) for s in r.take()] == [(3, b"in the turnnested")]


@settings(max_examples=300, deadline=None)
@given(
    chunk=st.integers(1, 40),
    window=st.integers(1, 80),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("turn"), st.lists(st.integers(1, 15), min_size=1, max_size=6)),
            st.tuples(st.just("record"), st.integers(1, 15)),
            st.tuples(st.just("take"), st.just(0)),
            st.tuples(st.just("ack"), st.just(0)),
        ),
        max_size=40,
    ),
)
def test_syncs_hold_every_record_once_in_order_and_never_half_a_turn(
    chunk: int, window: int, steps: list[tuple[str, Any]]
) -> None:
    r = Replicator(chunk=chunk, window=window)
    r.start(EPOCH, [], 0)
    position = 0
    ends: set[int] = {0}  # positions after which a sync may end
    appended: list[bytes] = []
    sent: list[SendSync] = []

    def record(size: int) -> None:
        nonlocal position
        position += 1
        frame = b"%d:" % position + b"." * size
        appended.append(frame)
        r.appended(position, frame)

    for what, arg in steps:
        if what == "turn":
            r.hold()
            for size in arg:
                record(size)
            r.release()
            ends.add(position)
        elif what == "record":
            record(arg)
            ends.add(position)
        elif what == "take":
            sent += r.take()
        elif sent:
            r.synced(sent[-1].upto)
    if sent:
        r.synced(sent[-1].upto)
    while more := r.take():  # the window lets it all go, an ack at a time
        sent += more
        r.synced(sent[-1].upto)
    assert all(s.upto in ends for s in sent)  # no sync ends inside a turn
    assert [s.upto for s in sent] == sorted({s.upto for s in sent})
    assert b"".join(s.data for s in sent) == b"".join(appended)


# --- take's fast path -------------------------------------------------------------------------

_STEP = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 300), st.booleans()),  # size, an enqueue?
    st.tuples(st.just("hold"), st.just(0), st.just(False)),
    st.tuples(st.just("release"), st.just(0), st.just(False)),
    st.tuples(st.just("take"), st.just(0), st.just(False)),
    st.tuples(st.just("ack"), st.just(0), st.just(False)),
)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(_STEP, max_size=60),
    chunk=st.integers(1, 1200),
    window=st.integers(1, 3000),
)
def test_take_sends_what_walking_the_records_sends(
    steps: list[tuple[str, int, bool]], chunk: int, window: int
) -> None:
    """``Replicator.take`` (whose fast path takes everything pending at once when it
    fits one chunk) sends the same syncs as the general walk, whatever the turns,
    sizes, window and acknowledgements."""
    fast = Replicator(chunk=chunk, window=window)
    walking = Replicator(chunk=chunk, window=window)
    for r in (fast, walking):
        r.start(EPOCH, [], 0)
    position = journal_id = 0
    for kind, size, enqueue in steps:
        if kind == "append":
            position += 1
            if enqueue:
                journal_id += 1
            for r in (fast, walking):
                r.appended(position, bytes([position % 256]) * size, journal_id if enqueue else 0)
        elif kind == "hold":
            fast.hold()
            walking.hold()
        elif kind == "release":
            fast.release()
            walking.release()
        elif kind == "take":
            assert fast.take() == walking._take_walking()
        else:
            assert fast.synced(fast.sent_upto) == walking.synced(walking.sent_upto)
    assert fast.take() == walking._take_walking()
    assert (fast.sent_upto, fast.in_flight) == (walking.sent_upto, walking.in_flight)


# --- sendable: when the shell wakes its sender ------------------------------------------------


def _replicator_state(r: Replicator) -> tuple[Any, ...]:
    return (
        list(r._pending),
        list(r._unacked),
        r.in_flight,
        r.sent_upto,
        r.synced_upto,
        r.applied_upto,
        r._last_id,
        r.replicating,
    )


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(_STEP | st.tuples(st.just("applied"), st.just(0), st.just(False)), max_size=60),
    chunk=st.integers(1, 1200),
    window=st.integers(1, 3000),
    coalesce=st.booleans(),
    stop_at=st.integers(0, 80),
    snapshot=st.booleans(),
)
def test_take_sends_nothing_and_changes_nothing_when_not_sendable(
    steps: list[tuple[str, int, bool]],
    chunk: int,
    window: int,
    coalesce: bool,
    stop_at: int,
    snapshot: bool,
) -> None:
    """``Replicator.sendable`` False (the shell then does not wake its sender) means
    ``take`` would send nothing and leave the replicator as it was, whatever the
    appends, turns, window, acknowledgements (applied or committed), coalescing, a
    stop and a restart; and one whose sender takes only when it is True sends the
    same syncs as one that takes after every step. ``appended`` returns what
    ``sendable`` then says (the tee wakes the sender on it)."""
    every = Replicator(chunk=chunk, window=window, coalesce=coalesce)
    lazy = Replicator(chunk=chunk, window=window, coalesce=coalesce)
    start = ([b"snapshot"], 1) if snapshot else ([], 0)
    for r in (every, lazy):
        r.start(EPOCH, *start)
    sent: list[SendSync] = []
    lazy_sent: list[SendSync] = []
    position = start[1]
    journal_id = 0
    for i, (kind, size, enqueue) in enumerate(steps):
        if i == stop_at:  # the link drops; the next step starts again
            for r in (every, lazy):
                r.stop()
        elif i == stop_at + 1:
            for r in (every, lazy):
                r.start(EPOCH, [], position)
        if kind == "append":
            position += 1
            if enqueue:
                journal_id += 1
            for r in (every, lazy):
                said = r.appended(
                    position, bytes([position % 256]) * size, journal_id if enqueue else 0
                )
                assert said == r.sendable  # what the shell's tee wakes the sender on
        elif kind == "hold":
            every.hold()
            lazy.hold()
        elif kind == "release":
            every.release()
            lazy.release()
        elif kind == "ack":
            every.synced(every.sent_upto)
            lazy.synced(lazy.sent_upto)
        elif kind == "applied":
            every.applied(every.sent_upto)
            lazy.applied(lazy.sent_upto)
        if every.sendable:
            sent += every.take()
        else:
            before = _replicator_state(every)
            assert every.take() == []
            assert _replicator_state(every) == before
        if lazy.sendable:
            lazy_sent += lazy.take()
        assert lazy_sent == sent
