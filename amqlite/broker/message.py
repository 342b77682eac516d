"""The values the broker moves around: messages, deliveries, publish outcomes.

One :class:`Message` instance is shared, unchanged, by every queue it is routed to;
what differs per queue (expiry, redelivered) lives in the queue beside it. A
:class:`Delivery` is created once per push or get and is the session's record of
the unacknowledged message, so a delivery costs one allocation.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .queue import Consumer, Queue

INF = float("inf")
#: queues exchange peering keeps for its subscribers (``amq.`` is reserved for the broker)
PEERING_QUEUE_PREFIX = "amq.peering."


class PublishOutcome(enum.Enum):
    """What became of a publish: some queue took it, none matched, or a full queue
    with ``x-overflow = reject-publish`` refused it (other queues may still hold it)."""

    ROUTED = "routed"
    UNROUTABLE = "unroutable"
    REJECTED = "rejected"
    #: the same publish (same ``Message.publish_key``) was routed already: a client
    #: sent it again after a reconnect; nothing is routed twice
    DUPLICATE = "duplicate"


class QueueInfo(NamedTuple):
    """Answer to a queue declaration: ready message count and consumer count."""

    name: str
    messages: int
    consumers: int


class Message:
    """A published message; satisfies :class:`amqlite.protocol.codec.WireMessage`.

    Never mutate a message once published: queues share it, and the codec caches
    its encoding in ``wire`` (which the broker never reads). ``deaths`` records
    ``(queue, reason)`` pairs of earlier dead-letterings, oldest first, so cycles
    are caught without touching user headers. ``journal_id`` is the id under which the
    journal holds a persistent message (0 when it does not). ``publish_key`` names
    one publish of one client (``""`` when the client gave none): the broker routes
    a key it has seen recently only once (:class:`~amqlite.broker.dedup.PublishKeys`).
    ``mesh`` is exchange peering's identity of the message (an object with a
    ``mesh_map()`` giving plain data, or that plain data after a restart; None off
    peered exchanges): the journal keeps it for messages in peering queues
    (:data:`PEERING_QUEUE_PREFIX`), so a peering link that sends them again after a
    restart sends the same identity and the remote drops the copy.
    """

    __slots__ = (
        "body",
        "deaths",
        "exchange",
        "headers",
        "journal_id",
        "mesh",
        "properties",
        "publish_key",
        "routing_key",
        "wire",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: dict[str, Any] | None = None,
        properties: dict[str, Any] | None = None,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.body = body
        self.headers: dict[str, Any] = headers if headers is not None else {}
        self.properties: dict[str, Any] = properties if properties is not None else {}
        self.wire: bytes | None = None
        self.journal_id = 0  # 0 = not journaled
        self.publish_key = ""
        self.mesh: Any = None
        self.deaths: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        return (
            f"Message(exchange={self.exchange!r}, routing_key={self.routing_key!r}, "
            f"body={self.body!r}, headers={self.headers!r}, properties={self.properties!r})"
        )


class Delivery:
    """A message handed out under a delivery tag.

    ``ctag`` is the consumer tag ("" for a get); ``dtag`` is unique within the
    session, starts at 1 and only grows; ``queue`` names the queue it came from.
    The private fields let the session settle it: the queue object (which may have
    been deleted since), the consumer whose credit it uses, and its expiry time.
    """

    __slots__ = (
        "_consumer",
        "_expires",
        "_origin",
        "ctag",
        "dtag",
        "message",
        "offset",
        "queue",
        "redelivered",
    )

    def __init__(
        self,
        ctag: str,
        dtag: int,
        redelivered: bool,
        message: Message,
        queue: str,
        origin: Queue | None = None,
        consumer: Consumer | None = None,
        expires: float = INF,
        offset: int | None = None,
    ) -> None:
        self.ctag = ctag
        self.offset = offset  # the message's offset when it comes from a stream
        self.dtag = dtag
        self.redelivered = redelivered
        self.message = message
        self.queue = queue
        self._origin = origin
        self._consumer = consumer
        self._expires = expires

    def __repr__(self) -> str:
        return (
            f"Delivery(ctag={self.ctag!r}, dtag={self.dtag}, redelivered={self.redelivered}, "
            f"queue={self.queue!r}, message={self.message!r})"
        )
