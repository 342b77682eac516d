"""What the broker tells its journal: one store record per durable change.

The broker core stays sans-IO: it hands records (``amqlite.store.records``) to a
``sink`` callable the shell gives it, and the shell appends them to the journal
(and, on an HA pair, streams them to the passive node). What is recorded follows
the journal's contract (``docs/storage.md``, "The fold and the caller's contract"):

- durable exchanges other than the predeclared ones; durable, non-exclusive queues;
  bindings whose queue is recorded and whose exchange is durable;
- persistent messages, naming only the recorded queues they reached, each under a
  message id the recorder assigns (``Message.pid``; 0 = not recorded);
- ``message.delivered`` the first time a recorded message is handed out from a
  queue, ``message.ack`` when it leaves that queue for good (acked, rejected,
  expired, dropped, dead-lettered, purged; a no-ack delivery is an ack at once).

While ``paused`` (the broker is applying records: a restart's recovery or a
passive HA node following its master) nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from amqlite.store.records import (
    ExchangeDeclare,
    ExchangeDelete,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueueUnbind,
    Record,
    StreamAppend,
    StreamTrack,
    StreamTruncate,
)

from .message import PEERING_QUEUE_PREFIX

if TYPE_CHECKING:
    from .exchange import Exchange
    from .message import Message
    from .queue import Queue

Sink = Callable[[Record], Any]


class Recorder:
    """Turns durable changes into records for ``sink``; one per broker.

    ``last_id`` is the highest message id handed out (a restarted node continues
    above the journal's); ``wall_offset`` turns the shell's monotonic ``now`` into
    wall-clock seconds for ``message.enqueue``'s ``at`` (the shell sets it: the core
    never reads a clock).
    """

    __slots__ = ("last_id", "paused", "sink", "wall_offset")

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.last_id = 0
        self.wall_offset = 0.0
        self.paused = False

    # --- topology ------------------------------------------------------------------

    def exchange_declared(self, vhost: str, exchange: Exchange) -> None:
        if not self.paused:
            self.sink(
                ExchangeDeclare(
                    vhost=vhost,
                    name=exchange.name,
                    type=exchange.kind,
                    auto_delete=exchange.auto_delete,
                    internal=exchange.internal,
                    arguments=dict(exchange.arguments),
                )
            )

    def exchange_deleted(self, vhost: str, name: str) -> None:
        if not self.paused:
            self.sink(ExchangeDelete(vhost=vhost, name=name))

    def queue_declared(self, vhost: str, queue: Queue) -> None:
        if not self.paused:
            self.sink(
                QueueDeclare(
                    vhost=vhost,
                    name=queue.name,
                    auto_delete=queue.auto_delete,
                    arguments=dict(queue.arguments),
                )
            )

    def queue_deleted(self, vhost: str, name: str) -> None:
        if not self.paused:
            self.sink(QueueDelete(vhost=vhost, name=name))

    def bound(self, vhost: str, queue: str, exchange: str, key: str, args: dict[str, Any]) -> None:
        if not self.paused:
            self.sink(
                QueueBind(vhost=vhost, queue=queue, exchange=exchange, key=key, arguments=args)
            )

    def unbound(
        self, vhost: str, queue: str, exchange: str, key: str, args: dict[str, Any]
    ) -> None:
        if not self.paused:
            self.sink(
                QueueUnbind(vhost=vhost, queue=queue, exchange=exchange, key=key, arguments=args)
            )

    # --- messages ------------------------------------------------------------------

    def enqueue(self, vhost: str, message: Message, queues: Iterable[Queue], now: float) -> None:
        """Record a persistent message routed to ``queues`` (the classic ones recorded)
        and give it an id; does nothing when none of them is recorded. (Streams
        record what they take themselves.)"""
        names = tuple(q.name for q in queues if q.recorder is not None)
        if not names or self.paused:
            return
        self.last_id = mid = self.last_id + 1
        message.pid = mid
        self.sink(
            MessageEnqueue(
                id=mid,
                vhost=vhost,
                queues=names,
                exchange=message.exchange,
                routing_key=message.routing_key,
                body=message.body,
                headers=message.headers,
                props=message.properties,
                enqueued_at=now + self.wall_offset,
                deaths=message.deaths,
                publish_key=message.publish_key,
                mesh=_mesh_of(message, names) if message.mesh is not None else {},
            )
        )

    def stream_append(
        self, vhost: str, queue: str, offset: int, message: Message, at: float
    ) -> None:
        if not self.paused:
            self.sink(
                StreamAppend(
                    vhost=vhost,
                    queue=queue,
                    offset=offset,
                    exchange=message.exchange,
                    routing_key=message.routing_key,
                    body=message.body,
                    headers=message.headers,
                    props=message.properties,
                    enqueued_at=at,
                    publish_key=message.publish_key,
                )
            )

    def stream_truncate(self, vhost: str, queue: str, before: int) -> None:
        if not self.paused:
            self.sink(StreamTruncate(vhost=vhost, queue=queue, before=before))

    def stream_track(self, vhost: str, queue: str, name: str, offset: int) -> None:
        if not self.paused:
            self.sink(StreamTrack(vhost=vhost, queue=queue, name=name, offset=offset))

    def delivered(self, mid: int, queue: str) -> None:
        if not self.paused:
            self.sink(MessageDelivered(id=mid, queue=queue))

    def ack(self, mid: int, queue: str) -> None:
        if not self.paused:
            self.sink(MessageAck(id=mid, queue=queue))


def is_persistent(message: Message) -> bool:
    properties = message.properties
    return bool(properties) and properties.get("persistent") is True


def _mesh_of(message: Message, queues: tuple[str, ...]) -> dict[str, Any]:
    """The peering identity to journal: only for a message in a peering queue."""
    mesh = message.mesh
    if mesh is None or not any(q.startswith(PEERING_QUEUE_PREFIX) for q in queues):
        return {}
    if isinstance(mesh, dict):
        return mesh
    plain: dict[str, Any] = mesh.mesh_map()
    return plain
