"""What a browser session holds for its page: a bounded, numbered list of frames.

Every frame the broker has for a session (replies, deliveries, notices) gets the
next sequence number and waits here until the page has it: a WebSocket's writer
takes frames as it sends them; a long poll returns the frames after the number
the page acknowledged (``GET /poll/recv?ack=N``), and keeps them until a later
poll acknowledges them, so a poll answer lost on the way is sent again.

The outbox is bounded in bytes, never the broker's memory:

- Past ``high`` bytes the oldest **droppable** frames go first, down to ``low``:
  deliveries to a consumer without acks of a message the journal does not hold
  (a transient message, or one on a non-durable queue). Each drop is counted per
  consumer and in :attr:`Outbox.dropped_total`, and one ``dropped`` notice per
  consumer (``{"m": "dropped", "ctag": ..., "count": n}``) follows, so the page
  learns it missed messages.
- When that is not enough (acked deliveries, replies), :attr:`over` is true and
  the session's shell stops the broker's pushes (``Session.set_writable(False)``)
  until the page takes frames and the outbox is below ``low`` again
  (:attr:`resumable`): acked consumers are held by their credit, the rest wait in
  their queues, which the JS client bounds with ``x-max-length``.

Sans-IO: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .codec import notice

__all__ = ["HIGH_BYTES", "LOW_BYTES", "Outbox"]

HIGH_BYTES = 4 * 1024 * 1024
LOW_BYTES = 1024 * 1024


@dataclass(slots=True)
class _Frame:
    seq: int
    text: str
    size: int
    droppable: bool
    ctag: str


class Outbox:
    """The frames a browser session owes its page."""

    def __init__(self, high: int = HIGH_BYTES, low: int = LOW_BYTES) -> None:
        if not 0 <= low <= high:
            raise ValueError("need 0 <= low <= high")
        self.high = high
        self.low = low
        self._frames: deque[_Frame] = deque()
        self._next = 1
        #: the last sequence number the page acknowledged (poll) or was sent (ws)
        self.acked = 0
        self.bytes = 0
        self._droppable_bytes = 0
        #: frames dropped since the session opened
        self.dropped_total = 0

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def last_seq(self) -> int:
        """The number of the newest frame (0: none yet)."""
        return self._next - 1

    @property
    def over(self) -> bool:
        """Past ``high`` with nothing left to drop: stop the broker's pushes."""
        return self.bytes > self.high

    @property
    def resumable(self) -> bool:
        """Down to ``low``: pushes may go on."""
        return self.bytes <= self.low

    def add(self, text: str, *, droppable: bool = False, ctag: str = "") -> int:
        """Queue one frame; its sequence number. Past ``high``, drop what may go."""
        seq = self._next
        self._next = seq + 1
        size = len(text)
        self._frames.append(_Frame(seq, text, size, droppable, ctag))
        self.bytes += size
        if droppable:
            self._droppable_bytes += size
        if self.bytes > self.high and self._droppable_bytes:
            self._drop()
        return seq

    def _drop(self) -> None:
        """Drop the oldest droppable frames until down to ``low`` (or none is left),
        then say so, once per consumer."""
        counts: dict[str, int] = {}
        kept: deque[_Frame] = deque()
        excess = self.bytes - self.low
        for frame in self._frames:
            if excess > 0 and frame.droppable:
                excess -= frame.size
                self.bytes -= frame.size
                self._droppable_bytes -= frame.size
                counts[frame.ctag] = counts.get(frame.ctag, 0) + 1
            else:
                kept.append(frame)
        self._frames = kept
        for ctag, count in counts.items():
            self.dropped_total += count
            text = notice("dropped", ctag=ctag, count=count, total=self.dropped_total)
            seq = self._next
            self._next = seq + 1
            self._frames.append(_Frame(seq, text, len(text), False, ""))
            self.bytes += len(text)

    def take(self, limit: int) -> list[str]:
        """Frames to send now, oldest first, about ``limit`` bytes (at least one),
        forgotten at once (a WebSocket: the stream keeps them in order)."""
        out: list[str] = []
        size = 0
        frames = self._frames
        while frames and (not out or size + frames[0].size <= limit):
            frame = frames.popleft()
            out.append(frame.text)
            size += frame.size
            self._forget(frame)
            self.acked = frame.seq
        return out

    def ack(self, upto: int) -> None:
        """The page holds every frame up to ``upto`` (a poll's ``ack``): forget them."""
        frames = self._frames
        while frames and frames[0].seq <= upto:
            self._forget(frames.popleft())
        if upto > self.acked:
            self.acked = min(upto, self.last_seq)

    def after(self, seq: int, limit: int) -> list[tuple[int, str]]:
        """The frames after ``seq`` (kept until acknowledged), about ``limit`` bytes
        (at least one)."""
        out: list[tuple[int, str]] = []
        size = 0
        for frame in self._frames:
            if frame.seq <= seq:
                continue
            if out and size + frame.size > limit:
                break
            out.append((frame.seq, frame.text))
            size += frame.size
        return out

    def _forget(self, frame: _Frame) -> None:
        self.bytes -= frame.size
        if frame.droppable:
            self._droppable_bytes -= frame.size
