"""Bulk calls: ``fetch_stream`` (a stream's stored records by offset range, as
columns) and ``publish_many`` (many confirmed publishes in few frames).

``fetch_stream`` sends ``stream.fetch`` and returns a :class:`StreamBatch`: no
consumer, no deliveries, no acks; the broker changes nothing. ``publish_many``
sends ``publish.batch`` frames, several in flight; each message is still
confirmed or refused on its own (see ``docs/client.md``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import cbor2
import trio

from amqlite.errors import (
    AmqliteError,
    PublishNacked,
    PublishReturned,
    RemoteProtocolError,
    ReplyCode,
    error_for,
)
from amqlite.protocol import check_headers, check_props
from amqlite.protocol import events as ev
from amqlite.protocol.codec import RECORDS_OVERHEAD, ends_array

from .replies import PendingReply, ReplyHook

#: What ``fetch_stream`` asks for by default (bytes of keys, exchanges, bodies).
DEFAULT_FETCH_BYTES = 1024 * 1024
#: The broker answers fetches of whole blocks of this many offsets (from offset 0
#: on) from replies it encoded once (``amqlite.broker.stream.FETCH_BLOCK``): a
#: reader that splits a range does best to split it on multiples of this.
FETCH_BLOCK = 8192
#: ``publish_many``: bytes and messages per frame, frames in flight.
BATCH_BYTES = 512 * 1024
BATCH_MESSAGES = 8192
BATCHES_IN_FLIGHT = 4

Message = Sequence[Any]  # (key, body) or (key, body, headers, properties)


class StreamRangeDropped(AmqliteError):
    """Part of the asked offset range was removed by the stream's retention."""

    code = ReplyCode.NOT_FOUND


class StreamBatch:
    """The records one ``fetch_stream`` returned: offsets ``first`` to ``next``
    (exclusive), in columns. ``dropped``: offsets of the asked range below
    ``first`` that retention removed; ``kept_first`` / ``kept_next``: what the
    stream held when it answered.

    The columns: :attr:`keys`, :attr:`exchanges`, :attr:`bodies` hold the values end
    to end and ``*_ends`` (arrays of ``count + 1`` positions) where each one ends;
    :meth:`rows` gives one tuple per record."""

    __slots__ = (
        "bodies",
        "body_ends",
        "count",
        "dropped",
        "exchange_ends",
        "exchanges",
        "extras",
        "first",
        "kept_first",
        "kept_next",
        "key_ends",
        "keys",
        "records",
    )

    def __init__(self, records: ev.StreamRecords) -> None:
        self.records = records
        self.first = records.first
        self.count = records.count
        self.dropped = records.dropped
        self.kept_first = records.kept_first
        self.kept_next = records.kept_next
        self.keys = records.keys
        self.exchanges = records.exchanges
        self.bodies = records.bodies
        self.key_ends = ends_array(records.key_ends)
        self.exchange_ends = ends_array(records.exchange_ends)
        self.body_ends = ends_array(records.body_ends)
        #: record index -> (headers, properties), for those that have any
        self.extras: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {
            i: (h or {}, p or {}) for i, h, p in records.extras
        }

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"StreamBatch(first={self.first}, count={self.count}, dropped={self.dropped})"

    @property
    def next(self) -> int:
        """The offset after the last record: where the next fetch starts."""
        return self.first + self.count

    def _texts(self, blob: bytes, ends: Any) -> list[str]:
        text = blob.decode()
        if len(text) == len(blob):  # ASCII: byte positions are character positions
            return [text[a:b] for a, b in itertools.pairwise(ends)]
        return [blob[a:b].decode() for a, b in itertools.pairwise(ends)]

    def routing_keys(self) -> list[str]:
        return self._texts(self.keys, self.key_ends)

    def exchange_names(self) -> list[str]:
        return self._texts(self.exchanges, self.exchange_ends)

    def body_list(self) -> list[bytes]:
        b, ends = self.bodies, self.body_ends
        return [b[x:y] for x, y in itertools.pairwise(ends)]

    def rows(
        self,
    ) -> Iterator[tuple[int, str, str, bytes, dict[str, Any], dict[str, Any]]]:
        """``(offset, exchange, routing_key, body, headers, properties)`` per record."""
        extras = self.extras
        empty: dict[str, Any] = {}
        for i, (ex, key, body) in enumerate(
            zip(self.exchange_names(), self.routing_keys(), self.body_list(), strict=True)
        ):
            h, p = extras.get(i, (empty, empty))
            yield self.first + i, ex, key, body, h, p


@dataclass
class PublishedMany:
    """What ``publish_many`` did: ``count`` messages sent, ``refused`` the
    ``(index, error)`` of each one the broker did not confirm (returned, nacked)."""

    count: int = 0
    refused: list[tuple[int, AmqliteError]] = field(default_factory=list)


def _refusal(index: int, code: int, text: str, kind: str) -> AmqliteError:
    text = f"message {index} of the batch: {text}"
    if kind == "returned":
        return PublishReturned(text, code)
    if kind == "nacked":
        return PublishNacked(text, code)
    return error_for(code, text)


def _wire(message: Message, persistent: bool) -> list[Any]:
    key, body = message[0], message[1]
    if type(body) is not bytes:
        body = body.encode() if isinstance(body, str) else bytes(body)
    if type(key) is not str:
        raise TypeError(f"a routing key must be text, got {type(key).__name__}")
    if len(message) == 2:
        return [key, body]
    headers = message[2] if len(message) > 2 else None
    props = message[3] if len(message) > 3 else None
    if headers and (why := check_headers(headers)) is not None:
        raise ValueError(f"publish headers: {why}")
    if props and (why := check_props(props)) is not None:
        raise ValueError(f"publish properties: {why}")
    if not headers and not props:
        return [key, body]
    return [key, body, dict(headers) if headers else None, dict(props) if props else None]


@dataclass(frozen=True)
class BatchColumns:
    """``count`` messages as the columns of a ``publish.batch``: routing keys
    (UTF-8) and bodies end to end in ``keys`` / ``bodies``, and ``count + 1``
    little-endian unsigned 32-bit end positions (the first 0) in ``key_ends`` /
    ``body_ends``: Arrow's string and binary layout. ``extras``: ``[i, headers,
    props]`` for the messages that have any."""

    count: int
    keys: bytes
    key_ends: bytes
    bodies: bytes
    body_ends: bytes
    extras: list[Any] = field(default_factory=list)

    @property
    def size(self) -> int:
        """About the bytes of its frame."""
        return len(self.keys) + len(self.bodies) + 8 * (self.count + 1) + RECORDS_OVERHEAD


class PendingBatch:
    """One ``publish.batch`` frame waiting for its ``ok``."""

    __slots__ = ("base", "count", "reply")

    def __init__(self, base: int, count: int, reply: PendingReply) -> None:
        self.base = base  # index of its first message in the whole call
        self.count = count
        self.reply = reply

    async def wait(self) -> list[tuple[int, AmqliteError]]:
        """The refused messages of this frame, by index in the whole call."""
        reply = await self.reply.wait()
        info = reply.info if isinstance(reply, ev.Ok) else None
        if info is None or info.get("count") != self.count:
            raise RemoteProtocolError(f"publish.batch: unexpected reply {reply}")
        out = []
        for item in info.get("refused", []):
            if type(item) is not list or len(item) != 4 or type(item[0]) is not int:
                raise RemoteProtocolError(f"publish.batch: bad refusal {item!r}")
            i, code, text, kind = item
            out.append((self.base + i, _refusal(self.base + i, int(code), str(text), str(kind))))
        return out


class BulkRequests:
    """``fetch_stream`` and ``publish_many``: mixed into the Connection."""

    max_frame: int

    def _new_id(self) -> int:  # pragma: no cover - provided by Connection
        raise NotImplementedError

    def _new_ids(self, n: int) -> int:  # pragma: no cover - provided by Connection
        raise NotImplementedError

    async def _call(
        self, event: Any, hook: ReplyHook | None = None
    ) -> ev.Event:  # pragma: no cover
        raise NotImplementedError

    async def _call_nowait(self, event: Any) -> PendingReply:  # pragma: no cover
        raise NotImplementedError

    @property
    def _receive_limit(self) -> int:  # pragma: no cover - provided by Connection
        raise NotImplementedError

    async def fetch_stream(
        self,
        queue: str,
        start: int,
        end: int | None = None,
        max_bytes: int = DEFAULT_FETCH_BYTES,
        *,
        strict: bool = False,
    ) -> StreamBatch:
        """The stored records of stream ``queue`` from offset ``start`` (below
        ``end``; None: whatever the stream holds), about ``max_bytes`` of them (at
        least one when there is one). Fewer than asked is normal: fetch again from
        ``batch.next``; an empty batch means nothing more is stored (yet).

        Offsets retention removed are skipped and counted in ``batch.dropped``;
        with ``strict`` they raise :class:`StreamRangeDropped` instead. Reading
        changes nothing on the broker. Sent again after a reconnect (an HA
        failover): the new server answers from its replica of the stream."""
        budget = max(1, min(max_bytes, self._receive_limit - 2 * RECORDS_OVERHEAD))
        reply = await self._call(ev.StreamFetch(self._new_id(), queue, start, end, budget))
        if not isinstance(reply, ev.StreamRecords):
            raise RemoteProtocolError(f"stream.fetch: unexpected reply {reply.METHOD!r}")
        batch = StreamBatch(reply)
        if strict and batch.dropped:
            raise StreamRangeDropped(
                f"stream {queue!r}: offsets {start} to {start + batch.dropped - 1} were "
                f"removed by retention (the oldest kept is {batch.kept_first})"
            )
        return batch

    async def publish_batch_nowait(
        self,
        exchange: str,
        messages: list[list[Any]],
        *,
        mandatory: bool = False,
        persistent: bool = False,
        base: int = 0,
    ) -> PendingBatch:
        """Send one ``publish.batch`` of wire messages (``[key, body]`` or ``[key,
        body, headers, props]``) and return without waiting for its ``ok``."""
        rid = self._new_ids(len(messages))
        event = ev.PublishBatch(rid, exchange, messages, mandatory, persistent)
        return PendingBatch(base, len(messages), await self._call_nowait(event))

    async def publish_columns_nowait(
        self,
        exchange: str,
        columns: BatchColumns,
        *,
        mandatory: bool = False,
        persistent: bool = False,
        base: int = 0,
    ) -> PendingBatch:
        """:meth:`publish_batch_nowait` of messages given as columns (a
        ``publish.columns``, see :class:`BatchColumns`)."""
        n = columns.count
        if n < 1:
            raise ValueError("a publish.batch holds at least one message")
        rid = self._new_ids(n)
        event = ev.PublishColumns(
            rid,
            exchange,
            n,
            columns.keys,
            columns.key_ends,
            columns.bodies,
            columns.body_ends,
            columns.extras,
            mandatory,
            persistent,
        )
        return PendingBatch(base, n, await self._call_nowait(event))

    async def publish_many(
        self,
        exchange: str,
        messages: Iterable[Message],
        *,
        mandatory: bool = False,
        persistent: bool = False,
        raise_refused: bool = True,
        in_flight: int = BATCHES_IN_FLIGHT,
    ) -> PublishedMany:
        """Publish every message of ``messages`` (``(routing_key, body)`` or
        ``(routing_key, body, headers, properties)``) to ``exchange``, confirmed, in
        ``publish.batch`` frames (a few in flight); returns once every one is
        confirmed or refused. Each message is its own confirmed publish: with
        ``raise_refused`` the first one returned (mandatory, unroutable) or nacked
        raises :class:`PublishReturned` / :class:`PublishNacked`, naming its index;
        otherwise they are listed in the result. Persistent batches are committed
        to the journal as a group. Across a reconnect the frames not yet confirmed
        are sent again, under the same publish keys (at least once, no duplicate
        on an HA pair)."""
        limit = max(1024, min(BATCH_BYTES, self.max_frame - 2 * RECORDS_OVERHEAD))
        result = PublishedMany()
        pending: list[PendingBatch] = []
        chunk: list[list[Any]] = []
        size = 0
        sent = 0

        async def settle(p: PendingBatch) -> None:
            refused = await p.wait()
            result.refused.extend(refused)
            if refused and raise_refused:
                raise refused[0][1]

        async def flush() -> None:
            nonlocal chunk, size, sent
            if len(pending) >= max(1, in_flight):
                await settle(pending.pop(0))
            pending.append(
                await self.publish_batch_nowait(
                    exchange, chunk, mandatory=mandatory, persistent=persistent, base=sent
                )
            )
            sent += len(chunk)
            chunk, size = [], 0

        for message in messages:
            wire = _wire(message, persistent)
            n = len(wire[1]) + 4 * len(wire[0]) + 12
            if len(wire) == 4:
                n += len(cbor2.dumps(wire[2:]))
            if chunk and (size + n > limit or len(chunk) >= BATCH_MESSAGES):
                await flush()
            chunk.append(wire)
            size += n
        if chunk:
            await flush()
        for p in pending:
            await settle(p)
        result.count = sent
        await trio.lowlevel.checkpoint()
        return result
