"""The broker trace: one record per publish, delivery and ack, in stream ``amq.trace``.

Off by default. When a :class:`Tracer` is set on the broker (``Broker.tracer``,
by config ``server.trace = true`` or the ``trace`` request), the session calls it
at three points, each one line in :mod:`.session`:

=============  ===========================================================
``publish``    once per queue the message was routed to (``queue`` = "" when
               it reached none); ``outcome`` = routed | unroutable | rejected
``deliver``    a push to a consumer or a get; ``redelivered`` as delivered
``ack``        a delivery acked (no-ack deliveries have no ack record)
=============  ===========================================================

Each record is a message appended to the stream queue ``amq.trace`` of the
vhost it happened in (created on first use: durable, keeping the newest
``x-max-length`` records, a million by default). Its headers hold the fields, all text or numbers:
``event``, ``message_id`` (the message's property, "" when it has none),
``exchange``, ``routing_key``, ``queue``, ``node``, ``time`` (Unix seconds) and
``redelivered`` / ``outcome`` where they apply; its routing key is the event and
its ``timestamp`` property the time in whole seconds. Nothing about ``amq.trace`` itself is traced.

Like the rest of the core this reads no clock: times are the broker's ``now``
plus its wall-clock offset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .arguments import parse_queue_arguments
from .message import Message, PublishOutcome
from .stream import StreamQueue

if TYPE_CHECKING:
    from .broker import Broker
    from .queue import Queue
    from .vhost import VirtualHost

TRACE_QUEUE = "amq.trace"
DEFAULT_MAX_RECORDS = 1_000_000  # records have empty bodies: capped by count


class Tracer:
    """Appends trace records to ``amq.trace``; see the module docstring."""

    __slots__ = ("_queues", "failures", "max_records", "node")

    def __init__(self, node: str, *, max_records: int = DEFAULT_MAX_RECORDS) -> None:
        self.node = node
        self.max_records = max_records
        self._queues: dict[str, StreamQueue] = {}
        #: records that could not be appended (shown by the node's status)
        self.failures = 0

    def trace_queue(self, vhost: VirtualHost) -> StreamQueue:
        """``amq.trace`` of ``vhost``, declared (and journaled) on first use."""
        queue = self._queues.get(vhost.name)
        if queue is not None and not queue.deleted:
            return queue
        existing = vhost.queues.get(TRACE_QUEUE)
        if not isinstance(existing, StreamQueue):
            arguments: dict[str, Any] = {
                "x-queue-type": "stream",
                "x-max-length": self.max_records,
            }
            existing = vhost.new_queue(
                TRACE_QUEUE,
                durable=True,
                owner=None,
                auto_delete=False,
                arguments=arguments,
                settings=parse_queue_arguments(arguments),
            )
            assert isinstance(existing, StreamQueue)
            if existing.journal is not None:
                existing.journal.queue_declared(vhost.name, existing)
        self._queues[vhost.name] = existing
        return existing

    def _record(
        self,
        vhost: VirtualHost,
        event: str,
        message: Message,
        queue: str,
        now: float,
        extra: dict[str, Any],
    ) -> None:
        when = now + vhost.wall_offset
        headers = {
            "event": event,
            "message_id": str(message.properties.get("message_id") or ""),
            "exchange": message.exchange,
            "routing_key": message.routing_key,
            "queue": queue,
            "node": self.node,
            "time": when,
            **extra,
        }
        record = Message("", event, b"", headers, {"timestamp": int(when)})
        try:
            self.trace_queue(vhost).offer(record, now, None)
        except Exception:  # the trace must never fail the publish, delivery or ack
            self.failures += 1

    def published(
        self, vhost: VirtualHost, message: Message, outcome: PublishOutcome, now: float
    ) -> None:
        if outcome is PublishOutcome.DUPLICATE or (
            message.exchange == "" and message.routing_key == TRACE_QUEUE
        ):
            return  # a publish sent again was traced (and stored) the first time
        extra = {"outcome": outcome.value}
        if outcome is PublishOutcome.UNROUTABLE:
            self._record(vhost, "publish", message, "", now, extra)
            return
        for name in _routed_to(vhost, message):
            self._record(vhost, "publish", message, name, now, extra)

    def delivered(self, queue: Queue, message: Message, redelivered: bool, now: float) -> None:
        if queue.name != TRACE_QUEUE:
            extra = {"redelivered": redelivered}
            self._record(queue.vhost, "deliver", message, queue.name, now, extra)

    def acked(self, queue: Queue, message: Message, now: float) -> None:
        if queue.name != TRACE_QUEUE:
            self._record(queue.vhost, "ack", message, queue.name, now, {})


def _routed_to(vhost: VirtualHost, message: Message) -> list[str]:
    """The queues a just-published message went to (routing again is pure)."""
    if not message.exchange:
        return [message.routing_key] if message.routing_key in vhost.queues else []
    exchange = vhost.exchanges.get(message.exchange)
    if exchange is None:
        return []
    return [q.name for q in exchange.route(message)]


def set_trace(broker: Broker, enabled: bool) -> bool:
    """Turn tracing on (keeping an existing tracer) or off; returns the new state."""
    if not enabled:
        broker.tracer = None
    elif broker.tracer is None:
        broker.tracer = Tracer(broker.node_id)
    return broker.tracer is not None
