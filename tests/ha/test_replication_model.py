"""A replicating pair in memory, driven by hypothesis: the real ``Replicator``,
``Follower`` and ``ReplicaProgress`` between two simulated journals and a link that
drops, lingers and comes back.

The active node appends records (persistent messages, each with a confirm held by
the durability barrier; stream appends; other records), commits its journal,
replicates; the passive node applies, journals, commits and acknowledges. Links
drop (the old connection's unread syncs may still be read later, interleaved with
the new link's), replication pauses and resumes on the same link (the peer went
silent and came back), the passive node restarts (losing what it had not
committed). Small chunks and a small window make every sync a few records. Each
example is a script of weighted steps (long scripts find the interleavings a
rule-based machine's short runs rarely reach); two pinned examples replay the old-link
interleavings that random scripts find only sometimes.

Checked at every step:

- a confirm released while the passive node is attached names a message the passive
  node has committed, and every such message stays in the passive node's committed
  state from then on (if the active node died now, the passive one would have it);
- a message (or stream offset) that the barrier lets be pushed is in the passive
  node's broker;

and, once the link is healthy for long enough, every confirm is released and the
passive node's state is the active one's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from amqlite.ha import (
    AckAfterCommit,
    ApplySync,
    Follower,
    FollowerAction,
    ReplicaApplied,
    ReplicaProgress,
    ReplicaSynced,
    ReplicationStarted,
    ReplicationStopped,
    Replicator,
    ReplicatorAction,
    SendSync,
    SendSynced,
)

EPOCH = 1
CHUNK, WINDOW = 40, 120  # bytes: a few records per sync, a few syncs in flight
STREAM = ("/", "s")

Record = tuple[str, int]  # ("enq", journal id) | ("stream", offset) | ("other", 0) | ("begin", 0)


def frame(record: Record, position: int) -> bytes:
    kind, arg = record
    return f"{kind} {arg} {'.' * (position * 7 % 13)}\n".encode()


def parse(data: bytes) -> list[Record]:
    out = []
    for line in data.splitlines():
        kind, arg, _ = line.decode().split(" ")
        out.append((kind, int(arg)))
    return out


@dataclass
class State:
    """A broker's (or a journal's) durable state, folded from records."""

    messages: set[int] = field(default_factory=set)
    offsets: set[int] = field(default_factory=set)

    def apply(self, record: Record) -> None:
        kind, arg = record
        if kind == "begin":  # snapshot.begin: everything before is superseded
            self.messages.clear()
            self.offsets.clear()
        elif kind == "enq":
            self.messages.add(arg)
        elif kind == "stream":
            self.offsets.add(arg)


def fold(records: list[Record]) -> State:
    state = State()
    for record in records:
        state.apply(record)
    return state


@dataclass
class Link:
    id: int
    to_passive: deque[SendSync] = field(default_factory=deque)
    to_active: deque[SendSynced] = field(default_factory=deque)
    open: bool = True  # the active node's end: acks on a closed link are lost


class ReplicatingPair:
    """The two nodes and the link; each public method is one step of the world."""

    def __init__(self, *, coalesce: bool = True) -> None:
        # the active node
        self.log: list[Record] = []  # position = index + 1
        self.committed = 0
        self.held: list[tuple[int, int]] = []  # (position, journal id) confirms waiting
        self.replicator = Replicator(chunk=CHUNK, window=WINDOW, coalesce=coalesce)
        self.progress = ReplicaProgress()
        self.tracked: set[int] = set()  # messages appended during this replication
        self.tracked_offsets: set[int] = set()
        self.confirmed_with_replica: set[int] = set()
        self.next_id = 1
        self.next_offset = 0
        # the link
        self.links = 0
        self.link: Link | None = None
        self.lingering: list[Link] = []  # closed, but the passive node may still read them
        # the passive node
        self.p_journal: list[Record] = []
        self.p_committed = 0
        self.p_waiting: list[tuple[int, Link, int]] = []  # (journal length, link, upto)
        self.p_broker = State()
        self.follower = Follower()
        self.connect()

    # --- the active node ------------------------------------------------------------------

    def _append(self, record: Record) -> int:
        """``NodeStorage.record``: journal, hand to the replicator, track for pushes."""
        self.log.append(record)
        position = len(self.log)
        if self.replicator.replicating:  # the tee is set
            kind, arg = record
            self.replicator.appended(position, frame(record, position), arg if kind == "enq" else 0)
            if self.progress.required:
                if kind == "enq":
                    self.tracked.add(arg)
                elif kind == "stream":
                    self.progress.offset_appended(*STREAM, arg, position)
                    self.tracked_offsets.add(arg)
        return position

    def _apply_replicator(self, actions: list[ReplicatorAction] | list[SendSync]) -> None:
        for action in actions:
            if isinstance(action, SendSync):
                assert self.link is not None
                self.link.to_passive.append(action)
                self.progress.sent(action.upto, action.last_id)
            elif isinstance(action, ReplicaSynced):
                self.progress.peer_synced(action.upto)
            elif isinstance(action, ReplicaApplied):
                self.progress.peer_applied(action.upto)
            elif isinstance(action, ReplicationStarted):
                assert action.position == len(self.log)
                self.progress.start(self.next_id)
            elif isinstance(action, ReplicationStopped):
                self.progress.stop()
                self.tracked.clear()
                self.tracked_offsets.clear()
        self._release()

    def _start(self) -> None:
        state = fold(self.log)
        snapshot: list[Record] = [("begin", 0)]
        snapshot += [("enq", m) for m in sorted(state.messages)]
        snapshot += [("stream", o) for o in sorted(state.offsets)]
        position = len(self.log)
        frames = [frame(r, position) for r in snapshot]
        self._apply_replicator(self.replicator.start(EPOCH, frames, position))

    def _release(self) -> None:
        """The durability barrier: a confirm goes once the local journal and, while a
        passive node is attached, the passive node have committed its position."""
        limit = self.progress.releasable(self.committed)
        keep = []
        for position, message in self.held:
            if position > limit:
                keep.append((position, message))
                continue
            if self.progress.required:
                assert message in self._passive_durable().messages, (
                    f"confirmed message {message} (position {position}) that the passive "
                    "node has not committed"
                )
                self.confirmed_with_replica.add(message)
        self.held = keep

    # --- the passive node -----------------------------------------------------------------

    def _passive_durable(self) -> State:
        return fold(self.p_journal[: self.p_committed])

    def _receive(self, link: Link, count: int) -> None:
        for _ in range(count):
            if not link.to_passive:
                return
            sync = link.to_passive.popleft()
            actions = self.follower.on_sync(link.id, sync.data, sync.upto, sync.reset, sync.epoch)
            self._apply_follower(actions, link)

    def _apply_follower(self, actions: list[FollowerAction], link: Link) -> None:
        for action in actions:
            if isinstance(action, ApplySync):
                records = [r for chunk in action.chunks for r in parse(chunk)]
                for record in records:
                    self.p_broker.apply(record)
                self.p_journal += records
            elif isinstance(action, SendSynced):
                if link.open:
                    link.to_active.append(action)
            elif isinstance(action, AckAfterCommit):
                self.p_waiting.append((len(self.p_journal), link, action.upto))

    # --- steps ------------------------------------------------------------------------------

    def publish(self, count: int) -> None:
        for _ in range(count):
            self.held.append((self._append(("enq", self.next_id)), self.next_id))
            self.next_id += 1

    def append_other(self, count: int) -> None:
        for i in range(count):
            if i % 2:
                self._append(("other", 0))
            else:
                self._append(("stream", self.next_offset))
                self.next_offset += 1

    def active_commit(self, count: int = 0) -> None:
        self.committed = len(self.log)
        self._release()

    def send(self, count: int = 0) -> None:
        if self.link is not None:
            self._apply_replicator(self.replicator.take())

    def passive_reads(self, count: int) -> None:
        if self.link is not None:
            self._receive(self.link, count)

    def passive_reads_old_link(self, count: int) -> None:
        """The passive node reads what an old link still holds (its task is behind)."""
        for link in self.lingering:
            if link.to_passive:
                self._receive(link, count)
                event("read an old link's sync")
                return

    def passive_commit(self, count: int = 0) -> None:
        self.p_committed = len(self.p_journal)
        waiting, self.p_waiting = self.p_waiting, []
        for length, link, upto in waiting:
            if length > self.p_committed:
                self.p_waiting.append((length, link, upto))
            else:
                self._apply_follower(self.follower.committed(upto), link)

    def active_reads(self, count: int) -> None:
        link = self.link
        for _ in range(count):
            if link is None or not link.to_active:
                return
            ack = link.to_active.popleft()
            if ack.applied:
                self._apply_replicator(self.replicator.applied(ack.upto))
            else:
                self._apply_replicator(self.replicator.synced(ack.upto))

    def round_trip(self, count: int = 0) -> None:
        """One healthy exchange on the current link: send, read, commit, acknowledge."""
        self.send()
        self.passive_reads(10**6)
        self.passive_commit()
        self.active_reads(10**6)
        self.active_commit()

    def drop_link(self, count: int = 0, *, linger: bool = False) -> None:
        """The connection breaks; with ``linger``, what the passive node had not read
        yet may still be read, after the new link's first syncs."""
        link = self.link
        if link is None:
            return
        link.open = False
        link.to_active.clear()
        if linger and link.to_passive:
            self.lingering.append(link)
        self.link = None
        self._apply_replicator(self.replicator.stop())

    def drop_link_lingering(self, count: int = 0) -> None:
        self.drop_link(linger=True)

    def connect(self, count: int = 0) -> None:
        if self.link is None:
            self.links += 1
            self.link = Link(self.links)
            self._start()

    def peer_silent(self, count: int = 0) -> None:
        """Replication stops, the link stays (the peer was silent, not disconnected)."""
        self._apply_replicator(self.replicator.stop())

    def peer_heard(self, count: int = 0) -> None:
        if self.link is not None and not self.replicator.replicating:
            self._start()

    def passive_restarts(self, count: int = 0) -> None:
        """kill -9 of the passive node: what it had not committed is gone, and so are
        its connections (nothing lingers)."""
        del self.p_journal[self.p_committed :]
        self.p_waiting.clear()
        self.p_broker = self._passive_durable()
        self.follower = Follower()
        self.lingering.clear()
        self.drop_link()

    # --- checks -----------------------------------------------------------------------------

    def check(self) -> None:
        durable = self._passive_durable()
        missing = self.confirmed_with_replica - durable.messages
        assert not missing, f"confirmed with the replica, then lost on it: {missing}"
        progress = self.progress
        for message in self.tracked:
            if progress.replicated(message):
                assert message in self.p_broker.messages, f"message {message} pushed too soon"
        for offset in self.tracked_offsets:
            if progress.stream_replicated(*STREAM, offset):
                assert offset in self.p_broker.offsets, f"offset {offset} read too soon"

    def settle(self) -> None:
        """Liveness: with a healthy link for long enough, every confirm goes out and
        both nodes agree."""
        self.connect()
        self.peer_heard()
        for _ in range(10_000):
            before = (len(self.held), self.progress.upto, len(self.p_journal), self.p_committed)
            for link in self.lingering:
                self._receive(link, 10**6)
            self.lingering.clear()
            self.round_trip()
            self.check()
            after = (len(self.held), self.progress.upto, len(self.p_journal), self.p_committed)
            if after == before:
                break
        assert self.held == [], "a confirm never went out on a healthy link"
        assert self.progress.upto == len(self.log)
        if self.log:  # (a snapshot of an empty journal is acknowledged with the first record)
            assert self.replicator.in_flight == 0
            assert self._passive_durable() == fold(self.log) == self.p_broker
        if self.confirmed_with_replica:
            event("confirmed with the replica")


STEPS = {  # step -> weight
    "publish": 6,
    "append_other": 2,
    "active_commit": 4,
    "send": 5,
    "passive_reads": 6,
    "passive_commit": 4,
    "active_reads": 5,
    "round_trip": 2,
    "passive_reads_old_link": 4,
    "drop_link": 1,
    "drop_link_lingering": 2,
    "connect": 3,
    "peer_silent": 1,
    "peer_heard": 1,
    "passive_restarts": 1,
}
STEP = st.sampled_from([name for name, weight in STEPS.items() for _ in range(weight)])


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(st.tuples(STEP, st.integers(1, 4)), min_size=20, max_size=120),
    coalesce=st.booleans(),
)
@example(  # an old link's snapshot, read late, must not clear what the new link brought
    script=[
        ("publish", 1),
        ("peer_silent", 1),
        ("peer_heard", 1),  # the old link's snapshot, at 1
        ("drop_link_lingering", 1),
        ("publish", 2),
        ("active_commit", 1),
        ("connect", 1),
        ("round_trip", 1),
        ("passive_reads_old_link", 4),
        ("passive_commit", 1),
    ],
    coalesce=True,
)
@example(  # nor break into the new link's snapshot while it is being staged
    script=[
        ("publish", 4),
        ("peer_silent", 1),
        ("peer_heard", 1),
        ("drop_link_lingering", 1),
        ("connect", 1),
        ("passive_reads", 1),
        ("passive_reads_old_link", 1),
        ("passive_reads", 4),
        ("passive_commit", 1),
        ("active_reads", 4),
        ("active_commit", 1),
    ],
    coalesce=True,
)
def test_a_replicating_pair_confirms_only_what_the_passive_node_holds(
    script: list[tuple[str, int]], coalesce: bool
) -> None:
    """Both with the shell's coalescing replicator (the tail waits while a sync is
    not applied) and without it."""
    pair = ReplicatingPair(coalesce=coalesce)
    for step, count in script:
        getattr(pair, step)(count)
        pair.check()
    pair.settle()
