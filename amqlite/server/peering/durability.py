"""What exchange peering keeps beyond a crash, and when a delivery is safe.

- **The epoch counter** (``PEERING_EPOCH`` in the data dir, :class:`EpochCounter`):
  the low bits of every sending log's epoch, grown at every activation and on
  disk before a link uses it.
- **The receive marks** (``peering.marks`` journal records): after a batch of
  deliveries that wrote to the journal, a record follows them in which every
  message taken from a link so far counts as received; so whatever the journal
  holds after a crash, it holds the marks that cover it, and the restarted node
  drops what the sender sends again.
- **The durable sending logs** (``peering.out`` / ``peering.out.ack`` records): a
  persistent message a dialer link took is journaled until the remote
  acknowledges it, and given back to the link after a restart or a failover.
- **The spill files** (``peering-spill/<link>.spill``) of ``overflow = "spill"``
  links, for one run of the broker.
- **The durability barrier** (:meth:`PeeringDurability.when_durable`): a
  delivery is confirmed to the sender only once the journal commit that holds it
  is done (and, on an HA pair, the passive node holds it too).

Journal records go through the node's storage (appended without I/O, committed
by its committer task); the epoch file is written in a worker thread.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog
import trio

from amqlite.broker import Message
from amqlite.errors import AmqliteError
from amqlite.peering import MemorySpill, PeeredExchange, PeeringLink, Persist, SpillStore
from amqlite.store import PeeringMarks, PeeringOut, PeeringOutAck
from amqlite.store.durable_file import read_if_present, write_durably
from amqlite.store.files import file_name_for

from .peering_queue import envelope_of
from .spill import FileSpill

if TYPE_CHECKING:
    from amqlite.broker.recording import Recorder
    from amqlite.server.storage import NodeStorage

log = structlog.get_logger("amqlite.peering")

EPOCH_FILE = "PEERING_EPOCH"
SPILL_DIR = "peering-spill"


def spill_path(data_dir: str, link_id: str) -> str:
    """The spill file of the link ``link_id``: always inside ``data_dir/peering-spill``
    whatever the id holds (``/``, ``..``, NUL, a thousand characters)."""
    return os.path.join(data_dir, SPILL_DIR, file_name_for(link_id) + ".spill")


# (vhost, exchange, link id) -> {peering.out id: record}
KeptLogs = dict[tuple[str, str, str], dict[int, PeeringOut]]


class EpochCounter:
    """The persisted counter in the low bits of the sending-log epoch: it grows at
    every activation, and a value is on disk before a link uses it (a restarted
    node that used a value again would see its messages dropped as already seen).

    It is kept one value ahead: :meth:`take` hands out a value already on disk,
    at once (an HA promotion starts the links before the client whose request
    triggered it publishes), and :meth:`reserve` writes the next one in a worker
    thread. A value reserved but never taken is skipped after a restart: epochs
    are only compared, a gap is harmless. A node without a data dir uses the clock.
    """

    def __init__(self) -> None:
        self._path: str | None = None
        self._on_disk = 0  # the highest value written
        self._reserved: int | None = None  # on disk, not yet taken
        self._lock = trio.Lock()

    async def open(self, directory: str | None) -> None:
        """Read the counter in ``directory`` and reserve its next value (both in a
        worker thread); None: no data dir, the clock gives the values."""
        if directory is None:
            return
        path = self._path = os.path.join(directory, EPOCH_FILE)
        try:
            raw = await trio.to_thread.run_sync(read_if_present, path)
            self._on_disk = int((raw or b"").strip() or 0)
        except (OSError, ValueError) as exc:
            raise AmqliteError(f"cannot read the peering epoch from {path}: {exc}") from exc
        await self.reserve()

    async def reserve(self) -> None:
        """Write the next value durably (in a worker thread) unless one is reserved."""
        async with self._lock:
            path = self._path
            if path is None or self._reserved is not None:
                return
            value = self._on_disk + 1
            await trio.to_thread.run_sync(write_durably, path, f"{value}\n".encode("ascii"))
            self._on_disk = self._reserved = value

    def take(self) -> int | None:
        """The next value, now used; None while it is not on disk yet (await
        :meth:`reserve`, then take again)."""
        if self._path is None:
            return int(time.time() * 1000)
        value, self._reserved = self._reserved, None
        return value


class PeeringDurability:
    """The journal records, files and barrier of one node's peering (see the
    module docstring). Without a journal (``storage`` None) nothing is kept and
    every delivery is safe at once."""

    def __init__(
        self, storage: NodeStorage | None, recorder: Callable[[], Recorder | None]
    ) -> None:
        self.storage = storage
        self._recorder = recorder  # the node's broker's (an HA pair replaces the broker)
        self.epochs = EpochCounter()
        self._outs: dict[str, deque[tuple[int, int]]] = {}  # durable log: (seq, out id)
        self._out_id = 0  # the last peering.out id handed out
        #: the exchanges whose deliveries wrote to the journal since the last marks
        self.marks_pending: dict[tuple[str, str], PeeredExchange] = {}

    async def open(self) -> None:
        """At start, once the node's storage is open: the epoch counter."""
        storage = self.storage
        await self.epochs.open(storage.directory if storage is not None else None)

    @property
    def journaled(self) -> bool:
        """Whether this node has a journal (durable sending logs, receive marks)."""
        storage = self.storage
        return storage is not None and storage.journal is not None

    def forget(self) -> None:
        """Peering stopped: the next activation starts again from the journal."""
        self._outs.clear()
        self.marks_pending.clear()

    # --- the receive marks ---------------------------------------------------------------

    def saved_marks(self, vhost: str, exchange: str) -> Mapping[str, Any] | None:
        """The exchange's latest ``peering.marks`` snapshot in the journal."""
        storage = self.storage
        journal = storage.journal if storage is not None else None
        saved = journal.state.peering.get((vhost, exchange)) if journal is not None else None
        return saved.marks if saved is not None else None

    def marks_due(self, px: PeeredExchange) -> None:
        """A delivery into ``px``'s exchange wrote to the journal: its marks follow."""
        self.marks_pending[(px.ctx.vhost, px.ctx.exchange)] = px

    def record_marks(self) -> None:
        """Journal the marks after the deliveries just journaled: every message
        taken from a link counts as received."""
        storage = self.storage
        due, self.marks_pending = self.marks_pending, {}
        if storage is None:
            return
        for px in due.values():
            ctx = px.ctx
            snapshot = px.snapshot()
            rows = []
            for node, link, epoch, settled in snapshot["marks"]:
                mark = ctx.marks.mark(node, link, epoch)
                rows.append([node, link, epoch, max(settled, mark.accepted if mark else 0)])
            snapshot["marks"] = rows
            storage.record(PeeringMarks(vhost=ctx.vhost, exchange=ctx.exchange, marks=snapshot))

    # --- the durable sending logs ----------------------------------------------------------

    def kept_logs(self) -> KeptLogs:
        """What the durable sending logs held when this node stopped or the previous
        HA master died (a copy: the journal's state moves on as acks are recorded);
        the next ``peering.out`` records are numbered after them."""
        storage = self.storage
        journal = storage.journal if storage is not None else None
        if journal is None:
            return {}
        self._out_id = journal.state.last_peering_out
        return {key: dict(backlog) for key, backlog in journal.state.peering_out.items()}

    def restore_log(
        self, px: PeeredExchange, link: PeeringLink, backlog: Mapping[int, PeeringOut], now: float
    ) -> None:
        """Give a dialer link back what its durable log held."""
        envelopes = []
        for r in backlog.values():
            message = Message(r.exchange, r.routing_key, r.body, dict(r.headers), dict(r.props))
            message.mesh = r.mesh
            envelopes.append(envelope_of(px, message))
        seqs = link.restore(envelopes, now)
        self._outs[link.id] = deque(zip(seqs, backlog, strict=True))
        log.info("peering_log_restored", link=link.id, messages=len(seqs))

    def drop_log(
        self, vhost: str, exchange: str, link_id: str, backlog: Mapping[int, PeeringOut]
    ) -> None:
        """A kept log whose ``[[cluster_mta]]`` entry is gone: so is what it held."""
        log.warning("peering_log_dropped", exchange=exchange, link=link_id, messages=len(backlog))
        self._record_out_ack(vhost, exchange, link_id, max(backlog))

    def log_out(self, px: PeeredExchange, action: Persist, publish_key: str) -> None:
        """Journal a persistent message a durable sending log took. ``publish_key``
        (of the client publish, if any) lets a publish sent again after a failover
        be recognised even when no local queue holds it."""
        recorder = self._recorder()
        if recorder is None:
            return
        env = action.envelope
        self._out_id += 1
        # through the broker's recorder: the publish that made the log take it names
        # this record in its journal span, so its confirm covers it
        recorder.append(
            PeeringOut(
                vhost=px.ctx.vhost,
                exchange=px.ctx.exchange,
                link=action.link,
                id=self._out_id,
                routing_key=env.routing_key,
                body=env.body,
                headers=dict(env.headers),
                props=dict(env.properties),
                mesh=env.mesh_map(),
                publish_key=publish_key,
            )
        )
        self._outs.setdefault(action.link, deque()).append((action.seq, self._out_id))

    def settle_out(self, px: PeeredExchange, link_id: str, seq: int) -> None:
        """The remote holds everything up to ``seq`` of a durable log."""
        outs = self._outs.get(link_id)
        if not outs:
            return
        last = 0
        while outs and outs[0][0] <= seq:
            last = outs.popleft()[1]
        if last:
            self._record_out_ack(px.ctx.vhost, px.ctx.exchange, link_id, last)

    def _record_out_ack(self, vhost: str, exchange: str, link: str, upto: int) -> None:
        storage = self.storage
        if storage is not None:
            storage.record(PeeringOutAck(vhost=vhost, exchange=exchange, link=link, id=upto))

    # --- spill ---------------------------------------------------------------------------

    def spill_store(self, link_id: str) -> SpillStore:
        """On disk (``peering-spill/`` in the data dir), or in memory without one.
        ``link_id`` holds the remote's node id and link name: it is made a safe file
        name (:func:`~amqlite.store.files.file_name_for`), never used as a path."""
        storage = self.storage
        if storage is None:
            return MemorySpill()
        return FileSpill(spill_path(storage.directory, link_id))

    # --- the barrier -----------------------------------------------------------------------

    def when_durable(self, first: int, last: int, callback: Callable[[bool], None]) -> None:
        """Call ``callback(stored)`` once the journal span ``first..last`` (a
        session's :attr:`~amqlite.broker.Session.journal_span`, or ``0,
        ALL_APPENDED`` for everything appended so far) is committed, and on an HA
        pair held by the passive node; ``stored`` is False when the disk dropped a
        record in it (logged by the storage). Only with a journal (:attr:`journaled`)."""
        storage = self.storage
        assert storage is not None
        storage.when_durable(first, last, lambda lost: callback(lost is None))
