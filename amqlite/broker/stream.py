"""Stream queues: an append-only log that consumers read by offset, without removing.

A stream (``x-queue-type = stream``) gives every message it takes the next offset
(0, 1, 2, ... for its whole life). Retention drops messages from the head by count
(``x-max-length``), body bytes (``x-max-length-bytes``) or age (``x-max-age``);
offsets are never reused. Each consumer has its own cursor, chosen when it
subscribes with the consume argument ``x-stream-offset``:

================  ===========================================================
``"first"``       the oldest message still kept
``"last"``        the newest message (or the next one when the stream is empty)
``"next"``        only messages appended from now on (the default)
an integer        that offset (clamped into what is kept)
a float           a Unix time: the first message appended at or after it
ISO-8601 text     the same, e.g. ``"2026-11-22T10:00:00Z"`` (no zone = UTC)
================  ===========================================================

Every consumer gets every message; acks (and nacks, and rejects) only return
credit, so a stream consumer with a prefetch of N has at most N messages out.
Deliveries carry their ``offset``. A consumer can store its offset under a name
and fetch it later (:meth:`StreamQueue.store_offset`), e.g. to resume after a
restart. Streams must be durable, non-exclusive and not auto-delete; with a
journal every message a stream takes is stored, persistent or not.
"""

from __future__ import annotations

import bisect
import datetime
import itertools
from typing import Any

from amqlite.errors import NotFound, PreconditionFailed

from .message import INF, Message
from .queue import Consumer, Entry, Queue

OFFSET_ARGUMENT = "x-stream-offset"
#: ``stream.fetch`` answers whole blocks of this many offsets (``offset //
#: FETCH_BLOCK``) from a cache of their encoded replies (:attr:`StreamQueue.blocks`)
FETCH_BLOCK = 8192
#: the encoded blocks a stream keeps at most (bytes; the oldest made go first)
FETCH_CACHE_BYTES = 128 * 1024 * 1024


class StreamQueue(Queue):
    """A stream queue; see the module docstring. ``ready`` stays empty."""

    __slots__ = (
        "_at",
        "_head",
        "_log",
        "blocks",
        "blocks_bytes",
        "bytes",
        "first",
        "next",
        "tracked",
    )

    is_stream = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._log: list[Message] = []  # messages from offset ``first``, at index _head
        self._at: list[float] = []  # their append times (wall clock), same indexes
        self._head = 0
        self.first = 0
        self.next = 0
        self.bytes = 0
        self.tracked: dict[str, int] = {}
        #: block index -> (its encoded ``stream.records``, its size): made by the
        #: server when a fetch first reads a whole block, which never changes after
        #: (retention drops the blocks it removes any of); see :meth:`whole_block`
        self.blocks: dict[int, tuple[Any, int]] = {}
        self.blocks_bytes = 0

    def __len__(self) -> int:
        return len(self._log) - self._head

    def count(self) -> int:
        return len(self._log) - self._head

    # --- appending ---------------------------------------------------------------------

    def offer(self, message: Message, now: float, expiration: int | None) -> bool:
        at = now + self.vhost.wall_offset
        offset = self.next
        self._append(message, at)
        self.stat_publish += 1
        recorder = self.journal
        if recorder is not None:
            recorder.stream_append(self.vhost.name, self.name, offset, message, at)
        self._retain(at)
        if self.consumers:
            self.dispatch(now)
        return True

    def offer_many(self, messages: list[Message], now: float) -> None:
        """:meth:`offer` of each of ``messages`` in order, with retention and the
        push to consumers once (a ``publish.batch``: the batch path of
        :meth:`~amqlite.broker.vhost.VirtualHost.publish_batch`). A stream takes
        every message, so there is no outcome to return. The log, the offsets and
        the journal's records end as ``offer`` one by one leaves them (retention
        drops the same head, in one ``stream.truncate`` instead of several)."""
        if not messages:
            return
        settings = self.settings
        if self.consumers and (
            settings.max_length is not None or settings.max_length_bytes is not None
        ):
            # whether a consumer gets a message depends on retention right after
            # its append (x-max-length 0, a body above x-max-length-bytes): one by one
            for message in messages:
                self.offer(message, now, None)
            return
        at = now + self.vhost.wall_offset
        if len(self) and at < self._at[-1]:
            at = self._at[-1]  # keep times in order (a clock step back) for bisecting
        first = self.next
        n = len(messages)
        self._log.extend(messages)
        self._at.extend(itertools.repeat(at, n))
        self.next = first + n
        self.bytes += sum([len(m.body) for m in messages])
        self.stat_publish += n
        recorder = self.journal
        if recorder is not None:
            vhost, name, append = self.vhost.name, self.name, recorder.stream_append
            for offset, message in enumerate(messages, first):
                append(vhost, name, offset, message, at)
        if self.consumers:  # before age retention, which spares what was just appended
            self.dispatch(now)
        self._retain(at)

    def _append(self, message: Message, at: float) -> None:
        if at < (self._at[-1] if len(self) else at):
            at = self._at[-1]  # keep times in order (a clock step back) for bisecting
        self._log.append(message)
        self._at.append(at)
        self.next += 1
        self.bytes += len(message.body)

    def restore(self, message: Message, expires: float) -> None:  # pragma: no cover
        raise TypeError("streams are restored with restore_at")

    def restore_at(self, offset: int, message: Message, at: float) -> None:
        """Append a journaled message at ``offset`` (recovery, a passive HA node)."""
        if offset < self.next:
            return
        if not len(self):
            self.first = offset
        self.next = offset
        self._append(message, at)

    def truncate(self, before: int) -> None:
        """Drop every message below offset ``before`` (journaled retention)."""
        drop = min(max(before - self.first, 0), len(self))
        for message in self._log[self._head : self._head + drop]:
            self.bytes -= len(message.body)
        self._head += drop
        self.first = max(self.first, before)
        self.next = max(self.next, self.first)
        if self.blocks:
            for block in [b for b in self.blocks if b * FETCH_BLOCK < self.first]:
                self.blocks_bytes -= self.blocks.pop(block)[1]
        if self._head > 1024 and self._head * 2 > len(self._log):
            del self._log[: self._head]
            del self._at[: self._head]
            self._head = 0

    def _retain(self, wall_now: float) -> None:
        settings = self.settings
        max_length = settings.max_length
        max_bytes = settings.max_length_bytes
        max_age = settings.max_age
        before = self.first
        log, at = self._log, self._at
        head = self._head
        size = self.bytes
        n = len(log)
        while head < n and (
            (max_length is not None and n - head > max_length)
            or (max_bytes is not None and size > max_bytes)
            or (max_age is not None and at[head] < wall_now - max_age)
        ):
            size -= len(log[head].body)
            head += 1
            before += 1
        if before != self.first:
            self.truncate(before)
            recorder = self.journal
            if recorder is not None:
                recorder.stream_truncate(self.vhost.name, self.name, before)

    def expire(self, now: float) -> int:
        """Age retention, on the broker's tick."""
        if self.settings.max_age is None or not len(self):
            return 0
        kept = len(self)
        self._retain(now + self.vhost.wall_offset)
        return kept - len(self)

    # --- consumers -----------------------------------------------------------------------

    def attach(self, consumer: Consumer, spec: Any) -> None:
        """Place a new consumer's cursor from its ``x-stream-offset`` argument."""
        consumer.cursor = self.resolve(spec)

    def resolve(self, spec: Any) -> int:
        if spec is None or spec == "next":
            return self.next
        if spec == "first":
            return self.first
        if spec == "last":
            return self.next - 1 if len(self) else self.next
        if type(spec) is int:
            if spec < 0:
                raise PreconditionFailed(f"{OFFSET_ARGUMENT} must not be negative, got {spec}")
            return max(self.first, min(spec, self.next))
        if type(spec) is float:
            return self._at_or_after(spec)
        if type(spec) is str:
            return self._at_or_after(_parse_time(spec))
        raise PreconditionFailed(
            f"{OFFSET_ARGUMENT} must be 'first', 'last', 'next', an offset, a Unix time "
            f"or an ISO-8601 time, got {spec!r}"
        )

    def _at_or_after(self, when: float) -> int:
        i = bisect.bisect_left(self._at, when, lo=self._head)
        return self.first + (i - self._head)

    def dispatch(self, now: float) -> None:
        """Push to every consumer with credit from its cursor to the end."""
        log = self._log
        for c in self.consumers:
            cursor = c.cursor
            if cursor < self.first:
                cursor = self.first
            end = self.next
            base = self._head - self.first
            session = c.session
            while cursor < end and c.writable and c.inflight < c.limit:
                session._deliver(c, self, log[base + cursor], INF, False, cursor)
                cursor += 1
            c.cursor = cursor

    def requeue(self, entries: list[Entry]) -> None:
        """Nothing goes back into a stream: a nack only returns credit."""

    def dead_letter_rejected(self, message: Message, now: float) -> None:
        """A rejected stream message stays where it is (streams do not dead-letter)."""

    def take(self, now: float) -> Entry | None:
        raise PreconditionFailed(
            f"queue {self.name!r} is a stream: read it with a consumer and "
            f"{OFFSET_ARGUMENT}, not get"
        )

    def purge(self) -> int:
        """Drop the whole log (the queue is being deleted; clients cannot purge)."""
        count = len(self)
        self.truncate(self.next)
        return count

    # --- bulk reads ----------------------------------------------------------------------

    def read(
        self, start: int, end: int | None, max_bytes: int, visible: int | None = None
    ) -> tuple[int, list[Message], int]:
        """The kept messages from offset ``start`` (below ``end``; None: all the
        stream holds; below ``visible`` too when given), as many as about
        ``max_bytes`` of keys, exchanges and bodies allow (at least one; headers and
        properties estimated):
        ``(first, messages, dropped)``. ``first`` is the offset of the first one
        (``start``, or the oldest kept when retention dropped ``dropped`` offsets of
        the range). Changes nothing: no cursor, no credit, no journal."""
        if type(start) is not int or start < 0:
            raise PreconditionFailed(f"a fetch's start must be an offset >= 0, got {start!r}")
        if end is not None and end < start:
            raise PreconditionFailed(f"a fetch's end ({end}) is below its start ({start})")
        hi = self.next if end is None else min(end, self.next)
        if visible is not None:
            hi = min(hi, visible)
        lo = max(start, self.first)
        dropped = max(0, (self.first if end is None else min(end, self.first)) - start)
        if lo >= hi:
            return lo, [], dropped
        base = self._head - self.first
        log = self._log
        budget = max_bytes
        i = lo
        while i < hi:
            m = log[base + i]
            cost = len(m.body) + len(m.routing_key) + len(m.exchange) + 12
            if m.headers or m.properties:
                cost += 64 + 24 * (len(m.headers) + len(m.properties))
            if cost > budget and i > lo:
                break
            budget -= cost
            i += 1
        return lo, log[base + lo : base + i], dropped

    def whole_block(self, start: int, end: int | None, visible: int | None) -> int | None:
        """The index of the block that offsets ``start`` to ``start + FETCH_BLOCK``
        make, when that is a block (``start`` on a block boundary), the stream keeps
        all of it and it lies below ``end`` and ``visible``; else None.

        Why blocks: a fetch that reads a whole block can be answered from its
        encoded reply, made once (:meth:`keep_block`), instead of encoding each
        record again for every reader and every replay."""
        if start % FETCH_BLOCK or start < self.first:
            return None
        stop = start + FETCH_BLOCK
        if stop > self.next or (end is not None and stop > end):
            return None
        if visible is not None and stop > visible:
            return None
        return start // FETCH_BLOCK

    def block_messages(self, block: int) -> list[Message]:
        """The messages of a whole block (see :meth:`whole_block`)."""
        at = self._head - self.first + block * FETCH_BLOCK
        return self._log[at : at + FETCH_BLOCK]

    def keep_block(self, block: int, encoded: Any, size: int) -> None:
        """Keep a block's encoded reply (``size`` bytes; None: it cannot be one reply,
        do not make it again), dropping the oldest kept beyond
        :data:`FETCH_CACHE_BYTES`."""
        if block * FETCH_BLOCK < self.first or block in self.blocks:
            return
        self.blocks[block] = (encoded, size)
        self.blocks_bytes += size
        while self.blocks_bytes > FETCH_CACHE_BYTES and len(self.blocks) > 1:
            oldest = next(iter(self.blocks))
            self.blocks_bytes -= self.blocks.pop(oldest)[1]

    def drop_blocks(self) -> int:
        """Forget every kept fetch reply (memory is short: they are made again on
        demand); the bytes freed."""
        freed = self.blocks_bytes
        self.blocks.clear()
        self.blocks_bytes = 0
        return freed

    def block_end(self, start: int) -> int:
        """The first offset after ``start`` on a block boundary."""
        return (start // FETCH_BLOCK + 1) * FETCH_BLOCK

    # --- named offsets -------------------------------------------------------------------

    def store_offset(self, name: str, offset: int) -> None:
        if type(offset) is not int or offset < 0:
            raise PreconditionFailed(f"offset must be a non-negative integer, got {offset!r}")
        self.tracked[name] = offset
        recorder = self.journal
        if recorder is not None:
            recorder.stream_track(self.vhost.name, self.name, name, offset)

    def query_offset(self, name: str) -> int:
        offset = self.tracked.get(name)
        if offset is None:
            raise NotFound(f"no offset stored under {name!r} in stream {self.name!r}")
        return offset

    def status_fields(self) -> dict[str, Any]:
        return {
            "first_offset": self.first,
            "next_offset": self.next,
            "bytes": self.bytes,
            "fetch_cache_bytes": self.blocks_bytes,
        }


def _parse_time(text: str) -> float:
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise PreconditionFailed(
            f"{OFFSET_ARGUMENT} must be 'first', 'last', 'next', an offset or an ISO-8601 "
            f"time, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()
