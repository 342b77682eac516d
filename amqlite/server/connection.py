"""The broker's side of one native connection: the handshake, then its endpoint.

The connection runs on a :class:`~amqlite.link.FramedLink` (the writer and its
one out-buffer, the heartbeat watchdog, closing the stream: see
:mod:`amqlite.link`). What it adds is the reader: it takes the decoded events in
batches of ``FRAMES_PER_TURN`` (other connections get a turn between batches; a
turn goes on for more batches, up to ``MAX_FRAMES_PER_TURN`` frames, while the
deliveries it made are spread so thin over consumer connections that each holds
less than ``TURN_BYTES`` to send: a publisher feeding ten consumers then gives each
a write of about fifty deliveries instead of six; and while it made none but its
publishes wait in a peered exchange's run, so that a sending site offers them to
its links in runs of up to ``MAX_FRAMES_PER_TURN``) and hands each request to the
connection's role endpoint (:mod:`.endpoints`) without a checkpoint per message.

The handshake (protocol version, role, credentials, the HA pair's admission)
chooses the endpoint; after it, this module knows nothing of what a request
means. The endpoint sees the connection as its :class:`~.endpoints.Link`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import structlog
import trio

from amqlite.auth import AuthenticatedUser, AuthRefused, Tag, require_tag
from amqlite.errors import AccessRefused, AmqliteError, RemoteProtocolError, ReplyCode
from amqlite.link import FramedLink
from amqlite.protocol import PROTOCOL_VERSION, Connection, PublishRun, Role
from amqlite.protocol import events as ev
from amqlite.protocol.heartbeat import negotiate_heartbeat

from .alarms import PublishGate
from .dispatch import RequestDispatcher
from .endpoints import (
    ClientEndpoint,
    Endpoint,
    HaPeerEndpoint,
    MonitorEndpoint,
    PeeringEndpoint,
)
from .endpoints.client import HIGH_WATER, LOW_WATER

if TYPE_CHECKING:
    from amqlite.broker.alarms import Resource

    from .context import NodeView

FRAMES_PER_TURN = 64  # frames handled before other connections get a turn (at least)
#: a turn goes on past FRAMES_PER_TURN while the consumer connections it pushed to
#: all hold less than TURN_BYTES to send, up to MAX_FRAMES_PER_TURN frames
TURN_BYTES = 8 * 1024
MAX_FRAMES_PER_TURN = 8 * FRAMES_PER_TURN
MAX_INSTANCE = 64  # longest hello.instance (a client token, see amqlite.broker.dedup)
ROLES = ("client", "monitor", "ha-peer", "peer-link")
#: roles a full node still takes, outside its connection counts: the HA pair's own
#: link, and monitors (the operator's `amqlite status`, which needs `monitoring`)
UNCOUNTED_ROLES = ("ha-peer", "monitor")
#: the tag each of the node's own roles needs, and the action it names in a refusal
ROLE_TAGS: dict[str, tuple[Tag, str]] = {
    "ha-peer": ("cluster", "opening an HA peer link (role 'ha-peer')"),
    "monitor": ("monitoring", "opening a monitor connection (role 'monitor')"),
    "peer-link": ("peering", "opening an exchange peering link (role 'peer-link')"),
}

log = structlog.get_logger("amqlite.server")

_REQUESTS = frozenset(ev.REQUESTS) - {ev.Hello}
_Publish = ev.Publish
_PublishRun = PublishRun


class NativeConnection:
    """Serves one native connection until it leaves, breaks the protocol, or the
    server stops; after the handshake its requests go to one role endpoint."""

    def __init__(
        self,
        node: NodeView,
        stream: trio.abc.Stream,
        remote_address: str,
        remote_host: str,
        *,
        slot: object | None = None,
    ):
        """``slot`` is the socket's key in the node's connection counts (its
        :class:`~amqlite.broker.limits.ConnectionLimits`)."""
        self.node = node
        self.slot: object = slot if slot is not None else object()
        self.remote_address = remote_address
        self.remote_host = remote_host
        self.tls = isinstance(stream, trio.SSLStream)
        self.proto = Connection(Role.SERVER, max_frame_size=node.config.server.max_frame_bytes)
        self.link = FramedLink(
            stream,
            self.proto,
            remote_address=remote_address,
            high_water=HIGH_WATER,
            low_water=LOW_WATER,
            on_drained=self._drained,
            on_lost=self._lost,
            handshake_timeout=node.config.limits.handshake_timeout,
        )
        self.connected_at = trio.current_time()
        #: shut while an alarm blocks this connection (client sessions only)
        self.gate = PublishGate(self.link.clock, self._notify_blocked)
        self.user = ""
        self.endpoint: Endpoint | None = None
        self._closing = False  # we said close: no more requests are run
        self._flow = False  # held back by a full peering link (PeeringView.hold_back)
        self._released = False

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def out(self) -> bytearray:
        """The link's out-buffer: endpoints append encoded frames, then :meth:`kick`."""
        return self.link.out

    @property
    def role(self) -> str:
        """The endpoint's role ("" until the handshake is done)."""
        return self.endpoint.role if self.endpoint is not None else ""

    # --- running -------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until done; always releases the endpoint and the socket."""
        try:
            await self.link.run(self._read)
        finally:
            self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        if self.endpoint is not None:
            self.endpoint.closed(trio.current_time())

    def _drained(self) -> None:
        if self.endpoint is not None:
            self.endpoint.drained(len(self.link.out))

    def _lost(self, error: AmqliteError) -> None:
        """The link failed: the stream broke, or the watchdog gave up on the other end."""
        now = trio.current_time()
        timeout = self.node.config.limits.handshake_timeout
        if self.endpoint is None and now - self.connected_at >= timeout:
            log.warning("handshake_timeout", remote=self.remote_address)
        elif self.link.clock.remote_silent(now):
            log.warning("heartbeat_missed", remote=self.remote_address, user=self.user)
        else:
            log.info(
                "connection_lost", remote=self.remote_address, user=self.user, reason=error.text
            )

    async def _read(self) -> None:
        link, gate, node = self.link, self.gate, self.node
        while True:
            endpoint = self.endpoint
            if (
                node.peering is not None
                and isinstance(endpoint, ClientEndpoint)
                and endpoint.dispatcher.peered_sent
            ):  # it published to a peered exchange: a full block link holds it back
                await node.peering.hold_back(
                    endpoint.dispatcher.held_back, link.clock, lambda: self._closing, self._held
                )
            more = await link.receive()
            node.client_read(link.last_read)
            if link.dead:  # the stream broke
                return
            if gate.blocked_by is not None and more:
                # blocked by an alarm: what came after we told it waits unread
                await gate.wait_open()
            try:
                keep_going = await self._handle_buffered()
            except RemoteProtocolError as exc:
                log.warning(
                    "protocol_error", remote=self.remote_address, code=exc.code, text=exc.text
                )
                link.send(ev.Close(exc.code, exc.text))
                return
            except Exception:
                log.exception("request_crashed", remote=self.remote_address, user=self.user)
                with contextlib.suppress(AmqliteError):
                    text = "internal error: the broker logged it; the connection is closed"
                    link.send(ev.Close(ReplyCode.INTERNAL_ERROR, text))
                return
            finally:
                self.node.pump()
            if gate.raised:  # an alarm: block this connection if it published
                gate.refresh()
            if not keep_going or not more:
                return

    async def _handle_buffered(self) -> bool:
        """Run every complete request buffered now; False when the connection ends.
        A batch ends at a state change, so a ``hello`` is the last of its batch and
        nothing behind it is decoded before it is answered."""
        proto = self.proto
        gate = self.gate
        now = trio.current_time()
        turn = 0  # frames handled since this reader last gave the others a turn
        batch: Sequence[ev.Event | PublishRun]
        while True:
            endpoint = self.endpoint  # set at a hello only, which ends its batch
            client = endpoint if type(endpoint) is ClientEndpoint else None
            if client is not None:
                # a client's plain publishes in a row come as one PublishRun
                # (Connection.events_with_publish_runs), handled in one go
                batch, frames = proto.events_with_publish_runs(FRAMES_PER_TURN)
            else:
                batch = proto.events(FRAMES_PER_TURN)
                frames = len(batch)
            if not batch:
                break
            for event in batch:
                t = type(event)
                if t is _PublishRun:
                    if client is not None and not self._closing:
                        gate.published = True
                        client.handle_run(cast(PublishRun, event), now)
                    continue
                event = cast(ev.Event, event)
                if endpoint is not None and not self._closing and t in _REQUESTS:
                    if t is _Publish:
                        gate.published = True
                        if event.props.get("persistent"):  # type: ignore[attr-defined]
                            gate.persistent = True
                    endpoint.handle(event, now)
                elif t is ev.EndOfStream or t is ev.CloseOk:
                    return False
                elif t is ev.Close:
                    self.send(ev.CloseOk())
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
                    self.send(ev.Error(event.id, event.code, event.text))
            if frames == FRAMES_PER_TURN:
                # Let other connections run (a consumer's acks free credit) instead
                # of working through a whole 256 KiB read first; but while what this
                # turn pushed is spread thin over many consumer connections, go on
                # (up to MAX_FRAMES_PER_TURN): each connection's writer then sends,
                # and its client reads and acks, a batch worth a system call.
                fullest = self.node.pump_sized()
                turn += FRAMES_PER_TURN
                if fullest == 0 and client is not None and client.dispatcher.runs_waiting():
                    # A sending site (its publishes only forwarded) goes on too: the
                    # service's flusher then offers and sends runs of up to
                    # MAX_FRAMES_PER_TURN, not FRAMES_PER_TURN, and what each run
                    # costs (the offer, a peer.forwards frame, a write, an ack, and
                    # the receiving site's frame) is spread over eight times the
                    # messages: about a tenth of the sending broker's CPU per
                    # peered message and a twentieth of the receiver's
                    # (benchmarks/peering_cpu.py; benchmarks/README.md, round 15)
                    fullest = 1
                if fullest == 0 or fullest >= TURN_BYTES or turn >= MAX_FRAMES_PER_TURN:
                    turn = 0
                    await trio.lowlevel.checkpoint()
                    now = trio.current_time()
        return True

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
        else:
            auth = node.authenticator
            args = (hello.login, hello.password, hello.vhost, self.remote_host)
            if auth.guest_only:  # no scrypt to run: a plain comparison
                result = auth.authenticate(*args)
            else:  # scrypt takes ~50 ms on purpose: keep it off the event loop
                result = await trio.to_thread.run_sync(auth.authenticate, *args)
            if isinstance(result, AuthenticatedUser):
                try:
                    _check_role(hello.role, result)
                except AccessRefused as exc:
                    result = AuthRefused(exc.code, exc.text, exc.text)
            if isinstance(result, AuthenticatedUser):
                if hello.role in ("client", "peer-link") and node.ha is not None:
                    deadline = trio.current_time() + 2 * node.ha.config.failover_timeout_ms / 1000
                    admitted, why = await node.ha.admit(deadline)
                    if not admitted:
                        text = f"node {node.node_id} is {node.state}: {why}"
                        self.send(ev.Refused(hello.id, ReplyCode.NOT_ACTIVE, text))
                        log.info(
                            "connection_refused_not_active",
                            remote=self.remote_address,
                            state=node.state,
                        )
                        return False
                if self._closing:  # the server closed us while we authenticated
                    return False
                reached = node.admit_connection(
                    self.slot, result.name, counted=hello.role not in UNCOUNTED_ROLES
                )
                if reached is None:
                    return self._open(hello, result)
                result = AuthRefused(reached.code, reached.text, reached.text)
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
        self.send(ev.Refused(hello.id, code, text))
        return False

    def _endpoint_for(self, hello: ev.Hello, user: AuthenticatedUser) -> Endpoint:
        """The role endpoint ``hello`` asks for (AmqliteError: refuse it)."""
        node = self.node
        if hello.role == "ha-peer":
            assert node.ha is not None  # refused in the handshake otherwise
            return HaPeerEndpoint(self, node.ha)
        if hello.role == "monitor":
            return MonitorEndpoint(self, node, user)
        if hello.role == "peer-link":
            return PeeringEndpoint(
                self, node.peering, user.permissions, user=user.name, vhost=hello.vhost, login=user
            )
        session = node.broker.open_session(hello.vhost, owner=None)
        peered = node.peering.hook_for(hello.vhost) if node.peering is not None else None
        dispatcher = RequestDispatcher(
            session,
            user,
            hello.vhost,
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
            log.warning(
                "connection_refused",
                remote=self.remote_address,
                login=hello.login,
                vhost=hello.vhost,
                code=exc.code,
                reason=exc.text,
            )
            self.send(ev.Refused(hello.id, exc.code, exc.text))
            return False
        self.user = user.name
        self.endpoint = endpoint
        heartbeat = negotiate_heartbeat(node.config.server.heartbeat, hello.heartbeat)
        self.link.send(
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
        self.link.start_heartbeat(heartbeat)  # after the welcome: a heartbeat needs OPEN
        endpoint.opened()
        if hello.role == "client":
            self.gate.update(node.alarms_raised)
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
            self.link.send(event)

    def kick(self) -> None:
        """Wake the writer for frames an endpoint appended to :attr:`out`."""
        link = self.link
        if not link.kicked:
            link.kick()

    def alarms_changed(self, raised: frozenset[Resource]) -> None:
        """The node's alarms changed: block or unblock a publishing client."""
        if self.role == "client" and not self._closing:
            self.gate.update(raised)

    def _notify_blocked(self, reason: str | None) -> None:
        if reason is not None:
            self.send(ev.Blocked(reason))
            log.info(
                "connection_blocked", remote=self.remote_address, user=self.user, reason=reason
            )
        else:
            self.send(ev.Unblocked())
            log.info("connection_unblocked", remote=self.remote_address, user=self.user)

    def close_from_server(self, code: int, text: str) -> None:
        """Tell the other end we are closing (e.g. 320 at shutdown); run() ends at
        its close-ok. Before the handshake is done, just drop the connection."""
        if self._closing:
            return
        self._closing = True
        self.gate.release()  # read on, up to the close-ok
        if self.node.peering is not None:
            self.node.peering.room_changed()  # (a reader held back reads on)
        try:
            self.link.send(ev.Close(code, text))
        except AmqliteError:
            self.link.close()

    def _held(self, held: bool) -> None:
        self._flow = held

    def info(self) -> dict[str, Any] | None:
        """The connection's line in ``status`` (client sessions only)."""
        info = self.endpoint.info() if self.endpoint is not None else None
        if info is not None and self.gate.blocked_by is not None:
            info["blocked"] = self.gate.blocked_by.reason
        if info is not None and self._flow:
            info["flow"] = True
        return info


def _check_role(role: str, user: AuthenticatedUser) -> None:
    """AccessRefused (403) unless ``user`` carries the tag ``role`` needs."""
    needed = ROLE_TAGS.get(role)
    if needed is not None:
        require_tag(user, *needed)


#: What a plain-text client on a TLS native port is told.
TLS_ONLY_TEXT = (
    "this port speaks TLS only: dial amqlites://host:port (amqlite CLI: --tls --ca FILE)"
)


def refuse_plain_hello(data: bytes) -> bytes:
    """The ``refused`` (530) for a plain-text ``hello`` that reached a TLS port, so
    the client is told why instead of seeing the socket close; b"" when ``data`` is
    not a whole hello."""
    proto = Connection(Role.SERVER)
    try:
        proto.receive_data(data)
        event = proto.next_event()
        if not isinstance(event, ev.Hello):
            return b""
        return proto.send(ev.Refused(re=event.id, code=ReplyCode.NOT_ALLOWED, text=TLS_ONLY_TEXT))
    except AmqliteError:
        return b""
