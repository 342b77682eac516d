"""The broker's side of one native connection: bytes, heartbeats, the handshake.

Three tasks per connection, owned by one nursery: the reader turns whole batches
of bytes into events and hands each request to the connection's role endpoint
(:mod:`.endpoints`) without a checkpoint per message; the writer sends everything
queued in one ``send_all``; the watchdog sends heartbeats when we are quiet and
drops a client that went silent.

The handshake (protocol version, role, credentials, the HA pair's admission)
chooses the endpoint; after it, this module knows nothing of what a request
means.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import structlog
import trio

from amqlite.auth import AuthenticatedUser
from amqlite.errors import AmqliteError, RemoteProtocolError, ReplyCode
from amqlite.protocol import NEED_DATA, PROTOCOL_VERSION, Connection, HeartbeatClock, Role
from amqlite.protocol import events as ev

from .dispatch import RequestDispatcher
from .endpoints import (
    ClientEndpoint,
    Endpoint,
    HaPeerEndpoint,
    MonitorEndpoint,
    PeeringEndpoint,
)

if TYPE_CHECKING:
    from .context import NodeView

RECEIVE_SIZE = 256 * 1024
FRAMES_PER_TURN = 64  # frames handled before other connections get a turn
HANDSHAKE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 2.0
MAX_INSTANCE = 64  # longest hello.instance (a client token, see amqlite.broker.dedup)
ROLES = ("client", "monitor", "ha-peer", "peer-link")

log = structlog.get_logger("amqlite.server")

_REQUESTS = frozenset(ev.REQUESTS) - {ev.Hello}


class NativeConnection:
    """Serves one native connection until it leaves, breaks the protocol, or the
    server stops; after the handshake its requests go to one role endpoint."""

    def __init__(
        self, node: NodeView, stream: trio.SocketStream, remote_address: str, remote_host: str
    ):
        self.node = node
        self.stream = stream
        self.remote_address = remote_address
        self.remote_host = remote_host
        self.proto = Connection(Role.SERVER, max_frame_size=node.config.server.max_frame_bytes)
        self.clock = HeartbeatClock(0.0)
        self.connected_at = trio.current_time()
        self.user = ""
        self.endpoint: Endpoint | None = None
        self.out = bytearray()
        self._wake = trio.Event()
        self._closing = False  # no more requests are run; the writer exits once drained
        self._opened = trio.Event()
        self._cancel_scope: trio.CancelScope | None = None
        self._released = False

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def role(self) -> str:
        """The endpoint's role ("" until the handshake is done)."""
        return self.endpoint.role if self.endpoint is not None else ""

    # --- the tasks -----------------------------------------------------------------

    async def run(self) -> None:
        """Serve until done; always releases the endpoint and the socket."""
        try:
            async with trio.open_nursery() as nursery:
                self._cancel_scope = nursery.cancel_scope
                writer_done = trio.Event()
                nursery.start_soon(self._writer, writer_done)
                nursery.start_soon(self._watchdog)
                await self._read_loop()
                self._closing = True
                self._wake.set()
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await writer_done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._release()
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await self.stream.aclose()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        if self.endpoint is not None:
            self.endpoint.closed(trio.current_time())

    async def _writer(self, done: trio.Event) -> None:
        try:
            while True:
                if not self.out:
                    if self._closing:
                        return
                    self._wake = trio.Event()
                    await self._wake.wait()
                    continue
                data, self.out = self.out, bytearray()
                await self.stream.send_all(data)
                self.clock.sent(trio.current_time())
                if self.endpoint is not None:
                    self.endpoint.drained(len(self.out))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._abort()
        finally:
            done.set()

    async def _watchdog(self) -> None:
        with trio.move_on_at(self.connected_at + HANDSHAKE_TIMEOUT):
            await self._opened.wait()
        if not self._opened.is_set():
            log.warning("handshake_timeout", remote=self.remote_address)
            self._abort()
            return
        while True:
            now = trio.current_time()
            if self.clock.remote_silent(now):
                log.warning("heartbeat_missed", remote=self.remote_address, user=self.user)
                self._abort()
                return
            if self.clock.send_due(now):
                self._queue(self.proto.send(ev.Heartbeat()))
                self.clock.sent(now)
            await trio.sleep_until(min(self.clock.next_deadline(now), now + 60.0))

    async def _read_loop(self) -> None:
        proto = self.proto
        while True:
            try:
                data = await self.stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            now = trio.current_time()
            self.clock.received(now)
            proto.receive_data(data)
            try:
                keep_going = await self._handle_buffered(now)
            except RemoteProtocolError as exc:
                log.warning(
                    "protocol_error", remote=self.remote_address, code=exc.code, text=exc.text
                )
                self._queue(proto.send(ev.Close(exc.code, exc.text)))
                return
            except Exception:
                log.exception("request_crashed", remote=self.remote_address, user=self.user)
                with contextlib.suppress(AmqliteError):
                    text = "internal error: the broker logged it; the connection is closed"
                    self._queue(proto.send(ev.Close(ReplyCode.INTERNAL_ERROR, text)))
                return
            finally:
                self.node.pump()
            if not keep_going or not data:
                return

    async def _handle_buffered(self, now: float) -> bool:
        """Run every complete request buffered now; False when the connection ends."""
        proto = self.proto
        budget = FRAMES_PER_TURN
        while True:
            event = proto.next_event()
            if event is NEED_DATA:
                return True
            assert isinstance(event, ev.Event)
            budget -= 1
            if not budget:
                # Let other connections run (a consumer's acks free credit) instead
                # of working through a whole 256 KiB read first.
                budget = FRAMES_PER_TURN
                self.node.pump()
                await trio.lowlevel.checkpoint()
                now = trio.current_time()
            t = type(event)
            endpoint = self.endpoint
            if endpoint is not None and not self._closing and t in _REQUESTS:
                endpoint.handle(event, now)
            elif t is ev.EndOfStream or t is ev.CloseOk:
                return False
            elif t is ev.Close:
                self._queue(proto.send(ev.CloseOk()))
                return False
            elif self._closing or t is ev.Heartbeat:
                continue  # after our close, drop what the other end sent before it saw it
            elif isinstance(event, ev.Hello):
                if not await self._handshake(event):
                    return False
            elif isinstance(event, ev.BadRequest):
                log.info(
                    "bad_request", remote=self.remote_address, code=event.code, text=event.text
                )
                self._queue(proto.send(ev.Error(event.id, event.code, event.text)))

    # --- handshake -----------------------------------------------------------------

    async def _handshake(self, hello: ev.Hello) -> bool:
        node = self.node
        refusal: tuple[int, str, str] | None = None
        if hello.protocol != PROTOCOL_VERSION:
            text = f"protocol version {hello.protocol} is not supported (use {PROTOCOL_VERSION})"
            refusal = (ReplyCode.NOT_IMPLEMENTED, text, text)
        elif hello.role not in ROLES:
            text = f"unknown role {hello.role!r} (client, monitor, ha-peer or peer-link)"
            refusal = (ReplyCode.COMMAND_INVALID, text, text)
        elif hello.role == "ha-peer" and node.ha is None:
            text = "this node is not part of an HA pair"
            refusal = (ReplyCode.NOT_ALLOWED, text, text)
        elif len(hello.instance) > MAX_INSTANCE:
            text = f"hello.instance is longer than {MAX_INSTANCE} characters"
            refusal = (ReplyCode.SYNTAX_ERROR, text, text)
        elif len(node.connections) > node.config.server.max_connections:
            refusal = (ReplyCode.NOT_ALLOWED, "too many connections", "max_connections reached")
        else:
            auth = node.authenticator
            args = (hello.login, hello.password, hello.vhost, self.remote_host)
            if auth.guest_only:  # no scrypt to run: a plain comparison
                result = auth.authenticate(*args)
            else:  # scrypt takes ~50 ms on purpose: keep it off the event loop
                result = await trio.to_thread.run_sync(auth.authenticate, *args)
            if isinstance(result, AuthenticatedUser):
                if hello.role in ("client", "peer-link") and node.ha is not None:
                    deadline = trio.current_time() + 2 * node.ha.config.failover_timeout_ms / 1000
                    admitted, why = await node.ha.admit(deadline)
                    if not admitted:
                        text = f"node {node.node_id} is {node.state}: {why}"
                        self._queue(
                            self.proto.send(ev.Refused(hello.id, ReplyCode.NOT_ACTIVE, text))
                        )
                        log.info(
                            "connection_refused_not_active",
                            remote=self.remote_address,
                            state=node.state,
                        )
                        return False
                return self._open(hello, result)
            refusal = (result.code, result.text, result.log_reason)
        code, text, reason = refusal
        log.warning(
            "connection_refused",
            remote=self.remote_address,
            login=hello.login,
            vhost=hello.vhost,
            code=code,
            reason=reason,
        )
        self._queue(self.proto.send(ev.Refused(hello.id, code, text)))
        return False

    def _endpoint_for(self, hello: ev.Hello, user: AuthenticatedUser) -> Endpoint:
        """The role endpoint ``hello`` asks for (AmqliteError: refuse it)."""
        node = self.node
        if hello.role == "ha-peer":
            assert node.ha is not None  # refused in the handshake otherwise
            return HaPeerEndpoint(self, node.ha)
        if hello.role == "monitor":
            return MonitorEndpoint(self, node)
        if hello.role == "peer-link":
            return PeeringEndpoint(
                self, node.peering, user.permissions, user=user.name, vhost=hello.vhost
            )
        session = node.broker.open_session(hello.vhost, owner=None)
        peered = node.peering.hook_for(hello.vhost) if node.peering is not None else None
        dispatcher = RequestDispatcher(
            session,
            user.name,
            hello.vhost,
            user.permissions,
            node.status,
            instance=hello.instance,
            peered=peered,
        )
        endpoint = ClientEndpoint(
            node,
            self,
            session,
            dispatcher,
            user=user.name,
            vhost=hello.vhost,
            client=hello.client,
            connected_at=self.connected_at,
        )
        session.owner = endpoint  # the node's pump hands it the session's pushes
        return endpoint

    def _open(self, hello: ev.Hello, user: AuthenticatedUser) -> bool:
        node = self.node
        try:
            endpoint = self._endpoint_for(hello, user)
        except AmqliteError as exc:
            self._queue(self.proto.send(ev.Refused(hello.id, exc.code, exc.text)))
            return False
        self.user = user.name
        self.endpoint = endpoint
        ours, theirs = node.config.server.heartbeat, hello.heartbeat
        heartbeat = min(ours, theirs) if ours > 0 and theirs > 0 else max(ours, theirs)
        self.clock = HeartbeatClock(heartbeat)
        self.clock.start(trio.current_time())
        self._opened.set()
        self._queue(
            self.proto.send(
                ev.Welcome(
                    hello.id,
                    server=node.node_id,
                    version=node.version,
                    state=node.state,
                    cluster=node.cluster_addresses,
                    heartbeat=heartbeat,
                    max_frame=self.proto.max_frame_size,
                )
            )
        )
        endpoint.opened()
        log.info(
            "connection_opened",
            remote=self.remote_address,
            user=user.name,
            vhost=hello.vhost,
            client=hello.client,
            role=hello.role,
            heartbeat=heartbeat,
        )
        return True

    # --- what endpoints and the node use -----------------------------------------------

    def send(self, event: ev.Event) -> None:
        """Encode and queue ``event`` (nothing once the protocol side is closed)."""
        with contextlib.suppress(AmqliteError):
            self._queue(self.proto.send(event))

    def kick(self) -> None:
        """Wake the writer for frames an endpoint appended to :attr:`out`."""
        self._wake.set()

    def close_from_server(self, code: int, text: str) -> None:
        """Tell the other end we are closing (e.g. 320 at shutdown); run() then ends."""
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(AmqliteError):  # not open yet: just drop the connection
            self._queue(self.proto.send(ev.Close(code, text)))
        self._wake.set()

    def info(self) -> dict[str, Any] | None:
        """The connection's line in ``status`` (client sessions only)."""
        return self.endpoint.info() if self.endpoint is not None else None

    # --- helpers -----------------------------------------------------------------------

    def _queue(self, data: bytes) -> None:
        self.out += data
        self._wake.set()

    def _abort(self) -> None:
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()
