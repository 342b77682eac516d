"""One framed link: a trio stream carrying amqlite frames, for every shell that
speaks the protocol (the client, the server's connections, the HA peer link, the
peering dials). It imports neither :mod:`amqlite.client` nor
:mod:`amqlite.server`.

A :class:`FramedLink` is a stream, a sans-IO :class:`~amqlite.protocol.Connection`
and the plumbing around them, written once:

* **writing**: everything outgoing is appended to one ``bytearray``
  (:attr:`FramedLink.out`); a writer task swaps it out and sends it with one
  ``send_all``, so sending never schedules a task per frame. The hot paths append
  encoded frames themselves and wake the writer with ``if not link.kicked:
  link.kick()``. ``before_flush`` runs before each swap (the client turns its
  marked acks into frames there). Flow control: :attr:`FramedLink.pending`,
  :meth:`~FramedLink.wait_writable` (below ``high_water``), ``on_drained`` (called
  after a send leaves less than ``low_water`` queued), :meth:`~FramedLink.wait_flushed`.
* **reading**: :meth:`~FramedLink.receive` reads once, feeds the protocol and
  marks the heartbeat clock; the caller's reader then takes the events
  (``proto.events(limit)`` for batches, ``proto.next_event()`` one at a time).
* **plain TCP** (a ``trio.SocketStream``, not TLS) is read and written on its file
  descriptor: a write the socket takes whole costs no task switch (trio's
  ``send_all`` yields after every send), and a read after a short one waits for
  the socket to be readable instead of first failing with ``EAGAIN`` (trio's
  ``receive_some`` tries, then waits, then yields after the read). A broker with
  ten consumer connections makes ten times the small sends and reads of one with
  one consumer; this halves their scheduling. The turn a send took is spent before
  it instead: a send of fewer than :data:`GATHER_BELOW` bytes waits one scheduler
  turn for more frames (fewer, larger sends; the other end reads and acks less
  often). A partial write, a read that would
  block and every other stream go the trio way; tests/test_link_tcp.py checks the
  bytes both ways and the reporting of an end of stream and a reset.
* **heartbeats**: a watchdog on one :class:`~amqlite.protocol.HeartbeatClock` sends a
  ``heartbeat`` when we have been quiet for an interval and fails the link when the
  other end has been silent for ``misses`` intervals; before
  :meth:`~FramedLink.start_heartbeat` it only enforces ``handshake_timeout``.
* **lifetime**: :meth:`~FramedLink.run` owns the writer, the watchdog and the
  caller's reader in one nursery; when the reader returns, the writer drains
  (bounded by ``close_timeout``), and the stream is always closed (shielded,
  bounded). A failure (the stream broke, the other end went silent, no handshake in
  time) is recorded once in :attr:`~FramedLink.error`, reported once through
  ``on_lost``, and aborts the link. Nothing here raises into the caller except
  the reader's own exceptions.

:func:`dial` opens TCP (and TLS over it when given an :class:`ssl.SSLContext`: the
server's certificate is checked against the context's CAs and ``server_hostname``,
the dialed host by default; a failure is a DialFailed naming the reason, see
:func:`amqlite.tls.describe_tls_error`), says ``hello`` and waits for ``welcome``;
:func:`open_link` does the same on a stream that is already open. Both raise
:class:`DialFailed` (``refused`` with the server's code and text, or why the
handshake never finished: unreachable, end of stream, timeout, protocol error).

How each user drives it:

* **client** (:mod:`amqlite.client.transport`): ``link, welcome = await
  dial(...)``; ``link.start_heartbeat(welcome.heartbeat)``; ``await
  link.run(reader)`` in the connection's nursery, where ``reader`` loops ``await
  link.receive()`` + ``proto.events()`` into the connection; ``before_flush``
  emits coalesced acks, ``on_lost`` starts a reconnect. Publishers append
  ``proto.send_publish(...)`` to ``link.out`` and wait on ``wait_writable()``.
* **server, a client's connection** (:mod:`amqlite.server.connection`):
  ``FramedLink(stream, Connection(Role.SERVER), handshake_timeout=...,
  high_water=..., low_water=..., on_drained=..., on_lost=...)``; its reader loops
  ``await link.receive()`` and runs ``proto.events(FRAMES_PER_TURN)`` batches with
  a checkpoint after each full one, awaits authentication in a thread when the
  batch holds the ``hello`` (a batch ends at a state change, so nothing behind
  the hello is decoded before the welcome), sends the ``welcome`` and then calls
  ``link.start_heartbeat(negotiate_heartbeat(ours, hello.heartbeat))``;
  deliveries are appended to ``link.out`` with ``send_deliver``; a session paused
  above ``high_water`` resumes in ``on_drained``; ``on_lost`` only logs. The
  reader returns after a ``close`` (answered), a ``close-ok``, the end of the
  stream or an error frame, and ``run`` drains and closes; a server-side close
  sends ``close`` and reads on until the ``close-ok``.
* **HA peer link** (:mod:`amqlite.server.ha`): ``link, welcome = await dial(peer
  host, port, Hello(role="ha-peer"), timeout=the failover timeout, at least 1
  s)`` (the HA machine has its own heartbeats: no ``start_heartbeat``);
  ``link.send(HaSync(...))``; a reader that hands ``HaSynced`` / ``HaHeartbeat``
  events to the replicator; ``run`` returns when the link ends, and the caller
  backs off and dials again.
* **peering dial** (:mod:`amqlite.server.peering.transport`): ``dial(...,
  timeout=connect timeout)``; a ``refused`` is ``DialFailed.refused`` (reported to
  the link core with its code); peering maps go out with
  ``link.send_bytes(proto.send_peer(encoded))``; peering's own ``peer.heartbeat``
  maps keep the link alive; ``link.abort()`` when the core says disconnect.

All three dialers see the end of the stream during the handshake alike: a
:class:`DialFailed`.
"""

from __future__ import annotations

import math
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import trio

from amqlite.errors import AmqliteError, ConnectionClosed, ProtocolError, ReplyCode
from amqlite.log import get_logger
from amqlite.protocol import DEFAULT_MAX_FRAME, NEED_DATA, Connection, HeartbeatClock, Role
from amqlite.protocol import events as ev
from amqlite.tls import describe_tls_error

log = get_logger("amqlite.link")

#: Bytes asked of the stream per read.
RECEIVE_SIZE = 256 * 1024
#: The writer holds a send of fewer bytes for one more scheduler turn.
GATHER_BELOW = 16 * 1024
_POSIX = os.name == "posix"
#: How long the writer may take to send what is queued when a link ends, and how
#: long closing the stream may take.
CLOSE_TIMEOUT = 2.0

_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

#: How a TCP stream to ``(host, port)`` is opened (a parameter of :func:`dial`).
OpenStream = Callable[[str, int], Awaitable[trio.abc.Stream]]


class DialFailed(AmqliteError):
    """The handshake did not end in a ``welcome``. With ``refused`` the server
    refused us and ``code``/``text`` are its own; otherwise ``text`` says why
    (unreachable, closed, timed out, a protocol error) and ``code`` is 320, or the
    code of the server's ``close``."""

    code = ReplyCode.CONNECTION_FORCED

    def __init__(self, text: str, code: int | None = None, *, refused: bool = False) -> None:
        super().__init__(text, code)
        self.refused = refused


def describe_os_error(exc: BaseException) -> str:
    """A short reason for a failed connect or a broken stream: ``connection
    refused``, ``unknown host``, ``timed out``..."""
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    causes: list[BaseException] = [exc]
    group = exc.__cause__
    if isinstance(group, BaseExceptionGroup):
        causes = list(group.exceptions)
    for c in causes:
        if isinstance(c, ConnectionRefusedError):
            return "connection refused"
        if isinstance(c, TimeoutError):
            return "timed out"
    for c in causes:
        if isinstance(c, OSError) and c.strerror:
            return c.strerror.lower()
    return str(exc) or type(exc).__name__


class WireProtocol(Protocol):
    """What a link needs of its sans-IO protocol connection: bytes in, and the bytes
    of one heartbeat out. amqlite's native :class:`~amqlite.protocol.Connection` and
    :class:`~amqlite.amqp.AmqpConnection` (the AMQP 0-9-1 listener) both are."""

    def receive_data(self, data: bytes | bytearray) -> None: ...
    def send_heartbeat(self) -> bytes: ...


P = TypeVar("P", bound=WireProtocol)


class WireLink(Generic[P]):
    """A stream, its protocol connection, a writer, a heartbeat watchdog (see the
    module docstring), for any :class:`WireProtocol`; :class:`FramedLink` is the
    one over amqlite's native protocol. ``remote_address`` names the other end in
    errors and logs. The callbacks are attributes too: a dialed link gets them
    after :func:`dial`."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        proto: P,
        *,
        remote_address: str = "",
        high_water: int = 1024 * 1024,
        low_water: int = 256 * 1024,
        before_flush: Callable[[], None] | None = None,
        on_drained: Callable[[], None] | None = None,
        on_lost: Callable[[AmqliteError], None] | None = None,
        handshake_timeout: float | None = None,
        close_timeout: float = CLOSE_TIMEOUT,
    ) -> None:
        self.stream = stream
        self.proto = proto
        self.remote_address = remote_address
        #: Frames waiting for the writer; append and then :meth:`kick`.
        self.out = bytearray()
        self.clock = HeartbeatClock(0.0)
        self.high_water = high_water
        self.low_water = low_water
        self.close_timeout = close_timeout
        #: True while the writer has been woken and has not taken ``out`` yet: the
        #: hot paths skip :meth:`kick` then.
        self.kicked = False
        #: Why the link failed (None while it has not).
        self.error: AmqliteError | None = None
        #: True once the link failed or was aborted: nothing more will be sent.
        self.dead = False
        #: Called before each swap of :attr:`out` (it may append frames).
        self.before_flush = before_flush
        #: Called after a send leaves fewer than ``low_water`` bytes queued.
        self.on_drained = on_drained
        #: Called once, with :attr:`error`, when the link fails.
        self.on_lost = on_lost
        self._handshake_timeout = handshake_timeout
        self._opened = trio.Event()
        self._heartbeat_frame = b""
        self._wake = trio.Event()
        self._drained: trio.Event | None = None
        self._in_flight = 0
        self._closing = False
        self._writer_done = trio.Event()
        self._scope = trio.CancelScope()
        self._short_read = False
        #: bytes the last :meth:`receive` read (the server's memory alarm counts them)
        self.last_read = 0

    # --- running --------------------------------------------------------------------

    async def run(self, reader: Callable[[], Awaitable[object]]) -> None:
        """Run the writer, the watchdog and ``reader`` until the reader returns or the
        link is aborted; then let the writer send what is queued (at most
        ``close_timeout``) and close the stream. Raises what ``reader`` raises."""
        error: Exception | None = None
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._writer)
                    nursery.start_soon(self._watchdog)
                    try:
                        await reader()
                    except Exception as exc:  # re-raised once the tasks are down
                        error = exc
                    else:
                        self.close()
                        with trio.move_on_after(self.close_timeout):
                            await self._writer_done.wait()
                    nursery.cancel_scope.cancel()
        finally:
            self.dead = True
            self._signal_drained()
            with trio.CancelScope(shield=True), trio.move_on_after(self.close_timeout):
                try:
                    await self.stream.aclose()
                except _STREAM_ERRORS:  # a TLS stream's close_notify on a dead socket
                    await trio.aclose_forcefully(self.stream)
        if error is not None:
            raise error

    def start_heartbeat(self, interval: float, misses: int = 3) -> None:
        """The handshake is over: heartbeat every ``interval`` seconds (0: never) and
        fail the link after ``misses`` silent intervals. Ends ``handshake_timeout``."""
        clock = self.clock
        clock.interval, clock.misses = interval, misses
        clock.start(trio.current_time())
        if clock.enabled:
            # encoded now, while the connection is open: when the watchdog first
            # sends it the reader may already have seen the other end's close
            self._heartbeat_frame = self.proto.send_heartbeat()
        self._opened.set()

    def fail(self, error: AmqliteError) -> None:
        """The link is lost for ``error`` (the first one counts): report it through
        ``on_lost`` once. The caller aborts or lets the reader end."""
        if self.dead:
            return
        self.dead = True
        self.error = error
        self._signal_drained()
        if self.on_lost is not None:
            self.on_lost(error)

    def close(self) -> None:
        """Send what is queued, then close the stream (the reader then ends)."""
        self._closing = True
        self.kick()

    def abort(self) -> None:
        """Stop now: the writer, the watchdog and the reader are cancelled, unsent
        bytes are dropped, and :meth:`run` closes the stream."""
        self.dead = True
        self._signal_drained()
        self._scope.cancel()

    async def aclose(self) -> None:
        """:meth:`abort`, and close the stream at once (also when :meth:`run` never ran)."""
        self.abort()
        await trio.aclose_forcefully(self.stream)

    # --- writing --------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        """Queue frames the protocol connection encoded (``send_deliver``,
        ``send_publish``, ``send_peer``...)."""
        self.out += data
        if not self.kicked:
            self.kick()

    def kick(self) -> None:
        """Wake the writer (after appending to :attr:`out`)."""
        self.kicked = True
        self._wake.set()

    @property
    def closing(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closing

    @property
    def pending(self) -> int:
        """Bytes queued or being sent."""
        return len(self.out) + self._in_flight

    @property
    def flushed(self) -> bool:
        return not self.out and not self._in_flight

    async def wait_writable(self) -> None:
        """Wait while ``high_water`` bytes or more are queued (and the link lives)."""
        while len(self.out) >= self.high_water and not self.dead:
            await self._wait_drained()

    async def wait_flushed(self) -> None:
        """Wait until everything queued so far has been handed to the kernel (or the
        link has died)."""
        while not self.flushed and not self.dead and not self._writer_done.is_set():
            self.kick()
            await self._wait_drained()

    async def _wait_drained(self) -> None:
        if self._drained is None:
            self._drained = trio.Event()
        await self._drained.wait()

    def _signal_drained(self) -> None:
        d = self._drained
        if d is not None:
            self._drained = None
            d.set()

    async def _writer(self) -> None:
        stream, clock = self.stream, self.clock
        try:
            while True:
                # always a checkpoint, even when kicked meanwhile: what the other
                # tasks append in that turn goes out in the same send_all
                await self._wake.wait()
                if len(self.out) < GATHER_BELOW:
                    # and a small send waits one turn more for what comes in it (the
                    # turn trio's send_all took after sending): a broker pushing to ten
                    # consumers sends ten times the small writes of one consumer, and
                    # each costs the other end a read and an ack frame
                    await trio.lowlevel.cancel_shielded_checkpoint()
                self._wake = trio.Event()
                self.kicked = False
                if self.before_flush is not None:
                    self.before_flush()
                data = self.out
                if data:
                    self.out = bytearray()
                    self._in_flight = len(data)
                    fd = self._plain_fd()
                    sent = 0
                    if fd >= 0:  # plain TCP: see the module docstring
                        try:
                            sent = os.write(fd, data)
                        except BlockingIOError:
                            sent = 0
                    if sent < len(data):
                        await stream.send_all(memoryview(data)[sent:] if sent else data)
                    self._in_flight = 0
                    clock.sent(trio.current_time())
                    if self.on_drained is not None and len(self.out) < self.low_water:
                        self.on_drained()
                self._signal_drained()
                if self._closing and not self.out:
                    break
            await stream.aclose()
        except _STREAM_ERRORS as exc:
            self.fail(self._lost_error(exc))
            self.abort()
        except Exception as exc:  # a bug (in before_flush, say): the link dies of it
            log.exception("link_writer_failed", remote=self.remote_address)
            err = ConnectionClosed(f"link writer failed: {exc!r}", ReplyCode.INTERNAL_ERROR)
            err.__cause__ = exc
            self.fail(err)
            self.abort()
        finally:
            self._in_flight = 0
            self._writer_done.set()
            self._signal_drained()

    def _lost_error(self, exc: BaseException) -> ConnectionClosed:
        reason = (
            describe_tls_error(exc)
            if isinstance(exc.__cause__, ssl.SSLError)
            else describe_os_error(exc)
        )
        return ConnectionClosed(f"connection to {self.remote_address} lost ({reason})")

    # --- reading --------------------------------------------------------------------

    async def receive(self) -> bool:
        """Read once (up to RECEIVE_SIZE), feed the protocol, mark the clock. False
        when the stream ended (the protocol then yields ``EndOfStream``) or broke
        (the link then fails: :attr:`error` says why)."""
        try:
            plain = await self._receive_plain() if self._plain_fd() >= 0 else None
            data = plain if plain is not None else await self.stream.receive_some(RECEIVE_SIZE)
            self.last_read = len(data)
            self._short_read = self.last_read < RECEIVE_SIZE
        except _STREAM_ERRORS as exc:
            if not (self._closing and isinstance(exc, trio.ClosedResourceError)):
                self.fail(self._lost_error(exc))
            return False
        self.clock.received(trio.current_time())
        self.proto.receive_data(data)
        return bool(data)

    def _plain_fd(self) -> int:
        """The socket's file descriptor when the stream is a plain TCP stream (not
        TLS, not a wrapper), else -1."""
        stream = self.stream
        if type(stream) is trio.SocketStream and _POSIX:
            return stream.socket.fileno()
        return -1

    async def _receive_plain(self) -> bytes | None:
        """One read straight from the socket: after a short read (the socket was
        drained) wait until it is readable first; after a full one, let the others
        run first. None: nothing to read after all (the caller reads the trio way)."""
        stream = self.stream
        assert type(stream) is trio.SocketStream
        if self._short_read:
            await trio.lowlevel.wait_readable(stream.socket)
        else:
            await trio.lowlevel.checkpoint()
        fd = stream.socket.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("socket was already closed")
        try:
            return os.read(fd, RECEIVE_SIZE)
        except BlockingIOError:
            return None

    # --- heartbeats -----------------------------------------------------------------

    async def _watchdog(self) -> None:
        if self._handshake_timeout is not None:
            with trio.move_on_after(self._handshake_timeout):
                await self._opened.wait()
            if not self._opened.is_set():
                text = (
                    f"no handshake from {self.remote_address} within {self._handshake_timeout:g}s"
                )
                self.fail(ConnectionClosed(text))
                self.abort()
                return
        await self._opened.wait()
        clock = self.clock
        if not clock.enabled:
            return
        while True:
            now = trio.current_time()
            if clock.remote_silent(now):
                silent = clock.interval * clock.misses
                text = f"{self.remote_address} sent nothing for {silent:g}s (heartbeat timeout)"
                self.fail(ConnectionClosed(text))
                self.abort()
                return
            if clock.send_due(now):
                self.send_bytes(self._heartbeat_frame)
                clock.sent(now)
            await trio.sleep_until(clock.next_deadline())


class FramedLink(WireLink[Connection]):
    """A :class:`WireLink` over amqlite's native protocol (frames are events)."""

    def send(self, event: ev.Event) -> None:
        """Queue ``event`` (raises LocalProtocolError when it is not ours to send now)."""
        self.out += self.proto.send(event)
        if not self.kicked:
            self.kick()


# --- opening ----------------------------------------------------------------------------


async def open_link(
    stream: trio.abc.Stream,
    hello: ev.Hello,
    *,
    max_frame_size: int = DEFAULT_MAX_FRAME,
    remote_address: str = "",
) -> tuple[FramedLink, ev.Welcome]:
    """Say ``hello`` on ``stream`` and read up to the ``welcome``; raises DialFailed.
    The stream is the caller's to close on failure. Bytes that came after the
    welcome stay buffered in the link's protocol connection."""
    proto = Connection(Role.CLIENT, max_frame_size=max_frame_size)
    link = FramedLink(stream, proto, remote_address=remote_address)
    try:
        await stream.send_all(proto.send(hello))
    except _STREAM_ERRORS as exc:
        raise DialFailed(describe_os_error(exc)) from None
    while True:
        try:
            event = proto.next_event()
        except ProtocolError as exc:
            raise DialFailed(f"protocol error during the handshake: {exc.text}", exc.code) from None
        if event is NEED_DATA:
            if not await link.receive() and link.error is not None:
                raise DialFailed(link.error.text)
            continue
        if isinstance(event, ev.Welcome):
            return link, event
        if isinstance(event, ev.Refused):
            raise DialFailed(event.text or "refused", event.code, refused=True)
        if isinstance(event, ev.Close):
            raise DialFailed(f"closed during the handshake: {event.text}", event.code)
        if isinstance(event, ev.EndOfStream):
            raise DialFailed("the server closed the connection during the handshake")
        # heartbeats before the welcome are fine; anything else the protocol refused


async def dial(
    host: str,
    port: int,
    hello: ev.Hello,
    *,
    max_frame_size: int = DEFAULT_MAX_FRAME,
    timeout: float = math.inf,  # noqa: ASYNC109 (a timeout becomes a DialFailed naming it)
    open_stream: OpenStream = trio.open_tcp_stream,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> tuple[FramedLink, ev.Welcome]:
    """Open TCP to ``host:port`` (then TLS with ``ssl_context``, verifying the
    name ``server_hostname``, by default ``host``) and :func:`open_link`, all within
    ``timeout`` seconds; raises DialFailed (and leaves no stream open) when that
    fails."""
    remote_address = f"{host}:{port}"
    with trio.move_on_after(timeout):
        try:
            stream: trio.abc.Stream = await open_stream(host, port)
        except OSError as exc:
            raise DialFailed(describe_os_error(exc)) from None
        try:
            if ssl_context is not None:
                stream = await _start_tls(stream, ssl_context, server_hostname or host)
            return await open_link(
                stream, hello, max_frame_size=max_frame_size, remote_address=remote_address
            )
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
    raise DialFailed(f"no answer within {timeout:g}s")


async def _start_tls(
    stream: trio.abc.Stream, context: ssl.SSLContext, server_hostname: str
) -> trio.SSLStream[trio.abc.Stream]:
    """``stream`` past a client-side TLS handshake; raises DialFailed naming why not
    (the stream is the caller's to close)."""
    tls_stream = trio.SSLStream(stream, context, server_hostname=server_hostname)
    try:
        await tls_stream.do_handshake()
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise DialFailed(describe_tls_error(exc)) from None
    return tls_stream
