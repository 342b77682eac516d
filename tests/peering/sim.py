"""An in-memory shell for the peering core: brokers, connections and a clock.

This is what the trio shell will do, minus the I/O: every action the core returns
is applied here the way docs/peering.md ("Shell integration") says, and every
wire message goes through CBOR (encoded as the shell does, by
:mod:`amqlite.peering.cbor`), so the tests exercise the real map shapes. Each
node runs a real :class:`amqlite.broker.Broker`; what its queues hold is what its
local consumers would get.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import cbor2

from amqlite.broker import Broker, Message, PublishOutcome, Session
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
    PeeringLink,
    PeeringMode,
    Send,
    StateChanged,
)
from amqlite.peering import cbor as peering_cbor

EXCHANGE = "x"
FRAME_BYTES = 2048  # small, so that runs of forwards are split across frames too
INF = float("inf")

# Settings for simulations: no heartbeats and no periodic resync (so a quiet
# network has no deadlines left), acks at once.
SIM_LINK = LinkSettings(
    name="template",
    heartbeat=0.0,
    resync_interval=1e9,
    ack_every=1,
    ack_delay=0.0,
    buffer_bytes=1 << 30,
)


@dataclass
class Conn:
    dialer: SimNode
    dialer_link: str
    acceptor: SimNode
    acceptor_link: str | None = None
    to_acceptor: deque[dict[str, Any]] = field(default_factory=deque)
    to_dialer: deque[dict[str, Any]] = field(default_factory=deque)
    open: bool = True


class SimNode:
    """One broker with one peered exchange ``x``."""

    def __init__(
        self,
        net: Net,
        node_id: str,
        *,
        exchange_type: str = "topic",
        epoch: int = 1,
        max_hops: int = 8,
        acceptor: LinkSettings | None = None,
        confirm_at_once: bool = True,
    ) -> None:
        self.net = net
        self.node_id = node_id
        self.exchange_type = exchange_type
        self.max_hops = max_hops
        self.acceptor_settings = acceptor or replace(SIM_LINK, overflow=OverflowPolicy.BLOCK)
        self.confirm_at_once = confirm_at_once
        self.broker = Broker(node_id=node_id)
        self.session: Session = self.broker.open_session("/")
        self.session.declare_exchange(EXCHANGE, exchange_type)
        self.up = True
        self.epoch = epoch
        self.px = self._new_px()
        self.received: dict[str, list[bytes]] = {}  # queue -> bodies drained so far
        self.unconfirmed: list[Deliver] = []  # deliveries published but not yet confirmed
        self.confirmed: list[bytes] = []  # bodies of deliveries made safe, in order
        self.bindings: list[tuple[str, str, dict[str, Any] | None]] = []
        self.blocked: list[Blocked] = []
        self.available: list[str] = []
        self.dialers: list[LinkSettings] = []
        self.acked: dict[str, int] = {}  # queue-fed link -> last Acked seq

    def _new_px(self) -> PeeredExchange:
        return PeeredExchange(
            node_id=self.node_id,
            epoch=self.epoch,
            exchange=EXCHANGE,
            exchange_type=self.exchange_type,
            rand=self.net.rng.random,
            max_hops=self.max_hops,
            acceptor=self.acceptor_settings,
            spill_store=lambda link_id: MemorySpill(),
        )

    @property
    def address(self) -> Address:
        return Address(self.node_id, 5555)

    def link(self, link_id: str) -> PeeringLink:
        return self.px.links[link_id]

    # --- set-up ------------------------------------------------------------------------

    def bind(self, queue: str, key: str, arguments: dict[str, Any] | None = None) -> None:
        self.session.declare_queue(queue)
        self.session.bind(queue, EXCHANGE, key, arguments)
        self.bindings.append((queue, key, arguments))
        self.net.apply(self, self.px.bind(queue, key, arguments, now=self.net.now))

    def unbind(self, queue: str, key: str, arguments: dict[str, Any] | None = None) -> None:
        self.session.unbind(queue, EXCHANGE, key, arguments)
        self.bindings.remove((queue, key, arguments))
        self.net.apply(self, self.px.unbind(queue, key, arguments, now=self.net.now))

    def dial(self, remote: SimNode, mode: PeeringMode, **overrides: Any) -> PeeringLink:
        name = overrides.pop("name", f"{self.node_id}->{remote.node_id}")
        settings = replace(SIM_LINK, name=name, mode=mode, addresses=(remote.address,), **overrides)
        self.dialers.append(settings)
        link = self.px.add_link(settings)
        self.net.apply(self, link.start(self.net.now))
        return link

    # --- messages ----------------------------------------------------------------------

    def publish(self, key: str, body: bytes, headers: dict[str, Any] | None = None) -> None:
        """A client publishes on ``x`` here."""
        outcome = self._publish_locally(key, body, headers or {}, {})
        envelope = self.px.envelope(key, body, headers)
        routed = outcome is not PublishOutcome.UNROUTABLE
        self.net.apply(self, self.px.published(envelope, routed_locally=routed, now=self.net.now))
        self._feed_queues(envelope)

    def _feed_queues(self, envelope: Envelope) -> None:
        """The peering queues of queue-fed (subscribe, accepting) ends, modelled as
        their interest: what it matches is handed to the link at once."""
        for link in list(self.px.links.values()):
            interest = link.interest
            if (
                link.queue_fed
                and interest is not None
                and interest.matches(envelope.routing_key, envelope.headers)
            ):
                _, actions = link.take(envelope, self.net.now)
                self.net.apply(self, actions)

    def _publish_locally(
        self, key: str, body: bytes, headers: dict[str, Any], props: dict[str, Any]
    ) -> PublishOutcome:
        message = Message(EXCHANGE, key, body, dict(headers), dict(props))
        return self.session.publish(message, now=self.net.now)

    def deliver(self, action: Deliver) -> None:
        env = action.envelope
        outcome = self._publish_locally(
            env.routing_key, env.body, dict(env.headers), dict(env.properties)
        )
        self.unconfirmed.append(action)
        if self.confirm_at_once:
            self.confirm_all()
        routed = outcome is not PublishOutcome.UNROUTABLE
        self.net.apply(self, self.px.published(env, routed_locally=routed, now=self.net.now))
        self._feed_queues(env)

    def confirm_all(self) -> None:
        pending, self.unconfirmed = self.unconfirmed, []
        last: dict[str, int] = {}
        for d in pending:
            last[d.link] = max(last.get(d.link, 0), d.tag)
            self.confirmed.append(d.envelope.body)
        for link_id, tag in last.items():
            link = self.px.links.get(link_id)
            if link is not None:
                self.net.apply(self, link.confirm(tag, self.net.now))

    def drain(self, queue: str) -> list[bytes]:
        """Everything the queue got since the start (drains it into ``received``)."""
        got = self.received.setdefault(queue, [])
        while (item := self.session.get(queue, no_ack=True, now=self.net.now)) is not None:
            got.append(item[0].message.body)
        return got

    # --- restart -----------------------------------------------------------------------

    def restart(self, snapshot: dict[str, Any] | None) -> None:
        """Crash and start again with a new epoch, the same bindings and dialers.
        ``confirmed`` survives (it is what was made safe); unconfirmed deliveries
        are lost. Broker queues are not modelled across a restart."""
        for conn in list(self.net.conns):
            if self in (conn.dialer, conn.acceptor):
                self.net.cut(conn)
        self.unconfirmed = []  # published but never made safe: gone with the crash
        self.epoch += 1
        self.px = self._new_px()
        if snapshot is not None:
            self.px.restore(snapshot)
        for queue, key, arguments in self.bindings:
            self.px.bind(queue, key, arguments, now=self.net.now)
        for settings in self.dialers:
            link = self.px.add_link(settings)
            self.net.apply(self, link.start(self.net.now))


class Net:
    """Nodes, connections between them, a clock, and fault injection."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self.nodes: dict[str, SimNode] = {}
        self.conns: list[Conn] = []
        self.partitioned: set[frozenset[str]] = set()
        self.frames = 0
        self.log: list[Action] = []

    def node(self, node_id: str, **options: Any) -> SimNode:
        n = self.nodes[node_id] = SimNode(self, node_id, **options)
        return n

    # --- applying actions --------------------------------------------------------------

    def _conn_of(self, node: SimNode, link_id: str) -> Conn | None:
        for conn in self.conns:
            if conn.dialer is node and conn.dialer_link == link_id:
                return conn
            if conn.acceptor is node and conn.acceptor_link == link_id:
                return conn
        return None

    def _send(self, node: SimNode, sends: list[Send]) -> None:
        """Consecutive sends, encoded as the shell encodes a turn's sends (runs of
        forwards as ``peer.forwards``, in ``peer.batch`` frames of about
        FRAME_BYTES); the queue gets the maps the receiving shell unpacks."""
        by_conn: dict[int, tuple[Conn, list[Any]]] = {}
        for send in sends:
            conn = self._conn_of(node, send.link)
            if conn is not None:
                by_conn.setdefault(id(conn), (conn, []))[1].append(send.message)
        for conn, messages in by_conn.values():
            queue = conn.to_acceptor if conn.dialer is node else conn.to_dialer
            for frame in peering_cbor.encode_frames(messages, FRAME_BYTES):
                m = cbor2.loads(frame)
                queue.extend(m["msgs"] if m["type"] == "peer.batch" else [m])

    def apply(self, node: SimNode, actions: list[Action]) -> None:
        sends: list[Send] = []
        for action in actions:
            self.log.append(action)
            if isinstance(action, Send):
                sends.append(action)
                continue
            if sends:
                self._send(node, sends)
                sends = []
            if isinstance(action, Connect):
                self._connect(node, action)
            elif isinstance(action, Disconnect):
                conn = self._conn_of(node, action.link)
                if conn is not None:
                    self._close(conn, by=node)
            elif isinstance(action, Deliver):
                node.deliver(action)
            elif isinstance(action, Blocked):
                node.blocked.append(action)
            elif isinstance(action, BufferAvailable):
                node.available.append(action.link)
            elif isinstance(action, Acked):
                node.acked[action.link] = action.seq
            else:
                assert isinstance(action, StateChanged)
        if sends:
            self._send(node, sends)

    def _connect(self, node: SimNode, action: Connect) -> None:
        target = self.nodes.get(action.address.host)
        link = node.link(action.link)
        if target is None or not target.up or self._cut_between(node, target):
            self.apply(node, link.connection_lost(self.now, "connection refused"))
            return
        conn = Conn(node, action.link, target)
        self.conns.append(conn)
        self.apply(node, link.connected(self.now))

    def _cut_between(self, a: SimNode, b: SimNode) -> bool:
        return frozenset((a.node_id, b.node_id)) in self.partitioned

    def _close(self, conn: Conn, by: SimNode | None) -> None:
        """Close ``conn``; the end(s) that did not ask for it learn of the loss."""
        if not conn.open:
            return
        conn.open = False
        self.conns.remove(conn)
        if by is not conn.dialer:
            link = conn.dialer.px.links.get(conn.dialer_link)
            if link is not None:
                self.apply(conn.dialer, link.connection_lost(self.now, "connection lost"))
        if by is not conn.acceptor and conn.acceptor_link is not None:
            link = conn.acceptor.px.links.get(conn.acceptor_link)
            if link is not None:
                self.apply(conn.acceptor, link.connection_lost(self.now, "connection lost"))

    def cut(self, conn: Conn) -> None:
        """The network drops the connection: frames in flight are lost."""
        self._close(conn, by=None)

    def cut_all(self) -> None:
        for conn in list(self.conns):
            self.cut(conn)

    # --- moving frames -----------------------------------------------------------------

    def pending(self) -> list[tuple[Conn, bool]]:
        out = []
        for conn in self.conns:
            if conn.to_acceptor:
                out.append((conn, True))
            if conn.to_dialer:
                out.append((conn, False))
        return out

    def step(self, choice: int = 0) -> bool:
        """Move one frame (the ``choice``-th pending direction); False when none."""
        pending = self.pending()
        if not pending:
            return False
        conn, to_acceptor = pending[choice % len(pending)]
        self.frames += 1
        if to_acceptor:
            frame = conn.to_acceptor.popleft()
            node = conn.acceptor
            if conn.acceptor_link is None:
                conn.acceptor_link = node.px.acceptor_id(frame["node"], frame["link"])
                for other in list(self.conns):  # the shell closes the link's older connection
                    same = other.acceptor is node and other.acceptor_link == conn.acceptor_link
                    if other is not conn and same:
                        self._close(other, by=node)
                link, actions = node.px.attach(frame, self.now)
                self.apply(node, actions)
                return True
            link_id = conn.acceptor_link
        else:
            frame = conn.to_dialer.popleft()
            node, link_id = conn.dialer, conn.dialer_link
        link = node.px.links.get(link_id)
        if link is not None:
            self.apply(node, link.receive(frame, self.now))
        return True

    def next_deadline(self) -> float:
        return min((n.px.next_deadline() for n in self.nodes.values() if n.up), default=INF)

    def advance(self, dt: float) -> None:
        """Let time pass and tick every node."""
        self.now += dt
        for node in list(self.nodes.values()):
            if node.up:
                self.apply(node, node.px.tick(self.now))

    def run(self, max_frames: int = 200_000, horizon: float = 600.0) -> None:
        """Move frames and let timers fire until nothing is left to do; fails when
        the network is still busy after ``max_frames`` frames (something circulates)."""
        start = self.frames
        end = self.now + horizon
        while True:
            if self.step(self.rng.randrange(1 << 30)):
                assert self.frames - start < max_frames, "frames still circulating"
                continue
            deadline = self.next_deadline()
            if deadline > end:
                return
            self.advance(max(0.0, deadline - self.now))

    def all_up(self) -> bool:
        return all(
            link.state is LinkState.UP for n in self.nodes.values() for link in n.px.links.values()
        )
