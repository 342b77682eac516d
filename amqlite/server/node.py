"""A broker node: the listener, its client connections and the broker they share."""

from __future__ import annotations

import math
import ssl
import time
from typing import TYPE_CHECKING, Any, Protocol

import structlog
import trio

import amqlite
from amqlite.auth import Authenticator
from amqlite.broker import Broker
from amqlite.broker.alarms import Resource
from amqlite.broker.limits import BrokerLimits, ConnectionLimits, LimitReached
from amqlite.broker.trace import set_trace
from amqlite.config import Config
from amqlite.errors import ReplyCode
from amqlite.store.files import FileLayer
from amqlite.tls import server_context

from .alarms import AlarmService, DiskProbe, MemoryProbe
from .connection import NativeConnection, refuse_plain_hello
from .endpoints import BrowserEndpoint, ClientEndpoint
from .ha import HaService
from .paging import PageFile
from .peering import PeeringQueue, PeeringService
from .storage import NodeStorage
from .tls_accept import accept_tls

if TYPE_CHECKING:
    from .amqp import AmqpServerConnection

    # the HTTP stack (hypercorn, starlette) is imported only by a node that serves
    # HTTP: it is most of a broker's start-up imports
    from .http import BrowserConnection, HttpService


class _PushOwner(Protocol):
    """A session owner the pump hands its pending pushes to."""

    def push(self) -> object: ...


TICK_INTERVAL = 0.1  # seconds between TTL sweeps
SHUTDOWN_GRACE = 5.0
#: Evictions of unauthenticated sockets are logged at most this often (an attack
#: would otherwise write a line per socket).
EVICTION_LOG_INTERVAL = 5.0

log = structlog.get_logger("amqlite.server")


class CannotListen(OSError):
    """A listener could not bind: ``where`` names it (``AMQP 127.0.0.1:5672``)."""

    def __init__(self, where: str, cause: OSError) -> None:
        super().__init__(cause.errno, f"cannot listen on {where}: {cause.strerror or cause}")
        self.where = where


class BrokerNode:
    """Owns the broker, accepts clients, and shuts down gracefully on request."""

    def __init__(
        self,
        config: Config,
        *,
        file_layer: FileLayer | None = None,
        memory_probe: MemoryProbe | None = None,
        disk_probe: DiskProbe | None = None,
    ) -> None:
        """``file_layer`` replaces the journal's operating-system calls, the probes
        the alarms' measurements (tests)."""
        self.config = config
        self.version = amqlite.__version__
        self.state = "standalone"
        self.cluster_addresses: list[str] = []
        self.authenticator = Authenticator(config.users, config.server.vhosts, config.constraints)
        self.connections: set[NativeConnection | AmqpServerConnection | BrowserConnection] = set()
        limits = config.limits
        #: sockets through their handshake or not, counted (docs/protocol.md "Limits")
        self.limits = ConnectionLimits(
            limits.max_connections,
            limits.max_connections_per_user,
            limits.max_unauthenticated_connections,
        )
        self._evictions_logged = 0
        self._eviction_logged_at = -math.inf
        self.node_id = config.server.node_id
        self.port = 0
        self.amqp_port: int | None = None  # bound once running, when [amqp] is on
        #: the session owners :meth:`pump_sized` hands pushes to. AMQP 0-9-1
        #: (``amqlite.amqp``'s method tables, ~0.1 s of a start) is imported only by a
        #: node that serves it, so a restart without ``[amqp]`` does not pay for it.
        self._push_owners: tuple[type[_PushOwner], ...] = (
            ClientEndpoint,
            PeeringQueue,
            BrowserEndpoint,
        )
        if config.amqp.enabled:
            from .amqp import AmqpChannel

            self._push_owners += (AmqpChannel,)
        self.storage = (
            NodeStorage(config.storage, file_layer=file_layer) if config.storage.persist else None
        )
        #: the page file transient messages wait in while memory is short (opened
        #: when the node starts)
        self.pages: PageFile | None = None
        self.broker: Broker = self.new_broker()
        self.ha = HaService(self, config.cluster) if config.cluster.enabled else None
        self.peering: PeeringService | None = PeeringService(self, config.cluster_mta)
        self.http: HttpService | None = None
        if config.http.enabled:
            from .http import HttpService

            self.http = HttpService(self)
        self.alarms = AlarmService(
            config.limits, self._alarms_changed, memory=memory_probe, disk=disk_probe
        )
        #: the TLS listeners' context (one for both: the node has one certificate)
        self.tls_context: ssl.SSLContext | None = (
            server_context(config.tls) if config.server.tls or config.amqp.tls else None
        )
        self.alarms.page = self._page
        self._started_at = 0.0
        self._started_wall = time.time()
        self._stop = trio.Event()
        self._no_connections = trio.Event()
        self.stopped = trio.Event()

    def new_broker(self) -> Broker:
        storage = self.storage
        limits = self.config.limits
        broker = Broker(
            vhosts=self.config.server.vhosts,
            node_id=self.node_id,
            record=storage.record if storage is not None else None,
            limits=BrokerLimits(
                max_queues_per_vhost=limits.max_queues_per_vhost,
                max_consumers_per_connection=limits.max_consumers_per_connection,
                max_message_size=limits.max_message_size,
            ),
            group_resume_timeout=self.config.server.group_resume_timeout,
        )
        if storage is not None and broker.recorder is not None:
            broker.recorder.source = storage.source
            # delivery marks and acks go to the journal as one record per queue and
            # commit (docs/storage.md, "Delivery marks and acks")
            broker.recorder.gather_marks(storage.wake)
            storage.before_commit = broker.recorder.flush_marks
        if self.pages is not None:
            broker.paging.pager = self.pages
            broker.paging.chunks = self.pages
        if self.config.server.trace:
            set_trace(broker, True)
        return broker

    def _open_pages(self, directory: str | None) -> None:
        """The page file (transient messages and backlog chunks while memory is short)."""
        self.pages = PageFile(directory)
        self.broker.paging.pager = self.pages
        self.broker.paging.chunks = self.pages

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until :meth:`stop` (graceful) or cancellation (abrupt).

        With a journal, the node recovers it before it accepts anyone: clients
        that connect meanwhile wait in the listen backlog."""
        cfg = self.config.server
        listeners = await trio.open_tcp_listeners(cfg.port, host=cfg.host)
        self.port = listeners[0].socket.getsockname()[1]
        amqp_listeners: list[trio.SocketListener] = []
        amqp = self.config.amqp
        if amqp.port is not None:
            host = amqp.listen_host(cfg)
            try:
                amqp_listeners = await trio.open_tcp_listeners(amqp.port, host=host)
            except OSError as exc:
                for listener in listeners:
                    await listener.aclose()
                raise CannotListen(f"AMQP {host}:{amqp.port}", exc) from exc
            except BaseException:
                for listener in listeners:
                    await listener.aclose()
                raise
            self.amqp_port = amqp_listeners[0].socket.getsockname()[1]
        if not self.node_id:
            self.node_id = cfg.effective_node_id(self.port)
            self.broker = self.new_broker()
        self._started_at = trio.current_time()
        self.broker.wall_offset = time.time() - self._started_at
        storage = self.storage
        try:
            async with trio.open_nursery() as nursery:
                if storage is not None:
                    # the page file once the data dir is ours, before the rebuild: a
                    # restarted backlog writes its middle out as it is rebuilt
                    await storage.open(
                        cfg.effective_data_dir(self.port),
                        self.broker,
                        locked=lambda: self._open_pages(storage.directory),
                    )
                    await nursery.start(storage.run)
                directory = storage.directory if storage is not None else None
                if self.pages is None:
                    self._open_pages(None)
                await nursery.start(self.alarms.run, directory)
                if self.ha is not None:
                    await nursery.start(self.ha.run)
                if self.peering is not None:
                    await nursery.start(self.peering.run)
                nursery.start_soon(self._ticker)
                if self.http is not None:
                    await self._start_http(nursery)
                async with trio.open_nursery() as accept_nursery:
                    for listener in listeners:
                        accept_nursery.start_soon(self._accept_loop, listener, nursery, False)
                    for listener in amqp_listeners:
                        accept_nursery.start_soon(self._accept_loop, listener, nursery, True)
                    log.info(
                        "server_listening",
                        host=cfg.host,
                        port=self.port,
                        tls=cfg.tls,
                        amqp=self.amqp_listen,
                        amqp_tls=amqp.tls if amqp.enabled else None,
                        http=self.http_listen,
                        node_id=self.node_id,
                        vhosts=list(cfg.vhosts),
                        data_dir=storage.directory if storage is not None else None,
                    )
                    task_status.started(self.port)
                    await self._stop.wait()
                    accept_nursery.cancel_scope.cancel()
                # refuse new connections at once (clients fail over instead of
                # waiting in the backlog), then close the open ones
                with trio.CancelScope(shield=True):
                    for listener in listeners + amqp_listeners:
                        await listener.aclose()
                if self.peering is not None:
                    self.peering.close()
                await self._close_connections()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners + amqp_listeners:
                    await listener.aclose()
                if storage is not None:
                    await storage.close()
                if self.pages is not None:
                    self.pages.close()
            self.stopped.set()
        log.info("server_stopped", node_id=self.node_id)

    async def _start_http(self, nursery: trio.Nursery) -> None:
        assert self.http is not None
        try:
            await nursery.start(self.http.run)
        except OSError as exc:
            cfg = self.config
            where = f"HTTP {cfg.http.listen_host(cfg.server)}:{cfg.http.port}"
            raise CannotListen(where, exc) from exc

    @property
    def http_listen(self) -> str | None:
        """``host:port`` of the HTTP listener (None: not listening)."""
        port = self.http.port if self.http is not None else None
        if port is None:
            return None
        host = self.config.http.listen_host(self.config.server)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def close_clients(self, code: int, text: str) -> None:
        """Close every client connection (not the HA peer link, not monitors):
        HA fencing and switchover."""
        for conn in list(self.connections):
            if conn.role not in ("ha-peer", "monitor"):
                conn.close_from_server(code, text)

    @property
    def alarms_raised(self) -> frozenset[Resource]:
        return self.alarms.raised

    def client_read(self, nbytes: int) -> None:
        """A client connection read ``nbytes`` (the memory alarm counts them)."""
        self.alarms.received(nbytes)

    def _page(self, on: bool) -> int:
        """The memory alarm service's paging switch (see amqlite.server.alarms)."""
        if not on:
            self.broker.stop_paging()
            return 0
        moved = self.broker.page_out()
        if moved:
            log.info("paged_out", messages=moved)
        return moved

    def _alarms_changed(self, raised: frozenset[Resource]) -> None:
        """An alarm was raised or cleared: every connection's gate hears it."""
        for conn in list(self.connections):
            conn.alarms_changed(raised)

    def stop(self) -> None:
        """Begin a graceful shutdown: stop accepting, close clients with 320."""
        self._stop.set()

    @property
    def amqp_listen(self) -> str | None:
        """``host:port`` of the AMQP 0-9-1 listener (None: not listening)."""
        if self.amqp_port is None:
            return None
        host = self.config.amqp.listen_host(self.config.server)
        return f"[{host}]:{self.amqp_port}" if ":" in host else f"{host}:{self.amqp_port}"

    async def _accept_loop(
        self, listener: trio.SocketListener, nursery: trio.Nursery, amqp: bool
    ) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # e.g. EMFILE: back off rather than spin
                log.error("accept_failed", error=str(exc))
                await trio.sleep(0.1)
                continue
            nursery.start_soon(self._serve_client, stream, amqp)

    async def _serve_client(self, stream: trio.SocketStream, amqp: bool = False) -> None:
        try:
            host, port = stream.socket.getpeername()[:2]
        except OSError:
            await stream.aclose()
            return
        remote = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        # One scope per socket: its deadline is the handshake timeout (lifted once
        # the connection is admitted), and cancelling it evicts the socket.
        timeout = self.config.limits.handshake_timeout
        slot = trio.CancelScope(deadline=trio.current_time() + timeout)
        evicted = self.limits.arrived(slot)
        if evicted is not None:
            assert isinstance(evicted, trio.CancelScope)
            evicted.cancel()
            self._log_eviction()
        try:
            with slot:
                await self._serve_socket(stream, amqp, slot, host, remote)
        finally:
            self.limits.left(slot)
            if slot.cancelled_caught:  # evicted, or the handshake took too long
                if trio.current_time() >= slot.deadline:  # (cancel_called is True for both)
                    listener = "amqp" if amqp else "native"
                    log.warning(
                        "handshake_timeout", remote=remote, listener=listener, timeout_s=timeout
                    )
                await trio.aclose_forcefully(stream)

    def _log_eviction(self) -> None:
        """A pending socket was closed to make room: log it, but not every time."""
        now = trio.current_time()
        if now - self._eviction_logged_at < EVICTION_LOG_INTERVAL:
            return
        self._eviction_logged_at = now
        limits = self.limits
        log.warning(
            "unauthenticated_connections_evicted",
            limit=limits.max_pending,
            evicted=limits.evicted - self._evictions_logged,
            evicted_total=limits.evicted,
            reason="limits.max_unauthenticated_connections reached: the oldest socket "
            "without a finished handshake was closed",
        )
        self._evictions_logged = limits.evicted

    def admit_connection(
        self, slot: object, user: str, *, counted: bool = True
    ) -> LimitReached | None:
        """May the connection holding ``slot`` open as ``user``? None: it is open
        (no longer subject to the handshake timeout); else the limit it hit."""
        refusal = self.limits.admit(slot, user, counted=counted)
        if refusal is None and isinstance(slot, trio.CancelScope):
            slot.deadline = math.inf
        return refusal

    async def _serve_socket(
        self,
        stream: trio.SocketStream,
        amqp: bool,
        slot: trio.CancelScope,
        host: str,
        remote: str,
    ) -> None:
        """Serve one accepted socket to its end."""
        client: trio.abc.Stream = stream
        if self.tls_context is not None and (
            self.config.amqp.tls if amqp else self.config.server.tls
        ):
            tls_stream = await accept_tls(
                stream,
                self.tls_context,
                remote=remote,
                listener="amqp" if amqp else "native",
                plain_reply=None if amqp else refuse_plain_hello,
                timeout=self.config.limits.handshake_timeout,
            )
            if tls_stream is None:
                return
            client = tls_stream
        conn: NativeConnection | AmqpServerConnection
        if amqp:
            from .amqp import AmqpServerConnection  # imported with AmqpChannel (__init__)

            conn = AmqpServerConnection(self, client, remote, host, slot=slot)
        else:
            conn = NativeConnection(self, client, remote, host, slot=slot)
        self.connections.add(conn)
        try:
            await conn.run()
        except Exception:
            # A bug must cost one connection, never the node and its other clients.
            log.exception("connection_crashed", remote=remote, user=conn.user)
        finally:
            self.connections.discard(conn)
            if not self.connections:
                self._no_connections.set()

    def add_connection(self, conn: BrowserConnection) -> None:
        """A browser session opened (its socket, if any, is the HTTP listener's)."""
        self.connections.add(conn)

    def remove_connection(self, conn: BrowserConnection) -> None:
        """A browser session ended: out of the node's connections and counts."""
        self.limits.left(conn)
        self.connections.discard(conn)
        if not self.connections:
            self._no_connections.set()

    async def _close_connections(self) -> None:
        if not self.connections:
            return
        log.info("server_stopping", connections=len(self.connections))
        self._no_connections = trio.Event()
        for conn in list(self.connections):
            conn.close_from_server(ReplyCode.CONNECTION_FORCED, "server shutting down")
        with trio.move_on_after(SHUTDOWN_GRACE):
            await self._no_connections.wait()

    async def _ticker(self) -> None:
        while True:
            await trio.sleep(TICK_INTERVAL)
            # only a node serving clients deletes unused queues (x-expires); an HA node
            # that is not (yet) master replays its master's deletes instead
            serving = self.state in ("standalone", "active")
            self.broker.tick(trio.current_time(), expire_queues=serving)
            self.pump()

    def pump(self) -> None:
        """Hand the broker's pending pushes to the connections that own them
        (:meth:`pump_sized`)."""
        self.pump_sized()

    def pump_sized(self) -> int:
        """Hand the broker's pending pushes to the connections that own them; the
        most bytes a native client connection it wrote to now has waiting to be
        sent (0: it wrote to none), by which a publisher's reader sizes its turn.

        The delivery marks gathered meanwhile wait for the next commit, on an HA
        pair too: a passive node that takes over without them (a failover, a quick
        restart of the master) flags every ready message ``redelivered``, and a
        planned switchover journals them before it hands over (docs/ha.md)."""
        broker = self.broker
        fullest = 0
        for session in broker.take_ready():
            owner = session.owner
            if type(owner) is ClientEndpoint:
                waiting = owner.push()
                if waiting > fullest:
                    fullest = waiting
            elif isinstance(owner, self._push_owners):
                owner.push()
        return fullest

    def status(self) -> dict[str, Any]:
        if self.ha is not None:
            self.ha.fold_replica()  # a passive node's broker, up to its last sync
        status = self.broker.status()
        status.update(
            {
                "node_id": self.node_id,
                "version": self.version,
                "uptime_s": round(trio.current_time() - self._started_at, 3),
                "started_at": self._started_wall,
                "state": self.state,
                "listen": f"{self.config.server.host}:{self.port}",
                "amqp_listen": self.amqp_listen,
                "tls": self.tls_status(),
                "http_listen": self.http_listen,
                "data_dir": self.storage.directory if self.storage is not None else None,
                "connections": [i for c in self.connections if (i := c.info()) is not None],
            }
        )
        status.update(self.alarms.status())
        limits = self.limits
        status["limits"]["connections"] = {
            "open": limits.open,
            "max": limits.max_connections,
            "max_per_user": limits.max_per_user,
            "unauthenticated": limits.pending,
            "max_unauthenticated": limits.max_pending,
            "evicted": limits.evicted,
        }
        if self.ha is not None:
            status["ha"] = self.ha.status()
        status["links"] = self.peering.status() if self.peering is not None else []
        storage = self.storage
        if storage is not None:
            status["storage"] = storage.status()
            counts = storage.queue_counts()
            for host in status["vhosts"]:
                for q in host["queues"]:
                    q["persistent"] = counts.get((host["name"], q["name"]), 0)
        else:
            status["storage"] = {"persist": False}
        return status

    def tls_status(self) -> dict[str, Any]:
        """``status`` ``tls``: which listeners speak TLS only (``amqp`` is null
        without an AMQP listener) and the ``[tls]`` rules in force for them and for
        the node's own dials (docs/tls.md)."""
        amqp = self.config.amqp
        tls = self.config.tls
        return {
            "native": self.config.server.tls,
            "amqp": amqp.tls if amqp.enabled else None,
            "verify": tls.verify,
            "min_version": tls.min_version,
        }


async def serve(
    config: Config, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run a broker node until cancelled; ``task_status.started(port)`` once listening."""
    await BrokerNode(config).run(task_status=task_status)
