"""A session: one client's view of the broker (a protocol adapter opens one per
connection) and the owner of its consumers, deliveries and exclusive queues.

Guarantees:
- Delivery tags are per session, start at 1 and strictly increase.
- Every delivery not made with ``no_ack`` stays unacknowledged here until it is
  acked, nacked, rejected or the session closes; closing requeues it (marked
  redelivered), and pushes the shell never took, so a message is never lost
  with a session.
- Pushes wait in :meth:`Session.take_deliveries`; the broker lists the sessions
  that have something waiting (:meth:`Broker.take_ready`).
- After :meth:`Session.close` every request raises 504 CHANNEL_ERROR (flow
  control and the ``take_*`` calls just do nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from itertools import repeat as _repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from amqlite.errors import (
    AccessRefused,
    BrokerError,
    NotAllowed,
    PreconditionFailed,
    ReplyCode,
)

from .groups import original_of
from .limits import BrokerLimits, consumer_limit_error
from .message import Delivery, Message, PublishOutcome, QueueInfo
from .queue import Consumer, Entry, Queue
from .selector import compile_selector
from .stream import OFFSET_ARGUMENT, StreamQueue
from .trace import set_trace

if TYPE_CHECKING:
    from .broker import Broker
    from .vhost import VirtualHost


_consumer_of = attrgetter("_consumer")
_origin_of = attrgetter("_origin")


class Session:
    """Request API of one client; see docs/CONTRACTS.md, "Broker core".

    ``owner`` is whatever the shell passed to :meth:`Broker.open_session`;
    ``holder`` is the session whose close deletes the exclusive queues this one
    declares (itself unless the shell names another).
    Methods without a ``now`` argument (or given ``now=None``) use the latest time
    the broker has been given.
    """

    __slots__ = (
        "_broker",
        "_cancellations",
        "_channel_prefetch",
        "_closed",
        "_consumers",
        "_credit_out",
        "_flagged",
        "_last_ctag",
        "_last_dtag",
        "_noack_journal_ids",
        "_owned",
        "_pending",
        "_unacked",
        "_vhost",
        "_writable",
        "consumers_held",
        "holder",
        "instance",
        "owner",
    )

    def __init__(
        self, broker: Broker, vhost: VirtualHost, owner: object, holder: Session | None = None
    ) -> None:
        self._broker = broker
        self._vhost = vhost
        self.owner = owner
        #: The session that holds this one's exclusive queues: itself, or (AMQP, where
        #: exclusivity is per connection and each channel is a session) the
        #: connection's holder session, which deletes them when it closes.
        self.holder: Session = self if holder is None else holder
        #: consumers of every session this one holds (its connection's), counted
        #: against the broker's ``max_consumers_per_connection``
        self.consumers_held = 0
        #: the client's ``hello.instance`` (kept across its reconnects; "" none): names
        #: its consumers as owners of message groups (:mod:`.groups`)
        self.instance = ""
        self._closed = False
        self._writable = True
        #: the channel-wide prefetch (AMQP ``basic.qos`` global=true): at most this
        #: many unacknowledged deliveries on the session, shared by its consumers
        #: (0: none); ``_credit_out`` is True while they are all taken
        self._channel_prefetch = 0
        self._credit_out = False
        self._flagged = False
        self._last_dtag = 0
        self._last_ctag = 0
        self._unacked: dict[int, Delivery] = {}
        self._pending: list[Delivery] = []
        # Journaled messages pushed to no-ack consumers: recorded as acked once the
        # shell takes the push (an untaken push is requeued by close()).
        self._noack_journal_ids: list[tuple[Queue, int]] = []
        self._cancellations: list[tuple[str, int, str]] = []
        self._consumers: dict[str, Consumer] = {}
        self._owned: set[Queue] = set()

    @property
    def vhost(self) -> str:
        return self._vhost.name

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def limits(self) -> BrokerLimits:
        """The broker's limits on client requests (:mod:`.limits`)."""
        return self._broker.limits

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerError("session is closed", ReplyCode.CHANNEL_ERROR)

    def _now(self, now: float | None) -> float:
        broker = self._broker
        if now is None:
            return broker.now
        broker.now = now
        return now

    # --- durability -------------------------------------------------------------

    def _start_span(self) -> None:
        recorder = self._broker.recorder
        if recorder is not None:
            recorder.start_span()

    def new_span(self) -> None:
        """A request begins whose reply depends on what the calls after this journal
        (a ``publish.batch``: its publishes pass ``span=False``)."""
        self._start_span()

    def journal_marks(self) -> tuple[int, int]:
        """Journal the gathered delivery marks and acks now (``Recorder.gather_marks``),
        as a request of their own; returns its span, ``(0, 0)`` when nothing was
        gathered. A reply that vouches for acks (``tx.commit``) waits for it too."""
        recorder = self._broker.recorder
        if recorder is None:
            return (0, 0)
        recorder.start_span()
        recorder.flush_marks(span=True)
        return (recorder.span_first, recorder.span_last)

    @property
    def journal_span(self) -> tuple[int, int]:
        """The journal positions ``(first, last)`` the reply to the latest request
        that promises durability depends on (publish, declare, delete, purge, bind,
        unbind, store_offset): the reply may go once the journal (and, on an HA pair,
        the passive node) holds ``last``; ``(0, 0)`` when it depends on nothing.
        ``last`` is ``ALL_APPENDED`` (-1) for a publish sent again whose first copy
        was replayed: everything appended so far."""
        recorder = self._broker.recorder
        if recorder is None:
            return (0, 0)
        return (recorder.span_first, recorder.span_last)

    # --- topology -----------------------------------------------------------------

    def declare_exchange(
        self,
        name: str,
        type: str,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        passive: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        self._check_open()
        self._start_span()
        self._vhost.declare_exchange(
            name,
            type,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            passive=passive,
            arguments=arguments,
        )

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        self._check_open()
        self._start_span()
        self._vhost.delete_exchange(name, if_unused=if_unused)

    def declare_queue(
        self,
        name: str = "",
        *,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        passive: bool = False,
        arguments: Mapping[str, Any] | None = None,
        reserved: bool = False,
    ) -> QueueInfo:
        self._check_open()
        self._start_span()
        return self._vhost.declare_queue(
            self,
            name,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            passive=passive,
            arguments=arguments,
            reserved=reserved,
        )

    def delete_queue(self, name: str, *, if_unused: bool = False, if_empty: bool = False) -> int:
        self._check_open()
        self._start_span()
        return self._vhost.delete_queue(self, name, if_unused=if_unused, if_empty=if_empty)

    def purge_queue(self, name: str) -> int:
        self._check_open()
        self._start_span()
        return self._vhost.purge_queue(self, name)

    def bind(
        self, queue: str, exchange: str, key: str = "", arguments: Mapping[str, Any] | None = None
    ) -> None:
        self._check_open()
        self._start_span()
        self._vhost.bind(self, queue, exchange, key, arguments)

    def unbind(
        self, queue: str, exchange: str, key: str = "", arguments: Mapping[str, Any] | None = None
    ) -> None:
        self._check_open()
        self._start_span()
        self._vhost.unbind(self, queue, exchange, key, arguments)

    # --- publishing ---------------------------------------------------------------

    def publish(
        self, message: Message, *, mandatory: bool = False, now: float, span: bool = True
    ) -> PublishOutcome:
        """Route ``message``. ``mandatory`` changes nothing here: the shell returns
        an UNROUTABLE mandatory message to its publisher. ``span=False``: the
        message joins the journal span of the request before (the messages of one
        ``publish.batch`` after the first: one reply vouches for them all)."""
        if self._closed:
            self._check_open()
        broker = self._broker
        broker.now = now
        recorder = broker.recorder
        if recorder is None:
            outcome = self._vhost.publish(message, now)
        else:
            if span:
                recorder.start_span()
            outcome = self._vhost.publish(message, now)
            if outcome is PublishOutcome.DUPLICATE:
                recorder.depend_on(self._vhost.publish_keys.position(message.publish_key))
        if self._broker.tracer is not None:  # trace hook (amq.trace)
            self._broker.tracer.published(self._vhost, message, outcome, now)
        return outcome

    def publish_run(
        self,
        exchange: str,
        key: str,
        bodies: list[bytes],
        *,
        now: float,
        meshes: Callable[[int], Sequence[Any]] | None = None,
    ) -> bool:
        """:meth:`publish` of ``Message(exchange, key, body)`` for each of ``bodies``,
        none mandatory: their outcomes are not returned. False when it did nothing
        (the session is closed, a trace hook watches publishes, or
        :meth:`~amqlite.broker.vhost.VirtualHost.publish_run` declined): the caller
        then publishes each through :meth:`publish`. The run is one journal span
        (each message's own record, if any, is the span's; a plain transient
        message records nothing of its own). ``meshes``: see
        ``VirtualHost.publish_run`` (not called when this returns False).

        Why it exists: see ``VirtualHost.publish_run``."""
        if self._closed:
            return False
        broker = self._broker
        if broker.tracer is not None:
            return False
        broker.now = now
        recorder = broker.recorder
        if recorder is not None:
            recorder.start_span()
        return self._vhost.publish_run(exchange, key, bodies, now, meshes)

    def routes_nowhere(self, exchange: str) -> bool:
        """True when :meth:`publish` of a message without a ``publish_key`` and
        not persistent to ``exchange`` (a named one) would route it nowhere and
        change nothing here but the broker's ``now``: the session is open, the
        exchange exists, is not internal and has no bindings, and no trace hook
        watches publishes (it would see the publish). False says nothing.

        Why it exists: a client publish on a peered exchange that only forwards
        (a sending site with no local queues bound) needs no ``Message`` and no
        routing; the dispatcher asks this instead
        (``tests/server/test_dispatch_publish.py`` checks the two paths agree)."""
        if not exchange or self._closed or self._broker.tracer is not None:
            return False
        target = self._vhost.exchanges.get(exchange)
        return target is not None and not target.bindings and not target.internal

    def publish_batch(
        self, exchange: str, messages: list[Message], *, now: float
    ) -> list[PublishOutcome]:
        """:meth:`publish` of each of ``messages`` (all to ``exchange``, ``span=False``:
        one ``publish.batch``), through
        :meth:`~amqlite.broker.vhost.VirtualHost.publish_batch`; with the trace on,
        one by one (the tracer sees each publish as it is routed)."""
        if self._closed:
            self._check_open()
        broker = self._broker
        broker.now = now
        if broker.tracer is not None:
            return [self.publish(m, now=now, span=False) for m in messages]
        return self._vhost.publish_batch(exchange, messages, now)

    # --- consuming ----------------------------------------------------------------

    def consume(
        self,
        queue: str,
        *,
        tag: str = "",
        prefetch: int = 0,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Mapping[str, Any] | None = None,
        selector: str | None = None,
        now: float,
    ) -> str:
        """Subscribe to ``queue``; returns the consumer tag (``ctag-N`` when empty).

        ``selector`` (JMS message-selector text, docs/selectors.md) limits the
        consumer to the messages it selects; a bad one is refused with 406 naming
        the position and the reason (:class:`~.selector.SelectorError`). An empty
        (or blank) selector is no selector, as in JMS."""
        self._check_open()
        now = self._now(now)
        q = self._vhost.queue(self, queue)
        if type(prefetch) is not int or prefetch < 0:
            raise PreconditionFailed(f"prefetch must be a non-negative integer, got {prefetch!r}")
        accepts = None
        if selector is not None and selector.strip():
            if isinstance(q, StreamQueue):
                raise PreconditionFailed(
                    f"queue {queue!r} in vhost {self._vhost.name!r} is a stream queue: "
                    "selectors are for classic queues"
                )
            accepts = compile_selector(selector).accepts
        if tag:
            if tag in self._consumers:
                raise NotAllowed(f"attempt to reuse consumer tag {tag!r}")
        else:
            tag = self._new_tag()
        holder = self.holder
        limit = self._broker.limits.max_consumers_per_connection
        if limit and holder.consumers_held >= limit:
            raise consumer_limit_error(limit)
        if q.has_exclusive_consumer():
            raise AccessRefused(
                f"queue {queue!r} in vhost {self._vhost.name!r} has an exclusive consumer"
            )
        if exclusive and q.consumers:
            raise AccessRefused(
                f"cannot obtain exclusive access to queue {queue!r} in vhost "
                f"{self._vhost.name!r}: it has consumers"
            )
        consumer = Consumer(
            tag,
            q,
            self,
            prefetch,
            no_ack,
            exclusive,
            dict(arguments or {}),
            self._writable and (no_ack or not self._credit_out),
            accepts,
        )
        if accepts is not None:
            consumer.selector = selector
        if isinstance(q, StreamQueue):
            q.attach(consumer, consumer.arguments.get(OFFSET_ARGUMENT))
        self._consumers[tag] = consumer
        holder.consumers_held += 1
        q.add_consumer(consumer)
        q.dispatch(now)
        self._vhost.consumers_changed(q)
        return tag

    def _new_tag(self) -> str:
        while True:
            self._last_ctag += 1
            tag = f"ctag-{self._last_ctag}"
            if tag not in self._consumers:
                return tag

    def cancel(self, tag: str) -> None:
        """Stop consumer ``tag`` (unknown tags are no error). Its unacknowledged
        deliveries stay with the session. An auto-delete queue losing its last
        consumer is deleted."""
        self._check_open()
        consumer = self._consumers.pop(tag, None)
        if consumer is not None:
            self._detach(consumer)

    def _detach(self, consumer: Consumer) -> None:
        self.holder.consumers_held -= 1
        queue = consumer.queue
        had_groups = bool(consumer.groups)
        queue.remove_consumer(consumer)
        self._vhost.consumers_changed(queue)
        if queue.auto_delete and not queue.consumers and not queue.deleted:
            self._vhost.remove_queue(queue)
        elif had_groups and queue.has_ready() and not queue.deleted:
            queue.dispatch(self._broker.now)  # its groups may move now

    def store_offset(self, queue: str, name: str, offset: int) -> None:
        """Keep ``offset`` under ``name`` in stream ``queue`` (survives a restart)."""
        self._check_open()
        self._start_span()
        self._stream(queue).store_offset(name, offset)

    def query_offset(self, queue: str, name: str) -> int:
        """The offset stored under ``name`` in stream ``queue``; 404 when none is."""
        self._check_open()
        return self._stream(queue).query_offset(name)

    def fetch_stream(
        self,
        queue: str,
        start: int,
        end: int | None,
        max_bytes: int,
        *,
        visible: int | None = None,
        now: float,
    ) -> tuple[StreamQueue, int, list[Message], int]:
        """The stored messages of stream ``queue`` from ``start`` (see
        :meth:`StreamQueue.read`): ``(queue, first, messages, dropped)``. Changes
        nothing on the broker; with the trace on, each message read is traced as a
        delivery."""
        self._check_open()
        now = self._now(now)
        q = self._stream(queue)
        first, messages, dropped = q.read(start, end, max_bytes, visible)
        tracer = self._broker.tracer
        if tracer is not None:
            for m in messages:
                tracer.delivered(q, m, False, now)
        return q, first, messages, dropped

    def fetch_block(
        self, queue: str, start: int, end: int | None, *, visible: int | None = None
    ) -> tuple[StreamQueue, int | None]:
        """Stream ``queue`` and the whole block a fetch from ``start`` reads
        (:meth:`StreamQueue.whole_block`), None when it is not one or the trace is
        on (each message read is traced: :meth:`fetch_stream`)."""
        self._check_open()
        q = self._stream(queue)
        if self._broker.tracer is not None:
            return q, None
        return q, q.whole_block(start, end, visible)

    def _stream(self, name: str) -> StreamQueue:
        q = self._vhost.queue(self, name)
        if not isinstance(q, StreamQueue):
            raise PreconditionFailed(
                f"queue {name!r} in vhost {self._vhost.name!r} is not a stream queue"
            )
        return q

    def get(self, queue: str, *, no_ack: bool = False, now: float) -> tuple[Delivery, int] | None:
        """Take one message: ``(delivery, messages still ready)``, or None when empty.
        The delivery has ``ctag == ""`` and must be acked unless ``no_ack``."""
        self._check_open()
        now = self._now(now)
        q = self._vhost.queue(self, queue)
        q.used_at = None  # a get is a use (x-expires)
        entry = q.take(now)
        if entry is None:
            return None
        message, expires, redelivered = entry
        self._last_dtag = dtag = self._last_dtag + 1
        delivery = Delivery("", dtag, redelivered, message, q.name, q, None, expires)
        q.stat_deliver += 1
        if redelivered:
            q.stat_redeliver += 1
        if self._broker.tracer is not None:  # trace hook (amq.trace)
            self._broker.tracer.delivered(q, message, redelivered, now)
        if not no_ack:
            self._unacked[dtag] = delivery
            q.unacked += 1
        if message.journal_id and q.recorder is not None:
            if no_ack:
                q.recorder.ack(message.journal_id, q.name)
            elif not redelivered:
                q.recorder.delivered(message.journal_id, q.name)
        return delivery, q.count()

    # --- settling -----------------------------------------------------------------

    def ack(self, dtag: int, *, multiple: bool = False, now: float | None = None) -> None:
        """Settle deliveries: ``dtag`` alone, or with ``multiple`` every unacked tag
        up to it (``0`` = all). Unknown ``dtag``: 406 and nothing is settled."""
        self._check_open()
        if not multiple:
            delivery = self._unacked.pop(dtag, None)
            if delivery is None:
                raise PreconditionFailed(f"unknown delivery tag {dtag}")
            consumer = delivery._consumer
            if consumer is not None:
                consumer.inflight -= 1
            queue = delivery._origin
            if queue is not None and not queue.deleted:
                queue.unacked -= 1
                queue.stat_ack += 1
                if queue.groups and consumer is not None and consumer.removed:
                    queue.group_settled(delivery.message)
                if self._broker.tracer is not None:  # trace hook (amq.trace)
                    self._broker.tracer.acked(queue, delivery.message, self._now(now))
                journal_id = delivery.message.journal_id
                if journal_id and queue.recorder is not None:
                    queue.recorder.ack(journal_id, queue.name)
                if queue.has_ready() or queue.is_stream:
                    queue.dispatch(self._now(now))
            if self._credit_out and len(self._unacked) < self._channel_prefetch:
                self._credit_back(self._now(now))
            return
        self._release(self._take(dtag, multiple), None, self._now(now))

    def nack(
        self, dtag: int, *, multiple: bool = False, requeue: bool = True, now: float | None = None
    ) -> None:
        """Give deliveries back: requeued at the head (redelivered) when
        ``requeue``, else dead-lettered as ``rejected`` (or dropped)."""
        self._check_open()
        self._release(self._take(dtag, multiple), requeue, self._now(now))

    def reject(self, dtag: int, *, requeue: bool = True, now: float | None = None) -> None:
        self.nack(dtag, multiple=False, requeue=requeue, now=now)

    def unsettled_of(self, consumer: Consumer) -> list[Delivery]:
        """``consumer``'s deliveries not settled yet (a queue counts its groups' when
        the consumer goes)."""
        return [d for d in self._unacked.values() if d._consumer is consumer]

    def _take(self, dtag: int, multiple: bool) -> list[Delivery]:
        unacked = self._unacked
        if not multiple or dtag != 0:
            if dtag not in unacked:
                raise PreconditionFailed(f"unknown delivery tag {dtag}")
            if not multiple:
                return [unacked.pop(dtag)]
        tags = []
        for tag in unacked:  # insertion order is delivery-tag order
            if dtag and tag > dtag:
                break
            tags.append(tag)
        return [unacked.pop(tag) for tag in tags]

    def _release(
        self,
        deliveries: Iterable[Delivery],
        requeue: bool | None,
        now: float,
        unsent: Container[int] = (),
    ) -> None:
        """Settle deliveries: ``requeue`` None acks, True requeues, False rejects;
        then let the queues involved dispatch to the credit freed.

        Requeued messages are marked redelivered, except those whose tag is in
        ``unsent`` (never taken by the shell), which keep their flag. Deliveries
        to no-ack consumers count here only when unsent (on close)."""
        if requeue is None and type(deliveries) is list and self._settle_acked(deliveries, now):
            return
        touched: dict[Queue, list[Entry]] = {}
        for delivery in deliveries:
            consumer = delivery._consumer
            counted = consumer is None or not consumer.no_ack
            if consumer is not None and counted:
                consumer.inflight -= 1
            queue = delivery._origin
            if queue is None or queue.deleted:
                continue
            if counted:
                queue.unacked -= 1
                if queue.groups and consumer is not None and consumer.removed:
                    queue.group_settled(delivery.message)
            entries = touched.get(queue)
            if entries is None:
                entries = touched[queue] = []
            if requeue:
                redelivered = delivery.redelivered if delivery.dtag in unsent else True
                entries.append((original_of(delivery.message), delivery._expires, redelivered))
            elif requeue is not None:
                queue.dead_letter_rejected(original_of(delivery.message), now)
            elif delivery.message.journal_id and queue.recorder is not None:
                queue.recorder.ack(delivery.message.journal_id, queue.name)
            if requeue is None and counted:
                queue.stat_ack += 1
            if requeue is None and self._broker.tracer is not None:  # trace hook (amq.trace)
                self._broker.tracer.acked(queue, delivery.message, now)
        for queue, entries in touched.items():
            if entries and not queue.deleted:
                queue.requeue(entries)
        for queue in touched:
            if not queue.deleted:
                queue.dispatch(now)
        if self._credit_out and len(self._unacked) < self._channel_prefetch:
            self._credit_back(now)

    def _settle_acked(self, deliveries: list[Delivery], now: float) -> bool:
        """:meth:`_release` of acked ``deliveries`` (at least two) when they are all
        one consumer's (not no-ack) from one queue without message groups and no
        trace hook watches: the counts moved once, not per delivery. False when
        it did nothing (the caller takes the general path).

        Why it exists: an ack of many deliveries (``ack`` with ``multiple``: a
        peering queue settling the run its subscriber acknowledged) spent most of
        its time in the general loop's per-delivery checks;
        tests/broker/test_offer_run.py checks both paths leave the same state."""
        if len(deliveries) < 2 or self._broker.tracer is not None:
            return False
        first = deliveries[0]
        consumer, queue = first._consumer, first._origin
        if (
            consumer is None
            or consumer.no_ack
            or queue is None
            or queue.groups
            or len(set(map(_consumer_of, deliveries))) != 1
            or len(set(map(_origin_of, deliveries))) != 1
        ):
            return False
        n = len(deliveries)
        consumer.inflight -= n
        if not queue.deleted:
            queue.unacked -= n
            recorder = queue.recorder
            if recorder is not None:
                recorder.acked_ids(
                    [i for d in deliveries if (i := d.message.journal_id)], queue.name
                )
            queue.stat_ack += n
            queue.dispatch(now)
        if self._credit_out and len(self._unacked) < self._channel_prefetch:
            self._credit_back(now)
        return True

    def set_trace(self, enabled: bool) -> bool:
        """Turn the broker's trace into ``amq.trace`` on or off (see :mod:`.trace`)."""
        self._check_open()
        return set_trace(self._broker, enabled)

    # --- flow control and output ----------------------------------------------------

    def set_writable(self, flag: bool, *, now: float | None = None) -> None:
        """Shell flow control: while False nothing is pushed to this session's
        consumers (messages stay ready or go to other consumers). A no-op once
        the session is closed, as are the ``take_*`` calls."""
        if self._closed or flag == self._writable:
            return
        self._writable = flag
        self._apply_writable()
        if flag:
            self._dispatch_all(self._now(now))

    def set_channel_prefetch(self, count: int, *, now: float | None = None) -> None:
        """Share a prefetch of ``count`` unacknowledged deliveries among all this
        session's consumers, present and future (AMQP ``basic.qos`` with
        global=true, as RabbitMQ applies it to a channel); 0 lifts it. It works
        beside each consumer's own prefetch: a consumer needs credit in both. No-ack
        consumers are not limited, as in RabbitMQ."""
        self._check_open()
        if type(count) is not int or count < 0:
            raise PreconditionFailed(f"prefetch must be a non-negative integer, got {count!r}")
        self._channel_prefetch = count
        out = bool(count) and len(self._unacked) >= count
        if out:
            self._set_credit_out(True)
        elif self._credit_out:
            self._credit_back(self._now(now))

    def _set_credit_out(self, out: bool) -> None:
        if out != self._credit_out:
            self._credit_out = out
            self._apply_writable()

    def _credit_back(self, now: float) -> None:
        """The channel-wide prefetch has room again: every queue the session
        consumes from may push (not only those whose deliveries were settled)."""
        self._set_credit_out(False)
        if self._writable and not self._closed:
            self._dispatch_all(now)

    def _apply_writable(self) -> None:
        flag = self._writable
        out = self._credit_out
        for consumer in self._consumers.values():
            consumer.writable = flag and (consumer.no_ack or not out)

    def _dispatch_all(self, now: float) -> None:
        for queue in {c.queue: None for c in self._consumers.values()}:
            if not queue.deleted:
                queue.dispatch(now)

    def take_deliveries(self) -> list[Delivery]:
        """Pushes produced since the last call, in delivery-tag order."""
        pending = self._pending
        if not pending:
            return []
        self._pending = []
        if self._noack_journal_ids:
            for queue, journal_id in self._noack_journal_ids:
                if queue.recorder is not None:
                    queue.recorder.ack(journal_id, queue.name)
            self._noack_journal_ids = []
        return pending

    def take_cancellations(self) -> list[tuple[str, int, str]]:
        """Consumers the server cancelled since the last call: (ctag, code, text)."""
        cancellations = self._cancellations
        if not cancellations:
            return []
        self._cancellations = []
        return cancellations

    def _deliver(
        self,
        consumer: Consumer,
        queue: Queue,
        message: Message,
        expires: float,
        redelivered: bool,
        offset: int | None = None,
    ) -> None:
        self._last_dtag = dtag = self._last_dtag + 1
        delivery = Delivery(
            consumer.tag, dtag, redelivered, message, queue.name, queue, consumer, expires, offset
        )
        queue.stat_deliver += 1
        if redelivered:
            queue.stat_redeliver += 1
        if not consumer.no_ack:
            self._unacked[dtag] = delivery
            consumer.inflight += 1
            queue.unacked += 1
            if self._channel_prefetch and len(self._unacked) >= self._channel_prefetch:
                self._set_credit_out(True)
        if message.journal_id:
            recorder = queue.recorder
            if recorder is not None:
                if consumer.no_ack:
                    self._noack_journal_ids.append((queue, message.journal_id))
                elif not redelivered:
                    recorder.delivered(message.journal_id, queue.name)
        if self._broker.tracer is not None:  # trace hook (amq.trace)
            self._broker.tracer.delivered(queue, message, redelivered, self._broker.now)
        self._pending.append(delivery)
        if not self._flagged:
            self._flagged = True
            self._broker._ready.append(self)

    def _deliver_run(self, consumer: Consumer, queue: Queue, messages: list[Message]) -> bool:
        """:meth:`_deliver` of each of ``messages`` (at least one, none expiring,
        none redelivered) to ``consumer``, whose credit covers them all; False when
        it did nothing because one of them could change the consumer's credit or
        needs more than being handed out (a no-ack consumer, a channel-wide
        prefetch on an acking consumer, a trace hook): the caller then delivers each.
        A no-ack consumer's deliveries are handed out only (nothing unacked), as
        :meth:`_deliver` does: the receiving side of a peering link feeds the
        benchmark's no-ack consumers this way
        (``ActionApplier._deliver_plain_run``).

        Why it exists: see ``Queue.offer_run``."""
        no_ack = consumer.no_ack
        if (self._channel_prefetch and not no_ack) or self._broker.tracer is not None:
            return False
        n = len(messages)
        first = self._last_dtag + 1
        self._last_dtag = first + n - 1
        tags = range(first, first + n)
        deliveries = list(
            map(
                Delivery,
                _repeat(consumer.tag),
                tags,
                _repeat(False),
                messages,
                _repeat(queue.name),
                _repeat(queue),
                _repeat(consumer),
            )
        )
        if no_ack:
            self._pending += deliveries
            queue.stat_deliver += n
            if queue.recorder is not None:
                for message in messages:
                    if message.journal_id:
                        self._noack_journal_ids.append((queue, message.journal_id))
            if not self._flagged:
                self._flagged = True
                self._broker._ready.append(self)
            return True
        self._unacked.update(zip(tags, deliveries, strict=True))
        consumer.inflight += n
        queue.unacked += n
        queue.stat_deliver += n
        recorder = queue.recorder
        if recorder is not None:
            for message in messages:
                if message.journal_id:
                    recorder.delivered(message.journal_id, queue.name)
        self._pending += deliveries
        if not self._flagged:
            self._flagged = True
            self._broker._ready.append(self)
        return True

    def _cancelled_by_server(self, consumer: Consumer, code: int, text: str) -> None:
        consumer.writable = False
        if self._consumers.get(consumer.tag) is consumer:
            del self._consumers[consumer.tag]
            self.holder.consumers_held -= 1
        if self._closed:
            return
        self._cancellations.append((consumer.tag, code, text))
        if not self._flagged:
            self._flagged = True
            self._broker._ready.append(self)

    @property
    def last_delivery_tag(self) -> int:
        """The newest delivery tag handed out (0: none yet)."""
        return self._last_dtag

    # --- exclusive queues -----------------------------------------------------------

    def own(self, queue: Queue) -> None:
        """Hold the exclusive ``queue``: :meth:`close` deletes it."""
        self._owned.add(queue)

    def disown(self, queue: Queue) -> None:
        """``queue`` was deleted before this session closed."""
        self._owned.discard(queue)

    # --- closing --------------------------------------------------------------------

    def close(self, now: float | None = None) -> None:
        """Cancel consumers (deleting auto-delete queues left without one), delete
        exclusive queues, and requeue every unacknowledged delivery (redelivered)
        and every push the shell has not taken, no-ack ones included (their flag
        unchanged); those may go straight to other sessions. Closing twice is a
        no-op."""
        if self._closed:
            return
        now = self._now(now)
        self._closed = True
        pending = self._pending
        self._pending = []
        self._noack_journal_ids = []
        self._cancellations = []
        consumers = list(self._consumers.values())
        for consumer in consumers:
            # a queue dispatching while we detach (a group moving) must not push to
            # a consumer of this closing session: nothing would take that push
            consumer.writable = False
        for consumer in consumers:
            if self._consumers.pop(consumer.tag, None) is consumer:
                self._detach(consumer)
        for queue in list(self._owned):
            self._vhost.remove_queue(queue)
        returned = dict(self._unacked)
        self._unacked.clear()
        for delivery in pending:
            returned[delivery.dtag] = delivery
        deliveries = [returned[dtag] for dtag in sorted(returned)]
        self._release(deliveries, True, now, unsent={d.dtag for d in pending})
