"""One end of a peering link: the state machine, the handshake, and the message flow.

A link joins an exchange on this broker to the exchange of the same name on a
remote broker (or HA pair). The *dialer* end belongs to the broker whose
``[[cluster_mta]]`` names the remote; the *acceptor* end is created on the remote
when the dialer's hello arrives. The mode fixes the direction: in ``publish`` and
``forward`` messages flow dialer -> acceptor, in ``subscribe`` acceptor -> dialer.
The end that sends keeps an :class:`~amqlite.peering.outbound.OutboundLog`; the end
that receives advertises its interest (its exchange's bindings), delivers, and acks.

The accepting end of a ``subscribe`` link is *queue-fed*: the shell keeps a durable
peering queue on the exchange, bound with the subscriber's interest, and hands what
the queue delivers to :meth:`PeeringLink.take` (messages published meanwhile are not
offered to it); an :class:`~amqlite.peering.actions.Acked` action says which of
those the subscriber has made safe, so the shell settles them in the queue. The
queue, not the link's memory, holds what waits while the subscriber is away.

Every method takes ``now`` and returns a list of actions
(:mod:`amqlite.peering.actions`) for the shell; the link never does I/O. States
change only through :data:`amqlite.peering.states.TRANSITIONS`.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any, NamedTuple, Protocol

from amqlite.protocol.heartbeat import HeartbeatClock, negotiate_heartbeat

from .actions import (
    Acked,
    Action,
    Blocked,
    BufferAvailable,
    Connect,
    Deliver,
    DeliverRun,
    Disconnect,
    Persist,
    Send,
    StateChanged,
)
from .addresses import AddressRing
from .backoff import Backoff
from .errors import LinkStateError, PeeringProtocolError
from .forwarding import Decision, decide
from .inbound import SenderMark
from .interest import BindingKey, RemoteInterest
from .mode import PeeringMode
from .outbound import OutboundLog, SpillStore
from .settings import ExchangeContext, LinkRole, LinkSettings
from .states import LinkEvent, LinkState, next_state
from .wire import (
    Ack,
    Envelope,
    Filter,
    Forward,
    Forwards,
    Heartbeat,
    Hello,
    Interest,
    MeshId,
    PeeringMessage,
    PlainRun,
    Refused,
    ResyncRequest,
    forwards_fast,
    from_map,
    one_node_path,
    plain_run_of,
)

INF = float("inf")
S, E = LinkState, LinkEvent
# enum members as module constants: ``S.UP`` is an attribute look-up on the enum
# class, several times slower than a global, and these run for every message
_UP, _CLOSED, _SYNCING = S.UP, S.CLOSED, S.SYNCING
_FORWARD_MODE = PeeringMode.FORWARD
_FORWARDS = Forwards.TYPE
_new_pending = tuple.__new__  # _Pending(...) without the Python-level __new__
_new_mesh_id = tuple.__new__  # MeshId(...) likewise


class PlainPublish(Protocol):
    """What ``PublishHook.forwarded_later`` reads of a client publish (the
    protocol's publish event has these fields; both maps empty): its key and
    body go on to :meth:`PeeringLink.offer_plain_run`."""

    @property
    def key(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, Any]: ...
    @property
    def props(self) -> Mapping[str, Any]: ...


_CONNECTED = (S.SYNCING, S.UP)
_MESH_ID = attrgetter("mesh_id")
_NO_HEADERS: Mapping[str, Any] = {}


def _no_room(envelope: Envelope, now: float) -> int | None:
    """``OutboundLog.accept_if_room`` of a link that refused a message: none of those
    that follow it is taken before it (:meth:`PeeringLink.offer`)."""
    return None


class _Pending(NamedTuple):
    """Deliveries awaiting the shell's confirm: tags from ``tag`` on, one per
    envelope, of the sender's (``epoch``) ``seqs``. One per received run (a run
    with no copy seen before: ``seqs`` a range, ``envelopes`` the run's own list),
    not one per message. ``origin``: (node, epoch, first origin seq) when the
    envelopes' mesh ids are ``MeshId(node, epoch, first + i)`` (a compact run
    claimed as one range: settled as one), else None."""

    tag: int
    epoch: int
    seqs: Sequence[int]
    envelopes: Sequence[Envelope]
    origin: tuple[str, int, int] | None

    def items(self) -> list[tuple[int, int, int, MeshId]]:
        """(tag, epoch, seq, mesh id) of each delivery, for tests."""
        return [
            (self.tag + i, self.epoch, seq, env.mesh_id)
            for i, (seq, env) in enumerate(zip(self.seqs, self.envelopes, strict=True))
        ]


class PeeringLink:
    """One end of one peering link. Build it through
    :class:`~amqlite.peering.exchange.PeeredExchange` (``add_link`` or ``attach``)."""

    def __init__(
        self,
        settings: LinkSettings,
        ctx: ExchangeContext,
        role: LinkRole,
        *,
        rand: Callable[[], float],
        spill: SpillStore | None = None,
        link_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.ctx = ctx
        self.role = role
        self.id = link_id or settings.name
        self.name = settings.name
        self.mode = settings.mode
        self.state = S.IDLE
        self.sends = (role is LinkRole.DIALER) == settings.mode.dialer_sends
        self.queue_fed = self.sends and role is LinkRole.ACCEPTOR  # subscribe: see the module doc
        #: the shell keeps persistent messages of this sending log durably
        #: (:class:`~amqlite.peering.actions.Persist` / ``Acked`` / :meth:`restore`)
        self.durable_log = False
        self.log: OutboundLog | None = None
        self.interest: RemoteInterest | None = None
        if self.sends:
            self.log = OutboundLog(
                epoch=ctx.epoch,
                buffer_bytes=settings.buffer_bytes,
                overflow=settings.overflow,
                spill=spill,
            )
            self.interest = RemoteInterest(ctx.exchange_type)
        self.addresses = AddressRing(settings.addresses) if role is LinkRole.DIALER else None
        self.backoff = Backoff(rand, settings.backoff_initial, settings.backoff_max)
        self.clock = HeartbeatClock(settings.heartbeat, settings.heartbeat_misses)
        self.remote_node: str | None = None
        self.remote_epoch = 0
        self.remote_lease: float | None = None  # subscribe, acceptor: the dialer's wishes
        self.remote_buffer_bytes: int | None = None
        #: subscribe mode, dialer: the selector its consumers want (None: every
        #: message), told to the remote (``peer.filter``)
        self.local_filter: str | None = None
        #: subscribe mode, acceptor: the subscriber's filter (None: every message);
        #: its peering queue sends only what it accepts
        self.remote_filter: str | None = None
        self.last_error = ""
        self._retry_at = INF
        self._connect_deadline = INF
        self._resync_at = INF
        self._ack_due_at = INF
        self._highest_sent = 0
        self._blocked = False
        self._pending: deque[_Pending] = deque()  # delivered, awaiting the shell's confirm
        self._tags = 0
        self._acked = 0  # the last settled seq acknowledged on this connection
        self._resume_sent: tuple[str, int, int] | None = None  # (node, epoch, seq) we told
        self.counters: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.took = False  # whether the last offer() took the message

    def __repr__(self) -> str:
        return f"PeeringLink({self.id!r}, {self.role.value}, {self.mode.label}, {self.state.value})"

    @property
    def receives(self) -> bool:
        return not self.sends

    # --- state ------------------------------------------------------------------------

    def _fire(self, event: LinkEvent, reason: str = "") -> list[Action]:
        old = self.state
        self.state = next_state(old, event)
        return [StateChanged(self.id, old, self.state, reason)]

    def _require(self, role: LinkRole, what: str) -> None:
        if self.role is not role:
            raise LinkStateError(f"{what} is for a {role.value} link end; {self.id!r} is not")

    def start(self, now: float) -> list[Action]:
        """Dialer: begin connecting to the first address."""
        self._require(LinkRole.DIALER, "start")
        actions = self._fire(E.START)
        return actions + self._connect(now)

    def _connect(self, now: float) -> list[Action]:
        assert self.addresses is not None
        self._connect_deadline = now + self.settings.connect_timeout
        return [Connect(self.id, self.addresses.current)]

    def connected(self, now: float) -> list[Action]:
        """Dialer: the transport connection is open; says hello."""
        self._require(LinkRole.DIALER, "connected")
        actions = self._fire(E.CONNECTED)
        self._connect_deadline = now + self.settings.connect_timeout  # now for the handshake
        self.clock.interval = self.settings.heartbeat
        self.clock.start(now)
        return actions + self._sent(now, [self._send(self._hello())])

    def connection_lost(self, now: float, reason: str = "connection lost") -> list[Action]:
        """The transport failed or closed. A no-op when the link has no connection
        (after it asked for a ``Disconnect`` itself, for instance)."""
        if self.role is LinkRole.DIALER:
            if self.state not in (S.CONNECTING, *_CONNECTED):
                return []
            return self._lose(now, E.LOST, reason)
        if self.state is not _UP:
            return []
        return self._lose(now, E.DETACHED, reason)

    def _lose(self, now: float, event: LinkEvent, reason: str) -> list[Action]:
        actions = self._fire(event, reason)
        self.last_error = reason
        self._connect_deadline = self._resync_at = self._ack_due_at = INF
        if self.log is not None:
            self.log.rewind()
        if self.state is S.BACKOFF:
            assert self.addresses is not None
            self.addresses.advance()
            self._retry_at = now + self.backoff.next_delay()
            self.counters["reconnects"] += 1
        return actions

    def _drop(self, now: float, reason: str, event: LinkEvent | None = None) -> list[Action]:
        """We end the connection ourselves: tell the shell, then move on."""
        if event is None:
            event = E.LOST if self.role is LinkRole.DIALER else E.DETACHED
        return [Disconnect(self.id, reason), *self._lose(now, event, reason)]

    def close(self, now: float) -> list[Action]:
        """Stop for good (the link was removed from the configuration)."""
        if self.state is _CLOSED:
            return []
        had_connection = self.state in (S.CONNECTING, *_CONNECTED)
        actions = self._fire(E.CLOSE, "closed")
        self._retry_at = self._connect_deadline = self._resync_at = self._ack_due_at = INF
        return ([Disconnect(self.id, "closed")] if had_connection else []) + actions

    # --- time -------------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        """Retry after backoff, time out connects, heartbeats, delayed acks, resyncs."""
        state = self.state
        if state is S.BACKOFF:
            if now < self._retry_at:
                return []
            self._retry_at = INF
            return self._fire(E.RETRY_DUE) + self._connect(now)
        if state is S.CONNECTING and now >= self._connect_deadline:
            return self._drop(now, "connect timed out")
        if state not in _CONNECTED:
            return []
        if state is _SYNCING and now >= self._connect_deadline:
            return self._drop(now, "handshake timed out")
        if self.clock.remote_silent(now):
            return self._drop(now, f"remote silent for {now - self.clock.last_received:.3f}s")
        sends: list[Action] = []
        if state is _UP and self.receives:
            if now >= self._ack_due_at:
                sends += self._ack()
            if now >= self._resync_at:
                self._resync_at = now + self.settings.resync_interval
                sends.append(self._send(self._interest(full=False)))
        if not sends and self.clock.send_due(now):
            sends.append(self._send(Heartbeat()))
        return self._sent(now, sends)

    def next_deadline(self) -> float:
        """The earliest ``now`` at which :meth:`tick` has something to do."""
        state = self.state
        if state is S.BACKOFF:
            return self._retry_at
        if state is S.CONNECTING:
            return self._connect_deadline
        if state is _SYNCING:
            return min(self._connect_deadline, self.clock.next_deadline())
        if state is _UP:
            return min(self.clock.next_deadline(), self._resync_at, self._ack_due_at)
        return INF

    # --- handshake --------------------------------------------------------------------

    def _hello(self) -> Hello:
        ctx = self.ctx
        resume = None
        self._resume_sent = None
        if self.receives:
            node = self.remote_node or ctx.marks.sender_of(self.name)
            resume = ctx.marks.position(node, self.name) if node is not None else None
            if node is not None and resume is not None:
                self._resume_sent = (node, *resume)
        subscriber = self.role is LinkRole.DIALER and self.receives
        return Hello(
            node=ctx.node_id,
            link=self.name,
            vhost=ctx.vhost,
            exchange=ctx.exchange,
            exchange_type=ctx.exchange_type,
            mode=self.mode,
            epoch=self.log.epoch if self.log is not None else 0,
            resume=resume,
            heartbeat=self.settings.heartbeat,
            lease=self.settings.lease if subscriber else None,
            buffer_bytes=self.settings.buffer_bytes if subscriber else None,
        )

    def hello_mismatch(self, hello: Hello) -> str:
        """Why the other end's hello does not fit this link ("" when it does)."""
        ctx = self.ctx
        if hello.node == ctx.node_id:
            return f"the remote is this broker ({hello.node!r})"
        for field, want in (
            ("link", self.name),
            ("vhost", ctx.vhost),
            ("exchange", ctx.exchange),
            ("exchange_type", ctx.exchange_type),
        ):
            got = getattr(hello, field)
            if got != want:
                return f"{field} mismatch: ours {want!r}, theirs {got!r}"
        if hello.mode is not self.mode:
            return f"mode mismatch: ours {self.mode.label}, theirs {hello.mode.label}"
        return ""

    def attach(self, hello: Hello, now: float) -> list[Action]:
        """Acceptor: the dialer's hello arrived on a (new) connection; answer it and
        sync. The shell closes any older connection of this link first."""
        self._require(LinkRole.ACCEPTOR, "attach")
        mismatch = self.hello_mismatch(hello)
        if mismatch:
            raise LinkStateError(f"attach with a hello that does not fit: {mismatch}")
        if self.log is not None and hello.resume is not None and hello.resume[0] == self.log.epoch:
            self._check_ack(hello.resume[1])
        actions = self._fire(E.ATTACHED)
        self.clock.start(now)
        self._adopt(hello)
        sends = [self._send(self._hello()), *self._sync(hello, now)]
        return actions + self._sent(now, sends)

    def _adopt(self, hello: Hello) -> None:
        self.remote_node = hello.node
        self.remote_epoch = hello.epoch
        self.remote_lease, self.remote_buffer_bytes = hello.lease, hello.buffer_bytes
        self.clock.interval = negotiate_heartbeat(self.settings.heartbeat, hello.heartbeat)

    def _handshake(self, hello: Hello, now: float) -> list[Action]:
        mismatch = self.hello_mismatch(hello)
        if mismatch:
            return self._refused(now, mismatch)
        self._adopt(hello)
        actions = self._fire(E.HANDSHAKE_DONE)
        self.backoff.reset()
        self.last_error = ""
        self._connect_deadline = INF
        return actions + self._sync(hello, now)

    def _refused(self, now: float, reason: str) -> list[Action]:
        self.counters["refused"] += 1
        return self._drop(now, f"refused: {reason}", E.REFUSED)

    def _sync(self, hello: Hello, now: float) -> list[Action]:
        """After the handshake: the sender trims what the remote already holds and
        resends the rest; the receiver advertises its whole interest."""
        if self.log is not None:
            self.log.rewind()
            acked: list[Action] = []
            if hello.resume is not None and hello.resume[0] == self.log.epoch:
                self._check_ack(hello.resume[1])
                self.counters["acked"] += self.log.ack(hello.resume[1])
                if self.queue_fed or self.durable_log:
                    acked.append(Acked(self.id, self.log.gone_upto))
            return acked + self._pump() + self._room_again()
        self._ack_due_at = INF
        self._resync_at = now + self.settings.resync_interval
        actions: list[Action] = [self._send(self._interest(full=True))]
        if self.role is LinkRole.DIALER:  # a subscriber: its filter, whatever it is
            actions.append(self._send(Filter(self.local_filter)))
        assert self.remote_node is not None
        mark = self.ctx.marks.mark(self.remote_node, self.name, self.remote_epoch)
        if mark is not None:
            told = self._resume_sent
            same = told is not None and told[:2] == (self.remote_node, mark.epoch)
            self._acked = told[2] if told is not None and same else 0
            actions += self._settle(mark, now)
        return actions

    # --- receiving --------------------------------------------------------------------

    def receive(
        self,
        message: Mapping[str, Any] | PeeringMessage,
        now: float,
        *,
        deliver_runs: bool = False,
    ) -> list[Action]:
        """A message (a decoded map, or an already parsed message) arrived on the
        link's connection. A malformed or out-of-place message ends the connection
        (a ``Disconnect`` action); messages arriving when the link has no
        connection any more are ignored. ``deliver_runs``: the caller takes a
        :class:`DeliverRun` for a compact run's deliveries (one action, no
        envelope each) where it would get a ``Deliver`` each otherwise."""
        state = self.state
        if state not in _CONNECTED:
            return []
        self.clock.received(now)
        if state is _UP and type(message) is dict and not self.sends:
            kind = message.get("type")
            if kind == _FORWARDS:  # the per-message path (what _dispatch would do)
                run = forwards_fast(message)
                if run is not None:
                    return self._sent(now, self._on_forwards(run, now, deliver_runs))
        try:
            msg = from_map(message) if isinstance(message, Mapping) else message
            return self._sent(now, self._dispatch(msg, now))
        except PeeringProtocolError as exc:
            self.counters["protocol_errors"] += 1
            return self._drop(now, exc.text)

    def _dispatch(self, msg: PeeringMessage, now: float) -> list[Action]:
        if isinstance(msg, Heartbeat):
            return []
        if self.state is _SYNCING:
            if isinstance(msg, Hello):
                return self._handshake(msg, now)
            if isinstance(msg, Refused):
                return self._refused(now, f"{msg.code} {msg.text}")
        elif self.sends:
            if isinstance(msg, Ack):
                return self._on_ack(msg)
            if isinstance(msg, Interest):
                return self._on_interest(msg)
            if isinstance(msg, Filter):
                self.remote_filter = msg.selector
                self.counters["filters"] += 1
                return []
        else:
            if isinstance(msg, Forwards):
                return self._on_forwards(msg, now)
            if isinstance(msg, Forward):
                return self._on_forward(msg, now)
            if isinstance(msg, ResyncRequest):
                self.counters["resyncs"] += 1
                return [self._send(self._interest(full=True))]
        raise PeeringProtocolError(
            f"unexpected {msg.TYPE} on a {self.role.value} link end "
            f"({'sending' if self.sends else 'receiving'}) in state {self.state.value}"
        )

    def _check_ack(self, seq: int) -> None:
        if seq > self._highest_sent:
            raise PeeringProtocolError(
                f"peer.ack: seq {seq} was never sent (highest sent {self._highest_sent})"
            )

    def _on_ack(self, ack: Ack) -> list[Action]:
        log = self.log
        assert log is not None
        if ack.epoch != log.epoch:
            return []  # for an earlier incarnation of this broker's log
        self._check_ack(ack.seq)
        self.counters["acked"] += log.ack(ack.seq)
        durable = self.queue_fed or self.durable_log
        acked: list[Action] = [Acked(self.id, log.gone_upto)] if durable else []
        return acked + self._pump() + self._room_again()

    def _room_again(self) -> list[Action]:
        """After a refusal (``block``), say so once the buffer is at most half full."""
        log = self.log
        assert log is not None
        if self._blocked and log.buffered_bytes <= log.buffer_bytes // 2:
            self._blocked = False
            return [BufferAvailable(self.id)]
        return []

    def _on_interest(self, msg: Interest) -> list[Action]:
        interest = self.interest
        assert interest is not None
        if msg.full:
            interest.replace(msg.add)
        else:
            for bkey in msg.remove:
                interest.remove(bkey)
            for bkey in msg.add:
                interest.add(bkey)
        if interest.digest.count != msg.count or interest.digest.hex != msg.digest:
            self.counters["resyncs"] += 1
            return [self._send(ResyncRequest())]
        return []

    def _on_forward(self, fwd: Forward, now: float) -> list[Action]:
        ctx = self.ctx
        assert self.remote_node is not None
        mark = ctx.marks.mark(self.remote_node, self.name, self.remote_epoch)
        if mark is None or fwd.seq <= mark.accepted:
            self.counters["duplicates_resent"] += 1  # resent after a cut, already here
            return []
        mark.accepted = fwd.seq
        env = fwd.envelope
        if ctx.node_id in env.path or env.hops > ctx.max_hops:
            self.counters["loops_dropped"] += 1
        elif not ctx.seen.claim(env.mesh_id):
            self.counters["duplicates_other_path"] += 1  # reached us along another path
        else:
            self._tags += 1
            self._pending.append(
                _new_pending(_Pending, (self._tags, mark.epoch, (fwd.seq,), (env,), None))
            )
            self.counters["received"] += 1
            return [Deliver(self.id, self._tags, env), *self._settle(mark, now)]
        return self._settle(mark, now)

    def _on_forwards(self, run: Forwards, now: float, deliver_runs: bool = False) -> list[Action]:
        """A run of forwards: what :meth:`_on_forward` does for each, in order, with
        the mark, the loop check (path and hops are the run's) and the settling
        done once."""
        ctx = self.ctx
        assert self.remote_node is not None
        mark = ctx.marks.mark(self.remote_node, self.name, self.remote_epoch)
        envelopes = run.envelopes
        counters = self.counters
        if mark is None:
            counters["duplicates_resent"] += len(envelopes)
            return []
        first = run.seq
        skip = mark.accepted - first + 1  # resent after a cut, already here
        if skip > 0:
            counters["duplicates_resent"] += min(skip, len(envelopes))
            envelopes = envelopes[skip:]
            first += skip
            if not envelopes:
                return []
        mark.accepted = first + len(envelopes) - 1
        env0 = envelopes[0]
        if ctx.node_id in env0.path or env0.hops > ctx.max_hops:
            counters["loops_dropped"] += len(envelopes)
            return self._settle(mark, now)
        link_id, tag, n = self.id, self._tags + 1, len(envelopes)
        origin = run.origin  # the compact form's: the ids are a range (claimed as one)
        if origin is not None:
            node, epoch, origin_seq = origin
            origin = (node, epoch, origin_seq + first - run.seq)  # past the resent ones
            if not ctx.seen.claim_run(*origin, n):
                origin = None  # some seen before: claim_each says which
        if origin is not None:
            seqs: Sequence[int] = range(first, first + n)
            if deliver_runs and type(envelopes) is PlainRun:
                # Why this exists beside the Delivers below: see PlainRun (one action
                # for the run, no envelope made per message);
                # tests/peering/test_fast_paths.py checks it against them
                self._tags = tag + n - 1
                self._pending.append(
                    _new_pending(_Pending, (tag, mark.epoch, seqs, envelopes, origin))
                )
                counters["received"] += n
                return [DeliverRun(link_id, tag, envelopes), *self._settle(mark, now)]
        elif all(firsts := ctx.seen.claim_each(map(_MESH_ID, envelopes))):
            # the usual case: one pending entry for the run, no copies
            seqs = range(first, first + n)
        else:
            kept = [i for i, first_copy in enumerate(firsts) if first_copy]
            counters["duplicates_other_path"] += n - len(kept)  # along another path
            if not kept:
                counters["received"] += 0  # (the key, as a run with some delivered)
                return self._settle(mark, now)
            seqs = [first + i for i in kept]
            envelopes = [envelopes[i] for i in kept]
            n = len(kept)
        self._tags = tag + n - 1
        self._pending.append(_new_pending(_Pending, (tag, mark.epoch, seqs, envelopes, origin)))
        counters["received"] += n
        actions: list[Action] = list(map(Deliver, repeat(link_id), range(tag, tag + n), envelopes))
        return actions + self._settle(mark, now)

    def confirm(self, tag: int, now: float) -> list[Action]:
        """The shell has published every delivery up to ``tag`` locally and it is
        safe; they may now be acknowledged to the sender."""
        pending = self._pending
        seen = self.ctx.seen
        while pending:
            first = pending[0]
            n = tag - first.tag + 1
            if n <= 0:
                break
            envelopes, origin = first.envelopes, first.origin
            if n >= len(envelopes):
                pending.popleft()
                if origin is not None:
                    seen.settle_run(*origin, len(envelopes))
                else:
                    seen.settle_each(map(_MESH_ID, envelopes))
                continue
            if origin is not None:
                node, epoch, origin_seq = origin
                seen.settle_run(node, epoch, origin_seq, n)
                origin = (node, epoch, origin_seq + n)
            else:
                seen.settle_each(map(_MESH_ID, envelopes[:n]))
            pending[0] = _new_pending(
                _Pending, (first.tag + n, first.epoch, first.seqs[n:], envelopes[n:], origin)
            )
            break
        if self.remote_node is None:
            return []
        mark = self.ctx.marks.mark(self.remote_node, self.name, self.remote_epoch)
        return [] if mark is None else self._sent(now, self._settle(mark, now))

    def _settle(self, mark: SenderMark, now: float) -> list[Action]:
        """Move the settled mark as far as confirms allow; ack when due."""
        settled = mark.accepted
        for p in self._pending:
            if p.epoch == mark.epoch:
                settled = p.seqs[0] - 1
                break
        mark.settled = max(mark.settled, settled)
        if self.state is not _UP or mark.epoch != self.remote_epoch or mark.settled <= self._acked:
            return []
        if mark.settled - self._acked >= self.settings.ack_every:
            return self._ack()
        if self._ack_due_at == INF:
            self._ack_due_at = now + self.settings.ack_delay
        return []

    def _ack(self) -> list[Action]:
        self._ack_due_at = INF
        assert self.remote_node is not None
        position = self.ctx.marks.position(self.remote_node, self.name)
        if position is None or position[0] != self.remote_epoch or position[1] <= self._acked:
            return []
        self._acked = position[1]
        return [self._send(Ack(position[0], position[1]))]

    # --- sending ----------------------------------------------------------------------

    def offer(self, envelope: Envelope, *, routed_locally: bool, now: float) -> list[Action]:
        """A message was published on the local exchange (by a client, or delivered
        from another link): send it if this end sends and the rules allow.
        Afterwards :attr:`took` says whether this end took it (into its log, or
        refused it for now: ``Blocked``)."""
        self.took = False
        state = self.state
        if state is _CLOSED or not self.sends or self.queue_fed:
            return []
        interest = self.interest
        remote = self.remote_node
        if (
            (remote is not None and remote in envelope.path)
            or envelope.hops >= self.ctx.max_hops
            or (routed_locally and self.mode is _FORWARD_MODE)
            or (
                interest is not None
                and not interest.matches(envelope.routing_key, envelope.headers)
            )
        ):  # some rule says no: decide() says which (it is the reference for them)
            decision = decide(
                sends=self.sends,
                mode=self.mode,
                routed_locally=routed_locally,
                remote_node=remote,
                path=envelope.path,
                hops=envelope.hops,
                max_hops=self.ctx.max_hops,
                interest=interest if interest is not None else _ANY_INTEREST,
                routing_key=envelope.routing_key,
                headers=envelope.headers,
            )
            if decision is not Decision.SEND:
                self.skipped[decision.value] += 1
                return []
        log = self.log
        assert log is not None
        self.took = True
        if self._blocked:
            # a refused message waits for room (the shell holds it): this one queues
            # behind it, not past it. The remote takes a sender's messages in mesh id
            # order within a window (SeenMessages): one overtaken by more than that
            # would be dropped there as already seen (tests/peering/test_link.py)
            log.blocked += 1
            return [Blocked(self.id, envelope)]
        dropped = log.dropped
        out = envelope.onward(self.ctx.node_id)
        seq = log.accept(out, now)
        if seq is None:
            self._blocked = True
            return [Blocked(self.id, envelope)]
        self.counters["accepted"] += 1
        if self.durable_log and (log.dropped != dropped or envelope.properties.get("persistent")):
            return self._kept(log, seq, out, dropped, state, now)
        if state is not _UP:
            return []
        entry = log.take_last(self.settings.max_in_flight)
        if entry is None:
            return self._sent(now, self._pump())
        seq = entry.seq  # the usual case: just this one is due; send it
        if seq > self._highest_sent:
            self._highest_sent = seq
            self.counters["forwarded"] += 1
        else:  # pragma: no cover (the last one accepted is new)
            self.counters["resent"] += 1
        self.clock.sent(now)
        return [Send(self.id, Forward(seq, entry.envelope))]

    def offer_run(
        self, envelopes: Sequence[Envelope], routed: Sequence[bool], now: float
    ) -> list[Action]:
        """:meth:`offer` for each of ``envelopes`` in order (``routed[i]`` says
        whether a local queue took ``envelopes[i]``), with what falls due sent at
        the end as one ``Send`` of a :class:`~amqlite.peering.wire.Forwards` per
        run of the same exchange, path and hops (what ``peer.forwards`` carries)
        instead of one ``Send`` of a ``Forward`` each. Afterwards :attr:`took`
        says whether this end took the last one.

        Why this exists beside :meth:`offer`: the sending broker is one thread,
        and offering each of a client's publishes alone (the offer, the log
        append, a ``Send`` and a turn each) was a third of what it spends per
        peered message beyond what the receiving broker spends on a local one.
        A message that needs more than an append to the log in memory (the
        overflow policy has to act, or a durable log keeps a persistent one)
        takes :meth:`offer` itself, after what the run accepted so far is sent,
        so the order of the actions is :meth:`offer`'s
        (``tests/peering/test_fast_paths.py`` checks the same forwards, other
        actions, counters and log as :meth:`offer` for each)."""
        state = self.state
        if state is _CLOSED or not self.sends or self.queue_fed:
            self.took = False
            return []
        log = self.log
        assert log is not None
        interest, remote = self.interest, self.remote_node
        max_hops, node = self.ctx.max_hops, self.ctx.node_id
        forward_mode, durable = self.mode is _FORWARD_MODE, self.durable_log
        one_path, grows = one_node_path(node), 16 + len(node)  # what onward(node) adds
        # once a message is refused (block), every later one goes offer()'s way: Blocked
        accept = _no_room if self._blocked else log.accept_if_room
        actions: list[Action] = []
        accepted = 0
        took = False
        # the remote's verdict on the last routing key: a run's keys mostly repeat, and
        # only a headers exchange looks at more than the key
        by_key = interest is not None and interest.exchange_type != "headers"
        last_key: str | None = None
        last_match = True
        for envelope, routed_locally in zip(envelopes, routed, strict=True):
            if interest is None:
                match = True
            elif by_key and envelope.routing_key == last_key:
                match = last_match
            else:
                match = interest.matches(envelope.routing_key, envelope.headers)
                last_key, last_match = envelope.routing_key, match
            if (
                (remote is not None and remote in envelope.path)
                or envelope.hops >= max_hops
                or (routed_locally and forward_mode)
                or not match
            ):  # as in offer(): decide() says which rule
                decision = decide(
                    sends=True,
                    mode=self.mode,
                    routed_locally=routed_locally,
                    remote_node=remote,
                    path=envelope.path,
                    hops=envelope.hops,
                    max_hops=max_hops,
                    interest=interest if interest is not None else _ANY_INTEREST,
                    routing_key=envelope.routing_key,
                    headers=envelope.headers,
                )
                if decision is not Decision.SEND:
                    self.skipped[decision.value] += 1
                    took = False
                    continue
            seq = None
            if not (durable and envelope.properties.get("persistent")):
                size = envelope._size
                if size >= 0 and not envelope.path:
                    # envelope.onward(node), inlined for a message published here
                    # with its size known (a client's: every one of a run): a call
                    # per message less (test_an_onward_envelope_knows_its_size and
                    # test_offering_a_run_is_offering_each hold the two to the same)
                    out = Envelope(
                        envelope.mesh_id,
                        envelope.routing_key,
                        envelope.body,
                        envelope.headers,
                        envelope.properties,
                        envelope.exchange,
                        one_path,
                        envelope.hops + 1,
                        size + grows,
                    )
                else:
                    out = envelope.onward(node)
                seq = accept(out, now)
            if seq is None:  # offer()'s way for this one: the run so far goes first
                if accepted:
                    self.counters["accepted"] += accepted
                    accepted = 0
                    actions += self._sent(now, self._pump())
                actions += self.offer(envelope, routed_locally=routed_locally, now=now)
                took = self.took
                if self._blocked:
                    accept = _no_room
                continue
            accepted += 1
            took = True
        self.took = took
        if accepted:
            self.counters["accepted"] += accepted
            actions += self._sent(now, self._pump())
        return actions

    def offer_plain_run(
        self, first_mint: int, keys: list[str], bodies: list[bytes], now: float
    ) -> list[Action]:
        """:meth:`offer_run` of the envelopes :meth:`PeeredExchange.envelope` would
        mint for the client publishes ``keys[i]`` / ``bodies[i]`` here (no headers,
        no properties, no local queue took them), their mesh ids numbered from
        ``first_mint`` on (the lists are this end's, or its log's, from now on):
        each message's onward envelope is made at once, the minted one only for a
        message the overflow policy has to act on.

        Why this exists beside :meth:`offer_run`: on a sending site (no queue
        bound to the exchange) the minted envelope of such a publish was made
        only to be copied here; one envelope per message less
        (``tests/peering/test_fast_paths.py`` checks the same actions, counters,
        skipped and log as :meth:`offer_run` of the minted envelopes)."""
        if self.state is _CLOSED or not self.sends or self.queue_fed:
            self.took = False
            return []
        log = self.log
        assert log is not None
        ctx = self.ctx
        interest, node, epoch, exchange = self.interest, ctx.node_id, ctx.epoch, ctx.exchange
        one_path = one_node_path(node)
        minted_size = 64 + len(exchange)  # envelope()'s size of a plain publish, but the
        onward_size = minted_size + 16 + len(node)  # key and body; onward() adds these
        if not self._blocked and bodies:
            # Why this exists beside the loop below: a client read's run of plain
            # publishes (a sending site's usual case) that the remote wants and
            # the log has room for needs no decision per message; it goes into the
            # log as one PlainRun (keys and bodies: no envelope, no mesh id each,
            # see OutboundLog), where the loop spent a Python iteration, an
            # attribute look-up per field and a call per message.
            # test_offering_a_plain_run_is_offering_its_minted_envelopes checks the
            # two against offer_run().
            distinct = set(keys)
            if interest is None or (
                interest.exchange_type != "headers"
                and all(interest.matches(k, _NO_HEADERS) for k in distinct)
            ):
                n = len(keys)
                total = onward_size * n + sum(map(len, bodies)) + sum(map(len, keys))
                if log.has_room(total):  # (quick no: then the loop, one by one)
                    run = PlainRun(
                        node,
                        epoch,
                        first_mint,
                        keys[0] if len(distinct) == 1 else keys,
                        bodies,
                        exchange,
                        one_path,
                        1,
                    )
                    if log.accept_run_if_room(run, total, now) is not None:
                        self.took = True
                        self.counters["accepted"] += n
                        return self._sent(now, self._pump())
        # once a message is refused (block), every later one goes offer()'s way: Blocked
        accept = _no_room if self._blocked else log.accept_if_room
        actions: list[Action] = []
        accepted = 0
        took = False
        by_key = interest is not None and interest.exchange_type != "headers"
        last_key: str | None = None
        last_match = True
        mint = first_mint - 1
        for key, body in zip(keys, bodies, strict=True):
            mint += 1
            if interest is None:
                match = True
            elif by_key and key == last_key:
                match = last_match
            else:
                match = interest.matches(key, _NO_HEADERS)
                last_key, last_match = key, match
            if not match:  # (no other rule stops a plain publish here: offer_run's)
                decision = decide(
                    sends=True,
                    mode=self.mode,
                    routed_locally=False,
                    remote_node=self.remote_node,
                    path=(),
                    hops=0,
                    max_hops=ctx.max_hops,
                    interest=interest if interest is not None else _ANY_INTEREST,
                    routing_key=key,
                    headers=_NO_HEADERS,
                )
                if decision is not Decision.SEND:
                    self.skipped[decision.value] += 1
                    took = False
                    continue
            mesh_id = _new_mesh_id(MeshId, (node, epoch, mint))
            size = len(body) + len(key)
            headers: dict[str, Any] = {}  # (each message its own maps, as envelope() gives)
            props: dict[str, Any] = {}
            out = Envelope(
                mesh_id, key, body, headers, props, exchange, one_path, 1, onward_size + size
            )
            seq = accept(out, now)
            if seq is None:  # offer()'s way for this one: the run so far goes first
                if accepted:
                    self.counters["accepted"] += accepted
                    accepted = 0
                    actions += self._sent(now, self._pump())
                minted = Envelope(
                    mesh_id, key, body, headers, props, exchange, (), 0, minted_size + size
                )
                actions += self.offer(minted, routed_locally=False, now=now)
                took = self.took
                if self._blocked:
                    accept = _no_room
                continue
            accepted += 1
            took = True
        self.took = took
        if accepted:
            self.counters["accepted"] += accepted
            actions += self._sent(now, self._pump())
        return actions

    def _kept(
        self, log: OutboundLog, seq: int, out: Envelope, dropped: int, state: LinkState, now: float
    ) -> list[Action]:
        """:meth:`offer`'s tail on a durable log, for a persistent message or after
        ``drop-oldest`` made room: what the shell must keep (``Persist``) or may
        settle (``Acked``), then the sends."""
        kept: list[Action] = []
        if log.dropped != dropped:  # those are gone for good
            kept.append(Acked(self.id, log.gone_upto))
        if out.properties.get("persistent"):
            kept.append(Persist(self.id, seq, out))
        if state is not _UP:
            return kept
        return kept + self._sent(now, self._pump())

    def restore(self, envelopes: list[Envelope], now: float) -> list[int]:
        """A durable sending log after a restart or failover: take back, in order,
        the messages an earlier log of this link kept (:class:`Persist`) and the
        remote had not acknowledged; they go out like new ones, under new sequence
        numbers, with their identities (the remote drops what it already holds).
        Returns their sequence numbers. Call it before :meth:`start`."""
        log = self.log
        if log is None:
            raise LinkStateError(f"{self.id!r} does not send: nothing to restore")
        seqs = []
        for envelope in envelopes:
            seq = log.accept(envelope, now)
            if seq is None:  # block: the byte cap is no reason to lose them
                seq = log.force(envelope, now)
            seqs.append(seq)
        self.counters["accepted"] += len(seqs)
        self.counters["restored"] += len(seqs)
        return seqs

    def take(self, envelope: Envelope, now: float) -> tuple[int | None, list[Action]]:
        """Queue-fed end: the peering queue delivered ``envelope`` (it matched the
        subscriber's interest there). Its sequence number in the log, or None when
        the rules skip it (the subscriber is on its path, or its hops are used up):
        the shell settles a skipped delivery at once, a taken one on
        :class:`~amqlite.peering.actions.Acked` for its number."""
        if not self.queue_fed:
            raise LinkStateError(f"take is for a queue-fed link end; {self.id!r} is not")
        if self.state is _CLOSED:
            return None, []
        decision = decide(
            sends=True,
            mode=self.mode,
            routed_locally=False,
            remote_node=self.remote_node,
            path=envelope.path,
            hops=envelope.hops,
            max_hops=self.ctx.max_hops,
            interest=_ANY_INTEREST,  # the queue's bindings chose it
            routing_key=envelope.routing_key,
            headers=envelope.headers,
        )
        if decision is not Decision.SEND:
            self.skipped[decision.value] += 1
            return None, []
        assert self.log is not None
        seq = self.log.accept(envelope.onward(self.ctx.node_id), now)
        assert seq is not None, "a queue-fed log has no byte cap: the queue has it"
        self.counters["accepted"] += 1
        if self.state is not _UP:
            return seq, []
        return seq, self._sent(now, self._pump())

    def take_run(
        self, envelopes: Sequence[Envelope], now: float
    ) -> tuple[Sequence[int | None], list[Action]]:
        """Queue-fed end: :meth:`take` for each of a batch the peering queue
        delivered at once, in order, with the sends worked out once at the end (one
        pump instead of one per message). Why it exists: the subscribe path's
        per-message cost; ``tests/peering/test_fast_paths.py`` checks it gives what
        calling :meth:`take` for each gives (numbers, sends, counters, the log).
        The numbers are a ``range`` when the batch went into the log as one run."""
        if not self.queue_fed:
            raise LinkStateError(f"take is for a queue-fed link end; {self.id!r} is not")
        if self.state is _CLOSED:
            return [None] * len(envelopes), []
        log = self.log
        assert log is not None
        remote, max_hops, node = self.remote_node, self.ctx.max_hops, self.ctx.node_id
        run = plain_run_of(envelopes)
        if run is not None and not (
            (remote is not None and remote in run.path) or run.hops >= max_hops
        ):
            # Why this exists beside the loop below: a batch of a client's plain
            # publishes (minted one after the other) goes into the log as one
            # PlainRun (see OutboundLog), out as one compact run and off the log
            # on the ack as one item, where the loop made an onward envelope and
            # an append each. test_taking_a_batch_is_taking_each checks the two.
            out = run.onward(node)
            first = log.accept_run_if_room(out, out.size(), now)
            if first is not None:
                n = len(out)
                self.counters["accepted"] += n
                numbers = range(first, first + n)
                if self.state is not _UP:
                    return numbers, []
                return numbers, self._sent(now, self._pump())
        accept = log.accept
        seqs: list[int | None] = []
        add = seqs.append
        for envelope in envelopes:
            if (remote is not None and remote in envelope.path) or envelope.hops >= max_hops:
                add(self.take(envelope, now)[0])  # skipped (decide() says why, take counts it)
                continue
            seq = accept(envelope.onward(node), now)
            assert seq is not None, "a queue-fed log has no byte cap: the queue has it"
            add(seq)
        taken = len(seqs) - seqs.count(None)
        self.counters["accepted"] += taken
        if self.state is not _UP or not taken:
            return seqs, []
        return seqs, self._sent(now, self._pump())

    @property
    def refusing(self) -> bool:
        """``block``: this end refused a message and takes none until it has room
        again (:class:`BufferAvailable`); the shell holds its publishers back."""
        return self._blocked

    def has_room(self, envelope: Envelope) -> bool:
        """Would :meth:`offer` take this message without overflowing? (True for an
        end that does not send.) Lets the shell hold a publisher back up front."""
        return self.log is None or (not self._blocked and self.log.has_room(envelope.size()))

    def _pump(self) -> list[Action]:
        """What falls due on this connection now (the window allowing), as one
        ``Send`` of a :class:`~amqlite.peering.wire.Forwards` per run of the same
        exchange, path and hops (the entries' seqs are consecutive): a run is what
        goes on the wire (``peer.forwards``), and one ``Send`` per message was a
        tenth of the sending broker's time when acks open the window
        (``tests/peering/test_fast_paths.py`` expands the runs against the
        forwards one by one)."""
        log = self.log
        if log is None or self.state is not _UP:
            return []
        room = self.settings.max_in_flight - log.in_flight
        if room <= 0 and log.spill is None:
            return []  # the window is full (what take_unsent would say; offers hit it often)
        first, items = log.take_unsent_run(room)
        if not items:
            return []
        if log.holds_runs:
            return self._pump_runs(first, items)
        envelopes: list[Envelope] = items  # type: ignore[assignment]  # (no run held)
        highest, last = self._highest_sent, first + len(envelopes) - 1
        if last > highest:  # in sequence order
            fresh = last - max(highest, first - 1)
            self._highest_sent = last
            self.counters["forwarded"] += fresh
            if len(envelopes) > fresh:
                self.counters["resent"] += len(envelopes) - fresh
        else:
            self.counters["resent"] += len(envelopes)
        link_id = self.id
        env = envelopes[0]
        exchange, path, hops = env.exchange, env.path, env.hops
        i, n = 1, len(envelopes)
        while i < n:
            env = envelopes[i]
            if env.path != path or env.hops != hops or env.exchange != exchange:
                break
            i += 1
        if i == n:  # the usual case: one run (a client's messages, published here)
            return [Send(link_id, Forwards(first, envelopes))]
        out: list[Action] = [Send(link_id, Forwards(first, envelopes[:i]))]
        run, start = [env], first + i
        exchange, path, hops = env.exchange, env.path, env.hops
        for env in itertools.islice(envelopes, i + 1, None):
            if env.path != path or env.hops != hops or env.exchange != exchange:
                out.append(Send(link_id, Forwards(start, run)))
                start += len(run)
                exchange, path, hops = env.exchange, env.path, env.hops
                run = [env]
            else:
                run.append(env)
        out.append(Send(link_id, Forwards(start, run)))
        return out

    def _pump_runs(self, first: int, items: list[Envelope | PlainRun]) -> list[Action]:
        """:meth:`_pump`'s sends when the log holds runs of plain publishes
        (:class:`PlainRun`): a ``Forwards`` of each run (runs that chain were joined
        by the log), the envelopes between them grouped as :meth:`_pump` does."""
        n = 0
        for item in items:
            n += len(item) if isinstance(item, PlainRun) else 1
        highest, last = self._highest_sent, first + n - 1
        if last > highest:  # in sequence order
            fresh = last - max(highest, first - 1)
            self._highest_sent = last
            self.counters["forwarded"] += fresh
            if n > fresh:
                self.counters["resent"] += n - fresh
        else:
            self.counters["resent"] += n
        link_id = self.id
        if len(items) == 1 and type(items[0]) is PlainRun:
            # the usual case: one held run (a client read's messages, published
            # here), or runs that continue each other (the log joined them)
            return [Send(link_id, Forwards(first, items[0]))]
        out: list[Action] = []
        start = first
        run: list[Envelope] = []
        path: tuple[str, ...] = ()
        exchange, hops = "", -1
        for item in items:
            if isinstance(item, PlainRun):  # a run of its own (its messages share all)
                if run:
                    out.append(Send(link_id, Forwards(start, run)))
                    start += len(run)
                    run = []
                out.append(Send(link_id, Forwards(start, item)))
                start += len(item)
                continue
            env = item
            if run and (env.path != path or env.hops != hops or env.exchange != exchange):
                out.append(Send(link_id, Forwards(start, run)))
                start += len(run)
                run = []
            if not run:
                exchange, path, hops = env.exchange, env.path, env.hops
            run.append(env)
        if run:
            out.append(Send(link_id, Forwards(start, run)))
        return out

    # --- interest (the receiving end) ---------------------------------------------------

    def _interest(
        self, *, full: bool, add: tuple[BindingKey, ...] = (), remove: tuple[BindingKey, ...] = ()
    ) -> Interest:
        mirror = self.ctx.mirror
        if full:
            add, remove = tuple(mirror.keys()), ()
        return Interest(full, add, remove, mirror.digest.count, mirror.digest.hex)

    def interest_changed(
        self, added: tuple[BindingKey, ...], removed: tuple[BindingKey, ...], now: float
    ) -> list[Action]:
        """The local exchange gained or lost distinct bindings: tell the remote."""
        if not self.receives or self.state is not _UP or not (added or removed):
            return []
        return self._sent(now, [self._send(self._interest(full=False, add=added, remove=removed))])

    def filter_changed(self, selector: str | None, now: float) -> list[Action]:
        """A subscriber's consumers now want only what ``selector`` accepts (None:
        everything): tell the remote (now, or when the link is next up)."""
        if not self.receives or self.role is not LinkRole.DIALER or selector == self.local_filter:
            return []
        self.local_filter = selector
        if self.state is not _UP:
            return []
        return self._sent(now, [self._send(Filter(selector))])

    def filtered(self, count: int = 1) -> None:
        """The shell kept ``count`` messages from crossing: the remote filter
        rejected them (counted in ``stats``)."""
        self.counters["filtered"] += count

    # --- helpers ------------------------------------------------------------------------

    def _send(self, message: PeeringMessage) -> Send:
        return Send(self.id, message)

    def _sent(self, now: float, actions: list[Action]) -> list[Action]:
        for a in actions:
            if type(a) is Send:
                self.clock.sent(now)
                break
        return actions

    # --- figures ------------------------------------------------------------------------

    def stats(self, now: float) -> dict[str, Any]:
        """This link end's line in ``amqlite status`` (under ``links``)."""
        log = self.log
        oldest = log.oldest_accepted_at if log is not None else None
        c = self.counters
        return {
            "link": self.id,
            "role": self.role.value,
            "vhost": self.ctx.vhost,
            "exchange": self.ctx.exchange,
            "mode": self.mode.label,
            "state": self.state.value,
            "remote_address": str(self.addresses.current) if self.addresses is not None else None,
            "remote_node": self.remote_node,
            "last_error": self.last_error,
            "lag_seconds": max(0.0, now - oldest) if oldest is not None else 0.0,
            "lag_messages": log.unacked if log is not None else 0,
            "in_flight": log.in_flight if log is not None else 0,
            "buffered_bytes": log.buffered_bytes if log is not None else 0,
            "spilled_bytes": log.spilled_bytes if log is not None else 0,
            "accepted": c["accepted"],
            "forwarded": c["forwarded"],
            "resent": c["resent"],
            "restored": c["restored"],
            "acked": c["acked"],
            "received": c["received"],
            "duplicates_dropped": c["duplicates_resent"] + c["duplicates_other_path"],
            "duplicates_resent": c["duplicates_resent"],
            "duplicates_other_path": c["duplicates_other_path"],
            "loops_dropped": c["loops_dropped"],
            "overflow_dropped": log.dropped if log is not None else 0,
            "overflow_blocked": log.blocked if log is not None else 0,
            "spilled": log.spilled if log is not None else 0,
            "skipped": dict(sorted(self.skipped.items())),
            "interest_size": len(self.interest)
            if self.interest is not None
            else len(self.ctx.mirror),
            "reconnects": c["reconnects"],
            "resyncs": c["resyncs"],
            # subscribe mode: the subscriber's selector filter (None: every message)
            # and what it kept from crossing
            "filter": self.remote_filter if self.sends else self.local_filter,
            "filtered": c["filtered"],
        }


class _Everything:
    def matches(self, routing_key: str, headers: Mapping[str, Any]) -> bool:
        return True


_ANY_INTEREST = _Everything()
