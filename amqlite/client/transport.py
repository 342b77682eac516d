"""The byte pipe under a client connection: a reader, a writer and heartbeats.

* The reader decodes each received chunk into a batch of events (see
  :mod:`.framing`) and hands the batch to the connection in one call.
* Everything outgoing is appended to one shared ``bytearray``; the writer swaps it
  out and sends it with a single ``send_all``, so publishing and acking never
  schedule a task per message. ``before_flush`` runs just before each swap (the
  connection turns marked acks into frames there).
* The heartbeat task sends a ``heartbeat`` when we have been quiet for an
  interval and declares the server dead after ``misses`` silent intervals.

No task here raises: a failure is reported once through ``on_lost`` and the
tasks wind down. :meth:`Transport.run` owns the three tasks; :meth:`Transport.cancel`
stops them (a reconnecting connection retires each dead transport that way).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import trio

from amqlite.errors import AmqliteError, ConnectionClosed, ProtocolError, ReplyCode
from amqlite.log import get_logger
from amqlite.protocol import Connection, PeerClock
from amqlite.protocol import events as ev

from .dial import describe_os_error
from .framing import FrameReader, Item

log = get_logger("amqlite.client")

RECEIVE_SIZE = 256 * 1024
#: Above this many unsent bytes, publishers wait for the writer.
HIGH_WATER = 1024 * 1024

EventsHandler = Callable[[list[Item]], None]
LostHandler = Callable[[AmqliteError], None]


class Transport:
    """Reader, writer and heartbeat tasks around one stream and its protocol state."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        proto: Connection,
        *,
        heartbeat: float,
        on_events: EventsHandler,
        on_lost: LostHandler,
        before_flush: Callable[[], None],
        peer: str,
    ) -> None:
        self.stream = stream
        self.proto = proto
        self.out = bytearray()
        self.clock = PeerClock(heartbeat)
        self.peer = peer
        self._on_events = on_events
        self._on_lost = on_lost
        self._before_flush = before_flush
        self._wake = trio.Event()
        #: True while the writer has been woken and has not run yet; lets the hot
        #: paths skip ``Event.set`` (``if not t.kicked: t.kick()``).
        self.kicked = False
        self._drained: trio.Event | None = None
        self._writer_idle = True
        self._shutting_down = False
        self.dead = False
        self._scope = trio.CancelScope()
        # encoded now, while the protocol is OPEN: by the time the heartbeat task
        # first runs, the reader may already have seen the server's close
        self._heartbeat_frame = proto.send(ev.Heartbeat())

    async def run(self) -> None:
        """Run the reader, writer and heartbeat tasks until they end or :meth:`cancel`."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                self.clock.start(trio.current_time())
                nursery.start_soon(self._read_loop)
                nursery.start_soon(self._write_loop)
                if self.clock.enabled:
                    nursery.start_soon(self._heartbeat_loop)

    def cancel(self) -> None:
        """Stop the tasks (call after :meth:`aclose`, or when they no longer matter)."""
        self.dead = True
        self._scope.cancel()

    # --- writing ------------------------------------------------------------------

    def kick(self) -> None:
        """Wake the writer (call after appending to ``out``)."""
        self.kicked = True
        self._wake.set()

    def write(self, data: bytes) -> None:
        self.out += data
        self.kicked = True
        self._wake.set()

    @property
    def flushed(self) -> bool:
        return not self.out and self._writer_idle

    async def wait_writable(self) -> None:
        """Wait while more than HIGH_WATER bytes are waiting to be sent."""
        while len(self.out) >= HIGH_WATER and not self.dead:
            if self._drained is None:
                self._drained = trio.Event()
            await self._drained.wait()

    async def wait_flushed(self) -> None:
        """Wait until everything appended so far has been handed to the kernel."""
        while not self.flushed and not self.dead:
            self.kick()
            if self._drained is None:
                self._drained = trio.Event()
            await self._drained.wait()

    def _signal_drained(self) -> None:
        d = self._drained
        if d is not None:
            self._drained = None
            d.set()

    async def _write_loop(self) -> None:
        stream = self.stream
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                self.kicked = False
                self._before_flush()
                if self.out:
                    data, self.out = self.out, bytearray()
                    self._writer_idle = False
                    await stream.send_all(data)
                    self._writer_idle = True
                    self.clock.sent(trio.current_time())
                self._signal_drained()
                if self._shutting_down and not self.out:
                    await stream.aclose()
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._lost(
                ConnectionClosed(f"connection to {self.peer} lost ({describe_os_error(exc)})")
            )
        except Exception as exc:  # a bug: surface it as a dead connection, with the cause
            log.exception("client_writer_failed", peer=self.peer)
            err = ConnectionClosed(f"client writer failed: {exc!r}", ReplyCode.INTERNAL_ERROR)
            err.__cause__ = exc
            self._lost(err)
        finally:
            self._writer_idle = True
            self._signal_drained()

    def shutdown_after_flush(self) -> None:
        """Send what is queued (e.g. a ``close-ok``), then close the stream."""
        self._shutting_down = True
        self.kick()

    async def aclose(self) -> None:
        """Close the stream now (unsent bytes are dropped)."""
        self.dead = True
        self._signal_drained()
        await trio.aclose_forcefully(self.stream)

    # --- reading ------------------------------------------------------------------

    async def _read_loop(self) -> None:
        proto, stream, clock = self.proto, self.stream, self.clock
        reader = FrameReader(proto)
        on_events = self._on_events
        try:
            events: list[Item] = list(proto.events())  # bytes that came with the welcome
            if events:
                on_events(events)
            while not self.dead:
                data = await stream.receive_some(RECEIVE_SIZE)
                clock.received(trio.current_time())
                events = reader.feed(bytes(data) if type(data) is not bytes else data)
                if events:
                    on_events(events)
                if not data:
                    self._lost(ConnectionClosed(f"{self.peer} closed the connection"))
                    return
        except ProtocolError as exc:
            # the server broke the protocol: tell it why, then hang up
            with contextlib.suppress(ProtocolError):
                self.write(proto.send(ev.Close(code=exc.code, text=exc.text)))
            self._lost(ConnectionClosed(f"protocol error from {self.peer}: {exc}", exc.code))
            self.shutdown_after_flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._lost(
                ConnectionClosed(f"connection to {self.peer} lost ({describe_os_error(exc)})")
            )
        except Exception as exc:  # a bug: surface it as a dead connection, with the cause
            log.exception("client_reader_failed", peer=self.peer)
            err = ConnectionClosed(f"client reader failed: {exc!r}", ReplyCode.INTERNAL_ERROR)
            err.__cause__ = exc
            self._lost(err)

    # --- heartbeats ---------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        clock = self.clock
        frame = self._heartbeat_frame
        while not self.dead:
            now = trio.current_time()
            if clock.peer_dead(now):
                silent = clock.interval * clock.misses
                self._lost(
                    ConnectionClosed(
                        f"{self.peer} sent nothing for {silent:g}s (heartbeat timeout)"
                    )
                )
                await self.aclose()
                return
            if clock.send_due(now):
                self.write(frame)
                clock.sent(now)
            await trio.sleep_until(clock.next_deadline(now))

    # --- failure ------------------------------------------------------------------

    def _lost_error(self, exc: BaseException) -> ConnectionClosed:
        return ConnectionClosed(f"connection to {self.peer} lost ({describe_os_error(exc)})")

    def _lost(self, exc: AmqliteError) -> None:
        if self.dead:
            return
        self.dead = True
        self._signal_drained()
        self._on_lost(exc)
