"""The broker's side of one AMQP 0-9-1 connection: the handshake, then its channels.

It runs on a :class:`~amqlite.link.WireLink` over the sans-IO
:class:`~amqlite.amqp.AmqpConnection` (the same writer, heartbeat watchdog and
closing as a native connection). The handshake is RabbitMQ's: ``start`` (PLAIN
and AMQPLAIN, the capabilities we implement), credentials checked at
``start-ok`` (a refusal is ``connection.close`` 403, as with RabbitMQ's
``authentication_failure_close``), ``tune``, then the vhost at ``open`` (530 when
the user has no access to it; 320 when this node of an HA pair is not the active
one, which clients take as "try the next address").
After it, each channel is an :class:`~.channel.AmqpChannel` over a broker
session. A soft error closes its channel; a hard one the connection.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import structlog
import trio

import amqlite
from amqlite.amqp import (
    NEED_DATA,
    AmqpConnection,
    AmqpError,
    BasicProperties,
    ContentReceived,
    MethodReceived,
    ProtocolHeaderMismatch,
    ProtocolHeaderReceived,
    Role,
)
from amqlite.amqp import methods as m
from amqlite.amqp.spec import Method
from amqlite.amqp.values import FieldTable, decode_table
from amqlite.auth import AuthenticatedUser, AuthRefused
from amqlite.errors import AmqliteError, ReplyCode
from amqlite.link import WireLink

from ..alarms import PublishGate
from ..dispatch import RequestDispatcher
from .channel import AmqpChannel, reply_name

if TYPE_CHECKING:
    from amqlite.broker import Session
    from amqlite.broker.alarms import Resource

    from ..context import NodeView

log = structlog.get_logger("amqlite.amqp")

#: How long we wait for ``close-ok`` after sending ``connection.close``.
CLOSE_OK_TIMEOUT = 5.0
EVENTS_PER_TURN = 64  # events handled before other connections get a turn
HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 512 * 1024
MECHANISMS = "PLAIN AMQPLAIN"

#: What RabbitMQ advertises in ``connection.start`` for what we implement.
CAPABILITIES: dict[str, Any] = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": False,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": False,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}


class AmqpServerConnection:
    """Serves one AMQP 0-9-1 connection until it closes, breaks the protocol, or the
    server stops."""

    role = "client"  # closed by HA fencing and switchover, like a native client

    def __init__(
        self,
        node: NodeView,
        stream: trio.abc.Stream,
        remote_address: str,
        remote_host: str,
        *,
        slot: object | None = None,
    ) -> None:
        """``slot`` is the socket's key in the node's connection counts."""
        cfg = node.config.amqp
        limits = node.config.limits
        self.node = node
        self.slot: object = slot if slot is not None else object()
        self.remote_address = remote_address
        self.remote_host = remote_host
        self.tls = isinstance(stream, trio.SSLStream)
        self.proto = AmqpConnection(
            Role.SERVER,
            frame_max=cfg.frame_max,
            channel_max=cfg.channel_max,
            max_body_size=limits.max_message_size,
            max_body_setting="limits.max_message_size",
        )
        self.link: WireLink[AmqpConnection] = WireLink(
            stream,
            self.proto,
            remote_address=remote_address,
            high_water=HIGH_WATER,
            low_water=LOW_WATER,
            before_flush=self._flush_confirms,
            on_drained=self._drained,
            on_lost=self._lost,
            handshake_timeout=limits.handshake_timeout,
        )
        self.connected_at = trio.current_time()
        #: shut while an alarm blocks this connection (see amqlite.server.alarms)
        self.gate = PublishGate(self.link.clock, self._notify_blocked)
        self.user = ""
        self.vhost = ""
        self.client_name = ""
        self.channels: dict[int, AmqpChannel] = {}
        self._confirming: list[AmqpChannel] = []  # channels with acks due
        self.holder: Session | None = None  # holds the connection's exclusive queues
        self._login = ""
        self._client_properties: FieldTable = {}
        self._user: AuthenticatedUser | None = None
        self._closing = False  # we sent connection.close: wait for close-ok
        self._flow = False  # held back by a full peering link (PeeringView.hold_back)
        self._paused = False
        self._released = False

    @property
    def closing(self) -> bool:
        return self._closing

    # --- running -------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until done; always releases the channels and the socket."""
        try:
            await self.link.run(self._read)
        finally:
            self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        now = trio.current_time()
        for channel in list(self.channels.values()):
            channel.close(now)
        self.channels.clear()
        if self.holder is not None:
            self.holder.close(now)  # the connection's exclusive queues go
            self.holder = None
            log.info("amqp_connection_closed", remote=self.remote_address, user=self.user)
        self.node.pump()

    def _lost(self, error: AmqliteError) -> None:
        log.info("amqp_connection_lost", remote=self.remote_address, reason=error.text)

    async def _read(self) -> None:
        link, gate, node = self.link, self.gate, self.node
        while True:
            if node.peering is not None and any(
                ch.dispatcher.peered_sent for ch in self.channels.values()
            ):  # it published to a peered exchange: a full block link holds it back
                await node.peering.hold_back(
                    self._held_back, link.clock, lambda: self._closing, self._held
                )
            more = await link.receive()
            node.client_read(link.last_read)
            if link.dead:
                return
            if gate.blocked_by is not None and more:
                # blocked by an alarm: what came after we told it waits unread
                await gate.wait_open()
            try:
                keep_going = await self._handle_buffered()
            except AmqpError as exc:
                keep_going = self._protocol_error(exc)
            except Exception:
                log.exception("amqp_request_crashed", remote=self.remote_address, user=self.user)
                error = AmqpError("INTERNAL_ERROR - see the broker log", ReplyCode.INTERNAL_ERROR)
                keep_going = self._protocol_error(error)
            finally:
                self.node.pump()
            if gate.raised:  # an alarm: block this connection if it published
                gate.refresh()
            if not keep_going or not more:
                return
            if self._closing:
                await self._await_close_ok()
                return

    def _held(self, held: bool) -> None:
        self._flow = held

    def _held_back(self) -> bool:
        return any(ch.dispatcher.held_back() for ch in list(self.channels.values()))

    async def _await_close_ok(self) -> None:
        """After our connection.close: read (and drop) until close-ok, bounded."""
        with trio.move_on_after(CLOSE_OK_TIMEOUT):
            while await self.link.receive():
                try:
                    while (event := self.proto.next_event()) is not NEED_DATA:
                        if isinstance(event, MethodReceived) and isinstance(
                            event.method, m.ConnectionCloseOk | m.ConnectionClose
                        ):
                            if isinstance(event.method, m.ConnectionClose):
                                self._send(0, m.ConnectionCloseOk())
                            return
                except AmqpError:
                    return

    def _protocol_error(self, exc: AmqpError) -> bool:
        """Answer ``exc``: close its channel (True: go on) or the connection."""
        if isinstance(exc, ProtocolHeaderMismatch):
            looks_like = "TLS" if exc.received[:1] == b"\x16" else None
            log.info(
                "amqp_wrong_protocol_header",
                remote=self.remote_address,
                looks_like=looks_like,
                hint="a TLS client on a plain port (amqps needs [amqp] tls = true)"
                if looks_like
                else None,
            )
            with contextlib.suppress(AmqliteError):
                self.link.send_bytes(self.proto.send_close_for(exc))
            return False
        channel = self.channels.pop(exc.channel, None) if exc.channel else None
        level = "info" if not exc.closes_connection else "warning"
        getattr(log, level)(
            "amqp_channel_error" if not exc.closes_connection else "amqp_connection_error",
            remote=self.remote_address,
            user=self.user,
            channel=exc.channel,
            code=exc.code,
            text=exc.text,
        )
        if channel is not None:  # its acks already due go out before its close
            with contextlib.suppress(AmqliteError):
                channel.flush_confirms()
        try:
            frame = self.proto.send_close_for(exc)
        except AmqliteError:
            frame = b""
        if channel is not None:
            channel.close(trio.current_time())
        if not frame:
            return False
        self.link.send_bytes(frame)
        if exc.closes_connection or exc.channel == 0:
            self._closing = True
        return True

    async def _handle_buffered(self) -> bool:
        """Run every complete event buffered now; False when the connection ends."""
        proto = self.proto
        gate = self.gate
        now = trio.current_time()
        handled = 0
        while (event := proto.next_event()) is not NEED_DATA:
            if self._closing:
                return True
            t = type(event)
            if t is ContentReceived:
                assert isinstance(event, ContentReceived)
                channel = self._channel(event.channel)
                if isinstance(event.method, m.BasicPublish):
                    gate.published = True
                    if event.properties.delivery_mode == 2:
                        gate.persistent = True
                    channel.publish(event.method, event.properties, event.body, now)
            elif t is MethodReceived:
                assert isinstance(event, MethodReceived)
                number, method = event.channel, event.method
                if number:
                    self._channel_method(number, method, now)
                elif not await self._connection_method(method):
                    return False
            elif t is ProtocolHeaderReceived:
                self._start()
            handled += 1
            if handled == EVENTS_PER_TURN:
                handled = 0
                self.node.pump()
                await trio.lowlevel.checkpoint()
                now = trio.current_time()
        return True

    def _channel(self, number: int) -> AmqpChannel:
        channel = self.channels.get(number)
        if channel is None:  # the core checks channel states: a bug if we get here
            raise AmqpError(f"CHANNEL_ERROR - channel {number} is not open", 504)
        return channel

    def _channel_method(self, number: int, method: Method, now: float) -> None:
        kind = type(method)
        if kind is m.ChannelOpen:
            self._open_channel(number)
        elif kind is m.ChannelClose:
            channel = self.channels.pop(number, None)
            if channel is not None:
                channel.close(now)
            self._send(number, m.ChannelCloseOk())
        elif kind is m.ChannelCloseOk:
            self.channels.pop(number, None)  # released when we sent channel.close
        else:
            self._channel(number).handle(method, now)

    # --- the handshake -------------------------------------------------------------------

    def _start(self) -> None:
        node = self.node
        properties: FieldTable = {
            "product": "amqlite",
            "version": amqlite.__version__,
            "platform": "Python/trio",
            "copyright": "amqlite contributors",
            "information": "amqlite: AMQP 0-9-1 beside its own protocol (see docs/amqp.md)",
            "cluster_name": node.node_id,
            "capabilities": dict(CAPABILITIES),
        }
        self._send(0, m.ConnectionStart(0, 9, properties, MECHANISMS, "en_US"))

    async def _connection_method(self, method: Method) -> bool:
        kind = type(method)
        if kind is m.ConnectionStartOk:
            assert isinstance(method, m.ConnectionStartOk)
            return await self._start_ok(method)
        if kind is m.ConnectionTuneOk:
            assert isinstance(method, m.ConnectionTuneOk)
            heartbeat = float(method.heartbeat)
            # we send when quiet for half the interval and give up after two
            # intervals of silence, as RabbitMQ does
            self.link.start_heartbeat(heartbeat / 2, misses=4)
            return True
        if kind is m.ConnectionOpen:
            assert isinstance(method, m.ConnectionOpen)
            return await self._open(method)
        if kind is m.ConnectionClose:
            # the connection's exclusive queues are gone once the client has close-ok
            self._release()
            self._send(0, m.ConnectionCloseOk())
            return False
        # close-ok ends the connection; update-secret and the like change nothing
        return kind is not m.ConnectionCloseOk

    async def _start_ok(self, start_ok: m.ConnectionStartOk) -> bool:
        self._client_properties = start_ok.client_properties
        product = start_ok.client_properties.get("product", "")
        self.client_name = product if isinstance(product, str) else ""
        credentials = _credentials(start_ok.mechanism, start_ok.response)
        if credentials is None:
            self._close(
                ReplyCode.ACCESS_REFUSED,
                f"ACCESS_REFUSED - unsupported authentication mechanism "
                f"{start_ok.mechanism!r} or malformed response (use {MECHANISMS})",
                start_ok,
            )
            return True
        login, password = credentials
        auth = self.node.authenticator
        args = (login, password, self.remote_host)
        if auth.guest_only:
            refused = auth.check_credentials(*args)
        else:  # scrypt: off the event loop
            refused = await trio.to_thread.run_sync(auth.check_credentials, *args)
        if refused is not None:
            log.warning(
                "amqp_connection_refused",
                remote=self.remote_address,
                login=login,
                reason=refused.log_reason,
            )
            self._close(
                ReplyCode.ACCESS_REFUSED,
                f"ACCESS_REFUSED - Login was refused using authentication mechanism "
                f"{start_ok.mechanism}. For details see the broker logfile.",
                start_ok,
            )
            return True
        self._login = login
        cfg = self.node.config.amqp
        heartbeat = round(cfg.heartbeat)
        self._send(0, m.ConnectionTune(cfg.channel_max, cfg.frame_max, min(heartbeat, 65535)))
        return True

    async def _open(self, open_: m.ConnectionOpen) -> bool:
        node = self.node
        vhost = open_.virtual_host
        result = node.authenticator.authorize(self._login, vhost)
        if isinstance(result, AuthRefused):
            self._close(
                ReplyCode.NOT_ALLOWED,
                f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{self._login}'",
                open_,
            )
            return True
        if node.ha is not None:
            deadline = trio.current_time() + 2 * node.ha.config.failover_timeout_ms / 1000
            admitted, why = await node.ha.admit(deadline)
            if not admitted:
                log.info(
                    "amqp_connection_refused_not_active",
                    remote=self.remote_address,
                    state=node.state,
                )
                # 320, not 530: py-amqp (kombu, Celery) and aio-pika treat 320 as
                # recoverable and try the next address; 530 would end their retries.
                self._close(
                    ReplyCode.CONNECTION_FORCED,
                    f"CONNECTION_FORCED - node {node.node_id} is {node.state}, not the "
                    f"active node of its HA pair ({why}): connect to the other one",
                    open_,
                )
                return True
        if self._closing:  # the server closed us meanwhile
            return True
        reached = node.admit_connection(self.slot, result.name)
        if reached is not None:
            log.warning(
                "amqp_connection_refused",
                remote=self.remote_address,
                login=self._login,
                reason=reached.text,
            )
            self._close(reached.code, f"NOT_ALLOWED - {reached.text}", open_)
            return True
        self._user = result
        self.user, self.vhost = result.name, vhost
        self.holder = node.broker.open_session(vhost, owner=None)
        self._send(0, m.ConnectionOpenOk())
        self.gate.update(node.alarms_raised)
        log.info(
            "amqp_connection_opened",
            remote=self.remote_address,
            user=self.user,
            vhost=vhost,
            client=self.client_name,
            heartbeat=self.proto.heartbeat,
        )
        return True

    def _open_channel(self, number: int) -> None:
        node, user, holder = self.node, self._user, self.holder
        assert user is not None and holder is not None  # the core allows channels once open
        session = node.broker.open_session(self.vhost, owner=None, holder=holder)
        peered = node.peering.hook_for(self.vhost) if node.peering is not None else None
        dispatcher = RequestDispatcher(session, user, self.vhost, node.status, peered=peered)
        channel = AmqpChannel(node, self, number, session, dispatcher)
        session.owner = channel  # the node's pump hands it the session's pushes
        if self._paused:
            channel.set_writable(False)
        self.channels[number] = channel
        self._send(number, m.ChannelOpenOk())

    # --- what channels and the node use ------------------------------------------------

    def _send(self, channel: int, method: Method) -> None:
        with contextlib.suppress(AmqliteError):
            self.send_method(channel, method)

    def send_method(self, channel: int, method: Method) -> None:
        link = self.link
        link.out += self.proto.send_method(channel, method)
        if not link.kicked:
            link.kick()

    def send_content(
        self, channel: int, method: Method, properties: BasicProperties, body: bytes
    ) -> None:
        link = self.link
        link.out += self.proto.send_content(channel, method, properties, body)
        if not link.kicked:
            link.kick()

    def send_deliver(
        self,
        channel: int,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties: BasicProperties,
        body: bytes,
    ) -> None:
        link = self.link
        link.out += self.proto.send_deliver(
            channel,
            consumer_tag,
            delivery_tag,
            redelivered,
            exchange,
            routing_key,
            properties,
            body,
        )
        if not link.kicked:
            link.kick()

    def confirms_pending(self, channel: AmqpChannel) -> None:
        """``channel`` has publisher acks due: they are written before the next send."""
        self._confirming.append(channel)
        link = self.link
        if not link.kicked:
            link.kick()

    def _flush_confirms(self) -> None:
        confirming = self._confirming
        if confirming:
            self._confirming = []
            for channel in confirming:
                with contextlib.suppress(AmqliteError):
                    channel.flush_confirms()

    def fail(self, error: AmqpError) -> None:
        """A channel's deferred reply failed (the disk lost what it promised)."""
        self._protocol_error(error)

    def flow(self) -> None:
        """A channel queued pushes: past HIGH_WATER, stop the sessions' pushes."""
        if len(self.link.out) > HIGH_WATER and not self._paused:
            self._paused = True
            for channel in self.channels.values():
                channel.set_writable(False)

    def _drained(self) -> None:
        if self._paused and len(self.link.out) < LOW_WATER:
            self._paused = False
            for channel in self.channels.values():
                channel.set_writable(True)
            self.node.pump()

    def _close(self, code: int, text: str, method: Method) -> None:
        self._closing = True
        with contextlib.suppress(AmqliteError):
            self.send_method(0, m.ConnectionClose(code, text, method.CLASS_ID, method.METHOD_ID))

    def alarms_changed(self, raised: frozenset[Resource]) -> None:
        """The node's alarms changed: block or unblock a publishing connection."""
        if self.holder is not None and not self._closing:
            self.gate.update(raised)

    def _notify_blocked(self, reason: str | None) -> None:
        """``connection.blocked`` / ``unblocked``, to clients that announced the
        capability (RabbitMQ's rule); the reader stops either way."""
        capabilities = self._client_properties.get("capabilities")
        told = isinstance(capabilities, dict) and capabilities.get("connection.blocked") is True
        if reason is not None:
            if told:
                self._send(0, m.ConnectionBlocked(reason))
            log.info(
                "amqp_connection_blocked",
                remote=self.remote_address,
                user=self.user,
                reason=reason,
                told=told,
            )
        else:
            if told:
                self._send(0, m.ConnectionUnblocked())
            log.info("amqp_connection_unblocked", remote=self.remote_address, user=self.user)

    def close_from_server(self, code: int, text: str) -> None:
        """Tell the client we are closing (320 at shutdown, HA fencing)."""
        if self._closing:
            return
        self._closing = True
        self.gate.release()  # read on, up to the close-ok
        if self.node.peering is not None:
            self.node.peering.room_changed()  # (a reader held back reads on)
        try:
            self.send_method(0, m.ConnectionClose(code, f"{reply_name(code)} - {text}", 0, 0))
        except AmqliteError:
            self.link.close()

    def info(self) -> dict[str, Any] | None:
        """The connection's line in ``status`` (once open)."""
        if self.holder is None:
            return None
        return {
            "remote": self.remote_address,
            "user": self.user,
            "vhost": self.vhost,
            "client": self.client_name,
            "protocol": "amqp-0-9-1",
            "tls": self.tls,
            "channels": len(self.channels),
            "since_s": round(trio.current_time() - self.connected_at, 3),
            **({"blocked": self.gate.blocked_by.reason} if self.gate.blocked_by else {}),
            **({"flow": True} if self._flow else {}),
        }


def _credentials(mechanism: str, response: bytes) -> tuple[str, str] | None:
    """(login, password) from a PLAIN or AMQPLAIN response, None if malformed."""
    try:
        if mechanism == "PLAIN":
            # authzid NUL authcid NUL password (RFC 4616); the authzid is ignored
            parts = response.split(b"\0")
            if len(parts) != 3:
                return None
            return parts[1].decode(), parts[2].decode()
        if mechanism == "AMQPLAIN":
            # a field table without its length prefix: LOGIN and PASSWORD
            table, _ = decode_table(len(response).to_bytes(4, "big") + response, 0)
            login, password = table.get("LOGIN"), table.get("PASSWORD")
            if isinstance(login, bytes):
                login = login.decode()
            if isinstance(password, bytes):
                password = password.decode()
            if isinstance(login, str) and isinstance(password, str):
                return login, password
    except (UnicodeDecodeError, AmqpError):
        return None
    return None
