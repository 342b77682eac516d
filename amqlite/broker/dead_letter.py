"""Dead-lettering: the copy a queue republishes, and the cycle rule.

The copy goes to the queue's dead-letter exchange with its dead-letter routing key
(or the original key), loses its ``expiration`` property (so it does not expire
again at once) and gains headers ``x-death-reason``, ``x-death-queue``,
``x-death-exchange`` (the exchange it had been published to) and
``x-death-count`` (incremented).

Cycle rule (as RabbitMQ's): a dead-lettered message is not routed into a queue it
already died in unless some death since then, this one included, was a rejection.
A cycle of automatic deaths (expiry, overflow) would otherwise never end.
"""

from __future__ import annotations

from .message import Message

EXPIRED = "expired"
REJECTED = "rejected"
MAXLEN = "maxlen"


def dead_letter_copy(
    message: Message, queue: str, reason: str, exchange: str, routing_key: str | None
) -> Message:
    """The message ``queue`` republishes to ``exchange`` after it died for ``reason``."""
    headers = dict(message.headers)
    count = headers.get("x-death-count")
    headers["x-death-reason"] = reason
    headers["x-death-queue"] = queue
    headers["x-death-exchange"] = message.exchange
    headers["x-death-count"] = (count if type(count) is int else 0) + 1
    properties = message.properties
    if "expiration" in properties:
        properties = {k: v for k, v in properties.items() if k != "expiration"}
    key = message.routing_key if routing_key is None else routing_key
    copy = Message(exchange, key, message.body, headers, properties)
    death = (queue, reason)
    copy.deaths = (*(d for d in message.deaths if d != death), death)
    return copy


def is_cycle(message: Message, queue: str) -> bool:
    """True when routing ``message`` into ``queue`` would close an automatic cycle."""
    for name, reason in reversed(message.deaths):
        if reason == REJECTED:
            return False
        if name == queue:
            return True
    return False
