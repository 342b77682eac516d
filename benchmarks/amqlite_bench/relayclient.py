"""Plain-trio clients for the baseline relay, in amqlite's framing.

The publisher builds its frames with the same hand-written encoder as
:mod:`amqlite.client` (:func:`amqlite.protocol.codec.encode_publish`) and sends a
whole batch with one ``send_all``; the consumer reads up to 256 KiB at a time,
decodes every frame with ``cbor2.loads`` and answers each read with one
``ack`` (``multiple``) for the last delivery tag, as a coalescing client would.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from amqlite.protocol.codec import encode_ack, encode_publish

from .baseline import RECEIVE_SIZE, FrameReader, frame
from .plan import STAMP_HEADER, ConsumeTally

HANDSHAKE_TIMEOUT = 10.0


async def _open(
    host: str, port: int, role: str
) -> tuple[trio.SocketStream, FrameReader, list[Any]]:
    """A connection past the handshake, its reader, and any frames that came with
    the welcome."""
    stream = await trio.open_tcp_stream(host, port)
    reader = FrameReader()
    try:
        await stream.send_all(frame({"m": "hello", "id": 1, "client": role}))
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            frames: list[Any] = []
            while not frames:
                data = await stream.receive_some(RECEIVE_SIZE)
                if not data:
                    raise ConnectionError("the relay closed the connection during the handshake")
                frames = reader.feed(data)
        if frames[0].get("m") != "welcome":
            raise ConnectionError(f"the relay answered the hello with {frames[0]!r}")
    except BaseException:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        raise
    return stream, reader, frames[1:]


class RelayPublisher:
    """Buffers ``publish`` frames; :meth:`flush` sends them in one write."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._out = bytearray()
        self._rid = 0

    @classmethod
    async def connect(cls, host: str, port: int) -> RelayPublisher:
        stream, _, _ = await _open(host, port, "publisher")
        return cls(stream)

    def publish(
        self, exchange: str, key: str, body: bytes, headers: dict[str, Any] | None = None
    ) -> None:
        self._rid += 1
        self._out += encode_publish(self._rid, exchange, key, body, headers, None, False, False)

    async def flush(self) -> None:
        if self._out:
            data, self._out = self._out, bytearray()
            await self.stream.send_all(data)

    async def aclose(self) -> None:
        try:
            with trio.move_on_after(5):
                await self.flush()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await self.stream.aclose()


async def consume(
    host: str,
    port: int,
    tally: ConsumeTally,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Connect as a consumer, report ready, and count deliveries until the tally is full."""
    stream, reader, frames = await _open(host, port, "consumer")
    try:
        task_status.started()
        hist = tally.hist
        expected = tally.expected
        clock = time.perf_counter_ns
        ack = bytearray()
        while tally.consumed < expected:
            if not frames:
                data = await stream.receive_some(RECEIVE_SIZE)
                if not data:
                    raise ConnectionError("the relay closed a consumer connection")
                frames = reader.feed(data)
            last = 0
            n = 0
            for m in frames:
                if m.get("m") != "deliver":
                    continue
                if hist is not None:
                    hist.record_value(max(1, (clock() - m["headers"][STAMP_HEADER]) // 1000))
                last = m["dtag"]
                n += 1
            if n:
                tally.consumed += n
                if tally.consumed >= expected:
                    tally.done_ns = clock()
                ack += encode_ack(1, last, True)
                await stream.send_all(ack)
                del ack[:]
            frames = []
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()
