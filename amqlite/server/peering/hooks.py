"""Where the broker path meets a peered exchange: the dispatcher's publish hook
and the exchange's binding watcher. Both hand what the core returns to the
action applier."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from amqlite.broker import PEERING_QUEUE_PREFIX, PublishOutcome
from amqlite.peering import Envelope, OverflowPolicy, PeeredExchange
from amqlite.peering.link import PlainPublish

from .applier import ActionApplier

if TYPE_CHECKING:
    from amqlite.broker.exchange import Exchange
    from amqlite.broker.vhost import VirtualHost

# enum members as constants (an enum attribute look-up is slow; these run per message)
_BLOCK, _UNROUTABLE = OverflowPolicy.BLOCK, PublishOutcome.UNROUTABLE


class PublishHook:
    """What the dispatcher calls for a publish on a peered exchange."""

    __slots__ = ("applier", "plain_bodies", "plain_keys", "px", "run", "run_routed")

    def __init__(self, applier: ActionApplier, px: PeeredExchange) -> None:
        self.applier = applier
        self.px = px
        #: client publishes not offered to the links yet, and whether a local
        #: queue took each (:meth:`published_later`)
        self.run: list[Envelope] = []
        self.run_routed: list[bool] = []
        #: or only forwarded plain client publishes, not minted yet
        #: (:meth:`forwarded_later`, :meth:`forwarded_run`), as their keys and
        #: bodies (no object per message); one of the two runs is empty
        self.plain_keys: list[str] = []
        self.plain_bodies: list[bytes] = []

    def mint(
        self,
        key: str,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        props: Mapping[str, Any] | None = None,
    ) -> Envelope:
        """``px.envelope(...)``, after the plain publishes waiting are offered (their
        mesh ids come first, in the order they were published)."""
        if self.plain_bodies:
            self.offer_run()
        return self.px.envelope(key, body, headers, props)

    def stamps(self) -> bool:
        """Whether a plain publish here is given a :class:`~amqlite.peering.MeshStamp`
        (``px.stamp()``) rather than an envelope: no link end of the exchange takes
        offers and no run waits to be offered (its mesh ids come first)."""
        return not (self.px.offers_taken or self.run or self.plain_bodies)

    def refusing(self) -> bool:
        """Whether a ``block`` link of the exchange refuses messages now (its buffer
        filled): the connections that published here wait before they read more."""
        return any(link.refusing for link in self.px.links.values())

    def has_room(self, envelope: Envelope) -> bool:
        """False when a ``block`` link is too full to take it (the publisher is
        pushed back); the other policies always make room."""
        if self.run or self.plain_bodies:
            self.offer_run()  # the log as it is once they are in it
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
        if self.run or self.plain_bodies:
            self.offer_run()  # in order: what was published before goes first
        routed = outcome is not _UNROUTABLE
        px = self.px
        self.applier.apply_published(
            px.published(envelope, routed_locally=routed, now=now), publish_key
        )
        return px.taken > 0

    def published_later(self, envelope: Envelope, outcome: PublishOutcome) -> None:
        """:meth:`published` for a publish whose reply does not depend on whether a
        link takes it (not mandatory) and that no journal record of a durable
        sending log must cover before its confirm (not persistent): the message
        joins this exchange's run, which is offered to the links as one
        (:meth:`offer_run`) once the client's read is done (the service's
        flusher), or before anything else is offered here.

        Why this exists beside :meth:`published`: the sending broker is one
        thread, and one offer, one log append, one ``Send`` and one turn per
        message were what it spent most on per peered message beyond the local
        path; a read of a client's connection brings a few hundred publishes,
        which now go as one run (``PeeredExchange.published_run``;
        ``tests/peering/test_fast_paths.py`` checks a run against
        ``published`` for each, ``tests/server/test_peering_applier.py`` the
        hook's ordering).

        Nothing joins the run while no link end of the exchange takes offers
        (``PeeredExchange.offers_taken``: every end receives, or a peering queue
        feeds it, as on a subscriber's remote): its offer would be nothing, and
        skipping it spares that publish path the run's work
        (``tests/server/test_peering_applier.py`` checks the actions against
        ``published`` with and without such ends)."""
        if self.plain_bodies:
            self.offer_run()  # (mint() did it: never, but the order is kept)
        if not self.run:
            if not self.px.offers_taken:
                return
            self.applier.run_waiting(self)
        self.run.append(envelope)
        self.run_routed.append(outcome is not _UNROUTABLE)

    def forwarded_later(self, publish: PlainPublish) -> None:
        """:meth:`published_later` of ``mint(publish.key, publish.body)`` with no local
        queue taking it, for a publish without headers or properties: it waits
        unminted, and the links make one envelope per message instead of two
        (``PeeredExchange.published_plain_run``).

        Why this exists beside :meth:`published_later`: a sending site's client
        publishes (no queue bound here, see ``Session.routes_nowhere``) are
        minted only to be copied into each link's log
        (``tests/server/test_peering_applier.py`` checks the dispatcher's
        forwards and replies against the general path)."""
        bodies = self.plain_bodies
        if not bodies:
            if self.run:
                self.offer_run()  # in order: what was published before goes first
            if not self.px.offers_taken:
                self.px.skip_mints(1)  # (its mesh id is used up, as envelope() would)
                return
            self.applier.run_waiting(self)
        self.plain_keys.append(publish.key)
        bodies.append(publish.body)

    def forwarded_run(self, key: str, bodies: list[bytes]) -> None:
        """:meth:`forwarded_later` of each of the plain publishes ``key`` /
        ``bodies[i]``, in order (a client read's run, ``RequestDispatcher.publish_run``).

        Why this exists beside :meth:`forwarded_later`: on a sending site every
        publish of a read went alone through the dispatcher and here (an event
        object, the checks and a call or two each), about a quarter of that
        broker's time per peered message (py-spy, ``benchmarks/peering_cpu.py``);
        the run's keys and bodies join the waiting run as they were read
        (``tests/server/test_peering_applier.py`` checks the mints, forwards,
        counters, held messages and push-back against each publish's way)."""
        if not bodies:
            return
        if not self.plain_bodies:
            if self.run:
                self.offer_run()  # in order: what was published before goes first
            if not self.px.offers_taken:
                self.px.skip_mints(len(bodies))  # (as forwarded_later of each)
                return
            self.applier.run_waiting(self)
        self.plain_keys += [key] * len(bodies)
        self.plain_bodies += bodies

    def drop_run(self) -> None:
        """Peering stopped: the run waiting is dropped with the links."""
        self.run, self.run_routed = [], []
        self.plain_keys, self.plain_bodies = [], []

    def offer_run(self) -> None:
        """Offer the run :meth:`published_later` or :meth:`forwarded_later`
        gathered to the links, now."""
        bodies = self.plain_bodies
        if bodies:
            keys = self.plain_keys
            self.plain_keys, self.plain_bodies = [], []
            now = trio.current_time()
            self.applier.apply(self.px.published_plain_run(keys, bodies, now=now))
        envelopes, routed = self.run, self.run_routed
        if not envelopes:
            return
        self.run, self.run_routed = [], []
        now = trio.current_time()
        self.applier.apply(self.px.published_run(envelopes, routed, now=now))


def consumer_filter(exchange: Exchange | None) -> str | None:
    """The selector a subscriber's remote may filter with: what some consumer of a
    queue bound to ``exchange`` selects (the selectors joined with OR). None (every
    message) as soon as one bound queue has no consumer (what arrives waits there
    for one) or a consumer without a selector."""
    if exchange is None:
        return None
    selectors: set[str] = set()
    for binding in exchange.bindings.values():
        queue = binding.queue
        if queue.name.startswith(PEERING_QUEUE_PREFIX):
            continue
        if not queue.consumers:
            return None
        for consumer in queue.consumers:
            if consumer.selector is None:
                return None
            selectors.add(consumer.selector)
    if not selectors:
        return None
    if len(selectors) == 1:
        return next(iter(selectors))
    return " OR ".join(f"({s})" for s in sorted(selectors))


def has_subscriber(px: PeeredExchange) -> bool:
    """Whether one of the exchange's link ends subscribes (dials, and receives)."""
    return any(link.receives and link.addresses is not None for link in px.links.values())


class BindingHook:
    """The exchange's binding watcher: its bindings -> ``px.bind``/``px.unbind``
    (the peering queues' own bindings are not interest), and the filter they imply."""

    def __init__(self, applier: ActionApplier, px: PeeredExchange, vhost: VirtualHost) -> None:
        self.applier = applier
        self.px = px
        self.vhost = vhost

    def bound(self, queue: str, key: str, arguments: Mapping[str, Any]) -> None:
        if not queue.startswith(PEERING_QUEUE_PREFIX):  # a subscriber's, not ours
            now = trio.current_time()
            self.applier.apply(self.px.bind(queue, key, arguments, now=now))
            self.refilter(now)

    def unbound(self, queue: str, key: str, arguments: Mapping[str, Any]) -> None:
        if not queue.startswith(PEERING_QUEUE_PREFIX):
            now = trio.current_time()
            self.applier.apply(self.px.unbind(queue, key, arguments, now=now))
            self.refilter(now)

    def refilter(self, now: float) -> None:
        """Tell a subscriber's remote the filter the exchange's queues imply now."""
        px = self.px
        if has_subscriber(px):
            exchange = self.vhost.exchanges.get(px.ctx.exchange)
            actions = px.filter_changed(consumer_filter(exchange), now)
            if actions:  # (a consumer came or went mid-request: no turn for nothing)
                self.applier.apply(actions)
