"""Applying journal records to a broker: recovery after a restart, and a passive HA
node following its master.

Each record changes the in-memory model the way the change it describes did,
without the checks a client request goes through (the change was already allowed
once) and without dispatching to consumers. A snapshot (``snapshot.begin`` ...
``snapshot.end``) first clears the durable state it supersedes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amqlite.store.records import (
    ExchangeDeclare,
    ExchangeDelete,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    PeeringOut,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    Record,
    SnapshotBegin,
    SnapshotEnd,
    StreamAppend,
    StreamTrack,
    StreamTruncate,
)

from .arguments import parse_queue_arguments
from .exchange import EXCHANGE_TYPES, binding_id
from .message import Message
from .stream import StreamQueue
from .vhost import PREDECLARED, VirtualHost

if TYPE_CHECKING:
    from .broker import Broker


def apply_record(broker: Broker, record: Record, now: float) -> bool:
    """Apply one record; False when it names a vhost this broker does not have."""
    if isinstance(record, MessageDelivered | MessageAck):
        for vhost in broker.all_vhosts():
            queue = vhost.queues.get(record.queue)
            if queue is None:
                continue
            if isinstance(record, MessageAck):
                if queue.remove(record.id):
                    return True
            else:
                queue.mark_delivered(record.id)
        return True
    if isinstance(record, SnapshotEnd):
        return True
    if isinstance(record, SnapshotBegin):
        for vhost in broker.all_vhosts():
            _clear_durable(vhost)
        if broker.recorder is not None:
            broker.recorder.last_id = max(broker.recorder.last_id, record.last_message_id)
        return True
    host = broker.vhost(record.vhost)
    if host is None:
        return False
    if isinstance(record, MessageEnqueue):
        _enqueue(broker, host, record)
    elif isinstance(record, QueueDeclare):
        if record.name not in host.queues:
            args = dict(record.arguments)
            host.new_queue(
                record.name,
                durable=True,
                owner=None,
                auto_delete=record.auto_delete,
                arguments=args,
                settings=parse_queue_arguments(args),
            )
    elif isinstance(record, ExchangeDeclare):
        existing = host.exchanges.get(record.name)
        if existing is not None and existing.kind != record.type:
            host._remove_exchange(existing)
            existing = None
        if existing is None and record.type in EXCHANGE_TYPES:
            host.add_exchange(
                EXCHANGE_TYPES[record.type](
                    record.name,
                    durable=True,
                    auto_delete=record.auto_delete,
                    internal=record.internal,
                    arguments=dict(record.arguments),
                )
            )
    elif isinstance(record, QueueBind | QueueUnbind):
        queue = host.queues.get(record.queue)
        exchange = host.exchanges.get(record.exchange)
        if queue is not None and exchange is not None and record.exchange:
            args = dict(record.arguments)
            if isinstance(record, QueueBind):
                ident = exchange.bind(queue, record.key, args)
                if ident is not None:
                    queue.bindings.add((exchange, ident))
            else:
                ident = binding_id(queue, record.key, args)
                if exchange.unbind(ident):
                    queue.bindings.discard((exchange, ident))
    elif isinstance(record, PeeringOut):
        if record.publish_key:  # a publish that only a peering link took
            host.publish_keys.add(record.publish_key)
    elif isinstance(record, QueueDelete):
        queue = host.queues.get(record.name)
        if queue is not None:
            host.remove_queue(queue)
    elif isinstance(record, QueuePurge):
        queue = host.queues.get(record.name)
        if queue is not None:
            queue.purge()
    elif isinstance(record, StreamAppend | StreamTruncate | StreamTrack):
        stream = host.queues.get(record.queue)
        if isinstance(stream, StreamQueue):
            if isinstance(record, StreamAppend):
                message = Message(
                    record.exchange,
                    record.routing_key,
                    record.body,
                    dict(record.headers),
                    dict(record.props),
                )
                if record.publish_key:
                    message.publish_key = record.publish_key
                    host.publish_keys.add(record.publish_key)
                stream.restore_at(record.offset, message, record.enqueued_at)
            elif isinstance(record, StreamTruncate):
                stream.truncate(record.before)
            else:
                stream.tracked[record.name] = record.offset
    elif isinstance(record, ExchangeDelete):
        exchange = host.exchanges.get(record.name)
        if exchange is not None and record.name and record.name not in PREDECLARED:
            host._remove_exchange(exchange)
    return True


def _enqueue(broker: Broker, host: VirtualHost, r: MessageEnqueue) -> None:
    recorder = broker.recorder
    wall_offset = 0.0
    if recorder is not None:
        recorder.last_id = max(recorder.last_id, r.id)
        wall_offset = recorder.wall_offset
    message = Message(r.exchange, r.routing_key, r.body, dict(r.headers), dict(r.props))
    message.pid = r.id
    message._deaths = r.deaths
    if r.mesh:
        message.mesh = r.mesh
    if r.publish_key:
        message.publish_key = r.publish_key
        host.publish_keys.add(r.publish_key)
    at = r.enqueued_at - wall_offset
    expiration = message.properties.get("expiration")
    for name in r.queues:
        queue = host.queues.get(name)
        if queue is not None:
            queue.restore(message, queue.expiry(at, expiration))


def _clear_durable(host: VirtualHost) -> None:
    """Drop what a snapshot supersedes: recorded queues and durable exchanges."""
    for queue in list(host.queues.values()):
        if queue.journal is not None:
            host.remove_queue(queue)
    for exchange in list(host.exchanges.values()):
        if exchange.durable and exchange.name and exchange.name not in PREDECLARED:
            host._remove_exchange(exchange)
