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
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from .mode import OverflowPolicy
from .wire import Envelope, Forward, PlainRun, from_map


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
    """Sequence numbers, cumulative acks, resend after a cut, and the byte cap.

    The messages held in memory are kept as their envelopes alone: their sequence
    numbers follow each other (the first is :attr:`gone_upto` + 1; a spilled one
    comes back after all of them), each envelope knows its size, and the times
    they were accepted are kept as stamps, one per run of messages accepted at the
    same instant (a client read's run is one). Why not an :class:`Entry` each: the
    log is on the sending broker's per-message path, and a tuple per message to
    make, keep for the cyclic GC to scan and free on the ack was a few percent of
    what that broker spends per peered message. :meth:`take_unsent` and
    :meth:`take_last` still give entries (:meth:`take_unsent_run` is what a pump takes:
    ``tests/peering/test_fast_paths.py`` checks the two agree, and
    ``tests/peering/test_outbound.py`` the times against a model).

    A run of plain client publishes accepted at once
    (:meth:`accept_run_if_room` of a :class:`~amqlite.peering.wire.PlainRun`) is
    held as that one run, not an envelope each: ``_held`` holds envelopes and
    runs (never an empty one), ``_count`` the messages in them; acks, drop-oldest
    and a take that ends inside a run split it (a run's slice is a run). Why: an
    envelope and a mesh id per message, made only to be held, encoded and freed on
    the ack, were about a tenth of the sending broker's work per peered message
    (``tests/peering/test_fast_paths.py::test_a_log_holding_runs_is_the_log_of_their_envelopes``
    checks the log against one holding an envelope each).
    """

    __slots__ = (
        "_bytes",
        "_count",
        "_held",
        "_runs",
        "_sent",
        "_stamps",
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
        # in memory, oldest first (their seqs follow each other); then the spill store
        self._held: deque[Envelope | PlainRun] = deque()
        self._count = 0  # messages in _held (a run holds several)
        self._runs = 0  # runs in _held (none: the envelope-only paths as before runs)
        #: [first seq, accepted at] of each run of held messages accepted at one time
        self._stamps: deque[tuple[int, float]] = deque()
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

    def _hold(self, seq: int, envelope: Envelope, size: int, now: float) -> None:
        """Keep ``envelope`` (``seq``, the next in memory) in memory."""
        stamps = self._stamps
        if not stamps or stamps[-1][1] != now:
            stamps.append((seq, now))
        self._held.append(envelope)
        self._count += 1
        self._bytes += size

    def accept(self, envelope: Envelope, now: float) -> int | None:
        """Take a message; its sequence number, or None when ``block`` refused it."""
        size = envelope.size()
        held = self._held
        if not held or (
            self._bytes + size <= self.buffer_bytes and (self.spill is None or not len(self.spill))
        ):  # room in memory (has_room, inlined: this runs for every message)
            seq = self.next_seq
            self.next_seq = seq + 1
            self._hold(seq, envelope, size, now)
            return seq
        if not self.has_room(size):
            if self.overflow is OverflowPolicy.BLOCK:
                self.blocked += 1
                return None
            if self.overflow is OverflowPolicy.DROP_OLDEST:
                while self._held and self._bytes + size > self.buffer_bytes:
                    self._forget_oldest()
                    self.dropped += 1
        seq = self.next_seq
        self.next_seq += 1
        if self._held and not self.has_room(size):  # spill
            assert self.spill is not None
            self.spill.append(Entry(seq, envelope, size, now))
            self.spilled += 1
        else:
            self._hold(seq, envelope, size, now)
        return seq

    def accept_if_room(self, envelope: Envelope, now: float) -> int | None:
        """:meth:`accept` when the message fits in memory as it is (no overflow
        policy has anything to do): its sequence number; None, with nothing
        changed, otherwise (then :meth:`accept` applies the policy)."""
        size = envelope._size  # size(), without the call when known (a run's are)
        if size < 0:
            size = envelope.size()
        held = self._held
        if not held or (
            self._bytes + size <= self.buffer_bytes and (self.spill is None or not len(self.spill))
        ):
            seq = self.next_seq
            self.next_seq = seq + 1
            stamps = self._stamps  # _hold(), inlined: a run's messages all come here
            if not stamps or stamps[-1][1] != now:
                stamps.append((seq, now))
            held.append(envelope)
            self._count += 1
            self._bytes += size
            return seq
        return None

    def accept_run_if_room(
        self, envelopes: list[Envelope] | PlainRun, size: int, now: float
    ) -> int | None:
        """:meth:`accept_if_room` of each of ``envelopes`` (``size``: their sizes'
        sum, each one known) when all of them fit in memory as they are: the first
        one's sequence number; None, with nothing changed, otherwise (then each
        goes its own way). A :class:`PlainRun` is held as itself (see the class).
        Why it exists: a client read's run of plain publishes, built at once
        (:meth:`PeeringLink.offer_plain_run`), goes into the log at once
        (``tests/peering/test_fast_paths.py`` checks the run offer against one
        offer each)."""
        if self._bytes + size > self.buffer_bytes or (self.spill is not None and len(self.spill)):
            return None
        n = len(envelopes)
        if not n:
            return None
        seq = self.next_seq
        self.next_seq = seq + n
        stamps = self._stamps  # _hold() of each: one stamp for the run at most
        if not stamps or stamps[-1][1] != now:
            stamps.append((seq, now))
        if type(envelopes) is PlainRun:
            self._held.append(envelopes)
            self._runs += 1
        else:
            self._held.extend(envelopes)
        self._count += n
        self._bytes += size
        return seq

    def force(self, envelope: Envelope, now: float) -> int:
        """Take a message past the byte cap (into memory, or the spill store when
        spilling): for messages already promised, such as a restored log's."""
        seq, size = self.next_seq, envelope.size()
        self.next_seq += 1
        if self._spilling:
            assert self.spill is not None
            self.spill.append(Entry(seq, envelope, size, now))
            self.spilled += 1
        else:
            self._hold(seq, envelope, size, now)
        return seq

    def _forget_oldest(self) -> None:
        held = self._held
        head = held[0]
        if isinstance(head, PlainRun):
            if len(head) == 1:
                held.popleft()
                self._runs -= 1
            else:
                held[0] = head.part(1, len(head))
            self._bytes -= head[0].size()
        else:
            self._bytes -= held.popleft().size()
        self._count -= 1
        if self._sent:
            self._sent -= 1
        self._drop_stamps()

    def _drop_stamps(self) -> None:
        """Forget the stamps of messages no longer held."""
        stamps = self._stamps
        if not self._held:
            stamps.clear()
            return
        first = self._first_held
        while len(stamps) > 1 and stamps[1][0] <= first:
            stamps.popleft()

    @property
    def _first_held(self) -> int:
        """The sequence number of ``_held[0]`` (held, then spilled, follow each other)."""
        return self.next_seq - self._count - (len(self.spill) if self.spill is not None else 0)

    def _envelopes(self) -> Iterator[Envelope]:
        """The held messages' envelopes, oldest first (a run's made as it goes)."""
        return itertools.chain.from_iterable(
            (item,) if type(item) is Envelope else item  # type: ignore[misc]
            for item in self._held
        )

    def _entries(self, start: int, end: int) -> list[Entry]:
        """The held messages ``start`` to ``end`` (0 the oldest) as entries
        (numbered, sized and timed)."""
        first = self._first_held + start
        stamps = self._stamps
        k = 0
        out = []
        for i, envelope in enumerate(itertools.islice(self._envelopes(), start, end)):
            seq = first + i
            while k + 1 < len(stamps) and stamps[k + 1][0] <= seq:
                k += 1
            out.append(Entry(seq, envelope, envelope.size(), stamps[k][1]))
        return out

    # --- sending and acknowledging -------------------------------------------------

    def take_last(self, max_in_flight: int) -> Entry | None:
        """The message just accepted, now in flight, when it is the only one due
        and fewer than ``max_in_flight`` are in flight (the usual case when the
        link keeps up); None otherwise: then :meth:`take_unsent` says what is due."""
        sent = self._sent
        if sent >= max_in_flight or sent != self._count - 1:
            return None
        spill = self.spill
        if spill is not None and len(spill):
            return None
        self._sent = sent + 1
        last = self._held[-1]
        envelope = last[-1] if isinstance(last, PlainRun) else last
        return Entry(self.next_seq - 1, envelope, envelope.size(), self._stamps[-1][1])

    def take_unsent(self, limit: int) -> list[Entry]:
        """Up to ``limit`` messages due on this connection, in sequence order; they
        count as in flight from now on."""
        self._refill()
        start = self._sent
        end = min(self._count, start + max(0, limit))
        if end <= start:
            return []
        self._sent = end
        return self._entries(start, end)

    def take_unsent_run(self, limit: int) -> tuple[int, list[Envelope | PlainRun]]:
        """:meth:`take_unsent` as the first one's sequence number and the messages
        (the others' numbers follow), each held run (or its part due) as one
        :class:`PlainRun`, runs that continue each other as one
        (:meth:`PlainRun.chained`): what a pump sends, without an entry (or an
        envelope) each."""
        self._refill()
        start = self._sent
        end = min(self._count, start + max(0, limit))
        if end <= start:
            return 0, []
        self._sent = end
        if not self._runs:  # (envelopes alone: one pass in C, as before runs)
            return self._first_held + start, list(itertools.islice(self._held, start, end))
        out: list[Envelope | PlainRun] = []
        at = 0  # the message index of item's first
        for item in self._held:
            if type(item) is Envelope:
                if at >= start:
                    if at >= end:
                        break
                    out.append(item)
                at += 1
                continue
            assert isinstance(item, PlainRun)
            n = len(item)
            if at + n <= start:
                at += n
                continue
            if at >= end:
                break
            if start > at or end < at + n:
                item = item.part(max(0, start - at), end - at)
            last = out[-1] if out else None
            if isinstance(last, PlainRun):
                joined = last.chained(item)
                if joined is not None:
                    out[-1] = joined
                    at += n
                    continue
            out.append(item)
            at += n
        return self._first_held + start, out

    def ack(self, seq: int) -> int:
        """Forget every message up to ``seq`` (cumulative); how many went."""
        held = self._held
        n = min(seq - self._first_held + 1, self._count)  # held seqs follow each other
        if n > 0:
            freed = 0
            popleft = held.popleft
            left = 0 if self._runs else n
            for _ in range(left):  # envelopes alone: _forget_oldest() each, inlined
                freed += popleft()._size  # type: ignore[union-attr]  # (held: size known)
            left = n - left
            while left:  # with runs held: per message or run
                item = popleft()
                if type(item) is Envelope:
                    freed += item._size  # (held: its size is known)
                    left -= 1
                    continue
                assert isinstance(item, PlainRun)
                k = len(item)
                if k > left:  # acked up to inside the run: the rest stays held
                    rest = item.part(left, k)
                    held.appendleft(rest)
                    freed += item.size() - rest.size()
                    break
                freed += item.size()
                self._runs -= 1
                left -= k
            self._count -= n
            self._bytes -= freed
            self._sent = max(0, self._sent - n)
            self._drop_stamps()
        else:
            n = 0
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
            self._hold(entry.seq, entry.envelope, entry.size, entry.accepted_at)

    # --- figures ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Sent on this connection and not yet acknowledged."""
        return self._sent

    @property
    def unsent(self) -> int:
        return self._count - self._sent + (len(self.spill) if self.spill is not None else 0)

    @property
    def unacked(self) -> int:
        """Every message accepted and not yet acknowledged (in memory or spilled)."""
        return self._count + (len(self.spill) if self.spill is not None else 0)

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    @property
    def spilled_bytes(self) -> int:
        return self.spill.bytes if self.spill is not None else 0

    @property
    def oldest_accepted_at(self) -> float | None:
        return self._stamps[0][1] if self._held else None

    @property
    def gone_upto(self) -> int:
        """Every message up to this sequence number has left the log (acknowledged,
        or dropped by ``drop-oldest``); the ones above it are still held."""
        return self._first_held - 1

    @property
    def holds_runs(self) -> bool:
        """Does the log hold a :class:`PlainRun` (:meth:`take_unsent_run` may give runs)?"""
        return self._runs > 0

    @property
    def last_seq(self) -> int:
        """The last sequence number handed out (0 before the first)."""
        return self.next_seq - 1
