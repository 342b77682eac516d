"""The node's peering service: owns the peering tasks and wires the parts.

One :class:`PeeringService` per node. It owns one
:class:`~amqlite.peering.PeeredExchange` per peered (vhost, exchange): those named
by ``[[cluster_mta]]`` entries (whose links it dials) and those a remote dialer
attached to (created on the first ``peer.hello``). Its tasks, in its nursery: one
per dialed link connection (:mod:`.transport`), one timer that sleeps until the
core's next deadline, one flusher that sends what a turn of work produced. What
the core returns goes to the action applier (:mod:`.applier`); what outlives a
crash (epochs, receive marks, durable sending logs, spill) is :mod:`.durability`'s;
the subscribe side's peering queues are :mod:`.peering_queue`'s. docs/peering.md,
"Shell integration", says what each action does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog
import trio

from amqlite.broker import PEERING_QUEUE_PREFIX, Broker, Session
from amqlite.broker.queue import Queue
from amqlite.config import Config, PeeringConfig
from amqlite.errors import ReplyCode
from amqlite.peering import (
    Address,
    Disconnect,
    LinkSettings,
    OverflowPolicy,
    PeeredExchange,
    PeeringProtocolError,
    Send,
)
from amqlite.peering.wire import Refused
from amqlite.protocol import events as ev
from amqlite.tls import node_client_context

from .applier import ActionApplier
from .durability import PeeringDurability
from .hooks import BindingHook, PublishHook
from .peering_queue import PeeringQueues
from .registry import LinkRegistry
from .transport import AcceptedConnection, DialedLink

if TYPE_CHECKING:
    from amqlite.ha import HaMachine
    from amqlite.protocol.heartbeat import HeartbeatClock
    from amqlite.server.storage import NodeStorage

log = structlog.get_logger("amqlite.peering")

INF = float("inf")
ACCEPTOR_RETENTION = 24 * 3600.0  # an acceptor end waiting this long is removed
EPOCH_RETRY = 1.0  # seconds between attempts to write the epoch while the disk refuses


class HaView(Protocol):
    """What peering reads of the node's HA service: the pair's current term."""

    @property
    def machine(self) -> HaMachine | None: ...


class PeeringNode(Protocol):
    """What peering uses of its broker node (``amqlite.server.node.BrokerNode``)."""

    @property
    def config(self) -> Config: ...

    @property
    def node_id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def storage(self) -> NodeStorage | None: ...

    @property
    def ha(self) -> HaView | None: ...

    def pump(self) -> None: ...


class PeeringService:
    """Every peered exchange of one node and their links; see the module docstring."""

    def __init__(
        self,
        node: PeeringNode,
        links: tuple[PeeringConfig, ...],
        *,
        acceptor_retention: float = ACCEPTOR_RETENTION,
    ) -> None:
        self.node = node
        self.acceptor_retention = acceptor_retention
        self.links_config = links
        # links with tls = true verify the remote against [tls] ca and its host name
        self._tls = (
            node_client_context(node.config.tls) if any(link.tls for link in links) else None
        )
        self.exchanges: dict[tuple[str, str], PeeredExchange] = {}
        self.hooks: dict[str, dict[str, PublishHook]] = {}  # vhost -> exchange -> hook
        #: (vhost, exchange) -> its binding watcher, which also computes its filter
        self._filters: dict[tuple[str, str], BindingHook] = {}
        self.epoch = 0
        self.node_id = ""
        self.active = False  # peering runs (standalone, or the HA pair's active node)
        self.registry = LinkRegistry()
        self.durability = PeeringDurability(node.storage, lambda: node.broker.recorder)
        self.applier = ActionApplier(
            self.registry,
            self.durability,
            session=self.session,
            dial=self._start_dial,
            pump=node.pump,
            turn_ended=self._turn_ended,
        )
        self.queues = PeeringQueues(
            self.registry.queues,
            broker=lambda: node.broker,
            session=self.session,
            feed=self.applier.feed,
            wake=self._wake_timer,
        )
        self._configs: dict[str, PeeringConfig] = {}  # dialer link id -> its entry
        self._accepted: dict[AcceptedConnection, str] = {}  # server connection -> link id
        self._sessions: dict[str, Session] = {}
        self._nursery: trio.Nursery | None = None
        self._activating = False  # waiting for the epoch's next value to be on disk
        self._closing = False
        self._wake = trio.Event()
        self._flush_due = trio.Event()
        self._timer_at = INF  # when the timer task wakes next

    # --- start and stop ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the peering links while this node serves (standalone, or the active node of its HA
        pair): :meth:`ha_state_changed` starts and stops the links."""
        await self.durability.open()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.ha_state_changed()
            nursery.start_soon(self._timer)
            nursery.start_soon(self._flusher)
            task_status.started()

    def close(self) -> None:
        """Shutting down: connection losses are no longer reported to the core."""
        self._closing = True

    def ha_state_changed(self) -> None:
        """Called by the HA service after every change of this node's state."""
        if self._nursery is None or self._activating:
            return  # not running yet (run() looks once it is), or activating
        serving = self.node.ha is None or self.node.state == "active"
        if serving and not self.active:
            self._activate()
        elif not serving and self.active:
            self._deactivate()

    def peering_node_id(self) -> str:
        """An HA pair is one broker to its remotes: both members use the pair's
        addresses as their peering id."""
        cluster = self.node.config.cluster
        if cluster.enabled:
            return f"{cluster.primary_peer},{cluster.backup_peer}"
        return self.node.node_id

    def _activate(self) -> None:
        """Start peering: a new sending-log epoch, the configured links (their
        exchanges declared if missing), the receive marks from the journal."""
        assert self._nursery is not None
        epochs = self.durability.epochs
        counter = epochs.take()
        if counter is None:  # the next value is not on disk yet: activate once it is
            self._activating = True
            self._nursery.start_soon(self._activate_when_reserved)
            return
        self._nursery.start_soon(self._reserve_epoch)  # for the next activation
        # On an HA pair the active term's HA epoch (pair-wide, higher at every
        # promotion) goes in the high bits, so the node that takes over continues
        # above its peer's sending log.
        ha = self.node.ha
        term = ha.machine.epoch if ha is not None and ha.machine is not None else 0
        self.epoch = (term << 32) + counter
        self.active = True
        self.node_id = self.peering_node_id()
        now = trio.current_time()
        counts: dict[tuple[str, str], int] = {}
        for cfg in self.links_config:
            counts[(cfg.vhost, cfg.name)] = counts.get((cfg.vhost, cfg.name), 0) + 1
        durability = self.durability
        durable_logs = durability.journaled
        kept = durability.kept_logs()
        starts = []
        for cfg in self.links_config:
            px = self._exchange_for(cfg.vhost, cfg.name, declare=cfg, max_hops=cfg.max_hops)
            assert px is not None
            alone = counts[(cfg.vhost, cfg.name)] == 1
            link = px.add_link(
                LinkSettings(
                    name=cfg.name if alone else f"{cfg.name}->{cfg.hosts}",
                    mode=cfg.mode,
                    addresses=cfg.host,
                    buffer_bytes=cfg.buffer_bytes,
                    overflow=cfg.overflow,
                    heartbeat=cfg.heartbeat,
                    lease=cfg.lease,
                )
            )
            self._configs[link.id] = cfg
            self.registry.owner[link.id] = px
            starts.append(link)
            if durable_logs:
                link.durable_log = True
                backlog = kept.pop((cfg.vhost, cfg.name, link.id), None)
                if backlog:
                    durability.restore_log(px, link, backlog, now)
        for (vhost_name, exchange, link_id), backlog in kept.items():
            durability.drop_log(vhost_name, exchange, link_id, backlog)
        self.queues.find_orphans(now)
        log.info("peering_started", node=self.node_id, epoch=self.epoch, links=len(starts))
        for link in starts:
            self.applier.apply(link.start(now))
        for hook in self._filters.values():
            hook.refilter(now)

    async def _activate_when_reserved(self) -> None:
        try:
            while True:
                try:
                    await self.durability.epochs.reserve()
                    break
                except OSError as exc:
                    log.error("peering_epoch_write_failed", error=str(exc))
                    await trio.sleep(EPOCH_RETRY)
        finally:
            self._activating = False
        self.ha_state_changed()

    async def _reserve_epoch(self) -> None:
        try:
            await self.durability.epochs.reserve()
        except OSError as exc:  # the next activation tries again
            log.warning("peering_epoch_write_failed", error=str(exc))

    def _deactivate(self) -> None:
        """Stop peering (this HA node became passive): close every link end and
        forget the peering state; the next activation rebuilds it from the journal."""
        now = trio.current_time()
        registry = self.registry
        for px in list(self.exchanges.values()):
            for link_id in list(px.links):
                self.applier.apply(px.remove_link(link_id, now))
            vhost = self.node.broker.vhost(px.ctx.vhost)
            if vhost is not None:
                vhost.watch(px.ctx.exchange, None)
                vhost.on_consumers = None
        self._filters.clear()
        for conn in list(registry.conns.values()):
            conn.close("peering stopped: this node is not active")
        registry.conns.clear()
        self.queues.close_all()
        for hooks in self.hooks.values():
            hooks.clear()  # the dispatchers hold these dicts
        self.exchanges.clear()
        self._configs.clear()
        registry.owner.clear()
        registry.held.clear()
        registry.waiting_since.clear()
        registry.room_changed()  # no link holds a publisher back now
        self.applier.forget()
        self.durability.forget()
        self._sessions.clear()
        self.active = False
        log.info("peering_stopped", node=self.node_id)

    # --- the broker side -------------------------------------------------------------------

    def session(self, vhost: str) -> Session:
        """The service's broker session in ``vhost`` (deliveries, declarations)."""
        session = self._sessions.get(vhost)
        if session is None or session.closed:
            session = self._sessions[vhost] = self.node.broker.open_session(vhost, owner=self)
        return session

    def hook_for(self, vhost: str) -> dict[str, PublishHook]:
        """The dispatcher's view: exchange name -> hook, for one vhost (a live dict)."""
        return self.hooks.setdefault(vhost, {})

    def room_changed(self) -> None:
        """Wake the readers :meth:`hold_back` holds: each checks again."""
        self.registry.room_changed()

    async def hold_back(
        self,
        held_back: Callable[[], bool],
        clock: HeartbeatClock,
        closing: Callable[[], bool],
        flow: Callable[[bool], None],
    ) -> None:
        """A connection's reader, before it reads more, when it published to a peered
        exchange: once what it published went to the links (the flusher runs first),
        wait while ``held_back()`` (a ``block`` link it published to is full) and
        the connection is not ``closing()``. Its heartbeats are not expected
        meanwhile (``clock`` paused, as for an alarm), and ``flow(True)`` /
        ``flow(False)`` say when the wait starts and ends. TCP then pushes back on the
        publisher, and the broker holds at most one read of it for the link
        (docs/peering.md, "Overflow policies")."""
        await trio.lowlevel.checkpoint()  # the read's run is offered to the links
        if not held_back():
            return
        clock.pause()  # (nests with an alarm's)
        flow(True)
        try:
            while not closing():
                room = self.registry.room
                if not held_back():
                    break
                await room.wait()
        finally:
            flow(False)
            clock.resume(trio.current_time())

    def _consumers_changed(self, queue: Queue) -> None:
        """A queue gained or lost a consumer: the filters of the peered exchanges it
        is bound to may change (vhost.on_consumers; must not raise)."""
        if not queue.bindings:
            return
        now = trio.current_time()
        vhost_name = queue.vhost.name
        for exchange, _ in list(queue.bindings):
            hook = self._filters.get((vhost_name, exchange.name))
            if hook is not None:
                hook.refilter(now)

    def _exchange_for(
        self,
        vhost_name: str,
        exchange_name: str,
        *,
        declare: PeeringConfig | None = None,
        max_hops: int = 8,
    ) -> PeeredExchange | None:
        """The peered exchange, created (and its exchange declared, for a configured
        link) on first use; None when the exchange does not exist here."""
        px = self.exchanges.get((vhost_name, exchange_name))
        if px is not None:
            return px
        vhost = self.node.broker.vhost(vhost_name)
        if vhost is None:
            return None
        exchange = vhost.exchanges.get(exchange_name)
        if exchange is None and declare is not None:
            self.session(vhost_name).declare_exchange(exchange_name, declare.type, durable=True)
            exchange = vhost.exchanges[exchange_name]
        if exchange is None or exchange_name == "":
            return None
        px = PeeredExchange(
            node_id=self.node_id,
            epoch=self.epoch,
            exchange=exchange_name,
            exchange_type=exchange.kind,
            vhost=vhost_name,
            rand=random.Random().random,
            max_hops=max_hops,
            acceptor=LinkSettings(name="acceptor", overflow=OverflowPolicy.DROP_OLDEST),
            spill_store=self.durability.spill_store,
        )
        saved = self.durability.saved_marks(vhost_name, exchange_name)
        if saved is not None:
            try:
                px.restore(saved)
            except ValueError as exc:
                log.error("peering_marks_ignored", exchange=exchange_name, error=str(exc))
        now = trio.current_time()
        for binding in exchange.bindings.values():
            if not binding.queue.name.startswith(PEERING_QUEUE_PREFIX):
                px.bind(binding.queue.name, binding.key, binding.arguments, now=now)
        # also once deleted and declared again
        hook = BindingHook(self.applier, px, vhost)
        vhost.watch(exchange_name, hook)
        self._filters[(vhost_name, exchange_name)] = hook
        vhost.on_consumers = self._consumers_changed
        self.exchanges[(vhost_name, exchange_name)] = px
        self.hooks.setdefault(vhost_name, {})[exchange_name] = PublishHook(self.applier, px)
        return px

    # --- the dialer's connections ----------------------------------------------------------

    def _start_dial(self, link_id: str, address: Address) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._dial, link_id, address)

    async def _dial(self, link_id: str, address: Address) -> None:
        """One connection attempt of a dialer link, and the connection if it opens.
        The connection is the link's from the start, so a ``Disconnect`` (a connect
        timeout, a protocol error) cancels it wherever it is."""
        registry = self.registry
        link = registry.link(link_id)
        cfg = self._configs.get(link_id)
        if link is None or cfg is None:
            return
        conn = DialedLink(
            link_id,
            max_frame_size=self.node.config.server.max_frame_bytes,
            ssl_context=self._tls if cfg.tls else None,
        )
        old = registry.conns.get(link_id)
        if old is not None:
            old.close("a new connection attempt")
        registry.conns[link_id] = conn
        hello = ev.Hello(
            1,
            vhost=cfg.vhost,
            login=cfg.login,
            password=cfg.password,
            client=f"peering {self.node_id}",
            role="peer-link",
        )

        def opened() -> bool:
            if registry.conns.get(link_id) is not conn:
                return False
            self.applier.apply(link.connected(trio.current_time()))
            return True

        def received(msg: dict[str, Any], now: float) -> None:
            self.applier.receive(link, msg, now)

        reason = "connection closed"
        try:
            reason = await conn.run(
                address,
                hello,
                timeout=link.settings.connect_timeout,
                opened=opened,
                received=received,
            )
        finally:
            if registry.conns.get(link_id) is conn:
                del registry.conns[link_id]
                if not self._closing:
                    self.applier.apply(link.connection_lost(trio.current_time(), reason))

    # --- the acceptor's connections (server side) -------------------------------------------

    def on_frame(self, conn: AcceptedConnection, msg: dict[str, Any]) -> None:
        """A ``peer`` frame on a server connection opened with role ``peer-link``."""
        now = trio.current_time()
        if not self.active:
            conn.close_from_server(ReplyCode.NOT_ACTIVE, f"node {self.node.node_id} is not active")
            return
        registry = self.registry
        link_id = self._accepted.get(conn)
        if link_id is not None:
            link = registry.link(link_id)
            if link is not None and registry.conns.get(link_id) is conn:
                self.applier.receive(link, msg, now)
            return
        vhost, exchange = msg.get("vhost"), msg.get("exchange")
        px = (
            self._exchange_for(vhost, exchange)
            if isinstance(vhost, str) and isinstance(exchange, str) and vhost == conn.vhost
            else None
        )
        if px is None:
            text = f"no exchange {exchange!r} in vhost {vhost!r} to peer with"
            conn.send_map(Refused(ReplyCode.NOT_FOUND, text).to_map())
            conn.close_from_server(ReplyCode.NOT_FOUND, text)
            return
        if not conn.may_peer(px.ctx.exchange):
            text = (
                f"access refused: user {conn.user!r} may not write and read exchange "
                f"{exchange!r} in vhost {vhost!r} (a peering link publishes into it)"
            )
            log.warning(
                "peering_link_refused", remote=conn.remote_address, user=conn.user, reason=text
            )
            conn.send_map(Refused(ReplyCode.ACCESS_REFUSED, text).to_map())
            conn.close_from_server(ReplyCode.ACCESS_REFUSED, text)
            return
        refusal = conn.constraint_refusal(px.ctx.exchange)
        if refusal is not None:
            log.warning(
                "constraint_refused",
                remote=conn.remote_address,
                user=conn.user,
                vhost=vhost,
                action="peer",
                resource=f"exchange {exchange!r}",
                reason=refusal,
            )
            conn.send_map(Refused(ReplyCode.ACCESS_REFUSED, refusal).to_map())
            conn.close_from_server(ReplyCode.ACCESS_REFUSED, refusal)
            return
        try:
            attached, actions = px.attach(msg, now)
        except PeeringProtocolError as exc:
            conn.close_from_server(exc.code, exc.text)
            return
        if attached is None:
            for action in actions:
                if isinstance(action, Send):
                    conn.send_map(action.message.to_map())
                elif isinstance(action, Disconnect):
                    conn.close_from_server(ReplyCode.PRECONDITION_FAILED, action.reason)
            return
        old = registry.conns.pop(attached.id, None)
        if old is not None and old is not conn:
            old.close("replaced by a new connection")
        registry.owner[attached.id] = px
        registry.conns[attached.id] = conn
        self._accepted[conn] = attached.id
        log.info("peering_link_accepted", link=attached.id, remote=conn.remote_address)
        self.applier.apply(actions)
        self.queues.attach(px, attached, now)

    def on_closed(self, conn: AcceptedConnection) -> None:
        """A ``peer-link`` server connection ended."""
        link_id = self._accepted.pop(conn, None)
        if link_id is None or self.registry.conns.get(link_id) is not conn:
            return
        del self.registry.conns[link_id]
        link = self.registry.link(link_id)
        if link is not None:
            self.applier.apply(link.connection_lost(trio.current_time(), "connection closed"))

    # --- time ------------------------------------------------------------------------------

    def _turn_ended(self) -> None:
        self._flush_due.set()  # the flusher runs once this task yields

    def _wake_timer(self) -> None:
        self._wake.set()

    def check_queue_bindings_every(self, interval: float) -> None:
        """Check the peering queues' bindings every ``interval`` seconds from now
        on (every 30 s by default)."""
        self.queues.check_bindings_every(interval, trio.current_time())

    async def _flusher(self) -> None:
        """Once the task that called into the core yields: sends what the core asked
        for (so what a whole turn of a connection's requests produced travels
        together), and wakes the timer if a deadline moved earlier."""
        while True:
            await self._flush_due.wait()
            self._flush_due = trio.Event()
            self.applier.flush()
            timer_at = self._timer_at  # (-INF: the timer is ticking, it looks itself)
            if timer_at != -INF and self._next_deadline() < timer_at:
                self._wake.set()

    async def _timer(self) -> None:
        while True:
            self._timer_at = self._next_deadline()
            with trio.move_on_at(min(self._timer_at, trio.current_time() + 3600)):
                await self._wake.wait()
            self._wake = trio.Event()
            self._timer_at = -INF  # ticking: no wake-ups needed meanwhile
            now = trio.current_time()
            for px in list(self.exchanges.values()):
                self.applier.apply(px.tick(now))
            if self.registry.waiting_since:
                self._retire_acceptors(now)
            self.queues.tick(now)

    def _next_deadline(self) -> float:
        """When the timer has something to do next. The flusher asks after every
        turn (on a sending site, every 64 client publishes): loops, not ``min`` of
        generators (which were half its cost)."""
        due = self.queues.next_deadline()
        for px in self.exchanges.values():
            at = px.next_deadline()
            if at < due:
                due = at
        waiting = self.registry.waiting_since
        if waiting:
            for link_id, since in waiting.items():
                due = min(due, since + self._retention(link_id))
        return due

    def _retention(self, link_id: str) -> float:
        """How long an acceptor end waits for its dialer: a subscriber's lease."""
        lease = self.queues.retention(link_id)
        return lease if lease is not None else self.acceptor_retention

    def _retire_acceptors(self, now: float) -> None:
        """Remove acceptor ends whose dialer has been away past the retention time
        (with what they held for it)."""
        registry = self.registry
        for link_id, since in list(registry.waiting_since.items()):
            if now < since + self._retention(link_id):
                continue
            del registry.waiting_since[link_id]  # always: a past deadline would spin the timer
            px = registry.owner.get(link_id)
            if px is None:
                continue
            log.warning("peering_acceptor_retired", link=link_id, waited=round(now - since, 3))
            self.applier.apply(px.remove_link(link_id, now))
            registry.forget(link_id)
            self.queues.retire(link_id)

    # --- status ----------------------------------------------------------------------------

    def _link_tls(self, link_id: str) -> bool:
        """A dialer end: it dials over TLS (``tls = true``); an acceptor end: its
        connection came over TLS (between connections: the native listener does)."""
        cfg = self._configs.get(link_id)
        if cfg is not None:
            return cfg.tls
        conn = self.registry.conns.get(link_id)
        return conn.tls if conn is not None else self.node.config.server.tls

    def status(self) -> list[dict[str, Any]]:
        """Every link end, for ``status`` under ``links``."""
        self.applier.offer_runs()  # the figures count the client publishes of this turn
        now = trio.current_time()
        out: list[dict[str, Any]] = []
        for px in self.exchanges.values():
            for item in px.status(now):
                link_id = item["link"]
                item["held"] = self.registry.held_count(link_id)
                item["tls"] = self._link_tls(link_id)
                pq = self.registry.queues.get(link_id)
                if pq is not None:  # what waits in the peering queue is lag too
                    queued = pq.queued()
                    item["queue"], item["queued"] = pq.name, queued
                    item["lag_messages"] += queued
                out.append(item)
        return out
