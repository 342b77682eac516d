"""Applies the peering core's actions to the broker and the links, in order
(docs/peering.md, "Applying actions").

Every call into the core goes through :meth:`ActionApplier.apply`, even when it
returned nothing (it may have moved a deadline). A *turn* is one outermost
``apply`` (or one received frame, or one feed of a peering queue): at its end the transient
deliveries are confirmed (one cumulative confirm per link), the receive marks of
the deliveries that wrote to the journal are journaled after them, the broker's
pushes are handed out, and the service is told (its flusher then sends what the
turn produced: :meth:`ActionApplier.flush`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, Protocol, cast

import structlog
import trio

from amqlite.broker import ALL_APPENDED, Delivery, Message, PublishOutcome, Session
from amqlite.errors import AmqliteError, BrokerError
from amqlite.peering import (
    Ack,
    Acked,
    Action,
    Address,
    Blocked,
    BufferAvailable,
    Connect,
    Deliver,
    DeliverRun,
    Disconnect,
    Envelope,
    LinkState,
    MeshStamp,
    PeeredExchange,
    PeeringLink,
    Persist,
    PlainRun,
    Send,
    StateChanged,
)
from amqlite.peering import cbor as peering_cbor
from amqlite.peering.wire import PeeringMessage, stamped_run
from amqlite.protocol.codec import check_headers, check_props

from .durability import PeeringDurability
from .peering_queue import PeeringQueue, envelope_of
from .registry import HeldEnvelopes, LinkRegistry
from .transport import LinkConnection

log = structlog.get_logger("amqlite.peering")


class WaitingRun(Protocol):
    """A publish hook's run of client publishes, as the applier sees it (the hook
    imports the applier, not the other way round)."""

    def offer_run(self) -> None: ...
    def drop_run(self) -> None: ...


INF = float("inf")
_UNROUTABLE = PublishOutcome.UNROUTABLE  # an enum attribute look-up is slow: per message
_RESUME_RUN = 256  # held messages offered again at a time (ActionApplier._resume_held)
BATCH_BYTES = 256 * 1024  # peering maps sent in one ``peer`` frame, at most about
BATCH = "peer.batch"


_MESSAGE, _DTAG = attrgetter("message"), attrgetter("dtag")  # a Delivery's
_MESH, _KEY, _BODY = attrgetter("mesh"), attrgetter("routing_key"), attrgetter("body")
_HEADERS, _PROPS = attrgetter("headers"), attrgetter("properties")  # a Message's


def _stamped(deliveries: list[Delivery]) -> PlainRun | None:
    """A peering queue's deliveries as one :class:`PlainRun` when they are one
    (:func:`~amqlite.peering.wire.stamped_run`: plain messages with stamps of one
    origin, consecutive); None otherwise."""
    if len(deliveries) < 2:
        return None
    messages = list(map(_MESSAGE, deliveries))
    if type(messages[0].mesh) is not MeshStamp or any(map(_HEADERS, messages)):
        return None
    if any(map(_PROPS, messages)):
        return None
    return stamped_run(
        list(map(_MESH, messages)), list(map(_KEY, messages)), list(map(_BODY, messages))
    )


def latest_acks(messages: list[PeeringMessage]) -> list[PeeringMessage]:
    """``messages`` (one connection's, sent in one go) without the acks a later ack
    of the same epoch covers: acks are cumulative, and a link end's grow, so the
    last one says all the earlier ones say. The others keep their order.

    Why: a receiving end acks each ``peer`` frame it took (its turn's confirm), and
    the frames of one read each end a turn; the sender took each ack alone (the
    log's ack, a pump, a ``Send``), about six a write at a window of 4,096 in
    ``benchmarks/peering.py``. ``tests/server/test_peering_acks.py`` checks the
    sender's log and sends against the acks one by one."""
    acks = [m for m in messages if type(m) is Ack]
    if len(acks) < 2:
        return messages
    last: dict[int, Ack] = {}
    for ack in acks:
        last[ack.epoch] = ack
    if len(last) == len(acks):
        return messages
    kept = set(map(id, last.values()))
    return [m for m in messages if type(m) is not Ack or id(m) in kept]


class ActionApplier:
    """Carries out the core's actions for every link end of one node.

    ``session(vhost)`` is the broker session deliveries are published with,
    ``dial(link id, address)`` starts a connection attempt, ``pump()`` hands the
    broker's pending pushes out, ``turn_ended()`` tells the service a turn ended.
    """

    def __init__(
        self,
        registry: LinkRegistry,
        durability: PeeringDurability,
        *,
        session: Callable[[str], Session],
        dial: Callable[[str, Address], None],
        pump: Callable[[], None],
        turn_ended: Callable[[], None],
    ) -> None:
        self.registry = registry
        self.durability = durability
        self._session = session
        self._dial = dial
        self._pump = pump
        self._turn_ended = turn_ended
        self._depth = 0  # nested apply() calls
        self._delivered = False  # deliveries (or freed credit) since the last pump
        self._confirms: dict[str, int] = {}  # link -> last tag safe now, confirmed at turn end
        self._commits_pending: dict[str, int] = {}  # link -> deliveries awaiting the barrier
        self._outbox: dict[LinkConnection, list[PeeringMessage]] = {}
        self._publish_key = ""  # of the client publish being offered to the links
        #: publish hooks with a run of client publishes not yet offered (offered
        #: before the next flush: PublishHook.published_later)
        self._runs: list[WaitingRun] = []
        #: outboxes held until the HA passive node holds what was journaled before
        #: them: (journal position, outbox), in order (:meth:`flush`)
        self._held: deque[tuple[int, dict[LinkConnection, list[PeeringMessage]]]] = deque()

    def forget(self) -> None:
        """Peering stopped: what waits for the links is dropped with them."""
        self._commits_pending.clear()
        self._confirms.clear()
        if self._held:
            self._held.clear()
            storage = self.durability.storage
            if storage is not None:
                storage.discard_waiter(self._release_held)
        for hook in self._runs:
            hook.drop_run()
        self._runs.clear()

    def run_waiting(self, hook: WaitingRun) -> None:
        """``hook`` started a run of client publishes: offer it before the next
        flush (the flusher runs once the publishing task yields)."""
        self._runs.append(hook)
        self._turn_ended()

    def offer_runs(self) -> None:
        """Offer every waiting run of client publishes to its links now."""
        runs = self._runs
        while runs:
            runs.pop(0).offer_run()

    # --- turns ---------------------------------------------------------------------------

    def apply(self, actions: list[Action]) -> None:
        """Apply the core's actions in order; ends the turn if this is the outermost call."""
        if not self._depth and not self._confirms and not self.durability.marks_pending:
            # Why this shortcut exists: every client publish on a peered exchange
            # ends a turn here with nothing (a local site) or one Send (a link takes
            # it), and holding and releasing the journal around that cost about a
            # tenth of the publish. A turn of Sends only writes nothing: it queues
            # them, pumps and ends the turn as _turn() does
            # (tests/server/test_peering_applier.py checks they agree).
            for action in actions:
                if type(action) is not Send:
                    break
            else:
                if actions:
                    conns, outbox = self.registry.conns, self._outbox
                    for send in cast("list[Send]", actions):
                        conn = conns.get(send.link)
                        if conn is not None:
                            outbox.setdefault(conn, []).append(send.message)
                if self._delivered:
                    self._delivered = False
                    self._pump()
                self._turn_ended()
                return
        self._turn(actions)

    def _turn(self, actions: list[Action]) -> None:
        """:meth:`apply` without its shortcut: the general rule."""
        held = self.durability.storage if not self._depth else None  # the outermost call's
        if held is not None:
            # the deliveries' records and the marks that cover them reach the files
            # together: a kill -9 between them would leave messages the restarted node
            # takes again from the sender (tests/e2e/test_peering.py, receiver killed)
            held.hold()
        try:
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
            if self.durability.marks_pending:
                self.durability.record_marks()
        finally:
            if held is not None:
                held.release()
        if self._delivered:
            self._delivered = False
            self._pump()
        self._turn_ended()

    def apply_published(self, actions: list[Action], publish_key: str) -> None:
        """Apply what a client publish (with ``publish_key``, or "") produced: the
        durable logs that take it journal the key with it."""
        if not publish_key:  # (a publish without confirm: no key to hand on)
            self.apply(actions)
            return
        self._publish_key = publish_key
        try:
            self.apply(actions)
        finally:
            self._publish_key = ""

    def flush(self) -> None:
        """Send what the core asked for: consecutive maps of one connection go in
        one ``peer`` frame (``peer.batch``) of at most about BATCH_BYTES, runs of
        forwards as ``peer.forwards``, encoded by :mod:`amqlite.peering.cbor`. The
        runs of client publishes still waiting are offered first."""
        if self._runs:
            self.offer_runs()
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, {}
        storage = self.durability.storage
        held = self._held
        if storage is not None and (held or storage.replica_upto is not None):
            # An HA active node: nothing leaves for a remote before the passive node
            # holds what was journaled before it (the peering queue's message a
            # subscriber gets, the ``peering.out`` record of what a publish or
            # forward link sends). Else a kill -9 could leave the remote holding a
            # message the node taking over lacks; its publisher sends it again, and
            # the new master sends it under a new peering identity, which the remote
            # cannot know for the same message (a duplicate, which
            # tests/e2e/test_peering.py's HA subscribe case met once in a CI run).
            # As pushes to consumers wait (endpoints/client.py ``_push_gated``).
            position = storage.appended
            if held or not storage.position_replicated(position):
                if not held:
                    storage.when_replicated(self._release_held)
                held.append((position, outbox))
                return
        self._send(outbox)

    def _release_held(self) -> None:
        """The passive node holds more (or replication stopped): send the held
        outboxes it now holds the records of, in order."""
        storage = self.durability.storage
        held = self._held
        while held:
            position, outbox = held[0]
            # (True for every position once replication stopped)
            if storage is not None and not storage.position_replicated(position):
                return
            held.popleft()
            self._send(outbox)
        if storage is not None:
            storage.discard_waiter(self._release_held)

    def _send(self, outbox: dict[LinkConnection, list[PeeringMessage]]) -> None:
        for conn, messages in outbox.items():
            if len(messages) > 1:
                messages = latest_acks(messages)
            for frame in peering_cbor.encode_frames(messages, BATCH_BYTES):
                conn.send_peer(frame)

    # --- what arrives from the links and queues ----------------------------------------------

    def receive(self, link: PeeringLink, msg: dict[str, Any], now: float) -> None:
        """One ``peer`` frame for ``link``: a peering map, or a batch of them."""
        self._receive_frame(link, msg, now)
        if link.queue_fed:
            pq = self.registry.queues.get(link.id)
            interest = link.interest
            if pq is not None and interest is not None and interest.digest.hex != pq.applied_digest:
                pq.sync_bindings()  # the subscriber's interest changed

    def _receive_frame(self, link: PeeringLink, msg: dict[str, Any], now: float) -> None:
        if msg.get("type") != BATCH:
            self.apply(link.receive(msg, now, deliver_runs=True))
            return
        items = msg.get("msgs")
        if not isinstance(items, list):
            self.apply(link.receive({"type": BATCH}, now))  # malformed: the core says so
            return
        # one turn for the whole frame, with the journal held as _turn() holds it: the
        # deliveries of every map in it and the receive marks that cover them (journaled
        # when the turn ends) must reach the files in one commit, or a kill -9 between
        # two commits leaves deliveries whose marks are lost, and the sender's resend
        # duplicates them (tests/server/test_peering_applier.py)
        held = self.durability.storage if not self._depth else None
        if held is not None:
            held.hold()
        try:
            self._depth += 1
            try:
                for item in items:
                    self.apply(link.receive(item, now, deliver_runs=True))
            finally:
                self._depth -= 1
            self.apply([])
        finally:
            if held is not None:
                held.release()

    def feed(self, pq: PeeringQueue) -> None:
        """Hand a peering queue's new deliveries to its link end, in order."""
        deliveries, cancelled = pq.take()
        if cancelled and not pq.session.closed:  # the queue was deleted by hand
            log.warning("peering_queue_deleted", queue=pq.name, link=pq.link.id)
            pq.declare(trio.current_time())  # what it had taken still acks
            pq.sync_bindings()
            deliveries += pq.take()[0]
        if not deliveries:
            return
        now = trio.current_time()
        link = pq.link
        px, filtered = pq.px, link.remote_filter is not None
        envelopes: Sequence[Envelope]
        run = None if filtered else _stamped(deliveries)
        if run is not None:
            # Why this exists beside the loop below: a batch of plain messages
            # minted here one after the other (PeeredExchange.stamp), or received
            # in a compact run, goes to the link end as the PlainRun it is (no
            # envelope each; take_run keeps it as one).
            # test_a_peering_queue_sends_its_stamped_messages_as_envelopes checks
            # the subscriber gets what the envelopes give
            envelopes, dtags = run, list(map(_DTAG, deliveries))
        else:
            envelopes, dtags = [], []
            for d in deliveries:
                if filtered and not pq.wants(d.message):
                    pq.settle(d.dtag, now)  # no consumer of the subscriber selects it
                    link.filtered()
                    continue
                envelopes.append(envelope_of(px, d.message))
                dtags.append(d.dtag)
        self._depth += 1  # one turn for them all
        try:
            seqs, actions = link.take_run(envelopes, now)  # one pump for the batch
            taken = pq.taken
            if type(seqs) is range and dtags[-1] - dtags[0] == len(dtags) - 1:
                # taken as one run, and the tags follow each other (they grow: no
                # gap): one block for the batch (PeeringQueue.taken), not one each;
                # tests/server/test_peering_applier.py checks the two ways agree
                taken.append((seqs[0], dtags[0], len(dtags)))
            else:
                for seq, dtag in zip(seqs, dtags, strict=True):
                    if seq is None:
                        pq.settle(dtag, now)  # skipped (the subscriber is on its path)
                    else:
                        taken.append((seq, dtag, 1))
            self.apply(actions)
        finally:
            self._depth -= 1
        self.apply([])

    # --- the actions -----------------------------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        now = -INF  # for deliveries: read once per call (a run arrives at one instant)
        registry = self.registry
        deliver = self._deliver
        i, n = 0, len(actions)
        while i < n:
            action = actions[i]
            i += 1
            t = type(action)  # the per-message kinds first, by type (no subclasses)
            if t is Deliver:
                if now == -INF:
                    now = trio.current_time()
                j, link_id = i, action.link
                while j < n:
                    nxt = actions[j]
                    if type(nxt) is not Deliver or nxt.link != link_id:
                        break
                    j += 1
                if j > i:  # a run of them (what one peer.forwards gives)
                    self._deliver_run(cast("list[Deliver]", actions[i - 1 : j]), now)
                    i = j
                else:
                    deliver(action, now)  # type: ignore[arg-type]
            elif t is DeliverRun:
                if now == -INF:
                    now = trio.current_time()
                self._deliver_plain_run(action, now)  # type: ignore[arg-type]
            elif t is Send:
                conn = registry.conns.get(action.link)
                if conn is not None:
                    self._outbox.setdefault(conn, []).append(action.message)  # type: ignore[union-attr]
            elif isinstance(action, Connect):
                self._dial(action.link, action.address)
            elif isinstance(action, Disconnect):
                old = registry.conns.pop(action.link, None)
                if old is not None:
                    old.close(action.reason)
                log.info("peering_disconnected", link=action.link, reason=action.reason)
            elif isinstance(action, Blocked):
                held = registry.held.setdefault(action.link, HeldEnvelopes())
                held.envelopes.append((action.envelope, False))
                held.waiting = True
            elif isinstance(action, BufferAvailable):
                self._resume_held(action.link)
                self.registry.room_changed()  # the publishers it held back look again
            elif isinstance(action, Acked):
                self._acked(action)
            elif isinstance(action, Persist):
                px = registry.owner.get(action.link)
                if px is not None:
                    self.durability.log_out(px, action, self._publish_key)
            elif isinstance(action, StateChanged):
                if action.new is LinkState.WAITING:
                    registry.waiting_since[action.link] = trio.current_time()
                else:
                    registry.waiting_since.pop(action.link, None)
                log.info(
                    "peering_link_state",
                    link=action.link,
                    old=action.old.value,
                    new=action.new.value,
                    reason=action.reason,
                )

    def _deliver_run(self, run: list[Deliver], now: float) -> None:
        """:meth:`_deliver` for each of ``run`` (consecutive deliveries of one link
        end), in order.

        Why this exists next to :meth:`_deliver`: every forward a link receives is
        one delivery, and looking up the link, its exchange and the broker session,
        copying empty headers and checking them cost about a tenth of the
        receiving broker's time per peered message. Here they are looked up once
        for the run; a delivery with headers or properties, one that wrote to the
        journal, and any delivery of an exchange with more links (it travels on)
        take :meth:`_deliver`'s way (the safe tag so far confirmed first, as
        there). ``tests/server/test_peering_applier.py`` checks the broker's
        queues, the confirms and the link's state agree with :meth:`_deliver`
        one by one."""
        link_id = run[0].link
        px = self.registry.owner.get(link_id)
        link = px.links.get(link_id) if px is not None else None
        if px is None or link is None:
            return
        if len(px.links) > 1 or self._commits_pending.get(link_id):
            for action in run:
                self._deliver(action, now)
            return
        session = self._session(px.ctx.vhost)
        publish, exchange = session.publish, px.ctx.exchange
        confirms, safe = self._confirms, 0  # the last tag safe at once, not yet in confirms
        # whether a delivery of this run waits for the journal (_commits_pending has
        # the link): none did when the run began (above), and only _deliver and
        # _delivered_tail start such a wait; so the map is read only after them
        waited = False
        self._delivered = True
        for action in run:
            env = action.envelope
            if env.headers or env.properties:
                if safe:
                    confirms[link_id], safe = safe, 0
                self._deliver(action, now)
                waited = True
                continue
            headers, properties = env.headers, env.properties
            if type(headers) is dict and type(properties) is dict:
                # the decoded (empty) maps serve the message: nothing changes a
                # message's maps in place, and no other holder of the envelope
                # looks at them again; two objects fewer per received message
                message = Message(exchange, env.routing_key, env.body, headers, properties)
            else:
                message = Message(exchange, env.routing_key, env.body, {}, {})
            message.mesh = env
            try:
                publish(message, now=now)
            except AmqliteError as exc:  # the exchange went away: nothing routes it
                log.warning("peering_deliver_failed", link=link_id, error=exc.text)
            if session.journal_span[1] != 0 or (waited and self._commits_pending.get(link_id)):
                if safe:
                    confirms[link_id], safe = safe, 0
                self._delivered_tail(px, link, action, session, True)
                waited = True
            else:
                safe = action.tag
        if safe:
            confirms[link_id] = safe

    def _deliver_plain_run(self, action: DeliverRun, now: float) -> None:
        """:meth:`_deliver_run` of ``action.delivers()``.

        Why this exists next to :meth:`_deliver_run`: a compact run's messages
        have no headers and no properties, so each is published from its key and
        body with a :class:`~amqlite.peering.MeshStamp` as its identity, without
        the envelope, mesh id and ``Deliver`` each that the run's single
        deliveries need (:class:`~amqlite.peering.PlainRun`). An exchange with
        more links (a message travels on) and a link with commits pending take
        :meth:`_deliver_run`'s way. A run of one routing key goes whole through
        ``Session.publish_run`` (below). ``tests/server/test_peering_applier.py``
        checks the broker's queues, the confirms and the journal waits agree."""
        link_id = action.link
        px = self.registry.owner.get(link_id)
        link = px.links.get(link_id) if px is not None else None
        if px is None or link is None:
            return
        if len(px.links) > 1 or self._commits_pending.get(link_id):
            self._deliver_run(action.delivers(), now)
            return
        session = self._session(px.ctx.vhost)
        publish, exchange, run = session.publish, px.ctx.exchange, action.run
        keys = run.keys
        if (
            type(keys) is str
            and run.bodies
            and session.publish_run(
                exchange, keys, run.bodies, now=now, meshes=lambda n: run.stamps()
            )
        ):
            # Why this exists: a run of one key is published whole (the route
            # looked up once, the queue offered the run: VirtualHost.publish_run),
            # not a Message, a publish and a journal-span check a message; what was
            # the receiving broker's largest item of its own (B's in mode publish,
            # A's in mode subscribe). The run is one journal span: when anything in
            # it wrote, the whole run's confirm (its last tag) waits for that
            # commit, so a confirm may come later than the general path's for the
            # run's earlier messages, never earlier. False (the exchange gone,
            # internal or a headers one, a trace hook): each message below, as
            # before. tests/server/test_peering_applier.py
            # (test_a_plain_run_published_whole_confirms_no_sooner) checks the
            # queues and the confirms against _deliver_run, commit by commit.
            self._delivered = True
            n = len(run)
            last = Deliver(link_id, action.tag + n - 1, run[n - 1])
            self._delivered_tail(px, link, last, session, True)
            return
        confirms, safe = self._confirms, 0  # the last tag safe at once, not yet in confirms
        waited = False  # (as in _deliver_run)
        self._delivered = True
        tag = action.tag
        for key, body, stamp in zip(run.key_list(), run.bodies, run.stamps(), strict=True):
            message = Message(exchange, key, body, {}, {})
            message.mesh = stamp
            try:
                publish(message, now=now)
            except AmqliteError as exc:  # the exchange went away: nothing routes it
                log.warning("peering_deliver_failed", link=link_id, error=exc.text)
            if session.journal_span[1] != 0 or (waited and self._commits_pending.get(link_id)):
                if safe:
                    confirms[link_id], safe = safe, 0
                deliver = Deliver(link_id, tag, run[tag - action.tag])
                self._delivered_tail(px, link, deliver, session, True)
                waited = True
            else:
                safe = tag
            tag += 1
        if safe:
            confirms[link_id] = safe

    def _deliver(self, action: Deliver, now: float) -> None:
        px = self.registry.owner.get(action.link)
        link = px.links.get(action.link) if px is not None else None
        if px is None or link is None:
            return
        env = action.envelope
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
            if bad is not None:  # only a broken remote sends these: never store them
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
        self._delivered_tail(px, link, action, session, bad is None)

    def _delivered_tail(
        self, px: PeeredExchange, link: PeeringLink, action: Deliver, session: Session, ok: bool
    ) -> None:
        """:meth:`_deliver` once the message is published (``ok``: it was well
        formed): its confirm, now or once the journal holds what it wrote."""
        durability = self.durability
        tag = action.tag
        first, last = session.journal_span if ok else (0, 0)
        wrote = last != 0
        if wrote:
            durability.marks_due(px)
        if wrote or self._commits_pending.get(action.link):
            self._commits_pending[action.link] = self._commits_pending.get(action.link, 0) + 1
            if self._confirms:
                self._confirm_safe()  # in order: what was safe before this goes first

            def committed(stored: bool) -> None:
                pending = self._commits_pending
                pending[action.link] = pending.get(action.link, 1) - 1
                if not stored:  # the disk dropped it: logged by storage
                    log.error("peering_delivery_not_stored", link=action.link, tag=tag)
                self.apply(link.confirm(tag, trio.current_time()))

            # like a client's confirm: after the commit, and on an HA pair after the
            # passive node holds it too; one that wrote nothing waits for what was
            # appended before it, so confirms keep their order
            if wrote:
                durability.when_durable(first, last, committed)
            else:
                durability.when_durable(0, ALL_APPENDED, committed)
        else:
            self._confirms[action.link] = tag  # safe now: confirmed once the turn ends

    def _confirm_safe(self) -> None:
        """Confirm the deliveries that were safe at once (transient), one call per
        link for a whole turn (confirms are cumulative)."""
        now = trio.current_time()
        self._depth += 1
        try:
            while self._confirms:
                link_id, tag = self._confirms.popitem()
                link = self.registry.link(link_id)
                if link is not None:
                    self._apply(link.confirm(tag, now))
        finally:
            self._depth -= 1

    def _resume_held(self, link_id: str) -> None:
        held = self.registry.held.get(link_id)
        link = self.registry.link(link_id)
        if held is None or link is None:
            return
        held.waiting = False
        now = trio.current_time()
        waiting = held.envelopes
        while waiting and not held.waiting:
            # a run at a time (one log append each, one Send per run, as a read's
            # publishes go); what the link refuses again, it refuses from the first
            # one on (link.offer), and it goes back first, in order
            run = [waiting.popleft() for _ in range(min(_RESUME_RUN, len(waiting)))]
            actions = link.offer_run([e for e, _ in run], [r for _, r in run], now)
            refused = {id(a.envelope) for a in actions if isinstance(a, Blocked)}
            if refused:
                waiting.extendleft(reversed([x for x in run if id(x[0]) in refused]))
                held.waiting = True
                actions = [a for a in actions if not isinstance(a, Blocked)]
            self.apply(actions)

    def _acked(self, action: Acked) -> None:
        """Settle what a durable log or a peering queue kept, up to ``action.seq``."""
        pq = self.registry.queues.get(action.link)
        if pq is not None:
            pq.acked(action.seq, trio.current_time())
            self._delivered = True  # the freed credit lets the queue push more
            return
        px = self.registry.owner.get(action.link)
        if px is not None:
            self.durability.settle_out(px, action.link, action.seq)
