"""Synchronous calls into the trio client, for Spark's Python workers.

Spark calls a data source's ``read`` and ``write`` from plain threads that expect
iterators and return values, so each call here runs the client under its own
``trio.run``: :func:`stream_bounds` and :func:`publish_rows` in the caller's thread,
:func:`read_range` in a helper thread that hands chunks of rows over a bounded
queue, so the caller can iterate while the consumer keeps reading.

This module does not import pyspark: it is what the data source (and the audit
job) do on the broker side, and it is tested without a JVM.
"""

from __future__ import annotations

import contextlib
import datetime
import queue as queue_mod
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cbor2
import trio

from amqlite.client import connect
from amqlite.client.bulk import FETCH_BLOCK, BatchColumns
from amqlite.errors import AmqliteError, NotFound, PreconditionFailed

Row = tuple[Any, ...]

CHUNK = 2000  # rows handed from the reading thread to Spark at a time


class SparkSourceError(ValueError):
    """A data source option or target the source cannot work with (bad option, a
    missing queue, a queue that is not a stream, unreachable servers)."""


@dataclass(frozen=True)
class ServerAccess:
    """Where and as whom to connect: the ``servers`` list and credentials; ``tls``
    dials every server over TLS (``amqlites://`` entries always are), verified
    against ``ca`` (a PEM file every executor can read; empty: the system's store)."""

    servers: str
    vhost: str = "/"
    login: str = "guest"
    password: str = field(default="guest", repr=False)
    connect_timeout: float = 5.0
    tls: bool = False
    ca: str = ""

    def _connect(self, name: str) -> Any:
        return connect(
            self.servers,
            vhost=self.vhost,
            login=self.login,
            password=self.password,
            client_name=name,
            connect_timeout=self.connect_timeout,
            tls=self.tls,
            ca=self.ca or None,
        )


@dataclass(frozen=True)
class StreamBounds:
    """A stream queue's kept offsets: ``first`` (oldest kept) to ``next`` (exclusive)."""

    first: int
    next: int


def _unreachable(access: ServerAccess, exc: AmqliteError) -> SparkSourceError:
    return SparkSourceError(f"amqlite: cannot connect to servers {access.servers!r}: {exc}")


def stream_bounds(access: ServerAccess, queue: str) -> StreamBounds:
    """The offsets kept by stream ``queue``; raises SparkSourceError when it is
    missing, not a stream, or the servers cannot be reached."""

    async def run() -> dict[str, Any]:
        async with access._connect("amqlite-spark-plan") as conn:
            status: dict[str, Any] = await conn.status()
            return status

    try:
        status = trio.run(run)
    except AmqliteError as exc:
        raise _unreachable(access, exc) from None
    for host in status.get("vhosts", []):
        if host.get("name") != access.vhost:
            continue
        for q in host.get("queues", []):
            if q.get("name") != queue:
                continue
            if q.get("type") != "stream":
                raise SparkSourceError(
                    f"amqlite: queue {queue!r} in vhost {access.vhost!r} is a "
                    f"{q.get('type')} queue, not a stream: declare it with "
                    f'arguments {{"x-queue-type": "stream"}} to read it from Spark'
                )
            return StreamBounds(int(q["first_offset"]), int(q["next_offset"]))
    raise SparkSourceError(
        f"amqlite: no queue {queue!r} in vhost {access.vhost!r} on {access.servers}"
    )


def resolve_start(spec: str, bounds: StreamBounds) -> int:
    """``startingOffset``: ``first``, ``last`` (the newest message), ``next`` /
    ``latest`` (only what comes after now), or a number (clamped into what is kept)."""
    text = spec.strip().lower()
    if text in ("first", "earliest"):
        return bounds.first
    if text == "last":
        return max(bounds.first, bounds.next - 1)
    if text in ("next", "latest"):
        return bounds.next
    number = _parse_offset("startingOffset", spec)
    return max(bounds.first, min(number, bounds.next))


def resolve_end(spec: str | None, bounds: StreamBounds) -> int:
    """``endingOffset`` (batch reads, exclusive): ``latest`` / ``next`` (what the
    stream holds now, the default) or a number (clamped to that)."""
    if spec is None or spec.strip().lower() in ("latest", "next", "last"):
        return bounds.next
    return min(_parse_offset("endingOffset", spec), bounds.next)


def _parse_offset(name: str, spec: str) -> int:
    try:
        number = int(spec)
    except ValueError:
        raise SparkSourceError(
            f"amqlite: option {name} must be 'first', 'last', 'next' or an offset, got {spec!r}"
        ) from None
    if number < 0:
        raise SparkSourceError(f"amqlite: option {name} must not be negative, got {number}")
    return number


def split_range(start: int, end: int, parts: int, min_size: int) -> list[tuple[int, int]]:
    """Split offsets ``[start, end)`` into at most ``parts`` contiguous ranges of at
    least ``min_size`` offsets each (one range when the whole is smaller)."""
    total = end - start
    if total <= 0:
        return []
    n = max(1, min(parts, total // max(1, min_size)))
    step, extra = divmod(total, n)
    ranges = []
    at = start
    for i in range(n):
        size = step + (1 if i < extra else 0)
        ranges.append((at, at + size))
        at += size
    return ranges


def _when(value: Any) -> datetime.datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
    if isinstance(value, str):
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            return None
        return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)
    return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def delivery_row(
    offset: int,
    exchange: str,
    routing_key: str,
    headers: Mapping[str, Any],
    body: bytes,
    props: Mapping[str, Any],
) -> Row:
    """One row in the source's column order (see ``READ_COLUMNS``)."""
    return (
        offset,
        exchange,
        routing_key,
        {str(k): _text(v) for k, v in headers.items()},
        body,
        _when(props.get("timestamp")),
        _text(props.get("message_id")),
        _text(props.get("correlation_id")),
        _text(props.get("content_type")),
    )


READ_COLUMNS = (
    "offset long, exchange string, routing_key string, headers map<string,string>, "
    "body binary, timestamp timestamp, message_id string, correlation_id string, "
    "content_type string"
)

_DONE = object()


def read_range(
    access: ServerAccess, queue: str, start: int, end: int, *, idle_timeout: float = 30.0
) -> Iterator[Row]:
    """Yield the rows of offsets ``[start, end)`` of stream ``queue``, in order.

    Offsets retention dropped meanwhile are skipped (the stream starts at its
    oldest). Raises SparkSourceError when nothing arrives for ``idle_timeout``
    seconds while offsets below ``end`` are still missing.
    """
    for chunk in read_chunks(access, queue, start, end, idle_timeout=idle_timeout):
        yield from chunk


def read_chunks(
    access: ServerAccess, queue: str, start: int, end: int, *, idle_timeout: float = 30.0
) -> Iterator[list[Row]]:
    """:func:`read_range` in lists of up to ``CHUNK`` rows."""
    if start >= end:
        return

    async def produce(put: Any) -> None:
        async with access._connect("amqlite-spark-read") as conn:
            # acked consumer with credit: the broker pushes at most ``prefetch``
            # ahead of what this task took, however slowly Spark pulls rows
            prefetch = min(CHUNK * 2, end - start)
            ack_every = max(1, prefetch // 4)
            consumer = await conn.consume(queue, offset=start, prefetch=prefetch)
            chunk: list[Row] = []
            it = consumer.__aiter__()
            taken = 0
            while True:
                with trio.move_on_after(idle_timeout) as waited:
                    try:
                        d = await it.__anext__()
                    except StopAsyncIteration:
                        raise SparkSourceError(
                            f"amqlite: the broker ended the read of stream {queue!r} "
                            f"before offset {end - 1}"
                        ) from None
                if waited.cancelled_caught:
                    raise SparkSourceError(
                        f"amqlite: stream {queue!r} sent nothing for {idle_timeout:g}s "
                        f"while offsets up to {end - 1} were expected"
                    )
                taken += 1
                if taken % ack_every == 0:
                    await conn.ack(d.delivery_tag, multiple=True)
                offset = d.offset
                if offset is None or offset >= end:
                    break
                chunk.append(
                    delivery_row(offset, d.exchange, d.routing_key, d.headers, d.body, d.properties)
                )
                if offset == end - 1:
                    break
                if len(chunk) >= CHUNK:
                    await put(chunk)
                    chunk = []
            if chunk:
                await put(chunk)

    yield from _pumped(access, queue, produce, what="read")


#: ``fetch_range``: bytes per fetch (within the default 4 MiB frame) and fetches in flight
FETCH_BYTES = 2 * 1024 * 1024
FETCHES_IN_FLIGHT = 3
_RETRY_FIRST, _RETRY_MAX = 0.005, 0.2  # polling an HA master whose passive lags


def fetch_range(
    access: ServerAccess,
    queue: str,
    start: int,
    end: int,
    *,
    idle_timeout: float = 30.0,
    max_bytes: int = FETCH_BYTES,
    in_flight: int = FETCHES_IN_FLIGHT,
    fail_on_data_loss: bool = False,
) -> Iterator[Any]:
    """The records of offsets ``[start, end)`` of stream ``queue``, in order, as
    :class:`~amqlite.client.bulk.StreamBatch` objects (``stream.fetch``: no
    consumer; ``in_flight`` fetches of about ``max_bytes`` at once, on consecutive
    sub-ranges, handed on in offset order).

    Offsets retention removed are skipped, as a consumer skips them, unless
    ``fail_on_data_loss``, when they raise SparkSourceError. Raises it too when
    offsets below ``end`` stay unreadable for ``idle_timeout`` seconds."""
    if start >= end:
        return

    async def produce(put: Any) -> None:
        async with access._connect("amqlite-spark-fetch") as conn:
            # sub-ranges sized from the records seen so far (first: a guess)
            sizes = {"bytes": 0, "records": 0}

            def span() -> int:
                if not sizes["records"]:
                    return max(1, max_bytes // 256)
                per = max(1, sizes["bytes"] // sizes["records"])
                return max(1, max_bytes // per)

            async def read(lo: int, hi: int, out: trio.MemorySendChannel[Any]) -> None:
                async with out:
                    at, waited, pause = lo, 0.0, _RETRY_FIRST
                    while at < hi:
                        batch = await conn.fetch_stream(queue, at, hi, max_bytes)
                        if batch.dropped and fail_on_data_loss:
                            raise SparkSourceError(
                                f"amqlite: offsets {at} to {at + batch.dropped - 1} of stream "
                                f"{queue!r} were removed by retention before they were read "
                                "(failOnDataLoss is true)"
                            )
                        if batch.count:
                            sizes["bytes"] += len(batch.bodies) + len(batch.keys) + 16 * len(batch)
                            sizes["records"] += batch.count
                            await out.send(batch)
                            at, waited, pause = batch.next, 0.0, _RETRY_FIRST
                        elif batch.first >= hi:
                            return  # the rest was removed by retention
                        else:  # not readable yet (an HA passive catching up)
                            if waited >= idle_timeout:
                                raise SparkSourceError(
                                    f"amqlite: stream {queue!r} gave nothing for "
                                    f"{idle_timeout:g}s while offsets from {at} to {hi - 1} "
                                    "were expected"
                                )
                            await trio.sleep(pause)
                            waited += pause
                            at = max(at, batch.first)
                            pause = min(pause * 2, _RETRY_MAX)

            async with trio.open_nursery() as nursery:
                pending: list[trio.MemoryReceiveChannel[Any]] = []
                at = start
                while at < end or pending:
                    while at < end and len(pending) < max(1, in_flight):
                        # on a block boundary: the broker answers whole blocks from
                        # replies it encoded once
                        hi = min(end, -(-(at + span()) // FETCH_BLOCK) * FETCH_BLOCK)
                        send, receive = trio.open_memory_channel[Any](1000)
                        nursery.start_soon(read, at, hi, send)
                        pending.append(receive)
                        at = hi
                    async with pending.pop(0) as receive:
                        async for batch in receive:
                            await put(batch)

    yield from _pumped(access, queue, produce)


def _pumped(
    access: ServerAccess, queue: str, produce: Any, *, what: str = "fetch"
) -> Iterator[Any]:
    """Run ``produce(put)`` under its own ``trio.run`` in a helper thread and yield
    what it puts, in order (at most a few items ahead of the caller)."""
    items: queue_mod.Queue[Any] = queue_mod.Queue(maxsize=8)
    token: list[trio.lowlevel.TrioToken] = []
    cancel: list[trio.CancelScope] = []

    async def put(item: Any) -> None:
        await trio.to_thread.run_sync(items.put, item, abandon_on_cancel=True)

    async def main() -> None:
        token.append(trio.lowlevel.current_trio_token())
        with trio.CancelScope() as scope:
            cancel.append(scope)
            await produce(put)

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # handed to the reading side
            items.put(exc)
        else:
            items.put(_DONE)

    thread = threading.Thread(target=run, name=f"amqlite-{what}-{queue}", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is _DONE:
                return
            while isinstance(item, BaseExceptionGroup):
                item = item.exceptions[0]  # a nursery's (first) failure: the fetches' cause
            if isinstance(item, SparkSourceError):
                raise item
            if isinstance(item, AmqliteError):
                raise _unreachable(access, item) if _is_link_error(item) else item
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        if thread.is_alive() and token and cancel:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(cancel[0].cancel, trio_token=token[0])
            while thread.is_alive():  # drain so a blocked put can finish
                with contextlib.suppress(queue_mod.Empty):
                    items.get(timeout=0.1)


def _is_link_error(exc: AmqliteError) -> bool:
    from amqlite.errors import ConnectionClosed, ConnectionRefused

    return isinstance(exc, ConnectionClosed | ConnectionRefused)


@dataclass(frozen=True)
class PublishSummary:
    published: int


#: ``publish_wire``: ``publish.batch`` frames in flight and bytes per frame
BATCHES_IN_FLIGHT = 4
BATCH_BYTES = 512 * 1024


def _frames(messages: list[list[Any]], limit: int) -> Iterator[list[list[Any]]]:
    """``messages`` cut into frames of about ``limit`` bytes."""
    chunk: list[list[Any]] = []
    size = 0
    for m in messages:
        n = len(m[1]) + 4 * len(m[0]) + 12
        if len(m) > 2:
            n += len(cbor2.dumps(m[2:]))
        if chunk and size + n > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(m)
        size += n
    if chunk:
        yield chunk


def _wire_frames(messages: list[list[Any]], limit: int) -> list[list[list[Any]]]:
    return list(_frames(messages, limit))


def publish_wire(
    access: ServerAccess,
    exchange: str,
    batches: Iterable[Any],
    *,
    mandatory: bool = True,
    persistent: bool = False,
    in_flight: int = BATCHES_IN_FLIGHT,
    encode: Callable[[Any, int], Sequence[Any]] = _wire_frames,
) -> PublishSummary:
    """Publish ``batches`` to ``exchange``: each turned by ``encode(batch,
    frame_bytes)`` (in a worker thread, while frames already made are in flight)
    into ``publish.batch`` frames of about ``frame_bytes``, each a list of wire
    messages (``[key, body]`` or ``[key, body, headers, props]``; the default:
    ``batches`` are lists of them) or a :class:`~amqlite.client.bulk.BatchColumns`.
    A few frames in flight; returns once every message is confirmed, or raises the
    first refusal (a nack, an unroutable message when ``mandatory``; its index
    counts from the first message of the call) or a lost connection that could not
    be restored. A frame not confirmed when the link breaks is sent again on the
    next (same publish keys: at least once)."""
    it = iter(batches)

    def take(limit: int) -> Sequence[Any] | None:
        batch = next(it, _DONE)
        return None if batch is _DONE else encode(batch, limit)

    async def run() -> int:
        sent = 0
        async with access._connect("amqlite-spark-write") as conn:
            limit = max(1024, min(BATCH_BYTES, conn.max_frame - 4096))
            pending: list[Any] = []

            async def settle(p: Any) -> None:
                refused = await p.wait()
                if refused:
                    raise refused[0][1]

            while (frames := await trio.to_thread.run_sync(take, limit)) is not None:
                for frame in frames:
                    if len(pending) >= max(1, in_flight):
                        await settle(pending.pop(0))
                    if isinstance(frame, BatchColumns):
                        pending.append(
                            await conn.publish_columns_nowait(
                                exchange,
                                frame,
                                mandatory=mandatory,
                                persistent=persistent,
                                base=sent,
                            )
                        )
                        sent += frame.count
                        continue
                    pending.append(
                        await conn.publish_batch_nowait(
                            exchange, frame, mandatory=mandatory, persistent=persistent, base=sent
                        )
                    )
                    sent += len(frame)
            for p in pending:
                await settle(p)
        return sent

    try:
        return PublishSummary(trio.run(run))
    except (NotFound, PreconditionFailed) as exc:
        raise SparkSourceError(f"amqlite: cannot publish to exchange {exchange!r}: {exc}") from exc
    except AmqliteError as exc:
        if _is_link_error(exc):
            raise _unreachable(access, exc) from exc
        raise


def publish_rows(
    access: ServerAccess,
    exchange: str,
    rows: Iterable[Mapping[str, Any]],
    *,
    mandatory: bool = True,
    persistent: bool = False,
    batch: int = 1000,
) -> PublishSummary:
    """Publish each row (``routing_key``, ``body`` bytes or text, optional
    ``headers`` and ``message_id``) to ``exchange`` with confirms; returns once
    every one is confirmed, or raises the first failure (a nack, an unroutable
    message when ``mandatory``, a lost connection that could not be restored)."""
    it = iter(rows)

    def take() -> list[Mapping[str, Any]]:
        out = []
        for row in it:
            out.append(row)
            if len(out) >= batch:
                break
        return out

    async def run() -> int:
        count = 0
        async with access._connect("amqlite-spark-write") as conn:
            pendings = []
            while True:
                rows_now = await trio.to_thread.run_sync(take)
                if not rows_now:
                    break
                for row in rows_now:
                    body = row.get("body")
                    if body is None:
                        body = b""
                    elif isinstance(body, bytearray | memoryview):
                        body = bytes(body)
                    headers = row.get("headers")
                    message_id = row.get("message_id")
                    pendings.append(
                        await conn.publish_nowait(
                            exchange,
                            str(row.get("routing_key") or ""),
                            body,
                            headers=dict(headers) if headers else None,
                            properties={"message_id": str(message_id)} if message_id else None,
                            mandatory=mandatory,
                            persistent=persistent,
                        )
                    )
                    count += 1
                for pending in pendings:
                    await pending.wait()
                pendings.clear()
            await conn.wait_for_confirms()
        return count

    try:
        return PublishSummary(trio.run(run))
    except (NotFound, PreconditionFailed) as exc:
        raise SparkSourceError(f"amqlite: cannot publish to exchange {exchange!r}: {exc}") from exc
    except AmqliteError as exc:
        if _is_link_error(exc):
            raise _unreachable(access, exc) from exc
        raise
