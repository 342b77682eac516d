"""The raw-trio baseline: a relay with the broker taken out.

``python -m amqlite_bench.baseline --port 0`` listens on loopback and logs one
JSON line ``{"event": "baseline_listening", "port": N}`` on stderr. It speaks
amqlite's framing (4-byte big-endian length, one CBOR map) with a two-frame
handshake: the client sends ``{"m": "hello", "id": 1, "client": "publisher" |
"consumer"}`` and gets ``{"m": "welcome", "re": 1}``.

Every ``publish`` frame read from a publisher is decoded with ``cbor2.loads`` and
re-encoded as a ``deliver`` frame to every connected consumer, with the very
encoder the broker uses (:func:`amqlite.protocol.codec.encode_deliver`): what
is left is the cost of the socket I/O and the codec, the floor under anything a
broker built on them can do. There is no routing, no queue, no validation, no
credit; consumers' ``ack`` frames are decoded and dropped.

The I/O is shaped like the server's: each reader takes whatever the socket has
(up to 256 KiB) and handles every complete frame in it without a checkpoint per
message; each consumer has one writer task that sends everything queued in one
``send_all``; a publisher stops reading while a consumer has more than
``HIGH_WATER`` bytes queued, until it drains below ``LOW_WATER``.
"""

from __future__ import annotations

import argparse
import json
import signal
import struct
import sys
from typing import Any

import cbor2
import trio

from amqlite.protocol.codec import encode_deliver

RECEIVE_SIZE = 256 * 1024
HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 512 * 1024
HANDSHAKE_TIMEOUT = 10.0

_LEN = struct.Struct(">I")


class RelayMessage:
    """What :func:`encode_deliver` needs from a message (``wire`` is its cache)."""

    __slots__ = ("body", "exchange", "headers", "properties", "routing_key", "wire")

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: dict[str, Any],
        properties: dict[str, Any],
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.body = body
        self.headers = headers
        self.properties = properties
        self.wire: bytes | None = None


def frame(m: dict[str, Any]) -> bytes:
    payload = cbor2.dumps(m)
    return _LEN.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into decoded CBOR maps (no validation)."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> list[Any]:
        """Every frame completed by ``data``, decoded."""
        buf = self._buf
        if self._pos:
            del buf[: self._pos]
            self._pos = 0
        buf += data
        out: list[Any] = []
        pos, end = 0, len(buf)
        loads, unpack_from = cbor2.loads, _LEN.unpack_from
        while end - pos >= 4:
            (n,) = unpack_from(buf, pos)
            stop = pos + 4 + n
            if stop > end:
                break
            out.append(loads(buf[pos + 4 : stop]))
            pos = stop
        self._pos = pos
        return out


class _ConsumerLink:
    """One consumer connection: its queued bytes and its delivery tags."""

    __slots__ = ("ctag", "drained", "dtag", "out", "wake")

    def __init__(self, ctag: str) -> None:
        self.ctag = ctag
        self.dtag = 0
        self.out = bytearray()
        self.wake = trio.Event()
        self.drained = trio.Event()


class Relay:
    """Accepts publishers and consumers; relays publishes to every consumer."""

    def __init__(self) -> None:
        self.consumers: list[_ConsumerLink] = []
        self.relayed = 0
        self._next_ctag = 0

    async def serve(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen until cancelled; ``task_status.started(port)`` once listening."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(bound)
                await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            reader = FrameReader()
            with trio.move_on_after(HANDSHAKE_TIMEOUT):
                frames: list[Any] = []
                while not frames:
                    data = await stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        return
                    frames = reader.feed(data)
            if not frames:
                return
            hello = frames[0]
            if not isinstance(hello, dict) or hello.get("m") != "hello":
                return
            welcome = frame({"m": "welcome", "re": hello.get("id", 0)})
            if hello.get("client") == "consumer":
                await self._serve_consumer(stream, reader, welcome)
            else:
                await stream.send_all(welcome)
                await self._serve_publisher(stream, reader, frames[1:])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    async def _serve_publisher(
        self, stream: trio.SocketStream, reader: FrameReader, early: list[Any]
    ) -> None:
        self._relay(early)
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                return
            self._relay(reader.feed(data))
            for link in list(self.consumers):
                while len(link.out) > HIGH_WATER and link in self.consumers:
                    link.drained = trio.Event()
                    await link.drained.wait()

    def _relay(self, frames: list[Any]) -> None:
        links = self.consumers
        n = 0
        for m in frames:
            if m.get("m") != "publish":
                continue
            msg = RelayMessage(
                m.get("exchange", ""),
                m.get("key", ""),
                m.get("body", b""),
                m.get("headers") or {},
                m.get("props") or {},
            )
            for link in links:
                link.dtag += 1
                link.out += encode_deliver(link.ctag, link.dtag, False, msg)
            n += 1
        if n:
            self.relayed += n
            for link in links:
                link.wake.set()

    async def _serve_consumer(
        self, stream: trio.SocketStream, reader: FrameReader, welcome: bytes
    ) -> None:
        self._next_ctag += 1
        link = _ConsumerLink(f"relay-{self._next_ctag}")
        self.consumers.append(link)  # before the welcome: a publisher may follow at once
        try:
            link.out += welcome
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_consumer, stream, link, nursery.cancel_scope)
                while True:
                    data = await stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        break
                    reader.feed(data)  # acks: decoded, dropped
                nursery.cancel_scope.cancel()
        finally:
            self.consumers.remove(link)
            link.drained.set()

    async def _write_consumer(
        self, stream: trio.SocketStream, link: _ConsumerLink, scope: trio.CancelScope
    ) -> None:
        try:
            while True:
                if not link.out:
                    link.wake = trio.Event()
                    await link.wake.wait()
                    continue
                data, link.out = link.out, bytearray()
                await stream.send_all(data)
                if len(link.out) < LOW_WATER:
                    link.drained.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()


async def _run(host: str, port: int) -> None:
    relay = Relay()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(relay.serve, port, host)
            line = {"event": "baseline_listening", "host": host, "port": bound}
            print(json.dumps(line), file=sys.stderr, flush=True)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()
    print(json.dumps({"event": "baseline_stopped", "relayed": relay.relayed}), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m amqlite_bench.baseline",
        description="Raw-trio relay: the I/O and codec floor under amqlite (see module doc).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (loopback)")
    parser.add_argument("--port", type=int, default=0, help="listen port (0 = any free one)")
    args = parser.parse_args(argv)
    trio.run(_run, args.host, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
