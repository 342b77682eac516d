"""One client's TCP connection: handshake, request loop, pushes, heartbeats.

Three tasks per connection, owned by one nursery: the reader turns whole batches
of bytes into events and runs them against the broker without a checkpoint per
message; the writer sends everything queued in one ``send_all``; the watchdog
sends heartbeats when we are quiet and drops a peer that went silent.

Flow control: when more than ``HIGH_WATER`` bytes wait for a slow client, the
broker stops pushing to its session (messages stay in their queues or go to other
consumers) until the writer has drained below ``LOW_WATER``.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog
import trio

from amqlite.auth import AuthenticatedUser, Permissions
from amqlite.broker import Session
from amqlite.errors import AmqliteError, RemoteProtocolError, ReplyCode
from amqlite.protocol import NEED_DATA, PROTOCOL_VERSION, Connection, PeerClock, Role
from amqlite.protocol import events as ev

from .dispatch import RequestDispatcher

if TYPE_CHECKING:
    from .node import BrokerNode
    from .storage import NodeStorage

RECEIVE_SIZE = 256 * 1024
FRAMES_PER_TURN = 64  # frames handled before other connections get a turn
HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 512 * 1024
HANDSHAKE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 2.0
MAX_INSTANCE = 64  # longest hello.instance (a client token, see amqlite.broker.dedup)

log = structlog.get_logger("amqlite.server")

_REQUESTS = frozenset(ev.REQUESTS) - {ev.Hello}
# Requests whose ok promises durability: held until the journal has what they
# recorded. (A consume records first deliveries; its ok must not wait, or the
# pushes would overtake it.)
_DURABLE = frozenset(
    {
        ev.Publish,
        ev.ExchangeDeclare,
        ev.ExchangeDelete,
        ev.QueueDeclare,
        ev.QueueDelete,
        ev.QueuePurge,
        ev.QueueBind,
        ev.QueueUnbind,
        ev.OffsetStore,
    }
)


class ClientConnection:
    """Serves one client until it leaves, breaks the protocol, or the server stops."""

    def __init__(self, node: BrokerNode, stream: trio.SocketStream, peer: str, peer_host: str):
        self.node = node
        self.stream = stream
        self.peer = peer
        self.peer_host = peer_host
        self.proto = Connection(Role.SERVER, max_frame_size=node.config.server.max_frame_bytes)
        self.clock = PeerClock(0.0)
        self.connected_at = trio.current_time()
        self.user = ""
        self.vhost = ""
        self.client_name = ""
        self.session: Session | None = None
        self.dispatcher: RequestDispatcher | None = None
        self._out = bytearray()
        # HA: pushes waiting until the passive node holds their message, in order:
        # (message id, stream, offset, frame); a message id of 0 and no stream = a
        # frame that only keeps its place behind them
        self._held_pushes: deque[tuple[int, str, int, bytes]] = deque()
        self._wake = trio.Event()
        self._closing = False  # no more requests are run; the writer exits once drained
        self._paused = False
        self._opened = trio.Event()
        self._cancel_scope: trio.CancelScope | None = None
        self._released = False
        self.peer_mode = False  # the HA pair's peer link (hello role "ha-peer")
        self.monitor = False  # may only ask for status (hello role "monitor")
        self.peer_link = False  # an exchange peering link (hello role "peer-link")
        self.peer_link_id: str | None = None  # the link end it carries, once attached
        self.permissions: Permissions | None = None

    # --- the tasks -----------------------------------------------------------------

    async def run(self) -> None:
        """Serve until done; always releases the session and the socket."""
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
        self._released = True
        if self._held_pushes:
            self._held_pushes.clear()  # unacked in the session, which requeues them
            if self.node.storage is not None:
                self.node.storage.discard_waiter(self._push_replicated)
        if self.peer_mode and self.node.ha is not None:
            self.node.ha.inbound_links -= 1
        if self.peer_link and self.node.peering is not None:
            self.node.peering.on_closed(self)
        if self.session is not None:
            self.session.close(trio.current_time())
            self.session = None
            self.node.pump()
            log.info("connection_closed", peer=self.peer, user=self.user, vhost=self.vhost)

    async def _writer(self, done: trio.Event) -> None:
        try:
            while True:
                if not self._out:
                    if self._closing:
                        return
                    self._wake = trio.Event()
                    await self._wake.wait()
                    continue
                data, self._out = self._out, bytearray()
                await self.stream.send_all(data)
                self.clock.sent(trio.current_time())
                if self._paused and len(self._out) < LOW_WATER and self.session is not None:
                    self._paused = False
                    self.session.set_writable(True)
                    self.node.pump()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._abort()
        finally:
            done.set()

    async def _watchdog(self) -> None:
        with trio.move_on_at(self.connected_at + HANDSHAKE_TIMEOUT):
            await self._opened.wait()
        if not self._opened.is_set():
            log.warning("handshake_timeout", peer=self.peer)
            self._abort()
            return
        while True:
            now = trio.current_time()
            if self.clock.peer_dead(now):
                log.warning("heartbeat_missed", peer=self.peer, user=self.user)
                self._abort()
                return
            if self.clock.send_due(now):
                self._send(self.proto.send(ev.Heartbeat()))
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
                log.warning("protocol_error", peer=self.peer, code=exc.code, text=exc.text)
                self._send(proto.send(ev.Close(exc.code, exc.text)))
                return
            except Exception:
                log.exception("request_crashed", peer=self.peer, user=self.user)
                with contextlib.suppress(AmqliteError):
                    text = "internal error: the broker logged it; the connection is closed"
                    self._send(proto.send(ev.Close(ReplyCode.INTERNAL_ERROR, text)))
                return
            finally:
                self.node.pump()
            if not keep_going or not data:
                return

    async def _handle_buffered(self, now: float) -> bool:
        """Run every complete request buffered now; False when the connection ends."""
        proto = self.proto
        storage = self.node.storage
        journal = storage.journal if storage is not None else None
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
            dispatcher = self.dispatcher
            special = self.peer_mode or self.monitor or self.peer_link
            if special and not self._closing and t in _REQUESTS:
                self._special(event)
                continue
            if dispatcher is not None and not self._closing and t in _REQUESTS:
                # only requests whose ok promises durability look at the journal
                before = journal.appended if journal is not None and t in _DURABLE else -1
                reply = dispatcher.handle(event, now)
                if t is ev.Cancel:
                    self.push()  # the consumer's last deliveries go before its cancel-ok
                if reply is not None:
                    if type(reply) is ev.Error:
                        self._log_failure(event, reply)
                    elif before >= 0 and type(reply) is ev.Ok:
                        assert journal is not None and storage is not None
                        if journal.appended != before:
                            # an ok that promises durability: after the commit covers it
                            storage.hold(before + 1, self.send_reply, event, reply)
                            continue
                        if dispatcher.duplicate:  # vouches for a first copy: wait for it
                            dispatcher.duplicate = False
                            storage.hold_for_all(self.send_reply, event, reply)
                            continue
                    self._send(proto.send(reply))
            elif t is ev.EndOfStream or t is ev.CloseOk:
                return False
            elif t is ev.Close:
                self._send(proto.send(ev.CloseOk()))
                return False
            elif self._closing or t is ev.Heartbeat:
                continue  # after our close, drop what the peer sent before it saw it
            elif isinstance(event, ev.Hello):
                if not await self._handshake(event):
                    return False
            elif isinstance(event, ev.BadRequest):
                log.info("bad_request", peer=self.peer, code=event.code, text=event.text)
                self._send(proto.send(ev.Error(event.id, event.code, event.text)))

    def _special(self, event: ev.Event) -> None:
        """A request on the HA peer link or on a monitor connection."""
        ha = self.node.ha
        if self.peer_mode and ha is not None:
            if isinstance(event, ev.HaHeartbeat):
                ha.on_peer_heartbeat(event)
                self._send_ha_heartbeat()
                return
            if isinstance(event, ev.HaSync):
                ha.on_sync(event, self)
                return
        peering = self.node.peering
        if self.peer_link and isinstance(event, ev.PeerMessage) and peering is not None:
            peering.on_frame(self, event.msg)
            return
        if self.monitor and isinstance(event, ev.Status):
            self._send(self.proto.send(ev.Ok(event.id, self.node.status())))
            return
        if self.monitor and isinstance(event, ev.HaSwitchover) and ha is not None:
            ha.start_switchover(event, self.send_reply)
            return
        rid = getattr(event, "id", None)
        what = (
            "the HA peer link"
            if self.peer_mode
            else "a peering link"
            if self.peer_link
            else "a monitor connection"
        )
        text = f"{event.METHOD!r} is not allowed on {what}"
        self._send(self.proto.send(ev.Error(rid, ReplyCode.NOT_ALLOWED, text)))

    def _send_ha_heartbeat(self) -> None:
        """Answer on the peer's link, so it hears us even before our own link is up."""
        ha = self.node.ha
        if ha is not None and ha.machine is not None:
            self._send(self.proto.send(ev.HaHeartbeat(**ha.machine.heartbeat().to_map())))

    def _log_failure(self, event: ev.Event, reply: ev.Event) -> None:
        assert isinstance(reply, ev.Error)
        log.info(
            "request_failed", peer=self.peer, method=event.METHOD, code=reply.code, text=reply.text
        )

    # --- handshake -----------------------------------------------------------------

    async def _handshake(self, hello: ev.Hello) -> bool:
        node = self.node
        refusal: tuple[int, str, str] | None = None
        if hello.protocol != PROTOCOL_VERSION:
            text = f"protocol version {hello.protocol} is not supported (use {PROTOCOL_VERSION})"
            refusal = (ReplyCode.NOT_IMPLEMENTED, text, text)
        elif hello.role not in ("client", "monitor", "ha-peer", "peer-link"):
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
            args = (hello.login, hello.password, hello.vhost, self.peer_host)
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
                        self._send(
                            self.proto.send(ev.Refused(hello.id, ReplyCode.NOT_ACTIVE, text))
                        )
                        log.info("connection_refused_not_active", peer=self.peer, state=node.state)
                        return False
                return self._open(hello, result)
            refusal = (result.code, result.text, result.log_reason)
        code, text, reason = refusal
        log.warning(
            "connection_refused",
            peer=self.peer,
            login=hello.login,
            vhost=hello.vhost,
            code=code,
            reason=reason,
        )
        self._send(self.proto.send(ev.Refused(hello.id, code, text)))
        return False

    def _open(self, hello: ev.Hello, user: AuthenticatedUser) -> bool:
        node = self.node
        self.user, self.vhost, self.client_name = user.name, hello.vhost, hello.client
        if hello.role == "ha-peer":
            self.peer_mode = True
            if node.ha is not None:
                node.ha.inbound_links += 1
        elif hello.role == "monitor":
            self.monitor = True
        elif hello.role == "peer-link":
            self.peer_link = True
            self.permissions = user.permissions
        else:
            try:
                session = node.broker.open_session(hello.vhost, owner=self)
            except AmqliteError as exc:
                self._send(self.proto.send(ev.Refused(hello.id, exc.code, exc.text)))
                return False
            self.session = session
            peered = node.peering.hook_for(hello.vhost) if node.peering is not None else None
            self.dispatcher = RequestDispatcher(
                session,
                user.name,
                hello.vhost,
                user.permissions,
                node.status,
                instance=hello.instance,
                peered=peered,
            )
        ours, theirs = node.config.server.heartbeat, hello.heartbeat
        heartbeat = min(ours, theirs) if ours > 0 and theirs > 0 else max(ours, theirs)
        self.clock = PeerClock(heartbeat)
        self.clock.start(trio.current_time())
        self._opened.set()
        self._send(
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
        if self.peer_mode:
            self._send_ha_heartbeat()
        log.info(
            "connection_opened",
            peer=self.peer,
            user=user.name,
            vhost=hello.vhost,
            client=hello.client,
            heartbeat=heartbeat,
        )
        return True

    # --- called by the node ------------------------------------------------------------

    def push(self) -> None:
        """Encode the deliveries and cancellations the broker has for this session."""
        session = self.session
        if session is None:
            return
        send_deliver = self.proto.send_deliver
        out = self._out
        storage = self.node.storage
        if storage is not None and storage.replica_upto is not None:
            self._push_gated(session, storage)
            return
        try:
            for d in session.take_deliveries():
                out += send_deliver(d.ctag, d.dtag, d.redelivered, d.message, d.offset)
            for tag, code, text in session.take_cancellations():
                out += self.proto.send(ev.Cancelled(tag, code, text))
        except AmqliteError:
            # Our protocol side is closing (the client said close): what was taken
            # stays unacked in the session, which requeues it when it closes. This
            # runs in whichever task pumped, so it must never raise there.
            return
        if out:
            self._flow()

    def _push_gated(self, session: Session, storage: NodeStorage) -> None:
        """``push`` while HA replicates: a journaled message goes out only once the
        passive node holds it, and nothing overtakes a held push."""
        send_deliver = self.proto.send_deliver
        held = self._held_pushes
        was_holding = bool(held)
        try:
            vhost = self.vhost
            for d in session.take_deliveries():
                frame = send_deliver(d.ctag, d.dtag, d.redelivered, d.message, d.offset)
                pid, offset = d.message.pid, d.offset
                if offset is not None:
                    if held or not storage.stream_replicated(vhost, d.queue, offset):
                        held.append((0, d.queue, offset, frame))
                        continue
                elif held or (pid and not storage.replicated(pid)):
                    held.append((pid, "", 0, frame))
                    continue
                self._out += frame
            for tag, code, text in session.take_cancellations():
                frame = self.proto.send(ev.Cancelled(tag, code, text))
                if held:
                    held.append((0, "", 0, frame))
                else:
                    self._out += frame
        except AmqliteError:
            return  # closing: see push
        if held and not was_holding:
            storage.when_replicated(self._push_replicated)
        self._flow()

    def _push_replicated(self) -> None:
        """The passive node holds more: send the held pushes it now holds."""
        held = self._held_pushes
        storage = self.node.storage
        while held:
            pid, stream, offset, _ = held[0]
            if storage is not None and (
                (pid and not storage.replicated(pid))
                or (stream and not storage.stream_replicated(self.vhost, stream, offset))
            ):
                break
            self._out += held.popleft()[3]
        if not held and storage is not None:
            storage.discard_waiter(self._push_replicated)
        self._flow()

    def _flow(self) -> None:
        """Wake the writer; past HIGH_WATER stop the session's pushes."""
        out = self._out
        if out:
            self._wake.set()
            if len(out) > HIGH_WATER and not self._paused:
                self._paused = True
                if self.session is not None:
                    self.session.set_writable(False)

    def send_reply(self, reply: ev.Event) -> None:
        """Send a reply the journal held until its records were committed."""
        if self._released:
            return  # gone: its requests' fate is what the client could not observe
        with contextlib.suppress(AmqliteError):
            self._send(self.proto.send(reply))

    def close_from_server(self, code: int, text: str) -> None:
        """Tell the client we are closing (e.g. 320 at shutdown); run() then ends."""
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(AmqliteError):  # not open yet: just drop the connection
            self._send(self.proto.send(ev.Close(code, text)))
        self._wake.set()

    def send_map(self, msg: dict[str, Any]) -> None:
        """Peering: send one ``peer`` frame."""
        if self._closing:
            return
        with contextlib.suppress(AmqliteError):
            self._send(self.proto.send(ev.PeerMessage(msg)))

    def send_peer(self, msg: bytes) -> None:
        """Peering: send one ``peer`` frame whose map ``msg`` is already encoded."""
        if self._closing:
            return
        with contextlib.suppress(AmqliteError):
            self._send(self.proto.send_peer(msg))

    def may_peer(self, exchange: str) -> bool:
        """Peering: may this link's user publish to and read from ``exchange``?"""
        perms = self.permissions
        return perms is not None and all(
            perms.allows(kind, exchange or "amq.default") for kind in ("write", "read")
        )

    def close(self, reason: str) -> None:
        """Peering: the link moved on (or a newer connection replaced this one)."""
        self.close_from_server(ReplyCode.CONNECTION_FORCED, reason)

    def info(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "user": self.user,
            "vhost": self.vhost,
            "client": self.client_name,
            "since_s": round(trio.current_time() - self.connected_at, 3),
        }

    # --- helpers -----------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        self._out += data
        self._wake.set()

    def _abort(self) -> None:
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()
