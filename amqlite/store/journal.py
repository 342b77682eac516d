"""The journal: one per node, append-only segment files of CBOR records.

Guarantees
----------
- :meth:`Journal.commit` returns a position; every record appended at or before
  it, except those a :class:`StoreWriteError` reported as dropped, is stored as
  the fsync policy promises: on stable storage for ``always`` and ``batch`` (one
  fsync covers every record written since the previous one: group commit), in
  the operating system's page cache for ``never`` (survives ``kill -9``, not a
  power cut or kernel crash). :attr:`Journal.synced` never passes what an fsync
  covered.
- A write or fsync error raises :class:`StoreWriteError`, cuts the segment back to
  what was stored before, and names exactly the records not stored. The journal
  keeps working: the next commit after the disk recovers succeeds.
- :meth:`Journal.recover` replays every segment in order, cuts a torn tail of the
  *last* segment (reporting what it dropped; the shell logs it) and refuses
  damage anywhere else (:class:`JournalCorrupt` says what to do).
- A lock file (``LOCK``, ``fcntl.flock``, holding the owner's pid) keeps a second
  process off the data directory (:class:`StoreLocked`).
- :meth:`Journal.compact` replaces every segment by one snapshot of the live
  state; a crash at any point of it leaves a journal that recovers to the state
  before or after it (protocol below).

Driving it from trio
--------------------
The journal does blocking file I/O and is thread-safe in one pattern: ``append``
from the event loop (it only encodes and buffers, microseconds), and ``commit``,
``flush``, ``compact`` and ``close`` from one worker thread at a time::

    pos = journal.append(MessageEnqueue(...))        # in the event loop
    waiting.append((pos, publish_id))

    async def committer():                            # one task, in the node's nursery
        while True:
            await work_pending.wait()                 # set by whoever appends
            await trio.sleep(journal.commit_interval) # 0 for always, batch_ms for batch
            try:
                done = await trio.to_thread.run_sync(journal.commit)
            except StoreWriteError as exc:            # nack exc.dropped, log, carry on
                ...
            confirm everything in `waiting` with pos <= done

While one commit runs in the thread, the loop keeps appending; the next commit
covers all of those with one fsync. ``journal.state`` is the durable state as of
the last append (the records a restart would replay once committed); read it
from the event loop, not while a commit or compaction runs.

Compaction protocol
-------------------
1. Under the buffer lock: take the snapshot of :attr:`state` (records that rebuild
   it, starting with ``snapshot.begin``) and the buffered records it covers.
2. Seal the active segment (fsync it), so no later write goes into an old file.
3. Write the snapshot to ``journal-<S>.log.tmp`` (S = next sequence number) and
   fsync it. A crash here leaves a ``.tmp`` file that recovery deletes; the old
   segments are intact.
4. Rename it to ``journal-<S>.log`` and fsync the directory. This is the commit
   point: recovery starts at the newest segment whose first record is
   ``snapshot.begin``, so from here the old segments are ignored.
5. Delete the older segments and fsync the directory. A crash part-way leaves
   some of them; recovery deletes them.
6. Segment S becomes the active segment; the buffered records taken in step 1 are
   committed (the snapshot holds them).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno as errno_
import heapq
import itertools
import os
import threading
from array import array
from collections.abc import Callable, Collection, Iterator
from typing import Any, Literal, NamedTuple, NoReturn, TypeVar, get_args

from .codec import EnqueueScan, decode_record
from .errors import JournalCorrupt, StoreError, StoreLocked, StoreWriteError
from .files import FileHandle, FileLayer, OsFileLayer, ReadHandle
from .records import MessageDelivered, MessageEnqueue, Record, SnapshotBegin
from .recover import ReplicaFrames, fold_segment
from .segment import (
    FRAME_HEAD,
    HEADER,
    SegmentReader,
    frame_record,
    parse_scanned,
    segment_name,
    segment_seq,
)
from .state import DEAD, MessageRef, MessageRun, ScannedEnqueue, StoreState, Unwritten

T = TypeVar("T")
FsyncPolicy = Literal["always", "batch", "never"]
FSYNC_POLICIES: tuple[str, ...] = get_args(FsyncPolicy)
LOCK_NAME = "LOCK"
TMP_SUFFIX = ".tmp"
DEFAULT_BATCH_MS = 10
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_COMPACT_AFTER_BYTES = 8 * 1024 * 1024
_HEAD_PROBE = 4096  # bytes read to see whether a segment starts with a snapshot
_WRITE_CHUNK = 1 << 20  # compaction writes its snapshot this much at a time
#: A message's location in the journal: ``seq << LOCATION_BITS | offset`` of its frame.
LOCATION_BITS = 36
_OFFSET_MASK = (1 << LOCATION_BITS) - 1


def location(seq: int, offset: int) -> int:
    """The location of the frame at ``offset`` of segment ``seq``."""
    return seq << LOCATION_BITS | offset


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :meth:`Journal.recover` found.

    ``records`` replayed from ``segments`` files; ``dropped_bytes`` cut from the
    end of ``truncated_segment`` for ``reason`` (None when the journal ended
    cleanly); ``removed`` lists leftovers of an interrupted compaction that were
    deleted. ``state`` is the durable state to rebuild the broker from; it is the
    journal's own :attr:`Journal.state`, which later appends keep changing, so
    rebuild from it before appending.
    """

    state: StoreState
    records: int
    segments: int
    dropped_bytes: int
    truncated_segment: str | None
    reason: str | None
    removed: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class CompactionReport:
    """What :meth:`Journal.compact` did: the snapshot ``segment`` holding ``records``,
    the ``removed`` segment files, the journal's size before and after, and how
    many messages were ``forgotten`` because ``live_journal_ids`` lacked them."""

    segment: str
    records: int
    removed: tuple[str, ...]
    bytes_before: int
    bytes_after: int
    forgotten: int


@dataclasses.dataclass(frozen=True, slots=True)
class JournalStats:
    """Numbers for ``amqlite status``."""

    directory: str
    fsync: str
    segments: int
    bytes: int
    live_messages: int
    live_message_bytes: int
    pending: int
    appended: int
    committed: int
    synced: int
    queue_messages: dict[tuple[str, str], int]


class _Pending(NamedTuple):
    position: int
    record: Record | None  # None: a scanned enqueue (``scanned``) or a tail (``tail``)
    frame: bytes
    scanned: Unwritten | None = None  # a scanned enqueue: its id and entry
    tail: _Unfolded | None = None  # frames appended unfolded (``append_unfolded``)


class _Unfolded:
    """Frames a passive HA node journaled as they came (:meth:`Journal.append_unfolded`)
    and where they went: ``at``, the location of the first once written (-1 before);
    ``placing``, what a fold before that write left to place (offsets in ``data``)."""

    __slots__ = ("at", "data", "placing")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = -1
        self.placing: list[tuple[int, Unwritten | MessageEnqueue]] | None = None


def _place_folded(
    place: Callable[[MessageEnqueue, int], Any],
    place_scanned: Callable[[Unwritten, int], Any],
    what: Unwritten | MessageEnqueue,
    at: int,
) -> None:
    """Place what a fold of unfolded frames left to place (``StoreState.fold_replicated``:
    a scanned enqueue's :data:`Unwritten`, a tuple, or a decoded enqueue) at ``at``."""
    if type(what) is tuple:
        place_scanned(what, at)
    else:
        place(what, at)  # type: ignore[arg-type]


#: ``_Pending(...)`` without the named tuple's ``__new__`` (a Python function): one
#: per record appended
_new_pending = tuple.__new__


class _Segment:
    """The segment being appended to. ``size`` is what is kept (the file may be longer
    after a failed write until ``repair`` is False again); ``synced`` is what an
    fsync covered."""

    __slots__ = ("dir_synced", "handle", "name", "repair", "seq", "size", "synced")

    def __init__(self, seq: int, handle: FileHandle, size: int, *, durable: bool) -> None:
        """``durable``: the ``size`` bytes and the directory entry are already fsynced
        (a recovered or compacted segment); else the segment is new and empty."""
        self.seq = seq
        self.name = segment_name(seq)
        self.handle = handle
        self.size = size
        self.synced = size if durable else 0
        self.dir_synced = durable
        self.repair = False


class Journal:
    """An append-only journal in ``directory``; see the module docstring.

    Open it, :meth:`recover` once, then :meth:`append` and :meth:`commit`.
    ``segment_bytes`` is a soft limit: a commit that starts in a segment of that
    size or more starts a new one, and one commit's records never span two files.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "batch",
        batch_ms: float = DEFAULT_BATCH_MS,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        compact_after_bytes: int = DEFAULT_COMPACT_AFTER_BYTES,
        file_layer: FileLayer | None = None,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}: {fsync!r}")
        if not batch_ms > 0:
            raise ValueError(f"batch_ms must be positive: {batch_ms!r}")
        if segment_bytes <= len(HEADER):
            raise ValueError(f"segment_bytes too small: {segment_bytes}")
        self.directory = os.fspath(directory)
        self.fsync_policy: FsyncPolicy = fsync
        self.batch_ms = batch_ms
        self.segment_bytes = segment_bytes
        self.compact_after_bytes = compact_after_bytes
        self._files: FileLayer = file_layer if file_layer is not None else OsFileLayer()
        self._sync = fsync != "never"
        self._mutex = threading.Lock()  # the buffer, the state, the counters
        self._writer = threading.Lock()  # one commit / compaction at a time
        self._pending: list[_Pending] = []
        # a turn held open (hold/release): records appended from _hold_from on wait
        # until it ends, so that a commit never stores half of one turn
        self._holds = 0
        self._hold_from = 0
        self._turn_over = threading.Condition(self._mutex)  # notified when holds reach 0
        self._unsynced: list[_Pending] = []  # written, not yet covered by an fsync
        #: the last write's records and the location of the first: placed at the next
        #: write (see _write_pending), or by place_written
        self._unplaced: tuple[list[_Pending], int] | None = None
        self._state = self._new_state()
        # a passive HA node's frames journaled, not folded yet (append_unfolded), their
        # bytes, and what their fold gave the broker to follow (take_followed)
        self._unfolded: list[_Unfolded] = []
        self.unfolded_bytes = 0
        self._followed: list[list[Record | ScannedEnqueue]] = []
        scan = EnqueueScan()
        self._scan = scan.scan
        self._replica = ReplicaFrames(scan)  # reads the unfolded frames at the fold
        # reading placed messages back: the handles open for it, and the lock that keeps
        # compaction from moving or deleting segments under a read
        self._readers: dict[int, ReadHandle] = {}
        self._read_lock = threading.RLock()
        self._sealed: dict[int, int] = {}  # seq -> size, older segments
        self._active: _Segment | None = None
        self._next_seq = 1
        self._appended = 0
        self._written = 0
        self._synced = 0
        self._recovered = False
        self._closed = False
        try:
            self._files.makedirs(self.directory)
        except OSError as exc:
            raise StoreError(f"cannot create data dir {self.directory}: {exc.strerror}") from None
        self._lock = self._take_lock()

    # --- the lock ----------------------------------------------------------------------

    def _take_lock(self) -> FileHandle:
        path = os.path.join(self.directory, LOCK_NAME)
        try:
            return self._files.lock(path, f"{os.getpid()}\n".encode())
        except BlockingIOError:
            pid: int | None
            try:
                pid = int(self._files.read(path, 64).split()[0])
            except (OSError, ValueError, IndexError):
                pid = None
            raise StoreLocked(self.directory, pid) from None
        except OSError as exc:
            raise StoreError(f"cannot lock data dir {self.directory}: {exc.strerror}") from None

    # --- positions and settings --------------------------------------------------------

    @property
    def appended(self) -> int:
        """Position of the last record appended (positions start at 1 per journal)."""
        return self._appended

    @property
    def committed(self) -> int:
        """Records up to here (less those reported dropped) are stored as the policy
        promises: fsynced for ``always``/``batch``, written for ``never``."""
        return self._synced if self._sync else self._written

    @property
    def synced(self) -> int:
        """Records up to here (less those reported dropped) are covered by an fsync."""
        return self._synced

    @property
    def commit_interval(self) -> float:
        """Seconds a shell should wait after an append before committing: ``batch_ms``
        for ``batch``, 0 for ``always`` (commit at once; appends made during a commit
        ride the next one) and for ``never`` (a commit is only a write)."""
        return self.batch_ms / 1000 if self.fsync_policy == "batch" else 0.0

    @property
    def state(self) -> StoreState:
        """The durable state as of the last append (see the module docstring); what
        :meth:`append_unfolded` left is folded first."""
        if self._unfolded:
            self.fold()
        return self._state

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _new_state(self) -> StoreState:
        state = StoreState()
        state.read = self._read_at
        return state

    # --- reading messages back -----------------------------------------------------------

    def _read_at(self, where: int) -> MessageEnqueue:
        """The ``message.enqueue`` record at location ``where`` (its frame is written)."""
        seq, offset = where >> LOCATION_BITS, where & _OFFSET_MASK
        with self._read_lock:
            handle = self._readers.get(seq)
            if handle is None:
                handle = self._files.open_read(self._path(segment_name(seq)))
                if self._closed:
                    try:
                        return self._decode_at(handle, offset, where)
                    finally:
                        handle.close()
                self._readers[seq] = handle
            return self._decode_at(handle, offset, where)

    def _decode_at(self, handle: ReadHandle, offset: int, where: int) -> MessageEnqueue:
        head = handle.pread(FRAME_HEAD.size, offset)
        length, _crc = FRAME_HEAD.unpack(head)
        record = decode_record(handle.pread(length, offset + FRAME_HEAD.size))
        if type(record) is not MessageEnqueue:
            raise StoreError(f"{self.directory}: no message at journal location {where}")
        return record

    def read_messages(self, journal_ids: Collection[int]) -> list[MessageEnqueue | None]:
        """The records of live messages ``journal_ids`` (None for one not live), from
        memory or read back from the segment files. Thread-safe against commits and
        compaction; call it from the event loop (a read is a few page-cache preads)."""
        with self._read_lock:
            with self._mutex:
                self._fold_locked()
                where = [self._state.located(i) for i in journal_ids]
            return [w if type(w) is not int else self._read_at(w) for w in where]  # type: ignore[misc]

    def snapshot(self) -> list[Record]:
        """:meth:`StoreState.snapshot` of :attr:`state`, its placed messages read back
        (safe against a commit or compaction running meanwhile)."""
        with self._read_lock, self._mutex:
            self._fold_locked()
            return self._state.snapshot()

    def with_refs(self, consume: Callable[[Iterator[Record | MessageRef | MessageRun]], T]) -> T:
        """``consume(state.iter_refs(runs=True))`` with the state held still (a commit
        running meanwhile moves written messages into the state's index): rebuilding
        a broker from the journal. ``consume`` must not append."""
        with self._mutex:
            self._fold_locked()
            return consume(self._state.iter_refs(runs=True))

    def _close_readers(self, below: int | None = None) -> None:
        with self._read_lock:
            for seq in [s for s in self._readers if below is None or s < below]:
                self._readers.pop(seq).close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"journal {self.directory} is closed")
        if not self._recovered:
            raise StoreError(f"journal {self.directory}: call recover() before using it")

    # --- recovery ----------------------------------------------------------------------

    def recover(self) -> RecoveryReport:
        """Replay the journal into :attr:`state`; call once, before anything else.

        Starts at the newest segment that begins with ``snapshot.begin`` (older
        ones are leftovers of a compaction and are deleted) and replays every
        segment after it in order. A damaged tail of the last segment is cut off
        and reported; damage in any other segment, a missing segment, or a journal
        that ends inside a snapshot raises :class:`JournalCorrupt`.
        """
        with self._writer:
            if self._closed:
                raise StoreError(f"journal {self.directory} is closed")
            if self._recovered:
                raise StoreError(f"journal {self.directory}: recover() runs only once")
            try:
                report = self._recover()
            except OSError as exc:
                raise StoreError(f"cannot read journal in {self.directory}: {exc}") from None
            self._recovered = True
            return report

    def _recover(self) -> RecoveryReport:
        files = self._files
        removed: list[str] = []
        seqs: list[int] = []
        for name in files.listdir(self.directory):
            if name.endswith(TMP_SUFFIX) and segment_seq(name[: -len(TMP_SUFFIX)]) is not None:
                files.remove(self._path(name))
                removed.append(name)
            elif (seq := segment_seq(name)) is not None:
                seqs.append(seq)
        seqs.sort()
        base = 0
        for i in range(len(seqs) - 1, 0, -1):
            if self._starts_with_snapshot(seqs[i]):
                base = i
                break
        superseded, live = seqs[:base], seqs[base:]
        for prev, seq in itertools.pairwise(live):
            if seq != prev + 1:
                raise JournalCorrupt(
                    f"{self.directory}: {segment_name(prev + 1)} is missing (found "
                    f"{segment_name(prev)} and {segment_name(seq)}); the records it held "
                    "are lost. Restore it, or restore the data dir from a backup or the "
                    "HA peer"
                )
        state = self._new_state()
        scan = EnqueueScan()
        records = dropped = 0
        truncated = reason = None
        sizes: dict[int, int] = {}
        for seq in live:
            name = segment_name(seq)
            data = files.read(self._path(name))
            reader = SegmentReader(data, name=f"{self.directory}/{name}")
            base = seq << LOCATION_BITS

            def decoded(offset: int, start: int, end: int) -> None:
                record = reader.decode(offset, start, end)  # noqa: B023 (called at once)
                state.apply(record)
                if type(record) is MessageEnqueue:
                    state.place(record, base | offset)  # noqa: B023

            # most records of a backlog are enqueues the scan reads without decoding
            # them whole, folded a batch at a time (docs/storage.md, "Backlogs on
            # disk"); the batch is folded before any other record
            fold_segment(
                reader, base, scan, state.enqueue_placed_many, decoded, state.enqueue_placed_run
            )
            records += reader.records
            sizes[seq] = reader.end
            if reader.defect is None:
                continue
            where = f"{reader.defect.reason} at offset {reader.defect.offset}"
            if seq != live[-1]:
                raise JournalCorrupt(
                    f"{self.directory}/{name} is damaged ({where}) and is not the last "
                    f"segment, so the {len(live) - live.index(seq) - 1} segment(s) after it "
                    "would be lost too. Restore the data dir from a backup or the HA peer; "
                    f"or, accepting the loss, truncate {name} to {reader.end} bytes and "
                    "move the later segments out of the data dir"
                )
            dropped, truncated, reason = len(data) - reader.end, name, where
        if state.snapshot_open:
            raise JournalCorrupt(
                f"{self.directory}: the journal ends inside a snapshot (snapshot.begin "
                "without snapshot.end), so the state it holds is incomplete. If this node "
                "is an HA backup, move the data dir aside and let it resync from its peer; "
                "otherwise restore the data dir from a backup"
            )
        for seq in superseded:
            files.remove(self._path(segment_name(seq)))
            removed.append(segment_name(seq))
        if removed:
            files.fsync_dir(self.directory)
        if live:
            last = live[-1]
            handle = files.open_append(self._path(segment_name(last)))
            if truncated is not None:
                handle.truncate(sizes[last])
            handle.fsync()  # what we replayed is what later records build on
            self._active = _Segment(last, handle, sizes[last], durable=True)
            self._sealed = {seq: sizes[seq] for seq in live[:-1]}
            self._next_seq = last + 1
        self._state = state
        return RecoveryReport(
            state=state,
            records=records,
            segments=len(live),
            dropped_bytes=dropped,
            truncated_segment=truncated,
            reason=reason,
            removed=tuple(removed),
        )

    def _starts_with_snapshot(self, seq: int) -> bool:
        head = self._files.read(self._path(segment_name(seq)), _HEAD_PROBE)
        try:
            for _offset, record in SegmentReader(head):
                return type(record) is SnapshotBegin
        except JournalCorrupt:
            return False
        return False

    # --- appending and committing ------------------------------------------------------

    def append(self, record: Record) -> int:
        """Buffer ``record`` and fold it into :attr:`state`; returns its position.

        No I/O: the record is stored by a later :meth:`commit` (or :meth:`flush`).
        Raises RecordError for an ill-typed record (nothing is buffered then).
        """
        return self.append_framed(record)[0]

    def append_framed(self, record: Record, framed: bytes | None = None) -> tuple[int, bytes]:
        """:meth:`append`, also returning the record's frame (HA replicates it).
        ``framed``, when given, is ``record``'s frame already checked (a passive HA
        node's, from :func:`~amqlite.store.segment.parse_framed`): not encoded again."""
        if framed is None:
            framed = frame_record(record)
        with self._mutex:
            if self._closed or not self._recovered:
                self._check_open()
            self._appended = position = self._appended + 1
            self._state.apply(record)
            self._pending.append(_new_pending(_Pending, (position, record, framed, None, None)))
        return position, framed

    def append_scanned(self, fields: ScannedEnqueue, framed: bytes) -> int:
        """:meth:`append_framed` of a ``message.enqueue`` frame that
        :class:`~amqlite.store.codec.EnqueueScan` read as ``fields`` (a passive HA
        node's, checked): folded without decoding it
        (:meth:`StoreState.enqueue_scanned` says why); returns its position."""
        with self._mutex:
            self._check_open()
            self._appended += 1
            position = self._appended
            scanned = self._state.enqueue_scanned(fields, framed)
            self._pending.append(_Pending(position, None, framed, scanned))
        return position

    def append_unfolded(self, data: bytes) -> int:
        """Buffer ``data``, whole frames (a passive HA node's sync, checked: see
        :func:`~amqlite.store.segment.check_frames`), as one entry, without folding
        them into :attr:`state` yet; returns its position (one for all of them).

        Why it exists: folding each replicated record as it comes was most of a passive
        node's CPU, and most of it went to messages acked a few syncs later. The
        frames are written and committed as any record (a commit never splits them);
        their fold waits until :meth:`fold`, or anything that reads the state
        (:attr:`state`, :meth:`snapshot`, :meth:`with_refs`, :meth:`read_messages`,
        :meth:`stats`, compaction), folds them first, in bulk
        (:meth:`StoreState.fold_replicated`). The caller bounds the unfolded tail
        (:attr:`unfolded_bytes`)."""
        tail = _Unfolded(data)
        with self._mutex:
            self._check_open()
            self._appended = position = self._appended + 1
            self._pending.append(_new_pending(_Pending, (position, None, data, None, tail)))
            self._unfolded.append(tail)
            self.unfolded_bytes += len(data)
        return position

    def fold(self) -> int:
        """Fold what :meth:`append_unfolded` left into :attr:`state`; returns how many
        records that was."""
        with self._mutex:
            return self._fold_locked()

    def take_followed(self) -> list[list[Record | ScannedEnqueue]]:
        """The records folded since the last call, one list an appended entry, in order
        (a tuple is a scanned enqueue's fields): what the passive node's broker
        follows (``Broker.follow``). A fold may run on the committer's thread, so the
        broker takes them from here, on its own."""
        with self._mutex:
            followed, self._followed = self._followed, []
        return followed

    @property
    def followed_waiting(self) -> bool:
        """A fold left records for :meth:`take_followed`."""
        return bool(self._followed)

    def _fold_locked(self) -> int:
        tails = self._unfolded
        if not tails:
            return 0
        self._unfolded = []
        self.unfolded_bytes = 0
        read = self._replica.scan
        # the tails folded as one run of records, so that an enqueue in one and its ack
        # in a later one cancel out; then what to place goes back to its tail. Frames
        # are not sliced (ReplicaFrames.scan, which reads runs of one shape in C):
        # each record's is found from where its tail's records begin (``firsts``) and
        # its tail's frame offsets (``at``)
        records: list[Record | ScannedEnqueue] = []
        firsts: list[int] = []
        at: list[list[int]] = []
        for tail in tails:
            firsts.append(len(records))
            got, starts = read(tail.data)
            self._followed.append(got)
            records += got
            at.append(starts)
        find = bisect.bisect_right

        def frame_of(i: int) -> bytes:
            k = find(firsts, i) - 1
            j = i - firsts[k]
            return tails[k].data[at[k][j] : at[k][j + 1]]

        placing = self._state.fold_records(records, frame_of)
        place, place_scanned = self._state.place, self._state.place_scanned
        k, n = -1, len(tails)
        tail, starts = tails[0], at[0]
        for i, what in placing:
            while k + 1 < n and firsts[k + 1] <= i:
                k += 1
                tail, starts = tails[k], at[k]
            offset = starts[i - firsts[k]]
            if tail.at < 0:
                if tail.placing is None:
                    tail.placing = []
                tail.placing.append((offset, what))
            else:
                _place_folded(place, place_scanned, what, tail.at + offset)
        return len(records)

    def hold(self) -> None:
        """Open a turn: the records appended from now until the matching
        :meth:`release` are written by one commit, never split between two. A commit
        running meanwhile (in another thread) writes only what came before. This is
        what lets a record that vouches for others (peering marks after the messages
        they cover) follow them in the same turn: the files never hold the messages
        without it, whatever instant a ``kill -9`` picks. Holds nest."""
        with self._mutex:
            if self._holds == 0:
                self._hold_from = self._appended + 1
            self._holds += 1

    def release(self) -> None:
        """Close the turn opened by :meth:`hold`."""
        with self._mutex:
            if self._holds <= 0:
                raise RuntimeError("journal release without a hold")
            self._holds -= 1
            if not self._holds:
                self._turn_over.notify_all()

    def flush(self) -> int:
        """Write the buffered records to the file, without fsync; returns the position
        written up to. Raises StoreWriteError (see :meth:`commit`)."""
        with self._writer:
            self._check_open()
            self._write_pending()
            return self._written

    def commit(self) -> int:
        """Write the buffered records and, unless the policy is ``never``, fsync once;
        returns :attr:`committed`. The messages of the last write are placed now and
        these at the next commit (one with nothing to write places them too; see
        :meth:`place_written`).

        On a write or fsync error, raises :class:`StoreWriteError`: the segment is
        cut back to what was stored before, ``message.enqueue`` records not stored
        are dropped (and forgotten by :attr:`state`), the other records are kept
        for the next commit.
        """
        with self._writer:
            self._check_open()
            self._write_pending()
            if self._sync and self._unsynced:
                try:
                    self._sync_active()
                except OSError as exc:
                    self._fail(exc, [])
            return self.committed

    def _write_pending(self, *, everything: bool = False) -> None:
        with self._mutex:
            pending = self._pending
            if self._holds and not everything:  # leave the open turn's records
                start = self._hold_from
                cut = next((i for i, p in enumerate(pending) if p.position >= start), None)
                if cut is None:
                    batch, self._pending = pending, []
                else:
                    batch, self._pending = pending[:cut], pending[cut:]
            else:
                batch, self._pending = pending, []
        if not batch:
            with self._mutex:
                self._place_written()  # an idle commit places what the last one wrote
            return
        try:
            segment = self._segment_for_write()
            data = b"".join(p.frame for p in batch)
            if segment.size == 0:
                data = HEADER + data
            segment.handle.write(data)
        except OSError as exc:
            self._fail(exc, batch)
        # The messages written are placed (their records leave memory, read back
        # later), but one write late: those of the last write now, these at the next.
        # Why: placing a message moves it into the state's index, and its ack then
        # finds it there and flags it dead, where a message acked before it is placed
        # costs neither. Most messages of a busy queue are acked within a commit or
        # two of their write, and on an HA pair's active node, whose deliveries wait
        # for the passive node and which commits as each sync goes out, nearly all
        # were still waiting at the write: placing them one write late cut its
        # instructions a message by 6.6%, a standalone node's by 5.7%
        # (benchmarks/ha_instructions.py; issue 16 item 3). Memory holds the records
        # of one more write; ``place_written`` places them when no write follows
        # (NodeStorage calls it once the journal is idle) and compaction places
        # them first. tests/store/test_placement.py's state machine checks the
        # journal's state against the plain fold at every step.
        at = location(segment.seq, segment.size + len(data)) - sum(len(p.frame) for p in batch)
        with self._mutex:
            unplaced = self._unplaced
            self._unplaced = (batch, at)
            if unplaced is not None:
                self._place(*unplaced)
        segment.size += len(data)
        self._written = batch[-1].position
        if self._sync:
            self._unsynced.extend(batch)

    def _place(self, batch: list[_Pending], at: int) -> None:
        """Place the messages of ``batch``, written from location ``at`` on (mutex held)."""
        place, place_scanned = self._state.place, self._state.place_scanned
        for p in batch:
            if type(p.record) is MessageEnqueue:
                place(p.record, at)
            elif p.scanned is not None:
                place_scanned(p.scanned, at)
            elif p.tail is not None:
                tail = p.tail
                tail.at = at
                if tail.placing is not None:  # folded before this write
                    for offset, what in tail.placing:
                        _place_folded(place, place_scanned, what, at + offset)
                    tail.placing = None
            at += len(p.frame)

    def _place_written(self) -> None:
        unplaced = self._unplaced
        if unplaced is not None:
            self._unplaced = None
            self._place(*unplaced)

    @property
    def unplaced(self) -> bool:
        """Whether messages of the last write wait to be placed (:meth:`place_written`)."""
        return self._unplaced is not None

    def place_written(self) -> None:
        """Place the messages the last write left in memory (they are placed one
        write late, see :meth:`commit`): what the shell calls once no write follows
        for a while. Thread-safe; a few microseconds a message."""
        with self._mutex:
            self._place_written()

    def _sync_active(self) -> None:
        """Fsync the active segment (and, once, its directory entry)."""
        segment = self._active
        assert segment is not None
        segment.handle.fsync()
        if not segment.dir_synced:
            self._files.fsync_dir(self.directory)
            segment.dir_synced = True
        segment.synced = segment.size
        self._synced = max(self._synced, self._written)
        self._unsynced.clear()

    def _segment_for_write(self) -> _Segment:
        """The active segment, rolled over when full and repaired after a failure."""
        segment = self._active
        if segment is not None:
            self._repair(segment)
        if segment is not None and segment.size >= self.segment_bytes:
            self._seal(segment)
            segment = None
        if segment is None:
            seq = self._next_seq
            handle = self._files.open_append(self._path(segment_name(seq)), truncate=True)
            segment = self._active = _Segment(seq, handle, 0, durable=False)
            self._next_seq = seq + 1
        return segment

    def _repair(self, segment: _Segment) -> None:
        """Cut off what a failed write left past ``size`` (when cutting failed then)."""
        if segment.repair:
            segment.handle.truncate(segment.size)
            if self._sync:
                segment.handle.fsync()
            segment.repair = False

    def _seal(self, segment: _Segment) -> None:
        """Fsync and close the active segment whatever the policy: only the last segment
        may ever hold a torn record."""
        self._repair(segment)
        if segment.synced < segment.size or not segment.dir_synced:
            self._sync_active()
        segment.handle.close()
        self._sealed[segment.seq] = segment.size
        self._active = None

    def _fail(self, exc: OSError, batch: list[_Pending]) -> NoReturn:
        """Undo a failed write: cut the segment back, drop the enqueues, keep the rest
        for the next commit, and raise StoreWriteError naming them."""
        failed = self._unsynced + batch
        self._unsynced = []
        segment = self._active
        if segment is not None:
            if self._sync:
                segment.size = segment.synced
            try:
                segment.handle.truncate(segment.size)
                if self._sync:
                    segment.handle.fsync()
            except OSError:
                segment.repair = True  # retried before the next write
        if self._sync:
            self._written = self._synced  # what was written since the fsync is gone
        with self._mutex:
            if any(p.tail is not None for p in failed):
                failed = self._split_tails(failed)
        dropped = [p for p in failed if type(p.record) is MessageEnqueue or p.record is None]
        retry = [p for p in failed if type(p.record) is not MessageEnqueue and p.record is not None]
        with self._mutex:
            self._pending[:0] = retry
            for p in dropped:
                if p.scanned is not None:  # a scanned enqueue: as the general path does
                    self._state.forget_message(p.scanned[0])
                elif type(p.record) is MessageEnqueue:
                    self._state.forget_message(p.record.id)
        reason = exc.strerror or errno_.errorcode.get(exc.errno or 0, str(exc))
        raise StoreWriteError(
            f"journal write failed in {self.directory} ({reason}): {len(dropped)} "
            f"message(s) not stored; {len(retry)} other record(s) kept for the next commit",
            dropped=tuple(p.position for p in dropped),
            retrying=tuple(p.position for p in retry),
            errno=exc.errno,
        ) from exc

    def _split_tails(self, failed: list[_Pending]) -> list[_Pending]:
        """``failed`` with each unfolded entry folded and split into its records (same
        position), so that a failed write drops and keeps them as it would have had
        they been appended one by one."""
        self._fold_locked()
        out: list[_Pending] = []
        scan = self._scan
        for p in failed:
            if p.tail is None:
                out.append(p)
                continue
            for record, frame in parse_scanned(p.tail.data, scan, checked=True):
                if type(record) is tuple:
                    out.append(_Pending(p.position, None, frame, (record[0], None)))
                else:
                    out.append(_Pending(p.position, record, frame))  # type: ignore[arg-type]
        return out

    # --- compaction --------------------------------------------------------------------

    def compaction_due(self) -> bool:
        """A rule of thumb for the shell: the journal is past one segment or
        ``compact_after_bytes`` (8 MiB), whichever is smaller, and more than twice what
        a snapshot of the live state would take. (Restart time is proportional to the
        journal, so history must not wait for a whole 64 MiB segment.)"""
        total = self._total_bytes()
        # not folded first: an unfolded tail (append_unfolded) is bounded, and
        # folding it here, after every commit, would fold it a commit at a time
        state = self._state
        estimate = (
            state.message_bytes
            + state.stream_bytes
            + 160 * (state.live_messages + state.stream_messages)
            + 4096
        )
        floor = min(self.segment_bytes, self.compact_after_bytes)
        return total >= floor and total > 2 * estimate

    def compact(self, live_journal_ids: Collection[int] | None = None) -> CompactionReport:
        """Replace every segment by one snapshot of :attr:`state` (protocol in the module
        docstring); returns what it did.

        ``live_journal_ids``, when given, is the broker's word on which journaled
        messages are still live: the others are dropped too (e.g. expired without
        an ack record). Raises :class:`StoreWriteError` like :meth:`commit` (the
        records appended since the last commit are the ones at stake); the old
        segments are then left as they were.

        Taking the snapshot holds the append lock for a time proportional to the
        live state (in memory, no I/O), so appends wait that long; writing it does
        not block appends.
        """
        with self._writer:
            self._check_open()
            forgotten = 0
            with self._mutex:
                # the snapshot covers whole turns only, as a commit does (see hold); a
                # turn is short and runs on another thread (compaction runs in a worker)
                while self._holds:
                    self._turn_over.wait()
                self._place_written()  # their locations are in the segments it replaces
                self._fold_locked()
                if live_journal_ids is not None:
                    keep = set(live_journal_ids)
                    for journal_id in self._state.live_journal_ids():
                        if journal_id not in keep:
                            self._state.forget_message(journal_id)
                            forgotten += 1
                parts = self._state.compaction_parts()
                batch, self._pending = self._pending, []
                upto = self._appended
            before = self._total_bytes()
            seq = self._next_seq
            name = segment_name(seq)
            tmp, final = self._path(name + TMP_SUFFIX), self._path(name)
            renamed = False
            size = 0
            try:
                if self._active is not None:
                    self._seal(self._active)
                handle = self._files.open_append(tmp, truncate=True)
                try:
                    size, moves, locations, count = self._write_snapshot(handle, parts, seq)
                    handle.fsync()
                finally:
                    handle.close()
                self._files.rename(tmp, final)
                renamed = True
                self._files.fsync_dir(self.directory)
            except OSError as exc:
                with self._mutex:
                    self._state.unpin()
                self._undo_compaction(tmp, final, seq, renamed, size)
                self._fail(exc, batch)
            except BaseException:
                with self._mutex:
                    self._state.unpin()
                raise
            self._next_seq = seq + 1
            with self._read_lock:  # no read sees a message between its two homes
                with self._mutex:
                    self._state.relocate(moves)
                    self._state.relocate_index(parts[3], locations)
                    self._state.unpin()
                self._close_readers(below=seq)
                removed = self._remove_sealed(below=seq)
            data_size = size
            try:
                handle = self._files.open_append(final)
            except OSError:
                self._sealed[seq] = data_size  # the next commit starts a new segment
            else:
                self._active = _Segment(seq, handle, data_size, durable=True)
            self._unsynced.clear()
            self._written = max(self._written, upto)
            self._synced = max(self._synced, upto)
            return CompactionReport(
                segment=name,
                records=count,
                removed=tuple(removed),
                bytes_before=before,
                bytes_after=self._total_bytes(),
                forgotten=forgotten,
            )

    def _write_snapshot(
        self, handle: FileHandle, parts: Any, seq: int
    ) -> tuple[int, list[tuple[int, MessageEnqueue | int, int]], array[int], int]:
        """Write the snapshot segment (``StoreState.compaction_parts``) a megabyte at a
        time: each message's record (read back from the old segments when placed)
        and its delivered flags, in enqueue order. Returns its size, the moves of the
        messages held as objects, the index entries' new locations (the dead keep
        theirs), and the number of records."""
        head, objects, tail, index, n = parts
        buffer = bytearray(HEADER)
        written = 0
        count = 0
        moves: list[tuple[int, MessageEnqueue | int, int]] = []
        locations = index.locs[:n]

        def emit(frame: bytes) -> int:
            nonlocal written, count
            at = written + len(buffer)
            buffer.extend(frame)
            count += 1
            if len(buffer) >= _WRITE_CHUNK:
                handle.write(bytes(buffer))
                written += len(buffer)
                buffer.clear()
            return at

        def message(journal_id: int, record: MessageEnqueue, queues: Any, delivered: Any) -> int:
            if record.queues != queues:
                record = dataclasses.replace(record, queues=queues)
            at = emit(frame_record(record))
            for q in delivered:
                emit(frame_record(MessageDelivered(id=journal_id, queue=q)))
            return at

        def indexed() -> Iterator[tuple[int, int]]:
            seqs, flags = index.seqs, index.flags
            for i in range(n):
                if not flags[i] & DEAD:
                    yield seqs[i], -1 - i

        for r in head:
            emit(frame_record(r))
        steps = heapq.merge(
            ((s, k) for k, (s, _) in enumerate(objects)), indexed(), key=lambda e: e[0]
        )
        for _, k in steps:
            if k >= 0:
                ref = objects[k][1]
                record = ref.record if ref.record is not None else self._read_at(ref.location)
                was: MessageEnqueue | int = ref.record if ref.record is not None else ref.location
                at = message(ref.id, record, ref.queues, ref.delivered)
                moves.append((ref.id, was, location(seq, at)))
            else:
                i = -1 - k
                journal_id = index.ids[i]
                queue = self._state.queue_of(index, i)
                delivered = (queue,) if index.flags[i] & 1 else ()
                record = self._read_at(index.locs[i])
                locations[i] = location(seq, message(journal_id, record, (queue,), delivered))
        for r in tail:
            emit(frame_record(r))
        if buffer:
            handle.write(bytes(buffer))
            written += len(buffer)
        return written, moves, locations, count

    def _undo_compaction(self, tmp: str, final: str, seq: int, renamed: bool, size: int) -> None:
        """After a failed compaction, take the snapshot away again if possible. If the
        renamed snapshot cannot be removed it stays valid (it holds the state of step
        1 and the records kept for retry re-apply on top of it), so the next segment
        must come after it; the messages reported dropped may then come back after a
        restart (at least once, never lost)."""
        try:
            self._files.remove(final if renamed else tmp)
        except FileNotFoundError:
            pass
        except OSError:
            if renamed:
                self._next_seq = seq + 1
                self._sealed[seq] = size

    def _remove_sealed(self, *, below: int) -> list[str]:
        """Delete the segments a snapshot superseded (step 5). One that cannot be
        deleted now is harmless: recovery deletes it, and so does the next compaction."""
        removed = []
        for seq in sorted(self._sealed):
            if seq >= below:
                continue
            name = segment_name(seq)
            try:
                self._files.remove(self._path(name))
            except FileNotFoundError:
                pass
            except OSError:
                continue
            del self._sealed[seq]
            removed.append(name)
        with contextlib.suppress(OSError):  # recovery finishes the job if this is lost
            self._files.fsync_dir(self.directory)
        return removed

    # --- status and closing ------------------------------------------------------------

    def _total_bytes(self) -> int:
        active = self._active.size if self._active is not None else 0
        return sum(self._sealed.values()) + active

    def stats(self) -> JournalStats:
        """Sizes and counts for ``amqlite status``."""
        with self._mutex:
            self._fold_locked()
            segments = len(self._sealed) + (1 if self._active is not None else 0)
            return JournalStats(
                directory=self.directory,
                fsync=self.fsync_policy,
                segments=segments,
                bytes=self._total_bytes(),
                live_messages=self._state.live_messages,
                live_message_bytes=self._state.message_bytes,
                pending=len(self._pending),
                appended=self._appended,
                committed=self.committed,
                synced=self._synced,
                queue_messages=self._state.message_counts(),
            )

    def close(self) -> None:
        """Commit what is buffered (when recovered), fsync, close the files and release
        the lock. Raises StoreWriteError if that last commit fails; the files are
        closed and the lock released all the same."""
        with self._writer:
            if self._closed:
                return
            try:
                if self._recovered:
                    self._write_pending(everything=True)
                    if self._active is not None and (
                        self._active.synced < self._active.size or self._unsynced
                    ):
                        try:
                            self._sync_active()
                        except OSError as exc:
                            self._fail(exc, [])
            finally:
                self._closed = True
                self._close_readers()
                if self._active is not None:
                    self._active.handle.close()
                self._lock.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
