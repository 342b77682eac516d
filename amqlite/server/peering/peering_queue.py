"""The durable peering queue behind the accepting end of a ``subscribe`` link.

A subscriber (the dialer) mirrors its exchange's bindings on this broker's
exchange; this broker keeps them as real bindings of one durable queue per
subscriber link, ``amq.peering.<exchange>.<link id>``, so that:

- what is published here while the subscriber is away waits in the queue, on disk
  when persistent, replicated to an HA passive node like any durable queue, and
  survives a restart of this broker;
- a binding deleted by hand comes back at the next check (every 30 s, and whenever
  the subscriber's interest changes);
- the queue has a *lease*: once no link has used it for the subscriber's ``lease``
  (told in its hello, kept in the queue's arguments), it is deleted with what it
  holds. A restart starts the lease again.

The link end takes the queue's deliveries in order (``PeeringLink.take``) and the
queue's messages are settled only once the subscriber acknowledged them
(``Acked``), so a cut, a restart or a failover sends them again; their peering
identity travels with them in the journal (``Message.mesh``), so the subscriber
drops a copy it already holds.

:class:`PeeringQueues` keeps them for the node: attaches a subscribe end to its
queue, checks their bindings now and then, and deletes the queues found at
start-up whose subscriber never came back within their lease.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from amqlite.broker import PEERING_QUEUE_PREFIX, Broker, Delivery, Message, Session
from amqlite.broker.selector import SelectorError, compile_selector
from amqlite.errors import AmqliteError
from amqlite.peering import (
    BindingKey,
    Envelope,
    MeshStamp,
    PeeredExchange,
    PeeringLink,
    PeeringProtocolError,
)

ARG_EXCHANGE = "x-peering-exchange"
ARG_LINK = "x-peering-link"
ARG_LEASE = "x-peering-lease"
DEFAULT_LEASE = 24 * 3600.0
DEFAULT_BYTES = 16 * 1024 * 1024
RECONCILE_INTERVAL = 30.0  # peering queues' bindings are checked this often
INF = float("inf")

log = structlog.get_logger("amqlite.peering")


def queue_name(exchange: str, link_id: str) -> str:
    return f"{PEERING_QUEUE_PREFIX}{exchange}.{link_id}"


def lease_of(arguments: Mapping[str, Any]) -> float:
    lease = arguments.get(ARG_LEASE)
    if isinstance(lease, int | float) and not isinstance(lease, bool) and lease > 0:
        return float(lease)
    return DEFAULT_LEASE


def envelope_of(px: PeeredExchange, message: Message) -> Envelope:
    """The peering envelope of a message the queue delivered: the one it was
    published with (in memory, or as journaled), or a new one (a message routed
    here without one, e.g. dead-lettered)."""
    mesh = message.mesh
    if isinstance(mesh, Envelope):
        return mesh
    if isinstance(mesh, MeshStamp):  # (received in a compact run: applier._deliver_plain_run)
        env = mesh.envelope(message.routing_key, message.body, message.headers, message.properties)
        message.mesh = env
        return env
    if isinstance(mesh, dict):
        try:
            return Envelope.from_mesh_map(
                mesh,
                message.routing_key,
                message.body,
                message.headers,
                message.properties,
                px.ctx.exchange,
            )
        except PeeringProtocolError:
            pass
    env = px.envelope(message.routing_key, message.body, message.headers, message.properties)
    message.mesh = env
    return env


class PeeringQueue:
    """One subscriber's queue and the consumer that feeds its link end. The broker
    session is this object's (``owner``): the node's pump calls :meth:`push`."""

    def __init__(
        self,
        broker: Broker,
        px: PeeredExchange,
        link: PeeringLink,
        *,
        prefetch: int,
        now: float,
        on_deliveries: Callable[[PeeringQueue], None],
    ) -> None:
        self.px = px
        self.link = link
        self.vhost = px.ctx.vhost
        self.exchange = px.ctx.exchange
        self.name = queue_name(self.exchange, link.id)
        self._on_deliveries = on_deliveries
        host = broker.vhost(self.vhost)
        assert host is not None, "a peered exchange's vhost exists"
        self.host = host
        self.session: Session = broker.open_session(self.vhost, owner=self)
        #: sent, not yet acknowledged: (first seq, first dtag, count) blocks in which
        #: both follow each other (a batch the link took as one run is one block,
        #: any other delivery a block of one; settled by :meth:`acked`)
        self.taken: deque[tuple[int, int, int]] = deque()
        self.applied_digest = ""  # the interest digest the bindings were last made from
        self.prefetch = prefetch
        # the subscriber's filter (link.remote_filter) as compiled, and its text
        self._filter_text: str | None = None
        self._accepts: Callable[[Message], bool] | None = None
        self.declare(now)

    def declare(self, now: float) -> None:
        """Declare the queue (or take the one a restart kept) and consume from it."""
        host = self.host
        lease = self.link.remote_lease or DEFAULT_LEASE
        if self.name not in host.queues:
            cap = self.link.remote_buffer_bytes or DEFAULT_BYTES
            self.session.declare_queue(
                self.name,
                durable=True,
                reserved=True,
                arguments={
                    "x-max-length-bytes": cap,
                    "x-overflow": "drop-head",
                    ARG_EXCHANGE: self.exchange,
                    ARG_LINK: self.link.id,
                    ARG_LEASE: lease,
                },
            )
        self.session.consume(self.name, prefetch=self.prefetch, now=now)

    @property
    def lease(self) -> float:
        queue = self.host.queues.get(self.name)
        return lease_of(queue.arguments) if queue is not None else DEFAULT_LEASE

    def queued(self) -> int:
        """Messages waiting in the queue (not yet handed to the link)."""
        queue = self.host.queues.get(self.name)
        return queue.count() if queue is not None else 0

    def push(self) -> None:
        self._on_deliveries(self)

    def take(self) -> tuple[list[Delivery], bool]:
        """The queue's new deliveries, and whether the consumer was cancelled (the
        queue was deleted by hand: :meth:`declare` it again)."""
        return self.session.take_deliveries(), bool(self.session.take_cancellations())

    def wants(self, message: Message) -> bool:
        """Whether the subscriber's filter (``peer.filter``: the selectors of its
        consumers) accepts ``message``; True without a filter. A filter that does
        not compile here lets everything through (nothing is lost for it)."""
        text = self.link.remote_filter
        if text is None:
            return True
        if text != self._filter_text:
            self._filter_text = text
            try:
                self._accepts = compile_selector(text).accepts
            except SelectorError as exc:
                log.warning("peering_filter_ignored", link=self.link.id, error=str(exc))
                self._accepts = None
        accepts = self._accepts
        return accepts is None or accepts(message)

    def settle(self, dtag: int, now: float) -> None:
        self.session.ack(dtag, now=now)

    def acked(self, seq: int, now: float) -> None:
        """The subscriber holds everything up to ``seq``: settle those deliveries."""
        last = 0
        taken = self.taken
        while taken:
            first, dtag, n = taken[0]
            if first > seq:
                break
            if first + n - 1 <= seq:
                taken.popleft()
                last = dtag + n - 1
            else:  # acknowledged up to inside the block: it keeps the rest
                k = seq - first + 1
                last = dtag + k - 1
                taken[0] = (seq + 1, dtag + k, n - k)
                break
        if last and not self.session.closed:
            self.session.ack(last, multiple=True, now=now)

    def sync_bindings(self) -> bool:
        """Make the queue's bindings the subscriber's interest (once it is known):
        binds what is missing (also a binding deleted by hand), unbinds the rest.
        True when something changed."""
        interest = self.link.interest
        if interest is None or not interest.known:
            return False
        self.applied_digest = interest.digest.hex
        host = self.host
        queue = host.queues.get(self.name)
        exchange = host.exchanges.get(self.exchange)
        if queue is None or exchange is None:
            return False
        have: dict[BindingKey, tuple[str, dict[str, Any]]] = {}
        for bound_to, ident in list(queue.bindings):
            binding = bound_to.bindings.get(ident)
            if bound_to is exchange and binding is not None:
                have[BindingKey.of(binding.key, binding.arguments)] = (
                    binding.key,
                    binding.arguments,
                )
        want = interest.keys()
        changed = False
        try:
            for bkey in want - have.keys():
                self.session.bind(self.name, self.exchange, bkey.key, bkey.arguments_map())
                changed = True
            for bkey in have.keys() - want:
                key, arguments = have[bkey]
                self.session.unbind(self.name, self.exchange, key, arguments)
                changed = True
        except AmqliteError:  # the exchange went away meanwhile: the next check
            return changed
        return changed

    def close(self, *, delete: bool) -> None:
        """Stop consuming (what was taken and not acknowledged goes back to the
        queue); ``delete`` also deletes the queue with what it holds."""
        if self.session.closed:
            return
        if delete:
            with contextlib.suppress(AmqliteError):
                self.session.delete_queue(self.name)
        self.session.close()


class PeeringQueues:
    """The node's peering queues, by the id of the subscribe end they feed
    (``by_link``, shared with the action applier, which settles them).

    ``broker()`` is the node's broker now, ``session(vhost)`` the service's
    broker session, ``feed(queue)`` hands a queue's deliveries to its link end,
    ``wake()`` makes the service's timer take :meth:`next_deadline` again.
    """

    def __init__(
        self,
        by_link: dict[str, PeeringQueue],
        *,
        broker: Callable[[], Broker],
        session: Callable[[str], Session],
        feed: Callable[[PeeringQueue], None],
        wake: Callable[[], None],
    ) -> None:
        self.by_link = by_link
        self._broker = broker
        self._session = session
        self._feed = feed
        self._wake = wake
        self.reconcile_interval = RECONCILE_INTERVAL
        self._reconcile_at = INF
        # (vhost, queue) -> (since, lease): found at activation, no link uses them yet
        self._orphans: dict[tuple[str, str], tuple[float, float]] = {}

    def check_bindings_every(self, interval: float, now: float) -> None:
        """Check the queues' bindings every ``interval`` seconds, the first time now."""
        self.reconcile_interval = interval
        self._reconcile_at = now
        self._wake()

    def find_orphans(self, now: float) -> None:
        """At activation: every peering queue the broker holds waits for its
        subscriber, at most for its lease."""
        for host in self._broker().all_vhosts():
            for queue in host.queues.values():
                if queue.name.startswith(PEERING_QUEUE_PREFIX) and ARG_LINK in queue.arguments:
                    self._orphans[(host.name, queue.name)] = (now, lease_of(queue.arguments))

    def attach(self, px: PeeredExchange, link: PeeringLink, now: float) -> None:
        """After an acceptor end attached: a subscribe end consumes from its peering
        queue (declared on first use, kept across cuts and restarts)."""
        pq = self.by_link.get(link.id)
        if pq is not None and pq.link is not link:  # the dialer was reconfigured
            del self.by_link[link.id]
            pq.close(delete=not link.queue_fed)
            pq = None
        if not link.queue_fed:
            return
        if pq is None:
            pq = PeeringQueue(
                self._broker(),
                px,
                link,
                prefetch=2 * link.settings.max_in_flight,
                now=now,
                on_deliveries=self._feed,
            )
            self.by_link[link.id] = pq
            self._orphans.pop((pq.vhost, pq.name), None)
            if self._reconcile_at == INF:
                self._reconcile_at = now + self.reconcile_interval
                self._wake()
            log.info("peering_queue_attached", link=link.id, queue=pq.name, lease=pq.lease)
        pq.sync_bindings()
        self._feed(pq)

    def retention(self, link_id: str) -> float | None:
        """How long the acceptor end ``link_id`` waits for its subscriber (the
        queue's lease); None when it has no peering queue."""
        pq = self.by_link.get(link_id)
        return pq.lease if pq is not None else None

    def retire(self, link_id: str) -> None:
        """The subscriber's lease ran out: its queue goes, with what it holds."""
        pq = self.by_link.pop(link_id, None)
        if pq is not None:
            pq.close(delete=True)
            log.warning("peering_queue_expired", queue=pq.name, lease=pq.lease)

    def close_all(self) -> None:
        """Peering stopped: stop consuming (the queues stay)."""
        for pq in self.by_link.values():
            pq.close(delete=False)
        self.by_link.clear()
        self._orphans.clear()
        self._reconcile_at = INF

    def next_deadline(self) -> float:
        due = self._reconcile_at
        for since, lease in self._orphans.values():
            due = min(due, since + lease)
        return due

    def tick(self, now: float) -> None:
        if self._orphans:
            self._expire_orphans(now)
        if now >= self._reconcile_at:
            self._reconcile(now)

    def _reconcile(self, now: float) -> None:
        """The periodic check: a peering queue's binding deleted by hand comes back."""
        self._reconcile_at = now + self.reconcile_interval if self.by_link else INF
        for pq in list(self.by_link.values()):
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
