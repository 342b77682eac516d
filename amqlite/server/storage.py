"""The node's journal, driven from trio: recovery, group commit, held replies,
compaction and disk errors (docs/storage.md, "Driving the journal from trio").

The broker core hands every durable change to :meth:`NodeStorage.record`, which
appends it to the journal (encode and buffer, no I/O) and returns its position. A
reply that must not go out before its records are on disk (a confirm for a
persistent message, the ok of a durable declaration) names the span of positions
it depends on (``Session.journal_span``) and waits at the one durability barrier,
:meth:`NodeStorage.when_durable`, released by the committer task once a commit
covers it (and, on an HA pair, once the passive node holds it). One task
commits, in a worker thread:
``always`` commits as soon as something is buffered (what is appended while an
fsync runs rides the next one), ``batch`` every ``batch_ms``.

A failed write or fsync (disk full, I/O error) turns the held confirms of the
messages it dropped into ``nacked`` replies with code 506, logs the error and
retries the other records later; the broker keeps serving, and the next commit
after space returns succeeds.
"""

from __future__ import annotations

import bisect
import ctypes
import time
from collections import deque
from collections.abc import Callable, Sequence, Sized
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import structlog
import trio

from amqlite.broker import ALL_APPENDED, Message
from amqlite.broker.replay import message_from_record
from amqlite.config import StorageConfig
from amqlite.ha.progress import ReplicaProgress
from amqlite.store.errors import StoreWriteError
from amqlite.store.files import FileLayer
from amqlite.store.journal import Journal, RecoveryReport
from amqlite.store.records import MessageEnqueue, Record, StreamAppend

if TYPE_CHECKING:
    from amqlite.broker import Broker
    from amqlite.ha import Replicator

log = structlog.get_logger("amqlite.server")

RETRY_INTERVAL = 1.0  # seconds between commit attempts while the disk fails
COMPACTION_CHECK = 1.0  # seconds between compaction checks
PLACE_IDLE = 0.05  # seconds without a write after which its messages are placed


#: Called once a span is durable (with None) or lost (with the reason).
DurableCallback = Callable[[str | None], None]


class _Waiter(NamedTuple):
    last: int  # released once the commit (and the replica) covers this position
    first: int  # a message the disk dropped in first..last refuses it
    callback: DurableCallback
    since: float = 0.0  # when it started waiting (HA: held replies fail after a bound)


class ConfirmSink(Protocol):
    """Who gets the confirms :meth:`NodeStorage.confirm_when_durable` releases (a
    client endpoint)."""

    def confirmed(self, ids: list[int]) -> None:
        """The publishes ``ids`` (request ids, in order) are durable: confirm them."""

    def refused(self, rid: int, text: str) -> None:
        """The disk dropped publish ``rid``'s message (or the HA promise failed it)."""


class _ConfirmRun:
    """Plain confirms of one connection's publishes in a row, one waiter for them
    all in :attr:`NodeStorage._waiting` (``last``, ``first``, ``since`` and
    ``callback`` as a :class:`_Waiter` has them: ``first`` and ``last`` span every
    member). Each member is released as soon as a commit covers its own ``last``,
    exactly as its own waiter would be (see :meth:`NodeStorage._release`)."""

    __slots__ = ("first", "firsts", "ids", "last", "lasts", "since", "sink")

    def __init__(self, sink: ConfirmSink, rid: int, first: int, last: int, since: float) -> None:
        self.sink = sink
        self.ids = [rid]
        self.firsts = [first]
        self.lasts = [last]
        self.first = first
        self.last = last
        self.since = since

    def callback(self, lost: str | None) -> None:
        if lost is None:
            self.sink.confirmed(self.ids)
        else:
            for rid in self.ids:
                self.sink.refused(rid, lost)

    def release_upto(self, done: int) -> None:
        """Confirm the members at the front whose ``last`` is ``<= done`` (not all:
        the caller pops a run whose ``last`` is covered)."""
        lasts = self.lasts
        n = 0
        for last in lasts:
            if last > done:
                break
            n += 1
        if n:
            ids = self.ids
            self.sink.confirmed(ids[:n])
            del ids[:n], lasts[:n], self.firsts[:n]
            self.first = min(self.firsts)

    def split_dropped(self, dropped: list[int], text: str) -> bool:
        """Refuse the members whose span holds a position in ``dropped`` (sorted);
        True when none is left."""
        keep_ids, keep_firsts, keep_lasts = [], [], []
        for rid, first, last in zip(self.ids, self.firsts, self.lasts, strict=True):
            i = bisect.bisect_left(dropped, first)
            if i < len(dropped) and dropped[i] <= last:
                self.sink.refused(rid, text)
            else:
                keep_ids.append(rid)
                keep_firsts.append(first)
                keep_lasts.append(last)
        self.ids, self.firsts, self.lasts = keep_ids, keep_firsts, keep_lasts
        if keep_ids:
            self.first = min(keep_firsts)
            self.last = max(keep_lasts)
        return not keep_ids


class LatencyHistogram:
    """Durations in cumulative buckets, as a Prometheus histogram counts them."""

    #: upper bounds in seconds: 0.1 ms to 10 s
    BOUNDS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 10.0)

    def __init__(self) -> None:
        self.counts = [0] * len(self.BOUNDS)  # observations <= each bound (not cumulative)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.sum += seconds
        for i, bound in enumerate(self.BOUNDS):
            if seconds <= bound:
                self.counts[i] += 1
                return

    def buckets(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs, ``+Inf`` last."""
        out, total = [], 0
        for bound, n in zip(self.BOUNDS, self.counts, strict=True):
            total += n
            out.append((repr(bound), total))
        out.append(("+Inf", self.count))
        return out


class JournalSource:
    """The broker's :class:`~amqlite.broker.backlog.MessageSource`: queue backlogs
    read journaled messages back through it (from the journal's memory while not
    yet written, else from the segment files: a few page-cache reads per batch)."""

    def __init__(self, storage: NodeStorage) -> None:
        self.storage = storage
        self.reads = 0

    def load(self, journal_ids: Sequence[int]) -> list[Message | None]:
        journal = self.storage.journal
        if journal is None:
            return [None] * len(journal_ids)
        self.reads += len(journal_ids)
        return [
            message_from_record(r) if r is not None else None
            for r in journal.read_messages(journal_ids)
        ]


def _nothing() -> None:
    pass


def _give_back_freed_memory() -> None:
    """Return the C heap's free pages to the system after a recovery (glibc only).

    Why: a restart reads the journal a segment at a time and builds the index's
    columns as it goes; the temporaries freed between them leave holes in the heap
    that glibc keeps (15 MiB of RSS for a million waiting messages, measured), and
    RSS per waiting message is what issue 16 item 4 bounds. ``malloc_trim`` hands
    them back; elsewhere (or without it) this does nothing."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


class NodeStorage:
    """One node's journal and the replies waiting on it."""

    def __init__(self, config: StorageConfig, *, file_layer: FileLayer | None = None) -> None:
        self.config = config
        self.journal: Journal | None = None
        self.directory = ""
        self._file_layer = file_layer
        self._waiting: deque[_Waiter | _ConfirmRun] = deque()
        self._dirty = trio.Event()
        #: whether ``record`` has set ``_dirty`` since the committer last replaced it
        #: (so the next record need not: one call a message)
        self._woken = False
        self._closed = False
        self.write_errors = 0
        self.last_error: str | None = None
        self.recovery: dict[str, Any] = {}
        self._last_compaction_check = 0.0
        self._committed = 0
        #: HA: every appended record's (position, frame, journal id of a
        #: ``message.enqueue`` else 0) also goes here while the active node
        #: replicates to its passive peer (``Replicator.appended``); when it returns
        #: True, ``tee_wake`` is called (the replication has something to send).
        self.tee: Callable[[int, bytes, int], bool] | None = None
        #: HA: the replicator itself instead of ``tee`` (its ``appended`` made inline
        #: here; the shell sets one or the other)
        self.tee_to: Replicator | None = None
        self.tee_wake: Callable[[], None] = _nothing
        #: HA: told of journal turns opening (True) and closing (False) while ``tee``
        #: is set, so that replication never splits one
        self.tee_turn: Callable[[bool], None] | None = None
        #: HA: what the passive peer holds (the bookkeeping is sans-IO, in ``ha/``)
        self.replica = replica = ReplicaProgress()
        #: Whether the passive peer holds message ``journal_id`` (True when no peer is
        #: replicated to). A node pushes a journaled message to a consumer only then: a
        #: consumer must never see a message the node that takes over does not hold,
        #: or it would see it twice, the second time not flagged redelivered. (Bound
        #: to ``replica``'s method, not wrapped: it is asked once per push.)
        self.replicated: Callable[[int], bool] = replica.replicated
        #: ``replicated`` for the message at ``offset`` of stream ``queue`` (vhost,
        #: queue, offset): a stream reader must never read an offset that the node
        #: taking over would give to another message.
        self.stream_replicated: Callable[[str, str, int], bool] = replica.stream_replicated
        self._after_commit: deque[tuple[int, Callable[[], None]]] = deque()
        #: the committer's ``batch`` wait while it runs (``after_commit`` cuts it short)
        self._gathering: trio.CancelScope | None = None
        #: what was appended at the latest commit_now: until a commit covers it, the
        #: next commit skips the batch wait (one that took it already grants it)
        self._now_upto = 0
        #: how long each commit (write + fsync, in a worker thread) took: /metrics
        self.commit_times = LatencyHistogram()
        self._replica_waiters: set[Callable[[], None]] = set()
        #: what queue backlogs read journaled messages through (the node gives it to
        #: every broker it makes)
        self.source = JournalSource(self)
        #: called just before every commit (and the close): the broker's gathered
        #: delivery marks and acks are appended then (``Recorder.flush_marks``)
        self.before_commit: Callable[[], None] | None = None

    # --- opening -----------------------------------------------------------------------

    async def open(
        self, directory: str, broker: Broker, *, locked: Callable[[], None] | None = None
    ) -> RecoveryReport:
        """Lock ``directory``, recover the journal (in a thread), rebuild ``broker``
        from it and log what was found. ``locked`` is called once the directory is
        this node's, before the rebuild. Raises StoreLocked / JournalCorrupt /
        StoreError for the caller to report."""
        self.directory = directory
        cfg = self.config
        started = time.monotonic()

        def recover() -> tuple[Journal, RecoveryReport]:
            journal = Journal(
                directory,
                fsync=cfg.fsync,  # type: ignore[arg-type]
                batch_ms=cfg.batch_ms,
                segment_bytes=cfg.segment_bytes,
                file_layer=self._file_layer,
            )
            try:
                return journal, journal.recover()
            except BaseException:
                journal.close()
                raise

        journal, report = await trio.to_thread.run_sync(recover)
        self.journal = journal
        if locked is not None:
            locked()
        state = report.state
        # lazily: each live message is queued by journal id, its body left in the journal
        now = trio.current_time()
        journal.with_refs(lambda refs: broker.apply(refs, now))
        _give_back_freed_memory()
        elapsed = time.monotonic() - started
        self.recovery = {
            "records": report.records,
            "segments": report.segments,
            "messages": state.live_messages,
            "stream_messages": state.stream_messages,
            "queues": len(state.queues()),
            "seconds": round(elapsed, 3),
            "dropped_bytes": report.dropped_bytes,
        }
        log.info(
            "journal_recovered",
            data_dir=directory,
            fsync=cfg.fsync,
            records=report.records,
            segments=report.segments,
            exchanges=len(state.exchanges()),
            queues=len(state.queues()),
            bindings=len(state.bindings()),
            messages=state.live_messages,
            stream_messages=state.stream_messages,
            seconds=round(elapsed, 3),
        )
        if report.dropped_bytes or report.reason:
            log.warning(
                "journal_tail_truncated",
                segment=report.truncated_segment,
                dropped_bytes=report.dropped_bytes,
                reason=report.reason,
            )
        if report.removed:
            log.info("journal_leftovers_removed", files=list(report.removed))
        return report

    # --- the event loop's side -----------------------------------------------------------

    @property
    def appended(self) -> int:
        journal = self.journal
        return journal.appended if journal is not None else 0

    def record(self, record: Record) -> int:
        """The broker's sink: append one record (no I/O), wake the committer and
        return the record's journal position (0 once closing: not stored)."""
        journal = self.journal
        if journal is None or self._closed:
            return 0  # shutting down: what is recorded now is what a crash would lose
        position, frame = journal.append_framed(record)
        replicator = self.tee_to
        if replicator is not None:
            # Replicator.appended, inline (what it does, without its call: a record
            # each on a busy active node). tests/server/test_tee_inline.py checks with
            # hypothesis that it queues, wakes and sends what the ``tee`` path does.
            if type(record) is MessageEnqueue:
                replicator.put((position, frame, not replicator.turns, record.id))
            else:
                replicator.put((position, frame, not replicator.turns, 0))
                if type(record) is StreamAppend and self.replica.upto is not None:
                    self.replica.offset_appended(
                        record.vhost, record.queue, record.offset, position
                    )
            if replicator.wakes:
                self.tee_wake()
        elif self.tee is not None:
            tee = self.tee
            if type(record) is MessageEnqueue:
                wake = tee(position, frame, record.id)
            else:
                wake = tee(position, frame, 0)
                if type(record) is StreamAppend and self.replica.upto is not None:
                    self.replica.offset_appended(
                        record.vhost, record.queue, record.offset, position
                    )
            if wake:
                self.tee_wake()
        if not self._woken:
            self._woken = True
            self._dirty.set()
        return position

    def wake(self) -> None:
        """Something waits for the next commit (the committer runs soon)."""
        self._dirty.set()

    def hold(self) -> None:
        """Open a turn whose records one commit writes whole (:meth:`Journal.hold`)."""
        if self.journal is not None:
            self.journal.hold()
            if self.tee_turn is not None:
                self.tee_turn(True)

    def release(self) -> None:
        """Close the turn opened by :meth:`hold`."""
        if self.journal is not None:
            self.journal.release()
            if self.tee_turn is not None:
                self.tee_turn(False)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once everything appended so far is committed. The commit
        starts at once, without the ``batch`` wait (see :meth:`run`)."""
        self._after_commit.append((self.appended, callback))
        self.commit_now()

    def commit_now(self) -> None:
        """Commit what is appended so far without the ``batch`` wait (or end the
        wait if it has begun); made during a commit that did not take all of it,
        the one after it goes at once. An HA active node calls it as a sync goes
        out (see :meth:`run`)."""
        self._now_upto = self.appended
        self._dirty.set()
        gathering = self._gathering
        if gathering is not None:
            gathering.cancel()

    # --- HA: what the passive peer holds (thin: see amqlite.ha.progress) -----------------

    @property
    def replica_upto(self) -> int | None:
        """HA: the passive peer holds everything up to here; None when no peer is
        being replicated to (held replies then wait for the local commit only)."""
        return self.replica.upto

    def replica_applied(self, upto: int) -> None:
        """HA: the passive peer has applied (not yet committed) everything up to
        ``upto``: enough to push those messages (its journal's state holds them)."""
        if self.replica.peer_applied(upto):
            self._wake_replica_waiters()

    def replica_progress(self, upto: int) -> None:
        """HA: the passive peer holds everything up to ``upto``."""
        moved = self.replica.peer_synced(upto)
        self._release(self._committed)
        if moved:
            self._wake_replica_waiters()

    def position_replicated(self, position: int) -> bool:
        """HA: whether the passive peer's broker holds the record at ``position``
        (True when no peer is replicated to)."""
        return self.replica.holds(position)

    def get_held(self, journal_id: int, holding: bool) -> bool:
        """HA: whether the reply of a ``get`` that took message ``journal_id`` (0:
        transient) waits until the passive node holds it, as a push of it would;
        ``holding``: its connection (or channel) holds pushes already, and the reply
        goes behind them."""
        return (
            journal_id != 0
            and self.replica.upto is not None
            and (holding or not self.replicated(journal_id))
        )

    def hold_get(self, journal_id: int, held: Sized, on_replicated: Callable[[], None]) -> bool:
        """:meth:`get_held` for an endpoint holding pushes in ``held``: True when the
        get's reply must join them (then ``on_replicated`` is a waiter, as for the
        first push held)."""
        if not self.get_held(journal_id, bool(held)):
            return False
        if not held:
            self.when_replicated(on_replicated)
        return True

    def when_replicated(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever the passive peer acks more (until it is
        removed with ``discard_waiter``) or replication stops."""
        self._replica_waiters.add(callback)

    def discard_waiter(self, callback: Callable[[], None]) -> None:
        self._replica_waiters.discard(callback)

    def _wake_replica_waiters(self) -> None:
        for callback in list(self._replica_waiters):
            callback()

    def replica_required(self, required: bool) -> None:
        """HA: start (True) or stop (False) holding replies until the passive peer
        holds them too."""
        if required:
            # a (re)joining peer holds nothing until it acks; the messages journaled
            # so far come in its snapshot
            journal = self.journal
            since = journal.state.last_journal_id + 1 if journal is not None else 0
            self.replica.start(since)
        else:
            self.replica.stop()
            self._release(self._committed)
            self._wake_replica_waiters()

    def confirm_alone(self, allowed: bool) -> None:
        """HA: whether replies may go on the local commit while no passive node is
        replicated to (the pair's promise, docs/ha.md); allowing releases what waited."""
        replica = self.replica
        if replica.alone_ok == allowed:
            return
        replica.alone_ok = allowed
        if allowed:
            self._release(self._committed)

    @property
    def holding(self) -> bool:
        """HA: replies wait for a passive node that is not there (the promise holds
        them back)."""
        return self.replica.upto is None and not self.replica.alone_ok

    def fail_held(self, since_before: float, text: str) -> int:
        """HA: refuse (with ``text``) every held reply waiting since before
        ``since_before``; returns how many."""
        keep: deque[_Waiter | _ConfirmRun] = deque()
        failed = 0
        for w in self._waiting:
            if w.since < since_before:
                w.callback(text)
                failed += len(w.ids) if type(w) is _ConfirmRun else 1
            else:
                keep.append(w)
        self._waiting = keep
        return failed

    def when_durable(self, first: int, last: int, callback: DurableCallback) -> None:
        """The durability barrier: call ``callback(None)`` once the journal has
        committed position ``last`` and, while a passive node is replicated to, that
        node holds it too; ``callback(reason)`` instead when the disk dropped a
        message among positions ``first..last``. ``last`` = ``ALL_APPENDED`` stands
        for everything appended so far. Called at once when already durable."""
        if last == ALL_APPENDED:
            last = self.appended
            if first <= 0:
                first = last + 1  # it vouches for records, but none of its own to lose
        if self.replica.releasable(self._committed) >= last:
            callback(None)
            return
        self._waiting.append(_Waiter(last, first, callback, trio.current_time()))
        self._dirty.set()

    def confirm_when_durable(
        self, first: int, last: int, sink: ConfirmSink, rid: int, now: float
    ) -> None:
        """:meth:`when_durable` for a publish's plain confirm: ``sink.confirmed([rid])``
        once durable (``sink.refused(rid, reason)`` if lost), with the confirms of
        the same sink's publishes in a row gathered into one waiter and released
        together, as one write.

        Why it exists beside :meth:`when_durable`: a confirmed persistent message
        made a callback, a waiter and a clock read, and its release a call chain and
        a frame of its own; a tenth of the broker's time per message. The barrier
        is the same: each confirm waits until a commit covers its own ``last``
        (``tests/server/test_confirm_runs.py`` checks both give the same replies in
        the same order for the same commits and failures)."""
        held = self._waiting
        if held and last != ALL_APPENDED:
            tail = held[-1]
            if (
                type(tail) is _ConfirmRun
                and tail.sink is sink
                and tail.since == now
                and (last >= held[0].last or self.replica.releasable(self._committed) < last)
            ):
                # One turn of the same connection's reads (``now`` is the turn's, so
                # fail_held sees each member's wait as its own waiter's), and not
                # releasable now: the head of the queue never is (``_release`` stops
                # at it), so neither is a position at or above it (a new record's
                # always is); an older one (a publish sent again) is asked, and one
                # already durable is confirmed at once below, as when_durable would.
                tail.ids.append(rid)
                tail.firsts.append(first)
                tail.lasts.append(last)
                if last > tail.last:
                    tail.last = last
                if first < tail.first:
                    tail.first = first
                return
        if last == ALL_APPENDED:
            last = self.appended
            if first <= 0:
                first = last + 1
        if self.replica.releasable(self._committed) >= last:
            sink.confirmed([rid])
            return
        held.append(_ConfirmRun(sink, rid, first, last, now))
        self._dirty.set()

    # --- the committer -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit what is appended, release held replies, compact now and then."""
        journal = self.journal
        assert journal is not None
        task_status.started()
        interval = journal.commit_interval
        while True:
            if journal.unplaced and not self._dirty.is_set():
                # the last write's messages are placed at the next one (Journal.commit
                # says why); when none comes within PLACE_IDLE, place them now
                with trio.move_on_after(PLACE_IDLE):
                    await self._dirty.wait()
                if not self._dirty.is_set():
                    await trio.to_thread.run_sync(journal.place_written)
                    continue
            await self._dirty.wait()
            if interval and not self._after_commit and self._now_upto <= self._committed:
                # batch: gather appends for batch_ms, one fsync for them all; unless
                # (or until) the commit is wanted now (:meth:`commit_now`):
                # - a callback waits on it (``after_commit``: an HA passive node's
                #   ``ha.synced``, which the active node's confirms wait for);
                # - an HA active node sent a sync (``HaService._apply_replication``).
                # Why: in a pair a confirm waits for both nodes' commits, and the
                # syncs come gathered already (one per ~185 messages on a busy pair,
                # the next once the last is applied). A confirm waited for the later
                # of the two nodes' batch waits, the passive's starting only once
                # the sync had reached it, and the active's 10 ms ran beside a round
                # trip that gathers as well: the pair's 1,000 unconfirmed messages
                # sat idle for them (benchmarks/README.md: round 15, "why the HA
                # pair waits"; round 16, "the active node commits as a sync goes
                # out"). What comes in during the fsync rides the next.
                with trio.CancelScope(deadline=trio.current_time() + interval) as gathering:
                    self._gathering = gathering
                    await trio.sleep_forever()
                self._gathering = None
            self._dirty = trio.Event()
            self._woken = False
            if self.before_commit is not None:
                self.before_commit()
            if not await self._commit(journal):
                self._dirty.set()  # retry what was kept, after a pause
                await trio.sleep(RETRY_INTERVAL)
            await self._maybe_compact(journal)

    async def _commit(self, journal: Journal) -> bool:
        started = time.perf_counter()
        try:
            done = await trio.to_thread.run_sync(journal.commit)
        except StoreWriteError as exc:
            self._failed(exc)
            return False
        finally:
            self.commit_times.observe(time.perf_counter() - started)
        self._release(done)
        if self.last_error is not None:
            log.warning("journal_writable_again", data_dir=self.directory)
            self.last_error = None
        return True

    def _release(self, done: int) -> None:
        self._committed = max(self._committed, done)
        waiting = self._after_commit
        while waiting and waiting[0][0] <= done:
            waiting.popleft()[1]()
        done = self.replica.releasable(done)
        held = self._waiting
        while held:
            w = held[0]
            if w.last <= done:
                held.popleft()
                w.callback(None)
            else:
                if type(w) is _ConfirmRun:  # its members covered so far go now
                    w.release_upto(done)
                break

    def _failed(self, exc: StoreWriteError) -> None:
        self.write_errors += 1
        first_failure = self.last_error is None
        self.last_error = str(exc)
        (log.error if first_failure else log.warning)(
            "journal_write_failed",
            data_dir=self.directory,
            error=str(exc),
            disk_full=exc.disk_full,
            messages_refused=len(exc.dropped),
            records_kept=len(exc.retrying),
        )
        dropped = sorted(exc.dropped)
        if not dropped:
            return
        keep: deque[_Waiter | _ConfirmRun] = deque()
        text = (
            "the broker could not store the message "
            f"({'disk full' if exc.disk_full else 'write error'}): it was not confirmed"
        )
        for w in self._waiting:
            i = bisect.bisect_left(dropped, w.first)
            if i < len(dropped) and dropped[i] <= w.last:
                if type(w) is _ConfirmRun:
                    if not w.split_dropped(dropped, text):
                        keep.append(w)
                else:
                    w.callback(text)
            else:
                keep.append(w)
        self._waiting = keep

    async def _maybe_compact(self, journal: Journal) -> None:
        now = trio.current_time()
        if now - self._last_compaction_check < COMPACTION_CHECK:
            return
        self._last_compaction_check = now
        if not journal.compaction_due():
            return
        try:
            report = await trio.to_thread.run_sync(journal.compact)
        except StoreWriteError as exc:
            self._failed(exc)
            return
        self._release(journal.committed)
        log.info(
            "journal_compacted",
            segment=report.segment,
            records=report.records,
            removed=len(report.removed),
            bytes_before=report.bytes_before,
            bytes_after=report.bytes_after,
        )

    # --- closing and status --------------------------------------------------------------

    async def close(self) -> None:
        """Commit what is left, release what it covers, close the journal (shielded)."""
        journal = self.journal
        if journal is None or self._closed:
            return
        if self.before_commit is not None:
            self.before_commit()
        self._closed = True
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(journal.close)
            except StoreWriteError as exc:
                self._failed(exc)
            else:
                self._release(journal.committed)
        log.info("journal_closed", data_dir=self.directory)

    def status(self) -> dict[str, Any]:
        journal = self.journal
        if journal is None:
            return {"persist": False}
        stats = journal.stats()
        return {
            "persist": True,
            "data_dir": stats.directory,
            "fsync": stats.fsync,
            "segments": stats.segments,
            "journal_bytes": stats.bytes,
            "live_messages": stats.live_messages,
            "live_message_bytes": stats.live_message_bytes,
            "appended": stats.appended,
            "committed": stats.committed,
            "commits": self.commit_times.count,
            "held_replies": len(self._waiting),
            "write_errors": self.write_errors,
            "last_error": self.last_error,
            "recovery": self.recovery,
        }

    def queue_counts(self) -> dict[tuple[str, str], int]:
        journal = self.journal
        return journal.stats().queue_messages if journal is not None else {}
