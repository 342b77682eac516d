"""Replication between the nodes of an HA pair, sans-IO: a :class:`Replicator` on the
active node, a :class:`Follower` on the passive one.

The active node streams its journal to the passive one with ``ha.sync``: first a
snapshot of its durable state (the first chunk flagged ``reset``; the records
themselves start with ``snapshot.begin``), then every record as it is appended.
The passive node applies each sync to its broker, journals its frames as they came
and answers ``ha.synced`` twice: at once with ``applied`` (its broker holds the
records: the active node may push them), then once its journal has committed them
(confirms may go). Positions are the active journal's (a record count): a sync's
``upto`` is the position of its last record, 0 for a snapshot chunk that is not
the last one (those are not acknowledged).

The shell moves the bytes, runs both journals and applies the actions in the order
they are returned; :class:`~amqlite.ha.progress.ReplicaProgress` keeps what the
passive node holds for the active node's replies and pushes.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from .errors import HaError
from .machine import HaMachine
from .states import HaState

SYNC_CHUNK = 512 * 1024  # bytes of records per ha.sync
SYNC_WINDOW = 8 * 1024 * 1024  # bytes of the tail sent and not yet acknowledged


def replication_wanted(machine: HaMachine, *, link_up: bool, now: float) -> bool:
    """Whether an active node should stream its journal to its peer now: it is
    active, its link to the peer is up, and the peer is neither active (one of the
    two is about to be fenced) nor silent (a dead peer holds up no confirm). With a
    witness, not to a peer that holds a newer epoch than ours either: we are a stale
    master the witness is about to fence, and our snapshot would replace what that
    peer confirmed alone in its term (docs/ha.md, "The witness")."""
    peer_epoch = machine.peer_epoch
    return (
        machine.state is HaState.ACTIVE
        and link_up
        and machine.peer_state is not HaState.ACTIVE
        and not machine.peer_silent(now)
        and not (machine.witnessed and peer_epoch is not None and peer_epoch > machine.epoch)
    )


# --- the active side ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicationStarted:
    """Replication starts with a snapshot of ``records`` records taken at journal
    position ``position``: from now on hand every appended record to
    :meth:`Replicator.appended`, and hold replies and pushes for the passive node
    (``ReplicaProgress.start``). Applied before the snapshot's sends."""

    position: int
    records: int


@dataclass(frozen=True, slots=True)
class ReplicationStopped:
    """Replication stopped: stop handing records over, and stop holding replies and
    pushes for the passive node (``ReplicaProgress.stop``)."""

    synced_upto: int


@dataclass(frozen=True, slots=True)
class SendSync:
    """Send ``ha.sync`` {upto, data, reset, epoch} to the passive node. ``last_id`` (not
    sent) is the highest journal id of the ``message.enqueue`` records appended up to
    ``upto`` since the start (0: none yet): once the passive node holds ``upto`` it
    holds every message with a journal id up to ``last_id``
    (``ReplicaProgress.sent``)."""

    upto: int
    data: bytes
    reset: bool
    epoch: int
    last_id: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaApplied:
    """The passive node's broker holds everything up to ``upto`` (pushes may go:
    ``ReplicaProgress.peer_applied``)."""

    upto: int


@dataclass(frozen=True, slots=True)
class ReplicaSynced:
    """The passive node has committed everything up to ``upto`` (replies may go:
    ``ReplicaProgress.peer_synced``)."""

    upto: int


ReplicatorAction = (
    ReplicationStarted | ReplicationStopped | SendSync | ReplicaApplied | ReplicaSynced
)


class Replicator:
    """The active node's side: snapshot, then the tail, within a window.

    Guarantees: the snapshot goes at :meth:`start`, whole (its chunks before the last
    carry ``upto`` 0 and are never acknowledged, so they cannot wait for a window),
    in chunks of about ``chunk`` bytes, the first one flagged ``reset``; records
    appended afterwards go in position order, in chunks of about ``chunk`` bytes,
    while fewer than ``window`` bytes are sent and not yet acknowledged (a chunk may
    overshoot either by one record); acknowledgements are cumulative, so repeated or
    late ones are harmless; :meth:`stop` drops what was not sent and the window, and
    everything but :meth:`start` is ignored until the next start.

    With ``coalesce`` (what the shell uses), the tail also waits while the last sync
    sent with records is not yet applied by the passive node (``ha.synced
    {applied}``, or a commit ack at or past it): whatever was appended meanwhile goes
    when that ack comes, in as few syncs as the chunk size allows. Why: a busy
    active node appends between every two turns of its sender, so it sent a small
    sync each time while earlier ones were still on their way (about 60% of them
    in a 1to1-persistent-confirm run), and each sync costs a send, two
    acknowledgements read and handled, and on the passive node a parse, an apply
    and two acknowledgements, whatever its size (issue 16 item 3). The passive node
    applies a sync as soon as it reads it, so this waits about one round trip at
    most; a push waits for that anyway.

    A journal turn (:meth:`hold` .. :meth:`release`, the records a commit writes
    whole, such as peering deliveries and the mark that covers them) is never split
    between two syncs: a chunk ends only where no turn is open, and the records of an
    open turn wait for its release. (A master killed between two syncs of one turn
    would leave the passive node, its successor, with the deliveries and not the
    mark: the sender would deliver them again.)
    """

    __slots__ = (
        "_chunk",
        "_coalesce",
        "_epoch",
        "_last_id",
        "_pending",
        "_unacked",
        "_window",
        "applied_upto",
        "in_flight",
        "put",
        "replicating",
        "sent_upto",
        "synced_upto",
        "turns",
        "wakes",
    )

    def __init__(
        self, *, chunk: int = SYNC_CHUNK, window: int = SYNC_WINDOW, coalesce: bool = False
    ) -> None:
        if chunk <= 0 or window <= 0:
            raise HaError(f"chunk and window must be positive, got {chunk!r}, {window!r}")
        self._chunk = chunk
        self._window = window
        self._coalesce = coalesce
        self.replicating = False
        self._epoch = 0
        #: (position, frame, a chunk may end here, journal id of a message.enqueue
        #: else 0) not yet sent
        self._pending: deque[tuple[int, bytes, bool, int]] = deque()
        #: ``appended`` without the call, for the journal's shell (``NodeStorage.record``
        #: on a busy active node, every record): ``put((position, frame, not turns,
        #: journal_id))`` while replicating, then wake the sender if ``wakes``
        self.put: Callable[[tuple[int, bytes, bool, int]], None] = self._pending.append
        self._last_id = 0  # the highest journal id taken into a sync since the start
        self.turns = 0  # journal turns open (nested)
        self._unacked: deque[tuple[int, int]] = deque()  # (upto, bytes) sent, not yet acked
        self.in_flight = 0  # bytes sent and not yet acknowledged
        self.sent_upto = 0
        self.synced_upto = 0  # the passive node committed up to here (this replication)
        self.applied_upto = 0  # the passive node holds (has applied) up to here
        #: what :meth:`appended` returns, kept current (see :meth:`_rewake`)
        self.wakes = False

    def start(self, epoch: int, snapshot: Sequence[bytes], position: int) -> list[ReplicatorAction]:
        """Start replicating in ``epoch`` with ``snapshot`` (the framed records of the
        durable state as of journal ``position``). Nothing if already replicating."""
        if self.replicating:
            return []
        self.replicating = True
        self._epoch = epoch
        self._pending.clear()
        self._unacked.clear()
        self.in_flight = 0
        self._last_id = 0
        self.synced_upto = self.applied_upto = self.sent_upto = 0
        actions: list[ReplicatorAction] = [ReplicationStarted(position, len(snapshot))]
        first = True
        chunk: list[bytes] = []
        size = 0
        for frame in snapshot:
            chunk.append(frame)
            size += len(frame)
            if size >= self._chunk:
                actions.append(self._send(b"".join(chunk), 0, reset=first))
                first, chunk, size = False, [], 0
        actions.append(self._send(b"".join(chunk), position, reset=first))
        return actions  # (_send set wakes)

    def appended(self, position: int, frame: bytes, journal_id: int = 0) -> bool:
        """The journal appended ``frame`` at ``position`` (every record, in order, from
        :class:`ReplicationStarted` on); sent by a later :meth:`take`. ``journal_id``:
        the message's, when the record is a ``message.enqueue`` (journal ids are handed
        out in journal order: ``Recorder.enqueue`` numbers a message and appends it in
        one step). Returns :attr:`sendable` as it is after the append (the shell wakes
        its sender when True).

        Why it returns it: the journal's shell hands every record here (the tee), and
        asking ``sendable`` after each one was a second call a record on the active
        node; this is the same test, made where the record is taken
        (``tests/ha/test_replication.py`` checks that the two agree)."""
        if self.replicating:
            self._pending.append((position, frame, self.turns == 0, journal_id))
            return self.wakes
        return False

    def _rewake(self) -> None:
        """Set :attr:`wakes`: whether :attr:`sendable` is True after an append (all
        but ``pending`` of its test); called wherever its fields change."""
        self.wakes = (
            self.replicating
            and self.in_flight < self._window
            and not (self._coalesce and self.sent_upto > self.applied_upto)
        )

    def hold(self) -> None:
        """The journal opened a turn: what is appended until the matching
        :meth:`release` goes in one sync."""
        self.turns += 1

    def release(self) -> None:
        """The turn opened by :meth:`hold` is closed: a chunk may end after its
        last record."""
        self.turns = max(0, self.turns - 1)
        pending = self._pending
        if not self.turns and pending and not pending[-1][2]:
            position, frame, _, journal_id = pending.pop()
            pending.append((position, frame, True, journal_id))

    @property
    def sendable(self) -> bool:
        """False when :meth:`take` would send nothing now and change nothing: not
        replicating, nothing pending, the window full, or (``coalesce``) the last
        sync not yet applied. Only an :meth:`appended`, a :meth:`release`, an
        acknowledgement or a :meth:`start` can make it True again.

        Why: the shell woke its sender task after every append, and on a busy pair
        the last sync is mostly on its way (coalescing), so about half of the
        sender's turns found nothing to send (a counting build: 505 of 1,000), each
        a task switch and a ``take``; the ack that lets the tail go wakes the sender
        anyway. ``tests/ha/test_replication.py`` checks with hypothesis that ``take``
        sends nothing and changes nothing whenever this is False, and that taking
        only when it is True sends the same syncs."""
        return (
            self.replicating
            and bool(self._pending)
            and self.in_flight < self._window
            and not (self._coalesce and self.sent_upto > self.applied_upto)
        )

    def take(self) -> list[SendSync]:
        """The syncs to send now: what was appended and not sent, while the window
        has room, each ending where no journal turn is open (records of a turn still
        open wait), and with ``coalesce`` nothing while the last sync sent is not
        applied. Called after :meth:`appended` and acknowledgements; batching what
        accumulated in between is what keeps the chunks large."""
        pending = self._pending
        sends: list[SendSync] = []
        if self._coalesce and self.sent_upto > self.applied_upto:
            return sends  # the ack that applies it takes what gathered meanwhile
        while self.replicating and pending and self.in_flight < self._window:
            if pending[-1][2]:
                # Fast path: everything pending fits one chunk and may end at its last
                # record, so the cut below would take it all; this takes it without
                # walking the records one by one in Python (a busy active node calls
                # this once a pump turn, for ~100 records). tests/ha/test_replication.py
                # checks with hypothesis that it sends what _take_walking sends.
                frames = [part[1] for part in pending]
                if sum(map(len, frames)) < self._chunk:
                    upto = pending[-1][0]
                    last_id = max([part[3] for part in pending])
                    pending.clear()
                    if last_id > self._last_id:
                        self._last_id = last_id
                    sends.append(self._send(b"".join(frames), upto, reset=False))
                    break
            step = self._take_walking(1)
            if not step:
                break  # only an open turn's records: they wait for its release
            sends += step
        return sends

    def _take_walking(self, limit: int = sys.maxsize) -> list[SendSync]:
        """Up to ``limit`` syncs, cut by walking the pending records (the general
        path of :meth:`take`; alone, with no limit, it sends what :meth:`take` does)."""
        pending = self._pending
        sends: list[SendSync] = []
        while len(sends) < limit and self.replicating and pending and self.in_flight < self._window:
            size = cut = 0
            for i, (_, frame, may_end, _) in enumerate(pending):
                size += len(frame)
                if may_end:
                    cut = i + 1
                    if size >= self._chunk:
                        break
            if not cut:
                break  # only an open turn's records: they wait for its release
            parts = [pending.popleft() for _ in range(cut)]
            data = b"".join([part[1] for part in parts])
            last_id = max([part[3] for part in parts])
            if last_id > self._last_id:
                self._last_id = last_id
            sends.append(self._send(data, parts[-1][0], reset=False))
        return sends

    def synced(self, upto: int) -> list[ReplicatorAction]:
        """``ha.synced``: the passive node committed everything up to ``upto``; frees
        the window (call :meth:`take` after)."""
        if not self.replicating:
            return []
        unacked = self._unacked
        while unacked and unacked[0][0] <= upto:
            self.in_flight -= unacked.popleft()[1]
        if upto <= self.synced_upto:
            self._rewake()
            return []
        self.synced_upto = upto
        self.applied_upto = max(self.applied_upto, upto)
        self._rewake()
        return [ReplicaSynced(upto)]

    def applied(self, upto: int) -> list[ReplicatorAction]:
        """``ha.synced {applied}``: the passive node holds (has applied) everything up to
        ``upto`` (not yet committed)."""
        if not self.replicating or upto <= self.applied_upto:
            return []
        self.applied_upto = upto
        self._rewake()
        return [ReplicaApplied(upto)]

    def stop(self) -> list[ReplicatorAction]:
        """Stop (the link dropped, the peer went silent, this node is no longer
        active): what was not sent is dropped, the next start sends a new snapshot."""
        if not self.replicating:
            return []
        self.replicating = False
        self._pending.clear()
        self._unacked.clear()
        self.in_flight = 0
        self.wakes = False
        return [ReplicationStopped(self.synced_upto)]

    def lag(self, appended: int) -> int | None:
        """Records the passive node has not committed yet, of ``appended``; None when
        not replicating."""
        return appended - self.synced_upto if self.replicating else None

    def _send(self, data: bytes, upto: int, *, reset: bool) -> SendSync:
        self.in_flight += len(data)
        self._unacked.append((upto, len(data)))
        if upto:
            self.sent_upto = upto
        self._rewake()
        return SendSync(upto, data, reset, self._epoch, self._last_id)


# --- the passive side ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApplySync:
    """Parse the framed records in ``chunks`` (in order), apply them to the broker,
    then journal each frame as it came (not encoded again), all in one step."""

    chunks: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class SendSynced:
    """Send ``ha.synced`` {upto, applied} on the link the sync came on."""

    upto: int
    applied: bool


@dataclass(frozen=True, slots=True)
class AckAfterCommit:
    """Once the journal has committed everything appended so far, call
    :meth:`Follower.committed` with ``upto`` and apply what it returns."""

    upto: int


FollowerAction = ApplySync | SendSynced | AckAfterCommit


FOLLOWED_LINKS = 4  # links a follower remembers (one is live; the rest are leftovers)


class Follower:
    """The passive node's side: apply, journal, acknowledge.

    Guarantees, for the active node's confirms to mean what they say:

    - every sync with an ``upto`` that is applied (or already held) is acknowledged
      twice, in this order: ``applied`` at once, and again once the journal has
      committed it;
    - a snapshot sent in several chunks is staged until its last chunk (the one with
      ``upto``) arrives, then applied whole: its first record clears the durable
      state, so applied chunk by chunk it would leave a passive node that takes over
      mid-way with half of it;
    - syncs are followed per ``link`` (any hashable naming the connection they came
      on): a link's tail syncs are applied only after its own snapshot, so neither
      the end of a snapshot whose start was dropped nor an old link's chunks can
      pass for something else;
    - what is applied is always contiguous: positions are the active journal's, and
      within one term (one ``epoch``) of one active node they only grow, so a sync
      whose ``upto`` this node already holds (the remains of an older link, read
      after a newer link's snapshot) is acknowledged but not applied again, and
      syncs from an older term are ignored.

    It remembers the ``FOLLOWED_LINKS`` links it heard from last (staged snapshots
    included): a link forgotten (long dead) is ignored until it starts a snapshot.

    It also says whether it holds exactly what an active node that handed over had
    journaled (:meth:`on_handover`, :attr:`handed_over`): then a takeover need not
    flag the messages ``redelivered``.
    """

    __slots__ = ("_handover", "_links", "epoch", "holds_upto", "synced_upto", "syncs_received")

    def __init__(self) -> None:
        self.syncs_received = 0
        self.epoch = 0  # the term followed: the highest sync epoch seen
        self.holds_upto = 0  # applied everything up to here, in this term
        self.synced_upto = 0  # the highest position acknowledged as committed
        #: link -> its snapshot's chunks so far, or None once its snapshot is applied
        #: (tail syncs follow); least recently heard first
        self._links: dict[Hashable, list[bytes] | None] = {}
        #: (epoch, upto) of the last ``ha.handover`` heard, None when none (or after
        #: a term of our own began)
        self._handover: tuple[int, int] | None = None

    def on_handover(self, upto: int, epoch: int) -> None:
        """``ha.handover`` {upto, epoch}: the active node of term ``epoch`` closed
        its clients, journaled every delivery mark and ack, and had appended ``upto``
        records when it said so."""
        self._handover = (epoch, upto)

    @property
    def handed_over(self) -> bool:
        """Whether this node holds exactly what the active node had journaled when it
        handed over: same term, same last position (a record appended after the
        handover, or one not received, makes it False). A takeover then knows every
        delivery the old master made; any other must assume any message was seen."""
        return self._handover == (self.epoch, self.holds_upto)

    def on_sync(
        self, link: Hashable, data: bytes, upto: int, reset: bool, epoch: int
    ) -> list[FollowerAction]:
        """A ``ha.sync`` {upto, data, reset, epoch} arrived on ``link``."""
        self.syncs_received += 1
        links = self._links
        if epoch != self.epoch:
            if epoch < self.epoch:
                return []  # an older term's leftovers
            self.epoch, self.holds_upto = epoch, 0  # a new term: its own positions
            links.clear()
        if reset:
            links.pop(link, None)
            stage: list[bytes] | None = []
        elif link in links:
            stage = links.pop(link)
        else:
            return []  # a link whose snapshot we did not see start: nothing is safe to apply
        if stage is not None:  # a snapshot
            stage.append(data)
            if not upto:
                self._follow(link, stage)
                return []
            chunks = tuple(stage)
        elif not upto:
            self._follow(link, None)
            return []  # not a tail sync (those always have an upto): ignore it
        else:  # a tail sync
            chunks = (data,)
        self._follow(link, None)
        acks: list[FollowerAction] = [SendSynced(upto, applied=True), AckAfterCommit(upto)]
        if upto <= self.holds_upto:
            return acks  # held already (contiguous from what gave holds_upto)
        self.holds_upto = upto
        return [ApplySync(chunks), *acks]

    def _follow(self, link: Hashable, stage: list[bytes] | None) -> None:
        links = self._links
        links[link] = stage  # the most recently heard last
        while len(links) > FOLLOWED_LINKS:
            del links[next(iter(links))]

    def committed(self, upto: int) -> list[FollowerAction]:
        """The journal committed what was appended when :class:`AckAfterCommit`
        ``upto`` was returned."""
        self.synced_upto = max(self.synced_upto, upto)
        return [SendSynced(upto, applied=False)]

    def stop(self, epoch: int) -> None:
        """This node became active in ``epoch``: forget every link (and the snapshots
        they were staging), and ignore the syncs of every term before ours (an active
        peer that later outranks us starts a new term, above ours, with a new
        snapshot)."""
        self._links.clear()
        self._handover = None
        self.epoch, self.holds_upto = epoch, 0
