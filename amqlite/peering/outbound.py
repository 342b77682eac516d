"""The outbound log of one link end: what was accepted for the remote and is not yet
acknowledged by it.

Sequence numbers are assigned when a message is accepted, within the log's
``epoch`` (the sending node's incarnation), and never reused. Messages are sent in
sequence order; the remote acknowledges cumulatively (``ack(seq)`` settles every
message up to ``seq``) and only then does the log forget them. When the connection
drops, :meth:`OutboundLog.rewind` makes every unacknowledged message due again, in
order, for the next connection: nothing is lost, and the receiver's high-water mark
drops whatever arrives twice.

Memory is bounded by ``buffer_bytes`` over the messages held (sent or not). When a
message would pass the cap the overflow policy decides: ``block`` refuses it (the
shell pushes back on the publisher; one message is always taken into an empty log,
so a message larger than the cap cannot wedge the link), ``drop-oldest`` forgets
the oldest unacknowledged messages (counted in ``dropped``), ``spill`` appends it
to the :class:`SpillStore`. Once anything is spilled, later messages are spilled
too, and spilled messages come back into memory, oldest first, as acks make room:
order is kept.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from .mode import OverflowPolicy
from .wire import Envelope, Forward, from_map


class Entry(NamedTuple):
    """One accepted message: its sequence number, the envelope as it goes on the
    wire, its size for the byte cap and when it was accepted (for the lag)."""

    seq: int
    envelope: Envelope
    size: int
    accepted_at: float

    def to_map(self) -> dict[str, Any]:
        """A plain map for a spill store to write (the ``peer.forward`` map plus
        ``accepted_at``)."""
        m = Forward(self.seq, self.envelope).to_map()
        m["accepted_at"] = self.accepted_at
        return m

    @classmethod
    def from_map(cls, m: Mapping[str, Any]) -> Entry:
        forward = from_map(m)
        assert isinstance(forward, Forward)
        env = forward.envelope
        return cls(forward.seq, env, env.size(), float(m["accepted_at"]))


_new_entry = tuple.__new__  # Entry(...) without the Python-level __new__


class SpillStore(Protocol):
    """Where a ``spill`` link puts what does not fit in memory: a FIFO of entries.

    The shell implements it on disk (``Entry.to_map`` / ``Entry.from_map`` give
    plain maps to encode). The core calls it synchronously, so appends should be
    buffered writes; :meth:`pop` is called only when memory has room.
    """

    def append(self, entry: Entry) -> None: ...
    def pop(self) -> Entry: ...  # the oldest entry
    def peek_size(self) -> int: ...  # the size of the oldest entry
    def __len__(self) -> int: ...
    @property
    def bytes(self) -> int: ...


class MemorySpill:
    """A :class:`SpillStore` in memory (tests, and a model for the disk one)."""

    __slots__ = ("_bytes", "_entries")

    def __init__(self) -> None:
        self._entries: deque[Entry] = deque()
        self._bytes = 0

    def append(self, entry: Entry) -> None:
        self._entries.append(entry)
        self._bytes += entry.size

    def pop(self) -> Entry:
        entry = self._entries.popleft()
        self._bytes -= entry.size
        return entry

    def peek_size(self) -> int:
        return self._entries[0].size

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes


class OutboundLog:
    """Sequence numbers, cumulative acks, resend after a cut, and the byte cap."""

    __slots__ = (
        "_bytes",
        "_held",
        "_sent",
        "blocked",
        "buffer_bytes",
        "dropped",
        "epoch",
        "next_seq",
        "overflow",
        "spill",
        "spilled",
    )

    def __init__(
        self,
        *,
        epoch: int,
        buffer_bytes: int,
        overflow: OverflowPolicy = OverflowPolicy.BLOCK,
        spill: SpillStore | None = None,
        next_seq: int = 1,
    ) -> None:
        if buffer_bytes <= 0:
            raise ValueError(f"buffer_bytes must be positive, got {buffer_bytes}")
        if overflow is OverflowPolicy.SPILL and spill is None:
            raise ValueError("the spill overflow policy needs a spill store")
        self.epoch = epoch
        self.buffer_bytes = buffer_bytes
        self.overflow = overflow
        self.spill = spill
        self.next_seq = next_seq
        self._held: deque[Entry] = deque()  # in memory, oldest first; then the spill store
        self._sent = 0  # how many of _held went out on the current connection
        self._bytes = 0
        self.dropped = 0  # forgotten by drop-oldest
        self.blocked = 0  # refused by block
        self.spilled = 0  # handed to the spill store

    # --- accepting ----------------------------------------------------------------

    def has_room(self, size: int) -> bool:
        """Would :meth:`accept` take a message of ``size`` bytes into memory now?"""
        return not self._held or (not self._spilling and self._bytes + size <= self.buffer_bytes)

    @property
    def _spilling(self) -> bool:
        return self.spill is not None and len(self.spill) > 0

    def accept(self, envelope: Envelope, now: float) -> int | None:
        """Take a message; its sequence number, or None when ``block`` refused it."""
        size = envelope.size()
        held = self._held
        if not held or (
            self._bytes + size <= self.buffer_bytes and (self.spill is None or not len(self.spill))
        ):  # room in memory (has_room, inlined: this runs for every message)
            seq = self.next_seq
            self.next_seq = seq + 1
            held.append(_new_entry(Entry, (seq, envelope, size, now)))
            self._bytes += size
            return seq
        if not self.has_room(size):
            if self.overflow is OverflowPolicy.BLOCK:
                self.blocked += 1
                return None
            if self.overflow is OverflowPolicy.DROP_OLDEST:
                while self._held and self._bytes + size > self.buffer_bytes:
                    self._forget_oldest()
                    self.dropped += 1
        entry = Entry(self.next_seq, envelope, size, now)
        self.next_seq += 1
        if self._held and not self.has_room(size):  # spill
            assert self.spill is not None
            self.spill.append(entry)
            self.spilled += 1
        else:
            self._held.append(entry)
            self._bytes += size
        return entry.seq

    def accept_if_room(self, envelope: Envelope, now: float) -> int | None:
        """:meth:`accept` when the message fits in memory as it is (no overflow
        policy has anything to do): its sequence number; None, with nothing
        changed, otherwise (then :meth:`accept` applies the policy)."""
        size = envelope.size()
        held = self._held
        if not held or (
            self._bytes + size <= self.buffer_bytes and (self.spill is None or not len(self.spill))
        ):
            seq = self.next_seq
            self.next_seq = seq + 1
            held.append(_new_entry(Entry, (seq, envelope, size, now)))
            self._bytes += size
            return seq
        return None

    def force(self, envelope: Envelope, now: float) -> int:
        """Take a message past the byte cap (into memory, or the spill store when
        spilling): for messages already promised, such as a restored log's."""
        entry = Entry(self.next_seq, envelope, envelope.size(), now)
        self.next_seq += 1
        if self._spilling:
            assert self.spill is not None
            self.spill.append(entry)
            self.spilled += 1
        else:
            self._held.append(entry)
            self._bytes += entry.size
        return entry.seq

    def _forget_oldest(self) -> None:
        entry = self._held.popleft()
        self._bytes -= entry.size
        if self._sent:
            self._sent -= 1

    # --- sending and acknowledging -------------------------------------------------

    def take_last(self, max_in_flight: int) -> Entry | None:
        """The message just accepted, now in flight, when it is the only one due
        and fewer than ``max_in_flight`` are in flight (the usual case when the
        link keeps up); None otherwise: then :meth:`take_unsent` says what is due."""
        held, sent = self._held, self._sent
        if sent >= max_in_flight or sent != len(held) - 1:
            return None
        spill = self.spill
        if spill is not None and len(spill):
            return None
        self._sent = sent + 1
        return held[sent]

    def take_unsent(self, limit: int) -> list[Entry]:
        """Up to ``limit`` messages due on this connection, in sequence order; they
        count as in flight from now on."""
        self._refill()
        start = self._sent
        end = min(len(self._held), start + max(0, limit))
        if end <= start:
            return []
        self._sent = end
        return list(itertools.islice(self._held, start, end))  # one pass, not end-start

    def ack(self, seq: int) -> int:
        """Forget every message up to ``seq`` (cumulative); how many went."""
        n = freed = 0
        held = self._held
        while held and held[0].seq <= seq:  # _forget_oldest() each, inlined (per message)
            freed += held.popleft().size
            n += 1
        if n:
            self._bytes -= freed
            self._sent = max(0, self._sent - n)
        self._refill()
        return n

    def rewind(self) -> int:
        """The connection dropped: every held message is due again; how many."""
        n, self._sent = self._sent, 0
        return n

    def _refill(self) -> None:
        spill = self.spill
        if spill is None:
            return
        while len(spill) and (
            not self._held or self._bytes + spill.peek_size() <= self.buffer_bytes
        ):
            entry = spill.pop()
            self._held.append(entry)
            self._bytes += entry.size

    # --- figures ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Sent on this connection and not yet acknowledged."""
        return self._sent

    @property
    def unsent(self) -> int:
        return len(self._held) - self._sent + (len(self.spill) if self.spill is not None else 0)

    @property
    def unacked(self) -> int:
        """Every message accepted and not yet acknowledged (in memory or spilled)."""
        return len(self._held) + (len(self.spill) if self.spill is not None else 0)

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    @property
    def spilled_bytes(self) -> int:
        return self.spill.bytes if self.spill is not None else 0

    @property
    def oldest_accepted_at(self) -> float | None:
        return self._held[0].accepted_at if self._held else None

    @property
    def gone_upto(self) -> int:
        """Every message up to this sequence number has left the log (acknowledged,
        or dropped by ``drop-oldest``); the ones above it are still held."""
        if self._held:
            return self._held[0].seq - 1
        if self.spill is not None and len(self.spill):
            return self.next_seq - 1 - len(self.spill)
        return self.next_seq - 1

    @property
    def last_seq(self) -> int:
        """The last sequence number handed out (0 before the first)."""
        return self.next_seq - 1
