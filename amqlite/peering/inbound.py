"""What a receiving end remembers so that nothing is delivered twice.

Two marks, for two ways a copy can arrive twice:

* :class:`HighWaterMarks`, per link: the highest sequence number taken from each
  sender log (``(sender node, link)``, in the sender's ``epoch``). A link is FIFO
  and the sender resends only in order, so a resent message is simply one at or
  below the mark. A sender that restarted with a new (higher) epoch starts a new
  mark; a lower epoch is stale.
* :class:`SeenMessages`, per exchange, across links: the mesh identities
  (:class:`~amqlite.peering.wire.MeshId`) already delivered. In a ring or a mesh
  one publish can reach a broker along two paths; the second copy is dropped here.
  Copies along different paths are not ordered, so this is a set: per origin, a
  floor (everything at or below it was seen) and the seen ids above it, at most
  ``window`` of them. When the window is full the floor moves up past the oldest,
  so an id that arrives later than ``window`` newer ids of the same origin counts as
  seen. Along one path ids arrive in order and this never matters.

Both keep two positions: *accepted* (dedup in memory, moved on arrival) and
*settled* (the shell confirmed the message is safe locally). Only the settled
positions are acknowledged to the sender and appear in :meth:`snapshot`, so a
receiver restored from a snapshot asks again for whatever it had not settled.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .wire import MeshId


@dataclass(slots=True)
class SenderMark:
    epoch: int
    accepted: int = 0
    settled: int = 0


class HighWaterMarks:
    """Per-sender-log marks, keyed by (sender node, link name)."""

    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: dict[tuple[str, str], SenderMark] = {}

    def mark(self, node: str, link: str, epoch: int) -> SenderMark | None:
        """The mark for this sender log, started afresh for a newer epoch; None when
        ``epoch`` is older than one already seen (a stale sender)."""
        key = (node, link)
        mark = self._marks.get(key)
        if mark is None or epoch > mark.epoch:
            mark = self._marks[key] = SenderMark(epoch)
        elif epoch < mark.epoch:
            return None
        return mark

    def position(self, node: str, link: str) -> tuple[int, int] | None:
        """(epoch, settled seq) for this sender, as a hello's ``resume``."""
        mark = self._marks.get((node, link))
        return None if mark is None else (mark.epoch, mark.settled)

    def sender_of(self, link: str) -> str | None:
        """The sending node of ``link`` when exactly one is known (after a restart
        the receiving dialer does not yet know the remote's node id)."""
        nodes = [node for node, name in self._marks if name == link]
        return nodes[0] if len(nodes) == 1 else None

    def snapshot(self) -> list[list[Any]]:
        """``[[node, link, epoch, settled seq], ...]``: plain data to persist."""
        return [[n, lk, m.epoch, m.settled] for (n, lk), m in sorted(self._marks.items())]

    @classmethod
    def restore(cls, snapshot: Iterable[Any]) -> HighWaterMarks:
        marks = cls()
        for item in snapshot:
            node, link, epoch, seq = _row(item, 4, "high-water mark")
            marks._marks[(node, link)] = SenderMark(epoch, seq, seq)
        return marks

    def __len__(self) -> int:
        return len(self._marks)


@dataclass(slots=True)
class _Origin:
    floor: int = 0
    above: set[int] = field(default_factory=set)
    heap: list[int] = field(default_factory=list)
    pending: set[int] = field(default_factory=set)

    def seen(self, seq: int) -> bool:
        return seq <= self.floor or seq in self.above or seq in self.pending

    def settle(self, seq: int, window: int) -> None:
        self.pending.discard(seq)
        if seq == self.floor + 1 and not self.heap:  # in order: what follows, in short
            self.floor = seq
            return
        if seq <= self.floor or seq in self.above:
            return
        self.above.add(seq)
        heapq.heappush(self.heap, seq)
        while len(self.above) > window:
            self.floor = heapq.heappop(self.heap)
            self.above.discard(self.floor)
        while self.heap and self.heap[0] == self.floor + 1:
            self.floor = heapq.heappop(self.heap)
            self.above.discard(self.floor)

    def claim_range(self, first: int, n: int) -> bool:
        """Hold ``first .. first + n - 1`` as pending when none of them was seen
        (True); change nothing otherwise (False)."""
        if first <= self.floor:
            return False
        seqs = range(first, first + n)
        above, pending = self.above, self.pending
        if (above and not above.isdisjoint(seqs)) or (pending and not pending.isdisjoint(seqs)):
            return False
        pending.update(seqs)
        return True

    def settle_range(self, first: int, n: int, window: int) -> None:
        """:meth:`settle` of ``first .. first + n - 1``, in order."""
        if first == self.floor + 1 and not self.heap:  # each one the in-order shortcut
            self.pending.difference_update(range(first, first + n))
            self.floor = first + n - 1
            return
        for seq in range(first, first + n):
            self.settle(seq, window)


class SeenMessages:
    """Mesh identities already delivered, per origin (node, epoch).

    :meth:`claim` says whether a copy is the first (and then holds its id as
    pending, so a second copy arriving before the first settles is a duplicate
    too); :meth:`settle` records it once the shell confirmed it. Only the latest
    ``epochs_kept`` epochs of each origin node are kept; copies from older epochs
    count as seen.
    """

    __slots__ = ("_origins", "epochs_kept", "window")

    def __init__(self, window: int = 16384, epochs_kept: int = 2) -> None:
        if window < 1 or epochs_kept < 1:
            raise ValueError("window and epochs_kept must be at least 1")
        self.window = window
        self.epochs_kept = epochs_kept
        self._origins: dict[str, dict[int, _Origin]] = {}

    def _origin(self, node: str, epoch: int) -> _Origin | None:
        epochs = self._origins.setdefault(node, {})
        origin = epochs.get(epoch)
        if origin is None:
            if len(epochs) >= self.epochs_kept and epoch < min(epochs):
                return None
            origin = epochs[epoch] = _Origin()
            while len(epochs) > self.epochs_kept:
                del epochs[min(epochs)]
        return origin

    def claim(self, mesh_id: MeshId) -> bool:
        """True for the first copy of ``mesh_id`` (now pending); False for a duplicate."""
        origin = self._origin(mesh_id.node, mesh_id.epoch)
        if origin is None or origin.seen(mesh_id.seq):
            return False
        origin.pending.add(mesh_id.seq)
        return True

    def settle(self, mesh_id: MeshId) -> None:
        origin = self._origins.get(mesh_id.node, {}).get(mesh_id.epoch)
        if origin is not None:
            origin.settle(mesh_id.seq, self.window)

    # Why the two below exist: a receiving link takes a run of forwards and settles
    # its confirmed deliveries at once, and their ids nearly always share one
    # origin (node, epoch); looking it up once per origin rather than once per
    # message is about a third of the per-message cost of claim and settle.
    # tests/peering/test_fast_paths.py checks they agree with claim and settle.

    def claim_each(self, mesh_ids: Iterable[MeshId]) -> list[bool]:
        """:meth:`claim` for each of ``mesh_ids``, in order."""
        out: list[bool] = []
        add = out.append
        key: tuple[str, int] | None = None
        origin: _Origin | None = None
        for mesh_id in mesh_ids:
            node, epoch, seq = mesh_id
            if key != (node, epoch):
                key = (node, epoch)
                origin = self._origin(node, epoch)
            if (
                origin is None
                or seq <= origin.floor
                or seq in origin.above
                or seq in origin.pending
            ):
                add(False)
                continue
            origin.pending.add(seq)
            add(True)
        return out

    def settle_each(self, mesh_ids: Iterable[MeshId]) -> None:
        """:meth:`settle` for each of ``mesh_ids``, in order."""
        key: tuple[str, int] | None = None
        origin: _Origin | None = None
        window = self.window
        for node, epoch, seq in mesh_ids:
            if key != (node, epoch):
                key = (node, epoch)
                origin = self._origins.get(node, {}).get(epoch)
            if origin is not None:
                origin.settle(seq, window)

    # Why the two below exist beside claim_each and settle_each: a run of forwards
    # in the compact form (a site's own client publishes) names one origin and
    # origin seqs in a row, so its ids can be claimed and settled as one range,
    # by set operations on the range, instead of one id at a time: a tenth of
    # what the receiving broker spent per peered message.
    # tests/peering/test_fast_paths.py checks they agree with claim and settle.

    def claim_run(self, node: str, epoch: int, first: int, n: int) -> bool:
        """:meth:`claim` of ``MeshId(node, epoch, first + i)`` for i in range(n) when
        every one is a first copy (True: all now pending); when any is not, nothing
        changes and it is False (then :meth:`claim_each` says which)."""
        origin = self._origin(node, epoch)
        return origin is not None and origin.claim_range(first, n)

    def settle_run(self, node: str, epoch: int, first: int, n: int) -> None:
        """:meth:`settle` of ``MeshId(node, epoch, first + i)`` for i in range(n), in order."""
        origin = self._origins.get(node, {}).get(epoch)
        if origin is not None:
            origin.settle_range(first, n, self.window)

    def snapshot(self) -> list[list[Any]]:
        """``[[node, epoch, floor, [seq above the floor...]], ...]`` (settled only)."""
        return [
            [node, epoch, o.floor, sorted(o.above)]
            for node, epochs in sorted(self._origins.items())
            for epoch, o in sorted(epochs.items())
        ]

    @classmethod
    def restore(
        cls, snapshot: Iterable[Any], window: int = 16384, epochs_kept: int = 2
    ) -> SeenMessages:
        seen = cls(window, epochs_kept)
        for item in snapshot:
            node, epoch, floor, above = _row(item, 4, "seen-messages", last_is_list=True)
            origin = _Origin(floor)
            for seq in above:
                origin.settle(seq, window)
            seen._origins.setdefault(node, {})[epoch] = origin
        return seen


def _row(item: Any, n: int, what: str, *, last_is_list: bool = False) -> list[Any]:
    """Validate one snapshot row: string(s) first, then non-negative integers."""
    bad = ValueError(f"bad {what} snapshot row: {item!r}")
    if not isinstance(item, list | tuple) or len(item) != n:
        raise bad
    row = list(item)
    strings = 2 if what == "high-water mark" else 1
    if not all(isinstance(v, str) for v in row[:strings]):
        raise bad
    ints = row[strings : n - 1] if last_is_list else row[strings:]
    if not all(type(v) is int and v >= 0 for v in ints):
        raise bad
    if last_is_list:
        tail = row[-1]
        if not isinstance(tail, list | tuple) or not all(type(v) is int and v > 0 for v in tail):
            raise bad
    return row
