"""Exchange peering's trio shell: drives the sans-IO core of :mod:`amqlite.peering`.

One :class:`PeeringService` per node. It owns one
:class:`~amqlite.peering.PeeredExchange` per peered (vhost, exchange): those named
by ``[[cluster_mta]]`` entries (whose links it dials) and those a remote dialer
attached to (created on the first ``peer.hello``). It applies every action the
core returns, in order (docs/peering.md, "Shell integration"):

- one nursery-owned task per dialed link connection (connect, ``hello`` with role
  ``peer-link``, then ``peer`` frames both ways) and one timer task that sleeps
  until the core's next deadline;
- accepted links ride on ordinary server connections (:class:`PeerLinkEnd`
  with role ``peer-link``), which hand their ``peer`` frames to :meth:`on_frame`;
- bindings reach the core through a watcher on the exchange, publishes through the
  dispatcher's hook (:meth:`hook_for`), deliveries from links are published into
  the local exchange and confirmed once safe (after the journal commit when the
  message is persistent).

Persisted: the peering epoch (``PEERING_EPOCH`` in the data dir, bumped before use
at every start) and the receive-side marks: after a batch of deliveries that wrote
to the journal, a ``peering.marks`` record follows them, in which every message
taken from a link so far counts as received; so whatever the journal holds after a
crash, it holds the marks that cover it, and the restarted node drops what the
sender sends again. Acknowledgements (and a new connection's ``resume``) only
cover deliveries confirmed after the journal commit that holds them. The sending
logs live in memory.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
import trio

from amqlite.broker import (
    ALL_APPENDED,
    PEERING_QUEUE_PREFIX,
    Message,
    PublishOutcome,
    Session,
)
from amqlite.config import PeeringConfig
from amqlite.errors import AmqliteError, BrokerError, ReplyCode
from amqlite.peering import (
    Acked,
    Action,
    Address,
    Blocked,
    BufferAvailable,
    Connect,
    Deliver,
    Disconnect,
    Envelope,
    LinkSettings,
    LinkState,
    MemorySpill,
    OverflowPolicy,
    PeeredExchange,
    PeeringProtocolError,
    PeerLink,
    Persist,
    Send,
    SpillStore,
    StateChanged,
)
from amqlite.peering import cbor as peering_cbor
from amqlite.peering.wire import PeeringMessage, Refused
from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev
from amqlite.protocol.codec import check_headers, check_props
from amqlite.store import PeeringMarks, PeeringOut, PeeringOutAck

from .peering_queue import ARG_LINK, PeeringQueue, envelope_of, lease_of
from .spill import FileSpill

if TYPE_CHECKING:
    from .context import PeerLinkEnd
    from .node import BrokerNode

log = structlog.get_logger("amqlite.peering")

INF = float("inf")
# enum members as constants (an enum attribute look-up is slow; these run per message)
_BLOCK, _UNROUTABLE = OverflowPolicy.BLOCK, PublishOutcome.UNROUTABLE
BATCH_BYTES = 256 * 1024  # peering maps sent in one ``peer`` frame, at most about
BATCH = "peer.batch"
ACCEPTOR_RETENTION = 24 * 3600.0  # an acceptor end waiting this long is removed
RECONCILE_INTERVAL = 30.0  # peering queues' bindings are checked this often
EPOCH_FILE = "PEERING_EPOCH"
SPILL_DIR = "peering-spill"
RECEIVE_SIZE = 256 * 1024
_LINK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, AmqliteError)


class _LinkFailed(Exception):
    """The dialed connection could not be opened or ended; ``args[0]`` says why."""


class _DialedConnection:
    """The dialer's side of one link connection: a protocol connection and its
    outgoing buffer (written by the link task's writer)."""

    def __init__(self, proto: Connection) -> None:
        self.proto = proto
        self.out = bytearray()
        self.wake = trio.Event()
        self.cancel_scope = trio.CancelScope()

    def send_map(self, msg: Mapping[str, Any]) -> None:
        with contextlib.suppress(AmqliteError):
            self.out += self.proto.send(ev.PeerMessage(dict(msg)))
            self.wake.set()

    def send_peer(self, msg: bytes) -> None:
        """One ``peer`` frame holding ``msg``, an encoded peering map."""
        with contextlib.suppress(AmqliteError):
            self.out += self.proto.send_peer(msg)
            self.wake.set()

    def close(self, reason: str) -> None:
        self.cancel_scope.cancel()


@dataclass
class _Held:
    """``block`` policy: messages a full link refused, re-offered in order."""

    envelopes: deque[tuple[Envelope, bool]] = field(default_factory=deque)
    waiting: bool = False


class _Watcher:
    """The exchange's binding watcher: bindings -> ``px.bind``/``px.unbind``."""

    def __init__(self, service: PeeringService, px: PeeredExchange) -> None:
        self.service = service
        self.px = px

    def bound(self, queue: str, key: str, arguments: Mapping[str, Any]) -> None:
        if not queue.startswith(PEERING_QUEUE_PREFIX):  # a subscriber's, not ours
            self.service.apply(self.px.bind(queue, key, arguments, now=trio.current_time()))

    def unbound(self, queue: str, key: str, arguments: Mapping[str, Any]) -> None:
        if not queue.startswith(PEERING_QUEUE_PREFIX):
            self.service.apply(self.px.unbind(queue, key, arguments, now=trio.current_time()))


class PublishHook:
    """What the dispatcher calls for a publish on a peered exchange."""

    __slots__ = ("px", "service")

    def __init__(self, service: PeeringService, px: PeeredExchange) -> None:
        self.service = service
        self.px = px

    def envelope(self, message: Message) -> Envelope:
        return self.px.envelope(
            message.routing_key, message.body, message.headers, message.properties
        )

    def has_room(self, envelope: Envelope) -> bool:
        """False when a ``block`` link is too full to take it (the publisher is
        pushed back); the other policies always make room."""
        for link in self.px.links.values():  # a loop: a generator costs more per publish
            if link.settings.overflow is _BLOCK and not link.has_room(envelope):
                return False
        return True

    def published(
        self, envelope: Envelope, outcome: PublishOutcome, now: float, publish_key: str = ""
    ) -> bool:
        """Offer the message to the links; True when one took it (it will be routed
        on another site). ``publish_key`` goes into the ``peering.out`` records of
        durable logs, so a publish sent again after a failover is recognised even
        when no local queue holds it."""
        routed = outcome is not _UNROUTABLE
        service = self.service
        service.publish_key = publish_key
        try:
            service.apply(self.px.published(envelope, routed_locally=routed, now=now))
        finally:
            service.publish_key = ""
        return self.px.taken > 0


class PeeringService:
    """Every peered exchange of one node and their links; see the module docstring."""

    def __init__(
        self,
        node: BrokerNode,
        links: tuple[PeeringConfig, ...],
        *,
        acceptor_retention: float = ACCEPTOR_RETENTION,
    ) -> None:
        self.node = node
        self.acceptor_retention = acceptor_retention
        self._waiting_since: dict[str, float] = {}  # acceptor ends whose dialer is away
        self.links_config = links
        self.exchanges: dict[tuple[str, str], PeeredExchange] = {}
        self.hooks: dict[str, dict[str, PublishHook]] = {}  # vhost -> exchange -> hook
        self.epoch = 0
        self.node_id = ""
        self._configs: dict[str, PeeringConfig] = {}  # dialer link id -> its entry
        self._owner: dict[str, PeeredExchange] = {}  # link id -> its exchange
        self._conns: dict[str, _DialedConnection | PeerLinkEnd] = {}
        self._held: dict[str, _Held] = {}
        self._commits_pending: dict[str, int] = {}
        self._sessions: dict[str, Session] = {}
        self._nursery: trio.Nursery | None = None
        self._wake = trio.Event()
        self._closing = False
        self._depth = 0  # nested apply() calls
        self._delivered = False  # deliveries (or freed credit) since the last pump
        self._confirms: dict[str, int] = {}  # link -> last tag safe now, confirmed at turn end
        self._outbox: dict[_DialedConnection | PeerLinkEnd, list[PeeringMessage]] = {}
        self._flush_due = trio.Event()
        self._timer_at = INF  # when the timer task wakes next
        self.active = False  # peering runs (standalone, or the HA pair's active node)
        self._marks_due: dict[tuple[str, str], PeeredExchange] = {}
        self._queues: dict[str, PeeringQueue] = {}  # subscribe acceptor end -> its queue
        self._outs: dict[str, deque[tuple[int, int]]] = {}  # durable log: (seq, out id)
        self._out_id = 0  # the last peering.out id handed out
        self.publish_key = ""  # of the client publish being offered to the links
        self._orphans: dict[tuple[str, str], tuple[float, float]] = {}  # (vhost, queue) ->
        # (since, lease): peering queues found at activation that no link uses yet
        self.reconcile_interval = RECONCILE_INTERVAL
        self._reconcile_at = INF

    # --- start ---------------------------------------------------------------------------

    def _data_path(self, name: str) -> str | None:
        storage = self.node.storage
        return os.path.join(storage.directory, name) if storage is not None else None

    def _next_epoch(self) -> int:
        """Grows at every activation: a persisted counter, +1 each time (a node
        without a data dir uses the clock). On an HA pair the active term's HA
        epoch (pair-wide, higher at every promotion) goes in the high bits, so the
        node that takes over continues above its peer's sending log."""
        ha = self.node.ha
        term = ha.machine.epoch if ha is not None and ha.machine is not None else 0
        return (term << 32) + self._next_counter()

    def _next_counter(self) -> int:
        path = self._data_path(EPOCH_FILE)
        if path is None:
            return int(time.time() * 1000)
        try:
            with open(path, encoding="ascii") as f:
                previous = int(f.read().strip() or 0)
        except FileNotFoundError:
            previous = 0
        except (OSError, ValueError) as exc:
            raise AmqliteError(f"cannot read the peering epoch from {path}: {exc}") from exc
        epoch = previous + 1
        _write_durably(path, f"{epoch}\n".encode("ascii"))
        return epoch

    def peering_node_id(self) -> str:
        """An HA pair is one broker to its peers: both members use the pair's
        addresses as their peering id."""
        cluster = self.node.config.cluster
        if cluster.enabled:
            return f"{cluster.primary_peer},{cluster.backup_peer}"
        return self.node.node_id

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Peer while this node serves (standalone, or the active node of its HA
        pair): :meth:`ha_state_changed` starts and stops the links."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.ha_state_changed()
            nursery.start_soon(self._timer)
            nursery.start_soon(self._flusher)
            task_status.started()

    def _serving(self) -> bool:
        return self.node.ha is None or self.node.state == "active"

    def ha_state_changed(self) -> None:
        """Called by the HA service after every change of this node's state."""
        if self._nursery is None:
            return  # not running yet: run() looks once it is
        if self._serving() and not self.active:
            self._activate()
        elif not self._serving() and self.active:
            self._deactivate()

    def _restore_log(
        self,
        px: PeeredExchange,
        link: PeerLink,
        backlog: Mapping[int, PeeringOut] | None,
        now: float,
    ) -> None:
        """Give a dialer link back what its durable log (``peering.out`` records)
        held when this node stopped or the previous HA master died."""
        if not backlog:
            return
        envelopes = []
        for r in backlog.values():
            message = Message(r.exchange, r.routing_key, r.body, dict(r.headers), dict(r.props))
            message.mesh = r.mesh
            envelopes.append(envelope_of(px, message))
        seqs = link.restore(envelopes, now)
        self._outs[link.id] = deque(zip(seqs, backlog, strict=True))
        log.info("peering_log_restored", link=link.id, messages=len(seqs))

    def _record_out_ack(self, vhost: str, exchange: str, link: str, upto: int) -> None:
        storage = self.node.storage
        if storage is not None:
            storage.record(PeeringOutAck(vhost=vhost, exchange=exchange, link=link, id=upto))

    def _persist(self, action: Persist) -> None:
        """Journal a persistent message a durable sending log took."""
        px = self._owner.get(action.link)
        recorder = self.node.broker.recorder
        if px is None or recorder is None:
            return
        env = action.envelope
        self._out_id += 1
        # through the broker's recorder: the publish that made the log take it
        # names this record in its journal span, so its confirm covers it
        recorder.append(
            PeeringOut(
                vhost=px.ctx.vhost,
                exchange=px.ctx.exchange,
                link=action.link,
                id=self._out_id,
                routing_key=env.routing_key,
                body=env.body,
                headers=dict(env.headers),
                props=dict(env.properties),
                mesh=env.mesh_map(),
                publish_key=self.publish_key,
            )
        )
        self._outs.setdefault(action.link, deque()).append((action.seq, self._out_id))

    def _acked(self, action: Acked) -> None:
        """Settle what a durable log or a peering queue kept, up to ``action.seq``."""
        now = trio.current_time()
        pq = self._queues.get(action.link)
        if pq is not None:
            pq.acked(action.seq, now)
            self._delivered = True  # the freed credit lets the queue push more
            return
        outs = self._outs.get(action.link)
        px = self._owner.get(action.link)
        if not outs or px is None:
            return
        last = 0
        while outs and outs[0][0] <= action.seq:
            last = outs.popleft()[1]
        if last:
            self._record_out_ack(px.ctx.vhost, px.ctx.exchange, action.link, last)

    def _activate(self) -> None:
        """Start peering: a new sending-log epoch, the configured links (their
        exchanges declared if missing), the receive marks from the journal."""
        self.active = True
        self.epoch = self._next_epoch()
        self.node_id = self.peering_node_id()
        now = trio.current_time()
        counts: dict[tuple[str, str], int] = {}
        for cfg in self.links_config:
            counts[(cfg.vhost, cfg.name)] = counts.get((cfg.vhost, cfg.name), 0) + 1
        starts: list[PeerLink] = []
        storage = self.node.storage
        journal = storage.journal if storage is not None else None
        kept = (  # a copy: the journal's state moves on as acks are recorded
            {key: dict(backlog) for key, backlog in journal.state.peering_out.items()}
            if journal is not None
            else {}
        )
        self._out_id = journal.state.last_peering_out if journal is not None else 0
        for cfg in self.links_config:
            px = self._exchange_for(cfg.vhost, cfg.name, declare=cfg, max_hops=cfg.max_hops)
            assert px is not None
            alone = counts[(cfg.vhost, cfg.name)] == 1
            link_name = cfg.name if alone else f"{cfg.name}->{cfg.hosts}"
            link = px.add_link(
                LinkSettings(
                    name=link_name,
                    mode=cfg.mode,
                    addresses=cfg.host,
                    buffer_bytes=cfg.buffer_bytes,
                    overflow=cfg.overflow,
                    heartbeat=cfg.heartbeat,
                    lease=cfg.lease,
                )
            )
            self._configs[link.id] = cfg
            self._owner[link.id] = px
            starts.append(link)
            if journal is not None:
                link.durable_log = True
                self._restore_log(px, link, kept.pop((cfg.vhost, cfg.name, link.id), None), now)
        for (vhost_name, exchange, link_id), backlog in list(kept.items()):
            log.warning(  # its [[cluster_mta]] entry is gone: so is what it held
                "peering_log_dropped", exchange=exchange, link=link_id, messages=len(backlog)
            )
            self._record_out_ack(vhost_name, exchange, link_id, max(backlog))
        for host in self.node.broker.all_vhosts():
            for queue in host.queues.values():
                if queue.name.startswith(PEERING_QUEUE_PREFIX) and ARG_LINK in queue.arguments:
                    self._orphans[(host.name, queue.name)] = (now, lease_of(queue.arguments))
        log.info("peering_started", node=self.node_id, epoch=self.epoch, links=len(starts))
        for link in starts:
            self.apply(link.start(now))

    def _deactivate(self) -> None:
        """Stop peering (this HA node became passive): close every link end and
        forget the peering state; the next activation rebuilds it from the journal."""
        now = trio.current_time()
        for px in list(self.exchanges.values()):
            for link_id in list(px.links):
                self.apply(px.remove_link(link_id, now))
            vhost = self.node.broker.vhost(px.ctx.vhost)
            if vhost is not None:
                vhost.watch(px.ctx.exchange, None)
        for conn in list(self._conns.values()):
            conn.close("peering stopped: this node is not active")
        self._conns.clear()
        for pq in self._queues.values():
            pq.close(delete=False)
        self._queues.clear()
        self._outs.clear()
        self._orphans.clear()
        self._reconcile_at = INF
        for hooks in self.hooks.values():
            hooks.clear()  # the dispatchers hold these dicts
        self.exchanges.clear()
        self._configs.clear()
        self._owner.clear()
        self._held.clear()
        self._commits_pending.clear()
        self._confirms.clear()
        self._sessions.clear()
        self._marks_due.clear()
        self._waiting_since.clear()
        self.active = False
        log.info("peering_stopped", node=self.node_id)

    def _session(self, vhost: str) -> Session:
        session = self._sessions.get(vhost)
        if session is None or session.closed:
            session = self._sessions[vhost] = self.node.broker.open_session(vhost, owner=self)
        return session

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
            self._session(vhost_name).declare_exchange(exchange_name, declare.type, durable=True)
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
            spill_store=self._spill_store,
        )
        storage = self.node.storage
        journal = storage.journal if storage is not None else None
        saved = journal.state.peering.get((vhost_name, exchange_name)) if journal else None
        if saved is not None:
            try:
                px.restore(saved.marks)
            except ValueError as exc:
                log.error("peering_marks_ignored", exchange=exchange_name, error=str(exc))
        now = trio.current_time()
        for binding in exchange.bindings.values():
            if not binding.queue.name.startswith(PEERING_QUEUE_PREFIX):
                px.bind(binding.queue.name, binding.key, binding.arguments, now=now)
        vhost.watch(exchange_name, _Watcher(self, px))  # also once deleted and declared again
        self.exchanges[(vhost_name, exchange_name)] = px
        self.hooks.setdefault(vhost_name, {})[exchange_name] = PublishHook(self, px)
        return px

    def _spill_store(self, link_id: str) -> SpillStore:
        """On disk (``peering-spill/`` in the data dir), or in memory without one."""
        storage = self.node.storage
        if storage is None:
            return MemorySpill()
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in link_id)
        return FileSpill(os.path.join(storage.directory, SPILL_DIR, f"{name}.spill"))

    def hook_for(self, vhost: str) -> dict[str, PublishHook]:
        """The dispatcher's view: exchange name -> hook, for one vhost (a live dict)."""
        return self.hooks.setdefault(vhost, {})

    # --- applying actions ----------------------------------------------------------------

    def apply(self, actions: list[Action]) -> None:
        """Apply the core's actions in order (docs/peering.md, "Applying actions").
        Every call into the core goes through here, even when it returned nothing:
        it may have moved a deadline (a delayed ack), which the flusher checks."""
        if actions:
            self._depth += 1
            try:
                self._apply(actions)
            finally:
                self._depth -= 1
        if self._depth:
            return
        if self._confirms:
            self._confirm_safe()
        if self._marks_due:
            self._record_marks()
        if self._delivered:
            self._delivered = False
            self.node.pump()
        self._flush_due.set()  # the flusher runs once this task yields

    async def _flusher(self) -> None:
        """Once the task that called into the core yields: sends what the core asked
        for (so what a whole turn of a connection's requests produced travels
        together), and wakes the timer if a deadline moved earlier."""
        while True:
            await self._flush_due.wait()
            self._flush_due = trio.Event()
            if self._outbox:
                self._flush()
            if self._next_deadline() < self._timer_at:
                self._wake.set()

    def _flush(self) -> None:
        """Consecutive maps of one connection go in one ``peer`` frame
        (``peer.batch``) of at most about BATCH_BYTES, runs of forwards as
        ``peer.forwards``, encoded by :mod:`amqlite.peering.cbor` (forwards by hand)."""
        outbox, self._outbox = self._outbox, {}
        for conn, messages in outbox.items():
            for frame in peering_cbor.encode_frames(messages, BATCH_BYTES):
                conn.send_peer(frame)

    def _receive(self, link: PeerLink, msg: dict[str, Any], now: float) -> None:
        """One ``peer`` frame for ``link``: a peering map, or a batch of them."""
        if link.queue_fed:
            self._receive_one(link, msg, now)
            pq = self._queues.get(link.id)
            interest = link.interest
            if pq is not None and interest is not None and interest.digest.hex != pq.applied_digest:
                pq.sync_bindings()  # the subscriber's interest changed
            return
        self._receive_one(link, msg, now)

    def _receive_one(self, link: PeerLink, msg: dict[str, Any], now: float) -> None:
        if msg.get("type") != BATCH:
            self.apply(link.receive(msg, now))
            return
        items = msg.get("msgs")
        if not isinstance(items, list):
            self.apply(link.receive({"type": BATCH}, now))  # malformed: the core says so
            return
        self._depth += 1
        try:
            for item in items:
                self.apply(link.receive(item, now))
        finally:
            self._depth -= 1
        self.apply([])

    def _next_deadline(self) -> float:
        due = min((px.next_deadline() for px in self.exchanges.values()), default=INF)
        for link_id, since in self._waiting_since.items():
            due = min(due, since + self._retention(link_id))
        for since, lease in self._orphans.values():
            due = min(due, since + lease)
        return min(due, self._reconcile_at)

    def _retention(self, link_id: str) -> float:
        """How long an acceptor end waits for its dialer: a subscriber's lease."""
        pq = self._queues.get(link_id)
        return pq.lease if pq is not None else self.acceptor_retention

    # --- subscribe: the peering queues (amqlite/server/peering_queue.py) ---------------

    def _attach_queue(self, px: PeeredExchange, link: PeerLink, now: float) -> None:
        """After an acceptor end attached: a subscribe end consumes from its peering
        queue (declared on first use, kept across cuts and restarts)."""
        pq = self._queues.get(link.id)
        if pq is not None and pq.link is not link:  # the dialer was reconfigured
            del self._queues[link.id]
            pq.close(delete=not link.queue_fed)
            pq = None
        if not link.queue_fed:
            return
        if pq is None:
            pq = PeeringQueue(
                self.node.broker,
                px,
                link,
                prefetch=2 * link.settings.max_in_flight,
                now=now,
                on_deliveries=self._feed,
            )
            self._queues[link.id] = pq
            self._orphans.pop((pq.vhost, pq.name), None)
            if self._reconcile_at == INF:
                self._reconcile_at = now + self.reconcile_interval
                self._wake.set()
            log.info("peering_queue_attached", link=link.id, queue=pq.name, lease=pq.lease)
        pq.sync_bindings()
        self._feed(pq)

    def _feed(self, pq: PeeringQueue) -> None:
        """Hand the queue's new deliveries to its link end, in order."""
        deliveries, cancelled = pq.take()
        if cancelled and not pq.session.closed:  # the queue was deleted by hand
            log.warning("peering_queue_deleted", queue=pq.name, link=pq.link.id)
            now = trio.current_time()
            pq.declare(now)  # what it had taken still acks
            pq.sync_bindings()
            deliveries += pq.take()[0]
        if not deliveries:
            return
        now = trio.current_time()
        self._depth += 1
        try:
            for d in deliveries:
                env = envelope_of(pq.px, d.message)
                seq, actions = pq.link.take(env, now)
                if seq is None:
                    pq.settle(d.dtag, now)  # skipped (the subscriber is on its path)
                else:
                    pq.taken.append((seq, d.dtag))
                self.apply(actions)
        finally:
            self._depth -= 1
        self.apply([])

    def _reconcile(self, now: float) -> None:
        """The periodic check: a peering queue's binding deleted by hand comes back."""
        self._reconcile_at = now + self.reconcile_interval if self._queues else INF
        for pq in list(self._queues.values()):
            if pq.sync_bindings():
                log.warning("peering_queue_bindings_repaired", queue=pq.name)

    def _expire_orphans(self, now: float) -> None:
        """Delete the peering queues found at start-up whose subscriber never came
        back within their lease."""
        for (vhost_name, name), (since, lease) in list(self._orphans.items()):
            if now < since + lease:
                continue
            del self._orphans[(vhost_name, name)]
            try:
                self._session(vhost_name).delete_queue(name)
            except AmqliteError as exc:
                log.warning("peering_queue_expiry_failed", queue=name, error=exc.text)
                continue
            log.warning("peering_queue_expired", queue=name, lease=lease)

    def _retire_acceptors(self, now: float) -> None:
        """Remove acceptor ends whose dialer has been away past the retention time
        (with what they held for it)."""
        for link_id, since in list(self._waiting_since.items()):
            if now < since + self._retention(link_id):
                continue
            del self._waiting_since[link_id]  # always: a past deadline would spin the timer
            px = self._owner.get(link_id)
            if px is None:
                continue
            log.warning("peering_acceptor_retired", link=link_id, waited=round(now - since, 3))
            self.apply(px.remove_link(link_id, now))
            self._owner.pop(link_id, None)
            self._held.pop(link_id, None)
            pq = self._queues.pop(link_id, None)
            if pq is not None:  # the subscriber's lease ran out: its queue goes too
                pq.close(delete=True)
                log.warning("peering_queue_expired", queue=pq.name, lease=pq.lease)

    def _record_marks(self) -> None:
        """Journal the marks after the deliveries just journaled (see the module
        docstring): every message taken from a link counts as received."""
        storage = self.node.storage
        due, self._marks_due = self._marks_due, {}
        if storage is None:
            return
        for px in due.values():
            ctx = px.ctx
            snapshot = px.snapshot()
            rows = []
            for node, link, epoch, settled in snapshot["marks"]:
                mark = ctx.marks.mark(node, link, epoch)
                rows.append([node, link, epoch, max(settled, mark.accepted if mark else 0)])
            snapshot["marks"] = rows
            storage.record(PeeringMarks(vhost=ctx.vhost, exchange=ctx.exchange, marks=snapshot))

    def _apply(self, actions: list[Action]) -> None:
        now = -INF  # for deliveries: read once per call (a run arrives at one instant)
        for action in actions:
            if isinstance(action, Send):
                conn = self._conns.get(action.link)
                if conn is not None:
                    self._outbox.setdefault(conn, []).append(action.message)
            elif isinstance(action, Deliver):
                if now == -INF:
                    now = trio.current_time()
                self._deliver(action, now)
            elif isinstance(action, Connect):
                assert self._nursery is not None
                self._nursery.start_soon(self._dial, action.link, action.address)
            elif isinstance(action, Disconnect):
                old = self._conns.pop(action.link, None)
                if old is not None:
                    old.close(action.reason)
                log.info("peering_disconnected", link=action.link, reason=action.reason)
            elif isinstance(action, Blocked):
                held = self._held.setdefault(action.link, _Held())
                held.envelopes.append((action.envelope, False))
                held.waiting = True
            elif isinstance(action, BufferAvailable):
                self._resume_held(action.link)
            elif isinstance(action, Acked):
                self._acked(action)
            elif isinstance(action, Persist):
                self._persist(action)
            elif isinstance(action, StateChanged):
                if action.new is LinkState.WAITING:
                    self._waiting_since[action.link] = trio.current_time()
                else:
                    self._waiting_since.pop(action.link, None)
                log.info(
                    "peering_link_state",
                    link=action.link,
                    old=action.old.value,
                    new=action.new.value,
                    reason=action.reason,
                )

    def _confirm_safe(self) -> None:
        """Confirm the deliveries that were safe at once (transient), one call per
        link for a whole turn (confirms are cumulative)."""
        now = trio.current_time()
        self._depth += 1
        try:
            while self._confirms:
                link_id, tag = self._confirms.popitem()
                link = self._link(link_id)
                if link is not None:
                    self._apply(link.confirm(tag, now))
        finally:
            self._depth -= 1

    def _link(self, link_id: str) -> PeerLink | None:
        px = self._owner.get(link_id)
        return px.links.get(link_id) if px is not None else None

    def _resume_held(self, link_id: str) -> None:
        held = self._held.get(link_id)
        link = self._link(link_id)
        if held is None or link is None:
            return
        held.waiting = False
        now = trio.current_time()
        while held.envelopes and not held.waiting:
            envelope, routed = held.envelopes.popleft()
            actions = link.offer(envelope, routed_locally=routed, now=now)
            blocked = [a for a in actions if isinstance(a, Blocked)]
            if blocked:
                held.envelopes.appendleft((envelope, routed))
                held.waiting = True
                actions = [a for a in actions if not isinstance(a, Blocked)]
            self.apply(actions)

    def _deliver(self, action: Deliver, now: float) -> None:
        px = self._owner.get(action.link)
        link = px.links.get(action.link) if px is not None else None
        if px is None or link is None:
            return
        env = action.envelope
        storage = self.node.storage
        headers, properties = env.headers, env.properties
        message = Message(
            px.ctx.exchange,
            env.routing_key,
            env.body,
            dict(headers) if headers else {},
            dict(properties) if properties else {},
        )
        message.mesh = env  # a subscriber's peering queue here keeps its identity
        bad = check_headers(message.headers) if headers else None
        if bad is None and properties:
            bad = check_props(message.properties)
        session = self._session(px.ctx.vhost)
        try:
            if bad is not None:  # only a broken peer sends these: never store them
                raise BrokerError(f"malformed headers or properties: {bad}")
            outcome = session.publish(message, now=now)  # starts the delivery's span
        except AmqliteError as exc:  # the exchange went away: nothing routes it
            log.warning("peering_deliver_failed", link=action.link, error=exc.text)
            outcome = PublishOutcome.UNROUTABLE
        self._delivered = True
        if len(px.links) > 1:  # it travels on to the other links (rings, meshes): first,
            # so the records that keeps for them are in this delivery's span
            routed = outcome is not _UNROUTABLE
            self.apply(px.published(env, routed_locally=routed, now=now))
        tag = action.tag
        first, last = session.journal_span if bad is None else (0, 0)
        wrote = last != 0
        if wrote:
            self._marks_due[(px.ctx.vhost, px.ctx.exchange)] = px
        if storage is not None and (wrote or self._commits_pending.get(action.link)):
            self._commits_pending[action.link] = self._commits_pending.get(action.link, 0) + 1
            if self._confirms:
                self._confirm_safe()  # in order: what was safe before this goes first

            def committed(lost: str | None) -> None:
                pending = self._commits_pending
                pending[action.link] = pending.get(action.link, 1) - 1
                if lost is not None:  # the disk dropped it: logged by storage
                    log.error("peering_delivery_not_stored", link=action.link, tag=tag)
                self.apply(link.confirm(tag, trio.current_time()))

            # like a client's confirm: after the commit, and on an HA pair after the
            # passive node holds it too; one that wrote nothing waits for what was
            # appended before it, so confirms keep their order
            if wrote:
                storage.when_durable(first, last, committed)
            else:
                storage.when_durable(0, ALL_APPENDED, committed)
        else:
            self._confirms[action.link] = tag  # safe now: confirmed once the turn ends

    # --- the dialer's connections ----------------------------------------------------

    async def _dial(self, link_id: str, address: Address) -> None:
        """One connection attempt of a dialer link, and the connection if it opens.
        The connection is the link's from the start, so a ``Disconnect`` (a connect
        timeout, a protocol error) cancels it wherever it is."""
        link = self._link(link_id)
        cfg = self._configs.get(link_id)
        if link is None or cfg is None:
            return
        max_frame = self.node.config.server.max_frame_bytes
        conn = _DialedConnection(Connection(Role.CLIENT, max_frame_size=max_frame))
        old = self._conns.get(link_id)
        if old is not None:
            old.close("a new connection attempt")
        self._conns[link_id] = conn
        reason = "connection closed"
        try:
            with conn.cancel_scope:
                stream = await trio.open_tcp_stream(address.host, address.port)
                async with stream:
                    await self._open(stream, conn.proto, cfg, address)
                    if self._conns.get(link_id) is not conn:
                        return
                    self.apply(link.connected(trio.current_time()))
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._writer, stream, conn)
                        reason = await self._reader(stream, conn.proto, link)
                        nursery.cancel_scope.cancel()
        except* _LinkFailed as group:
            reason = str(group.exceptions[0])
        except* _LINK_ERRORS as group:
            reason = f"{address}: {type(group.exceptions[0]).__name__}: {group.exceptions[0]}"
        except* Exception as group:  # a bug costs this connection, never the node
            log.error("peering_link_crashed", link=link_id, exc_info=group)
            reason = f"internal error: {group.exceptions[0]!r}"
        finally:
            if self._conns.get(link_id) is conn:
                del self._conns[link_id]
                if not self._closing:
                    self.apply(link.connection_lost(trio.current_time(), reason))

    async def _open(
        self,
        stream: trio.SocketStream,
        proto: Connection,
        cfg: PeeringConfig,
        address: Address,
    ) -> None:
        hello = ev.Hello(
            1,
            vhost=cfg.vhost,
            login=cfg.login,
            password=cfg.password,
            client=f"peering {self.node_id}",
            role="peer-link",
        )
        await stream.send_all(proto.send(hello))
        reply = await _receive(stream, proto)  # the link's connect timeout bounds it
        if isinstance(reply, ev.Refused):
            raise _LinkFailed(f"{address} refused the link: {reply.code} {reply.text}")
        if not isinstance(reply, ev.Welcome):
            raise _LinkFailed(f"{address} answered hello with {reply.METHOD!r}")

    async def _writer(self, stream: trio.SocketStream, conn: _DialedConnection) -> None:
        while True:
            if not conn.out:
                conn.wake = trio.Event()
                await conn.wake.wait()
                continue
            data, conn.out = conn.out, bytearray()
            await stream.send_all(data)

    async def _reader(self, stream: trio.SocketStream, proto: Connection, link: PeerLink) -> str:
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            proto.receive_data(data)
            now = trio.current_time()
            while True:
                event = proto.next_event()
                if event is NEED_DATA:
                    break
                if isinstance(event, ev.PeerMessage):
                    self._receive(link, event.msg, now)
                elif isinstance(event, ev.Close):
                    return f"the remote closed the connection: {event.code} {event.text}"
                elif isinstance(event, ev.EndOfStream):
                    return "the remote closed the connection"
            if not data:
                return "the remote closed the connection"
            await trio.lowlevel.checkpoint()

    # --- the acceptor's connections (server side) ---------------------------------------

    def on_frame(self, conn: PeerLinkEnd, msg: dict[str, Any]) -> None:
        """A ``peer`` frame on a server connection opened with role ``peer-link``."""
        now = trio.current_time()
        if not self.active:
            conn.close_from_server(ReplyCode.NOT_ACTIVE, f"node {self.node.node_id} is not active")
            return
        link_id = conn.peer_link_id
        if link_id is not None:
            link = self._link(link_id)
            if link is not None and self._conns.get(link_id) is conn:
                self._receive(link, msg, now)
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
            text = f"user {conn.user!r} may not read and write exchange {exchange!r}"
            conn.send_map(Refused(ReplyCode.ACCESS_REFUSED, text).to_map())
            conn.close_from_server(ReplyCode.ACCESS_REFUSED, text)
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
        old = self._conns.pop(attached.id, None)
        if old is not None and old is not conn:
            old.close("replaced by a new connection")
        self._owner[attached.id] = px
        self._conns[attached.id] = conn
        conn.peer_link_id = attached.id
        log.info("peering_link_accepted", link=attached.id, peer=conn.peer)
        self.apply(actions)
        self._attach_queue(px, attached, now)

    def on_closed(self, conn: PeerLinkEnd) -> None:
        """A ``peer-link`` server connection ended."""
        link_id = conn.peer_link_id
        if link_id is None or self._conns.get(link_id) is not conn:
            return
        del self._conns[link_id]
        link = self._link(link_id)
        if link is not None:
            self.apply(link.connection_lost(trio.current_time(), "connection closed"))

    # --- time and persistence -----------------------------------------------------------

    async def _timer(self) -> None:
        while True:
            self._timer_at = self._next_deadline()
            with trio.move_on_at(min(self._timer_at, trio.current_time() + 3600)):
                await self._wake.wait()
            self._wake = trio.Event()
            self._timer_at = -INF  # ticking: no wake-ups needed meanwhile
            now = trio.current_time()
            for px in list(self.exchanges.values()):
                self.apply(px.tick(now))
            if self._waiting_since:
                self._retire_acceptors(now)
            if self._orphans:
                self._expire_orphans(now)
            if now >= self._reconcile_at:
                self._reconcile(now)

    def close(self) -> None:
        """Shutting down: connection losses are no longer reported to the core."""
        self._closing = True

    def status(self) -> list[dict[str, Any]]:
        """Every link end, for ``status`` under ``links``."""
        now = trio.current_time()
        out: list[dict[str, Any]] = []
        for px in self.exchanges.values():
            for item in px.status(now):
                held = self._held.get(item["link"])
                item["held"] = len(held.envelopes) if held is not None else 0
                pq = self._queues.get(item["link"])
                if pq is not None:  # what waits in the peering queue is lag too
                    queued = pq.queued()
                    item["queue"], item["queued"] = pq.name, queued
                    item["lag_messages"] += queued
                out.append(item)
        return out


async def _receive(stream: trio.SocketStream, proto: Connection) -> ev.Event:
    while True:
        event = proto.next_event()
        if event is not NEED_DATA:
            assert isinstance(event, ev.Event)
            if isinstance(event, ev.Heartbeat):
                continue
            return event
        data = await stream.receive_some(RECEIVE_SIZE)
        proto.receive_data(data)
        if not data:
            raise _LinkFailed("the remote closed the connection during the handshake")


def _write_durably(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
