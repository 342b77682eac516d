"""A fault-injecting TCP proxy for end-to-end tests: link cuts, partitions, latency, chaos.

The proxy listens on 127.0.0.1 (port 0, never a well-known port) and forwards every
accepted connection to a target that may change at runtime, e.g. to follow an HA
failover. Each direction of a connection is a reader and a writer joined by a small
bounded queue; faults act on the writer, so what was read but not yet written is
exactly what a partition holds. Guarantees:

- each direction is forwarded byte-exact and in order until its connection is cut;
  a cut drops what was still queued, it never reorders;
- a cut resets both sides (SO_LINGER 0): peers see an error or EOF at once;
- while partitioned nothing is written to either side, no upstream connection is
  opened, and EOFs and resets are held like data; ``heal()`` releases them in order,
  as TCP retransmission would, and ``heal(drop=True)`` cuts every connection instead;
- EOF is propagated per direction (half-close); a connection ends when both
  directions have, and an error on either side resets both;
- every task is owned by the nursery of :meth:`FaultProxy.run`.

Test use::

    async with FaultProxy.open(target=("127.0.0.1", port)) as proxy:
        client = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        proxy.cut()
        await proxy.wait_for(lambda stats: stats.cuts >= 1)
"""

from __future__ import annotations

import enum
import random
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Final

import trio

_CHUNK_SIZE: Final = 64 * 1024
_QUEUED_CHUNKS: Final = 16
_RESET_ON_CLOSE: Final = struct.pack("ii", 1, 0)

Target = tuple[str, int]


@dataclass(frozen=True)
class ProxyStats:
    """A snapshot of the proxy's counters.

    ``accepted`` counts every accepted connection, ``refused`` the ones closed at once
    because of ``partition(refuse_new=True)``. ``cuts`` counts connections reset by a
    fault (``cut``, ``heal(drop=True)``, chaos, ``retarget(cut_existing=True)``), not
    ones that ended by error. ``bytes_from_*`` were read by the proxy, ``bytes_to_*``
    were written to the other side; their difference is what is held or was dropped.
    """

    accepted: int = 0
    refused: int = 0
    connect_failures: int = 0
    open: int = 0
    closed: int = 0
    cuts: int = 0
    bytes_from_client: int = 0
    bytes_to_target: int = 0
    bytes_from_target: int = 0
    bytes_to_client: int = 0


class _Direction(enum.Enum):
    TO_TARGET = "to_target"
    TO_CLIENT = "to_client"


@dataclass(frozen=True, slots=True)
class _Chunk:
    """What a reader saw, due for writing at ``due``: bytes, ``b""`` (EOF) or ``None``
    (the source failed, so the link must be reset)."""

    due: float
    data: bytes | None


def _reset(stream: trio.SocketStream) -> None:
    """Close ``stream`` with a TCP reset; idempotent and safe while others wait on it."""
    sock = stream.socket
    if sock.fileno() == -1:
        return
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
    sock.close()


class _Link:
    """One proxied connection: the accepted client side, the upstream side once
    connected, and the cancel scope all of its tasks run in."""

    def __init__(self, client: trio.SocketStream) -> None:
        self.client = client
        self.upstream: trio.SocketStream | None = None
        self.scope = trio.CancelScope()
        self.aborted = False

    def abort(self) -> None:
        """Reset both sides now; the link's tasks unwind through its cancel scope."""
        self.aborted = True
        self.scope.cancel()
        self.close()

    def close(self) -> None:
        for stream in (self.client, self.upstream):
            if stream is None:
                continue
            if self.aborted:
                _reset(stream)
            else:
                stream.socket.close()


class FaultProxy:
    """A loopback TCP proxy whose faults a test triggers at any moment.

    All fault methods are synchronous and take effect before they return (sockets
    are reset, forwarding stops); only their consequences at the peers are
    asynchronous. Use :meth:`wait_for` to wait on the counters.
    """

    def __init__(self, target: Target, *, connect_timeout: float = 5.0) -> None:
        self._target = target
        self._connect_timeout = connect_timeout
        self._port: int | None = None
        self._nursery: trio.Nursery | None = None
        self._links: set[_Link] = set()
        self._latency = 0.0
        self._partitioned = False
        self._refuse_new = False
        self._healed = trio.Event()
        self._healed.set()
        self._chaos_rng: random.Random | None = None
        self._chaos_probability = 0.0
        self._chaos_scope: trio.CancelScope | None = None
        self._counts: dict[str, int] = {}
        self._changed = trio.Event()

    @classmethod
    @asynccontextmanager
    async def open(
        cls, target: Target, *, connect_timeout: float = 5.0
    ) -> AsyncIterator[FaultProxy]:
        """Run a proxy for the duration of the block; exceptions from the block are
        re-raised as they are, not wrapped in an exception group."""
        proxy = cls(target, connect_timeout=connect_timeout)
        body_error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            try:
                yield proxy
            except BaseException as exc:
                body_error = exc
            nursery.cancel_scope.cancel()
        if body_error is not None:
            raise body_error

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1, report ``started(port)``, forward until cancelled."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        listener = listeners[0]
        try:
            async with listener, trio.open_nursery() as nursery:
                self._nursery = nursery
                self._port = listener.socket.getsockname()[1]
                task_status.started(self._port)
                while True:
                    stream = await listener.accept()
                    nursery.start_soon(self._serve, stream)
        finally:
            self._nursery = None
            self._chaos_scope = None

    # -- what tests read -------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FaultProxy is not running")
        return self._port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def target(self) -> Target:
        return self._target

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    @property
    def stats(self) -> ProxyStats:
        return ProxyStats(open=len(self._links), **self._counts)

    async def wait_for(self, predicate: Callable[[ProxyStats], bool]) -> ProxyStats:
        """Wait until ``predicate(stats)`` holds; put a deadline around the call."""
        while True:
            changed = self._changed
            stats = self.stats
            if predicate(stats):
                return stats
            await changed.wait()

    # -- faults ----------------------------------------------------------------------

    def retarget(self, target: Target, *, cut_existing: bool = False) -> None:
        """Send new connections to ``target``; existing ones stay on the old target
        unless ``cut_existing``."""
        self._target = target
        if cut_existing:
            self.cut()

    def cut(self) -> int:
        """Reset every open connection now and return how many; keep accepting."""
        links = [link for link in self._links if not link.aborted]
        for link in links:
            self._cut(link)
        return len(links)

    def partition(self, *, refuse_new: bool = False) -> None:
        """Stop all forwarding, holding what arrives (a write already handed to the
        kernel still lands); new connections are accepted and held too, or reset at
        once if ``refuse_new``."""
        self._refuse_new = refuse_new
        if not self._partitioned:
            self._partitioned = True
            self._healed = trio.Event()
        self._notify()

    def heal(self, *, drop: bool = False) -> None:
        """End a partition: deliver what was held, in order, or with ``drop`` cut
        every connection so nothing from the partition arrives."""
        if not self._partitioned:
            return
        if drop:
            self.cut()
        self._partitioned = False
        self._refuse_new = False
        self._healed.set()
        self._notify()

    def delay(self, seconds: float) -> None:
        """Hold every chunk read from now on for ``seconds`` before writing it; order
        is kept, so lowering the delay never lets a chunk overtake another."""
        if seconds < 0:
            raise ValueError(f"delay must be >= 0, got {seconds}")
        self._latency = seconds

    def chaos(
        self,
        rng: random.Random,
        *,
        cut_probability: float | None = None,
        mean_interval: float | None = None,
    ) -> None:
        """Cut at random, driven by ``rng`` so that a seed reproduces a failure.

        With ``cut_probability``, each chunk about to be forwarded (either way)
        resets its connection with that probability instead; the same seed and the
        same chunk sequence give the same cuts. With ``mean_interval``, ``cut()``
        runs after exponentially distributed pauses of that mean (needs ``run``).
        Replaces any earlier chaos; :meth:`calm` stops it.
        """
        if (cut_probability is None) == (mean_interval is None):
            raise ValueError("give exactly one of cut_probability and mean_interval")
        self.calm()
        if cut_probability is not None:
            if not 0.0 <= cut_probability <= 1.0:
                raise ValueError(f"cut_probability must be in [0, 1], got {cut_probability}")
            self._chaos_rng = rng
            self._chaos_probability = cut_probability
        elif mean_interval is not None:
            if mean_interval <= 0:
                raise ValueError(f"mean_interval must be > 0, got {mean_interval}")
            if self._nursery is None:
                raise RuntimeError("FaultProxy is not running")
            self._chaos_scope = trio.CancelScope()
            self._nursery.start_soon(self._cut_at_random, rng, mean_interval, self._chaos_scope)

    def calm(self) -> None:
        """Stop chaos of either kind."""
        self._chaos_rng = None
        self._chaos_probability = 0.0
        if self._chaos_scope is not None:
            self._chaos_scope.cancel()
            self._chaos_scope = None

    # -- forwarding ------------------------------------------------------------------

    def _count(self, name: str, amount: int = 1) -> None:
        self._counts[name] = self._counts.get(name, 0) + amount
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _cut(self, link: _Link) -> None:
        link.abort()
        self._count("cuts")

    async def _cut_at_random(
        self, rng: random.Random, mean_interval: float, scope: trio.CancelScope
    ) -> None:
        with scope:
            while True:
                await trio.sleep(rng.expovariate(1.0 / mean_interval))
                self.cut()

    async def _pass_partition(self) -> None:
        while self._partitioned:
            await self._healed.wait()

    async def _serve(self, client: trio.SocketStream) -> None:
        self._count("accepted")
        if self._partitioned and self._refuse_new:
            _reset(client)
            self._count("refused")
            return
        link = _Link(client)
        self._links.add(link)
        try:
            with link.scope:
                await self._pass_partition()
                upstream = await self._connect()
                if upstream is None:
                    link.aborted = True
                    return
                link.upstream = upstream
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, link, client, upstream, _Direction.TO_TARGET)
                    nursery.start_soon(self._pump, link, upstream, client, _Direction.TO_CLIENT)
        finally:
            link.close()
            self._links.discard(link)
            self._count("closed")

    async def _connect(self) -> trio.SocketStream | None:
        host, port = self._target
        with trio.move_on_after(self._connect_timeout):
            try:
                return await trio.open_tcp_stream(host, port)
            except OSError:
                pass
        self._count("connect_failures")
        return None

    async def _pump(
        self,
        link: _Link,
        source: trio.SocketStream,
        dest: trio.SocketStream,
        direction: _Direction,
    ) -> None:
        send, receive = trio.open_memory_channel[_Chunk](_QUEUED_CHUNKS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, source, send, direction)
            await self._write(link, dest, receive, direction)

    async def _read(
        self,
        source: trio.SocketStream,
        queue: trio.MemorySendChannel[_Chunk],
        direction: _Direction,
    ) -> None:
        received = "bytes_from_client" if direction is _Direction.TO_TARGET else "bytes_from_target"
        async with queue:
            while True:
                data: bytes | None
                try:
                    data = bytes(await source.receive_some(_CHUNK_SIZE))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = None
                else:
                    self._count(received, len(data))
                await queue.send(_Chunk(trio.current_time() + self._latency, data))
                if not data:
                    return

    async def _write(
        self,
        link: _Link,
        dest: trio.SocketStream,
        queue: trio.MemoryReceiveChannel[_Chunk],
        direction: _Direction,
    ) -> None:
        forwarded = "bytes_to_target" if direction is _Direction.TO_TARGET else "bytes_to_client"
        async with queue:
            async for chunk in queue:
                if chunk.due > trio.current_time():
                    await trio.sleep_until(chunk.due)
                await self._pass_partition()
                if chunk.data is None:
                    link.abort()
                    return
                if (
                    chunk.data
                    and self._chaos_rng is not None
                    and self._chaos_rng.random() < self._chaos_probability
                ):
                    self._cut(link)
                    return
                try:
                    if chunk.data:
                        await dest.send_all(chunk.data)
                    else:
                        await dest.send_eof()
                        return
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    link.abort()
                    return
                self._count(forwarded, len(chunk.data))
