"""Applying journal records to a broker: recovery after a restart, and a passive HA
node following its master.

Each record changes the in-memory model the way the change it describes did,
without the checks a client request goes through (the change was already allowed
once) and without dispatching to consumers. A snapshot (``snapshot.begin`` ...
``snapshot.end``) first clears the durable state it supersedes.

One handler per record type, as :class:`amqlite.store.state.StoreState` folds the
same records: :data:`_ONE_VHOST` holds the records that name a vhost (skipped when
the broker has no such vhost), :data:`_EVERY_VHOST` those that do not. Like the
fold, a handler ignores what it cannot place (an ack for a message no queue holds,
a binding to a missing queue or exchange).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from amqlite.store.records import (
    ExchangeDeclare,
    ExchangeDelete,
    GroupOwner,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    MessageMarks,
    PeeringMarks,
    PeeringOut,
    PeeringOutAck,
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
from amqlite.store.state import MessageRef, MessageRun

from .arguments import parse_queue_arguments
from .exchange import EXCHANGE_TYPES, binding_id
from .message import Message
from .stream import StreamQueue
from .vhost import PREDECLARED, VirtualHost

if TYPE_CHECKING:
    from .broker import Broker


class _InVhost(Protocol):
    """A record that names its vhost (every type in :data:`_ONE_VHOST`)."""

    @property
    def vhost(self) -> str: ...


class Replay:
    """Applies records to one broker (:meth:`amqlite.broker.Broker.apply` makes one
    per call; the broker pauses its recorder meanwhile)."""

    __slots__ = ("broker",)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def apply(self, record: Record | MessageRef | MessageRun) -> bool:
        """Apply one record; False when it names a vhost this broker does not have."""
        handler = _ONE_VHOST.get(type(record))
        if handler is None:
            _EVERY_VHOST[type(record)](self, record)
            return True
        host = self.broker.vhost(cast(_InVhost, record).vhost)
        if host is None:
            return False
        handler(self, host, record)
        return True

    # --- records without a vhost ----------------------------------------------------------

    def _message_delivered(self, r: MessageDelivered) -> None:
        for host in self.broker.all_vhosts():
            queue = host.queues.get(r.queue)
            if queue is not None:
                queue.mark_delivered(r.id)

    def _message_ack(self, r: MessageAck) -> None:
        for host in self.broker.all_vhosts():
            queue = host.queues.get(r.queue)
            if queue is not None and queue.remove(r.id):
                return

    def _message_marks(self, r: MessageMarks) -> None:
        for host in self.broker.all_vhosts():
            queue = host.queues.get(r.queue)
            if queue is not None:
                for journal_id in r.delivered:
                    queue.mark_delivered(journal_id)
                for journal_id in r.acked:
                    queue.remove(journal_id)

    def _snapshot_begin(self, r: SnapshotBegin) -> None:
        for host in self.broker.all_vhosts():
            _clear_durable(host)
        recorder = self.broker.recorder
        if recorder is not None:
            recorder.last_journal_id = max(recorder.last_journal_id, r.last_journal_id)

    def _snapshot_end(self, r: SnapshotEnd) -> None:
        pass

    # --- records of one vhost -------------------------------------------------------------

    def _exchange_declare(self, host: VirtualHost, r: ExchangeDeclare) -> None:
        existing = host.exchanges.get(r.name)
        if existing is not None and existing.kind != r.type:
            host.remove_exchange(existing)
            existing = None
        if existing is None and r.type in EXCHANGE_TYPES:
            host.add_exchange(
                EXCHANGE_TYPES[r.type](
                    r.name,
                    durable=True,
                    auto_delete=r.auto_delete,
                    internal=r.internal,
                    arguments=dict(r.arguments),
                )
            )

    def _exchange_delete(self, host: VirtualHost, r: ExchangeDelete) -> None:
        exchange = host.exchanges.get(r.name)
        if exchange is not None and r.name and r.name not in PREDECLARED:
            host.remove_exchange(exchange)

    def _queue_declare(self, host: VirtualHost, r: QueueDeclare) -> None:
        if r.name not in host.queues:
            args = dict(r.arguments)
            host.new_queue(
                r.name,
                durable=True,
                owner=None,
                auto_delete=r.auto_delete,
                arguments=args,
                settings=parse_queue_arguments(args),
            )

    def _queue_delete(self, host: VirtualHost, r: QueueDelete) -> None:
        queue = host.queues.get(r.name)
        if queue is not None:
            host.remove_queue(queue)

    def _queue_purge(self, host: VirtualHost, r: QueuePurge) -> None:
        queue = host.queues.get(r.name)
        if queue is not None:
            queue.purge()

    def _queue_bind(self, host: VirtualHost, r: QueueBind) -> None:
        queue = host.queues.get(r.queue)
        exchange = host.exchanges.get(r.exchange)
        if queue is not None and exchange is not None and r.exchange:
            ident = exchange.bind(queue, r.key, dict(r.arguments))
            if ident is not None:
                queue.bindings.add((exchange, ident))

    def _queue_unbind(self, host: VirtualHost, r: QueueUnbind) -> None:
        queue = host.queues.get(r.queue)
        exchange = host.exchanges.get(r.exchange)
        if queue is not None and exchange is not None and r.exchange:
            ident = binding_id(queue, r.key, dict(r.arguments))
            if exchange.unbind(ident):
                queue.bindings.discard((exchange, ident))

    def _message_enqueue(
        self, host: VirtualHost, r: MessageEnqueue, queues: tuple[str, ...] | None = None
    ) -> None:
        """Queue the message on ``queues`` (default: every queue its record names)."""
        recorder = self.broker.recorder
        wall_offset = 0.0
        if recorder is not None:
            recorder.last_journal_id = max(recorder.last_journal_id, r.id)
            wall_offset = recorder.wall_offset
        message = message_from_record(r)
        if r.publish_key:
            host.publish_keys.add(r.publish_key)
        at = r.enqueued_at - wall_offset
        expiration = message.properties.get("expiration")
        for name in r.queues if queues is None else queues:
            queue = host.queues.get(name)
            if queue is not None:
                queue.restore(message, queue.expiry(at, expiration))

    def _message_ref(self, host: VirtualHost, r: MessageRef) -> None:
        """A message of a lazy snapshot (a restart): queued by journal id, its body
        left in the journal (queue backlogs read it back), unless its record is still
        in memory (not yet written, or one the journal keeps: an expiration, a group)."""
        if r.record is not None:
            # the ref's queues, not the record's: those that acked it are left out
            self._message_enqueue(host, r.record, r.queues)
            for name in r.delivered:
                queue = host.queues.get(name)
                if queue is not None:
                    queue.mark_delivered(r.id)
            return
        recorder = self.broker.recorder
        if recorder is None or recorder.source is None:
            raise RuntimeError("a lazy snapshot needs the journal's message source")
        recorder.last_journal_id = max(recorder.last_journal_id, r.id)
        wall_offset = recorder.wall_offset
        if r.publish_key:
            host.publish_keys.add(r.publish_key)
        at = r.enqueued_at - wall_offset
        delivered = r.delivered
        for name in r.queues:
            queue = host.queues.get(name)
            if queue is not None:
                queue.restore_ref(r.id, r.size, queue.expiry(at, None), name in delivered)

    def _message_run(self, host: VirtualHost, r: MessageRun) -> None:
        """Placed messages of one queue in bulk (a restart): as a ``MessageRef`` each."""
        recorder = self.broker.recorder
        if recorder is None or recorder.source is None:
            raise RuntimeError("a lazy snapshot needs the journal's message source")
        if r.stop <= r.start:
            return
        recorder.last_journal_id = max(recorder.last_journal_id, r.ids[r.stop - 1])
        for key in r.publish_keys:
            host.publish_keys.add(key)
        queue = host.queues.get(r.queue)
        if queue is not None:
            queue.restore_refs(
                r.ids, r.sizes, r.ats, r.flags, r.start, r.stop, recorder.wall_offset
            )

    def _stream_append(self, host: VirtualHost, r: StreamAppend) -> None:
        stream = host.queues.get(r.queue)
        if isinstance(stream, StreamQueue):
            message = Message(r.exchange, r.routing_key, r.body, dict(r.headers), dict(r.props))
            if r.publish_key:
                message.publish_key = r.publish_key
                host.publish_keys.add(r.publish_key)
            stream.restore_at(r.offset, message, r.enqueued_at)

    def _stream_truncate(self, host: VirtualHost, r: StreamTruncate) -> None:
        stream = host.queues.get(r.queue)
        if isinstance(stream, StreamQueue):
            stream.truncate(r.before)

    def _stream_track(self, host: VirtualHost, r: StreamTrack) -> None:
        stream = host.queues.get(r.queue)
        if isinstance(stream, StreamQueue):
            stream.tracked[r.name] = r.offset

    def _group_owner(self, host: VirtualHost, r: GroupOwner) -> None:
        queue = host.queues.get(r.queue)
        if queue is not None and not queue.is_stream:
            queue.reserve_group(r.group, r.owner)

    def _peering_out(self, host: VirtualHost, r: PeeringOut) -> None:
        if r.publish_key:  # a publish that only a peering link took
            host.publish_keys.add(r.publish_key)

    def _peering_state(self, host: VirtualHost, r: PeeringMarks | PeeringOutAck) -> None:
        """Exchange peering's own bookkeeping: the peering service reads it from the
        journal's state; the broker model has nothing to change."""


#: The records a passive HA node's broker follows as they arrive: the topology (which
#: its status and HTTP reads show) and the snapshot frame around it. Why only these:
#: building a message object per replicated message (and marking, acking it) was a
#: third of the passive node's CPU, and on one machine the two nodes share the cores
#: (issue 16). The messages wait in the journal's state, as a restart's do, and the
#: broker is rebuilt from that state when the node takes over (``HaService``), so it
#: then holds exactly what a full rebuild gives. ``tests/ha_pair`` checks the rebuilt
#: broker against one fed every record.
PASSIVE_FOLLOWED: frozenset[type[Record]] = frozenset(
    {
        ExchangeDeclare,
        ExchangeDelete,
        QueueDeclare,
        QueueDelete,
        QueuePurge,
        QueueBind,
        QueueUnbind,
        SnapshotBegin,
        SnapshotEnd,
    }
)


def message_from_record(r: MessageEnqueue) -> Message:
    """The broker's message for a journaled one (a restart, a backlog reading it back)."""
    message = Message(r.exchange, r.routing_key, r.body, dict(r.headers), dict(r.props))
    message.journal_id = r.id
    message.deaths = r.deaths
    if r.mesh:
        message.mesh = r.mesh
    if r.publish_key:
        message.publish_key = r.publish_key
    return message


def _clear_durable(host: VirtualHost) -> None:
    """Drop what a snapshot supersedes: recorded queues and durable exchanges."""
    for queue in list(host.queues.values()):
        if queue.journal is not None:
            host.remove_queue(queue)
    for exchange in list(host.exchanges.values()):
        if exchange.durable and exchange.name and exchange.name not in PREDECLARED:
            host.remove_exchange(exchange)


#: Handlers of the records that carry no vhost (they reach into every vhost).
_EVERY_VHOST: dict[type[Record | MessageRef | MessageRun], Callable[[Replay, Any], None]] = {
    MessageDelivered: Replay._message_delivered,
    MessageAck: Replay._message_ack,
    MessageMarks: Replay._message_marks,
    SnapshotBegin: Replay._snapshot_begin,
    SnapshotEnd: Replay._snapshot_end,
}

#: Handlers of the records of one vhost, called with that vhost.
_ONE_VHOST: dict[
    type[Record | MessageRef | MessageRun], Callable[[Replay, VirtualHost, Any], None]
] = {
    ExchangeDeclare: Replay._exchange_declare,
    ExchangeDelete: Replay._exchange_delete,
    QueueDeclare: Replay._queue_declare,
    QueueDelete: Replay._queue_delete,
    QueuePurge: Replay._queue_purge,
    QueueBind: Replay._queue_bind,
    QueueUnbind: Replay._queue_unbind,
    MessageEnqueue: Replay._message_enqueue,
    MessageRef: Replay._message_ref,
    MessageRun: Replay._message_run,
    StreamAppend: Replay._stream_append,
    StreamTruncate: Replay._stream_truncate,
    StreamTrack: Replay._stream_track,
    GroupOwner: Replay._group_owner,
    PeeringMarks: Replay._peering_state,
    PeeringOut: Replay._peering_out,
    PeeringOutAck: Replay._peering_state,
}
