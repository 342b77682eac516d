"""Ack coalescing, sans-IO: many acks, few frames.

The client keeps the delivery tags it has received and not yet settled, in the
order they arrived (tags increase strictly on a connection). An ``ack`` only marks
a tag; when the writer is about to flush, :meth:`AckCoalescer.take` turns the marks
into frames: one ``ack`` with ``multiple=True`` for the longest settled prefix,
plus single acks for marked tags stuck behind an unsettled one.

Guarantee: a ``multiple`` ack never covers a tag the application has not settled
(tags settled by a nack or reject, already sent, may sit inside the prefix: the
server no longer holds them, so the multiple ack skips them).
"""

from __future__ import annotations

from collections import deque


class AckCoalescer:
    """Delivered-but-unsettled tags, and acks waiting to be sent."""

    __slots__ = ("_acked", "_settled", "_unsettled", "marks")

    def __init__(self) -> None:
        self._unsettled: deque[int] = deque()
        self._acked: set[int] = set()  # marked for ack, not sent yet
        self._settled: set[int] = set()  # settled on the wire, still in _unsettled
        #: The set of tags marked for ack; the hot path may add a tag straight to it
        #: (what ``ack(tag)`` does for a tag that is not settled).
        self.marks = self._acked

    def __len__(self) -> int:
        """Tags received and not yet settled on the wire (acks waiting count as unsettled)."""
        return len(self._unsettled) - len(self._settled)

    @property
    def pending(self) -> bool:
        """True when :meth:`take` has acks to return."""
        return bool(self._acked)

    def delivered(self, dtag: int) -> None:
        """A tag the server now expects us to settle."""
        self._unsettled.append(dtag)

    def delivered_many(self, dtags: list[int]) -> None:
        """:meth:`delivered` of each of ``dtags``, in order."""
        self._unsettled.extend(dtags)

    def ack(self, dtag: int, multiple: bool = False) -> int:
        """Mark ``dtag`` (and with ``multiple`` every open tag up to it) as acked.

        Returns how many tags were newly marked; 0 means ``dtag`` was unknown or
        already settled.
        """
        if not multiple:
            if dtag in self._acked or dtag in self._settled:
                return 0
            self._acked.add(dtag)
            return 1
        return self._mark_upto(dtag, self._acked)

    def settle(self, dtag: int, multiple: bool = False) -> None:
        """``dtag`` (up to it with ``multiple``) was settled by a frame already queued
        (nack or reject); call :meth:`take` first so earlier acks keep their order."""
        if multiple:
            self._mark_upto(dtag, self._settled)
        elif dtag not in self._acked:
            self._settled.add(dtag)

    def _mark_upto(self, dtag: int, into: set[int]) -> int:
        n = 0
        acked, settled = self._acked, self._settled
        for t in self._unsettled:
            if t > dtag:
                break
            if t not in acked and t not in settled:
                into.add(t)
                n += 1
        return n

    def take(self) -> list[tuple[int, bool]]:
        """The acks to send now, as ``(dtag, multiple)`` in wire order."""
        acked = self._acked
        if not acked:
            return []
        settled, unsettled = self._settled, self._unsettled
        if not settled and len(acked) == len(unsettled) and unsettled[-1] in acked:
            # the common case: everything received has been acked, in order
            last = unsettled[-1]
            if len(acked) == 1 or acked.issuperset(unsettled):
                many = len(acked) > 1
                acked.clear()
                unsettled.clear()
                return [(last, many)]
        out: list[tuple[int, bool]] = []
        last = 0
        count = 0
        while unsettled:
            t = unsettled[0]
            if t in acked:
                acked.discard(t)
                last = t
                count += 1
            elif t in settled:
                settled.discard(t)
            else:
                break
            unsettled.popleft()
        if count:
            out.append((last, count > 1))
        if acked:
            for t in sorted(acked):
                out.append((t, False))
                settled.add(t)
            acked.clear()
        return out

    def forget(self) -> None:
        """Drop everything (the connection is gone; its tags are void)."""
        self._unsettled.clear()
        self._acked.clear()
        self._settled.clear()
