"""What the client hands the application: a received message, a queue's counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amqlite.protocol import events as ev
from amqlite.protocol.codec import EMPTY

if TYPE_CHECKING:
    from .settling import Settler


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """The reply to a queue declare: the queue's (possibly server-made) name and counts."""

    name: str
    messages: int
    consumers: int


class Delivery:
    """A message received from a consumer or by :meth:`Connection.get`.

    Fields: ``body`` (bytes), ``exchange``, ``routing_key``, ``headers``,
    ``properties``, ``redelivered``, ``delivery_tag``, ``consumer_tag`` (``""`` for
    a get), ``queue`` and ``offset`` (the message's offset in a stream queue, else
    None). Settle it once with :meth:`ack`, :meth:`nack` or
    :meth:`reject`; for a ``no_ack`` delivery those are no-ops. Acks are
    coalesced: ``await d.ack()`` does not wait for the network.

    A delivery received before its connection reconnected is :attr:`stale`: its tag
    belonged to the old link, so settling it is a no-op (it never acks another
    message); the server has put the message back and delivers it again with
    ``redelivered`` set.
    """

    # The fields live in the decoded event: building a delivery is then one small
    # object per message, which matters at tens of thousands a second.
    __slots__ = (
        "_event",
        "_headers",
        "_props",
        "_settled",
        "_settler",
        "consumer_tag",
        "delivery_tag",
        "queue",
    )
    _headers: dict[str, Any]  # set on first use, when the event's are the shared EMPTY
    _props: dict[str, Any]

    def __init__(
        self,
        settler: Settler | None,
        event: ev.Deliver,
        delivery_tag: int,
        consumer_tag: str,
        queue: str,
        no_ack: bool,
    ) -> None:
        self._settler = settler  # the connection's: settling goes through it
        self._event = event
        self.delivery_tag = delivery_tag
        self.consumer_tag = consumer_tag
        self.queue = queue
        self._settled = no_ack

    @property
    def body(self) -> bytes:
        return self._event.body

    @property
    def exchange(self) -> str:
        return self._event.exchange

    @property
    def routing_key(self) -> str:
        return self._event.key

    @property
    def headers(self) -> dict[str, Any]:
        h = self._event.headers
        if h is EMPTY:  # shared by every event without headers: the application's own
            try:
                return self._headers
            except AttributeError:
                h = self._headers = {}
        return h

    @property
    def properties(self) -> dict[str, Any]:
        p = self._event.props
        if p is EMPTY:  # as for headers
            try:
                return self._props
            except AttributeError:
                p = self._props = {}
        return p

    @property
    def redelivered(self) -> bool:
        return self._event.redelivered

    @property
    def offset(self) -> int | None:
        """The message's offset when it comes from a stream queue, else None."""
        return self._event.offset

    def __repr__(self) -> str:
        body = self.body
        offset = self.offset
        return (
            f"Delivery(tag={self.delivery_tag}, exchange={self.exchange!r}, "
            f"routing_key={self.routing_key!r}, "
            f"{'' if offset is None else f'offset={offset}, '}body={body[:40]!r}"
            f"{'...' if len(body) > 40 else ''})"
        )

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded as text."""
        return self.body.decode(encoding)

    @property
    def stale(self) -> bool:
        """True when it came over a link that has since broken (see the class doc)."""
        s = self._settler
        return s is not None and self.delivery_tag <= s.tag_base

    @property
    def settled(self) -> bool:
        """True once acked, nacked or rejected (or when received with ``no_ack``)."""
        return self._settled

    async def ack(self) -> None:
        """Acknowledge: the broker forgets the message. Coalesced with other acks;
        raises ConnectionClosed when the connection is gone; a no-op when
        :attr:`stale`."""
        if self._settled or self._settler is None:
            return
        self._settler.ack_one(self.delivery_tag)
        self._settled = True

    async def nack(self, requeue: bool = True) -> None:
        """Give the message back (``requeue``) or drop / dead-letter it."""
        if self._settled or self._settler is None:
            return
        self._settler.settle(self.delivery_tag, requeue=requeue, reject=False)
        self._settled = True

    async def reject(self, requeue: bool = True) -> None:
        """Like :meth:`nack` for this one message."""
        if self._settled or self._settler is None:
            return
        self._settler.settle(self.delivery_tag, requeue=requeue, reject=True)
        self._settled = True


class PlainDelivery(Delivery):
    """A :class:`Delivery` read straight from a ``deliver`` map in its usual shape
    (:data:`amqlite.protocol.DeliverMap`: no headers, not redelivered, no offset;
    properties or none). It exists because building an event and then a delivery for every
    message cost a consumer about a fifth of its time per message: here the map
    cbor2 decoded is the one store of the fields. tests/client/test_plain_delivery.py
    checks that it reads as the :class:`Delivery` of the checked event does."""

    __slots__ = ("_map",)

    def __init__(
        self,
        settler: Settler | None,
        m: dict[str, Any],
        delivery_tag: int,
        consumer_tag: str,
        queue: str,
        no_ack: bool,
    ) -> None:
        self._settler = settler
        self._map = m
        self.delivery_tag = delivery_tag
        self.consumer_tag = consumer_tag
        self.queue = queue
        self._settled = no_ack

    @property
    def body(self) -> bytes:
        return self._map["body"]  # type: ignore[no-any-return]

    @property
    def exchange(self) -> str:
        return self._map["exchange"]  # type: ignore[no-any-return]

    @property
    def routing_key(self) -> str:
        return self._map["key"]  # type: ignore[no-any-return]

    @property
    def headers(self) -> dict[str, Any]:
        try:
            return self._headers
        except AttributeError:
            h = self._headers = {}
            return h

    @property
    def properties(self) -> dict[str, Any]:
        try:
            return self._props
        except AttributeError:
            p = self._map.get("props")
            if p is None:
                p = {}
            self._props = p
            return p

    @property
    def redelivered(self) -> bool:
        return False

    @property
    def offset(self) -> int | None:
        return None


class RunDelivery(PlainDelivery):
    """A :class:`PlainDelivery` of a run (``protocol.DeliverRun``, buffered by
    ``Consumer.push_run``): its fields are the ``(dtag, body, (exchange, key,
    props))`` tuple the consumer buffered, not a map; ``props`` is the run's
    properties map, shared by its deliveries (each delivery's
    :attr:`properties` is its own copy, made when first read), or None for none.
    It exists because a tuple a message, made in one go for a run, is cheaper than
    a map a message. tests/client/test_plain_delivery.py checks that it reads and
    settles as the PlainDelivery of the same message's map."""

    __slots__ = ("_item",)

    def __init__(
        self,
        settler: Settler | None,
        item: tuple[int, bytes, tuple[str, str, dict[str, Any] | None]],
        consumer_tag: str,
        queue: str,
        no_ack: bool,
    ) -> None:
        self._settler = settler
        self._item = item
        self.delivery_tag = item[0]
        self.consumer_tag = consumer_tag
        self.queue = queue
        self._settled = no_ack

    @property
    def body(self) -> bytes:
        return self._item[1]

    @property
    def exchange(self) -> str:
        return self._item[2][0]

    @property
    def routing_key(self) -> str:
        return self._item[2][1]

    @property
    def properties(self) -> dict[str, Any]:
        try:
            return self._props
        except AttributeError:
            shared = self._item[2][2]
            p: dict[str, Any] = {} if shared is None else dict(shared)
            self._props = p
            return p
