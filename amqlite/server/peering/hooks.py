"""Where the broker path meets a peered exchange: the dispatcher's publish hook
and the exchange's binding watcher. Both hand what the core returns to the
action applier."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from amqlite.broker import PEERING_QUEUE_PREFIX, Message, PublishOutcome
from amqlite.peering import Envelope, OverflowPolicy, PeeredExchange

from .applier import ActionApplier

# enum members as constants (an enum attribute look-up is slow; these run per message)
_BLOCK, _UNROUTABLE = OverflowPolicy.BLOCK, PublishOutcome.UNROUTABLE


class PublishHook:
    """What the dispatcher calls for a publish on a peered exchange."""

    __slots__ = ("applier", "px")

    def __init__(self, applier: ActionApplier, px: PeeredExchange) -> None:
        self.applier = applier
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
        px = self.px
        self.applier.apply_published(
            px.published(envelope, routed_locally=routed, now=now), publish_key
        )
        return px.taken > 0


class BindingHook:
    """The exchange's binding watcher: its bindings -> ``px.bind``/``px.unbind``
    (the peering queues' own bindings are not interest)."""

    def __init__(self, applier: ActionApplier, px: PeeredExchange) -> None:
        self.applier = applier
        self.px = px

    def bound(self, queue: str, key: str, arguments: Mapping[str, Any]) -> None:
        if not queue.startswith(PEERING_QUEUE_PREFIX):  # a subscriber's, not ours
            self.applier.apply(self.px.bind(queue, key, arguments, now=trio.current_time()))

    def unbound(self, queue: str, key: str, arguments: Mapping[str, Any]) -> None:
        if not queue.startswith(PEERING_QUEUE_PREFIX):
            self.applier.apply(self.px.unbind(queue, key, arguments, now=trio.current_time()))
