"""One AMQP 0-9-1 channel: a broker session, and the methods turned into its calls.

A channel is what a native client connection is to the broker: one
:class:`~amqlite.broker.Session` (its consumers, delivery tags and unacked
messages), whose requests run through the same
:class:`~amqlite.server.dispatch.RequestDispatcher` as native ones (permissions,
exchange peering's publish hooks, confirms' dedup keys). Here each method becomes
the native request it means and the reply becomes the AMQP method RabbitMQ sends;
replies that promise durability (a confirm of a persistent message, the ok of a
durable declaration) wait at the node's one barrier like a native client's.

The connection's channels share one holder session, which owns their exclusive
queues (exclusivity is per connection in AMQP; they go when the connection
closes).
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from amqlite.amqp import AmqpError, BasicProperties
from amqlite.amqp import methods as m
from amqlite.amqp.mapping import from_native, to_native
from amqlite.amqp.spec import Method
from amqlite.broker import group_record_position
from amqlite.errors import AmqliteError, ReplyCode
from amqlite.protocol import events as ev

if TYPE_CHECKING:
    from amqlite.broker import Delivery, Session

    from ..context import NodeView
    from ..dispatch import RequestDispatcher
    from ..storage import NodeStorage

log = structlog.get_logger("amqlite.amqp")

#: RabbitMQ's header on each message delivered from a stream queue: its offset.
STREAM_OFFSET_HEADER = "x-stream-offset"
#: basic.consume's argument holding a JMS message selector (docs/selectors.md), as
#: ActiveMQ's AMQP clients name it; the consumer's selector, not kept as an argument
SELECTOR_ARGUMENT = "x-selector"


class ChannelLink(Protocol):
    """The AMQP connection under a channel."""

    remote_address: str

    def send_method(self, channel: int, method: Method) -> None: ...
    def confirms_pending(self, channel: AmqpChannel) -> None: ...
    def send_content(
        self, channel: int, method: Method, properties: BasicProperties, body: bytes
    ) -> None: ...
    def send_deliver(
        self,
        channel: int,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties: BasicProperties,
        body: bytes,
    ) -> None: ...
    def fail(self, error: AmqpError) -> None: ...
    def flow(self) -> None: ...


class AmqpChannel:
    """Serves one open channel until it is closed (by either end) or its connection goes."""

    def __init__(
        self,
        node: NodeView,
        link: ChannelLink,
        number: int,
        session: Session,
        dispatcher: RequestDispatcher,
    ) -> None:
        self.node = node
        self.link = link
        self.number = number
        self.session: Session | None = session
        self.dispatcher = dispatcher
        self.vhost = dispatcher.vhost
        self.prefetch = 0  # basic.qos prefetch-count for consumers created after it
        self.confirming = False  # confirm.select was received
        self.transactional = False  # tx.select was received
        self._seq = 0  # publish sequence number (confirm mode)
        # confirms: acks due but not written yet (written, coalesced, by
        # flush_confirms before the connection's next send); every publish up to
        # _confirmed_upto has had its ack or nack, and so have those in _confirmed_above
        self._acks_due: list[int] = []
        self._confirmed_upto = 0
        self._confirmed_above: set[int] = set()
        self._tx: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._released = False
        # HA: pushes held until the passive node has their message, in order:
        # (journal id, stream, offset, send) where send writes the frames
        self._held: deque[tuple[int, str, int, int, Callable[[], None]]] = deque()
        self._methods: dict[type[Method], Callable[[Any, float], None]] = {
            m.BasicAck: self._ack,
            m.BasicNack: self._nack,
            m.BasicReject: self._reject,
            m.BasicQos: self._qos,
            m.BasicConsume: self._consume,
            m.BasicCancel: self._cancel,
            m.BasicGet: self._get,
            m.BasicRecover: self._recover,
            m.BasicRecoverAsync: self._recover,
            m.ExchangeDeclare: self._exchange_declare,
            m.ExchangeDelete: self._exchange_delete,
            m.ExchangeBind: self._exchange_bind,
            m.ExchangeUnbind: self._exchange_bind,
            m.QueueDeclare: self._queue_declare,
            m.QueueBind: self._queue_bind,
            m.QueueUnbind: self._queue_unbind,
            m.QueuePurge: self._queue_purge,
            m.QueueDelete: self._queue_delete,
            m.ConfirmSelect: self._confirm_select,
            m.TxSelect: self._tx_select,
            m.TxCommit: self._tx_commit,
            m.TxRollback: self._tx_rollback,
            m.ChannelFlow: self._channel_flow,
        }

    # --- requests ----------------------------------------------------------------------

    def handle(self, method: Method, now: float) -> None:
        """Run one method the client sent on this channel (not channel.open/close)."""
        handler = self._methods.get(type(method))
        if handler is None:
            raise AmqpError(
                f"COMMAND_INVALID - {method.NAME} is not a request a client may send",
                ReplyCode.COMMAND_INVALID,
                channel=self.number,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        handler(method, now)

    def publish(
        self, method: m.BasicPublish, properties: BasicProperties, body: bytes, now: float
    ) -> None:
        """basic.publish with its content."""
        if method.immediate:
            self._fail(method, ReplyCode.NOT_IMPLEMENTED, "immediate=true")
        headers, props = to_native(properties, channel=self.number)
        if self.confirming:
            self._seq += 1
        request = ev.Publish(
            self._seq,
            method.exchange,
            method.routing_key,
            body,
            headers,
            props,
            method.mandatory,
            self.confirming,
        )
        if self.transactional:
            self._tx.append((self._run_publish, (request, properties)))
            return
        self._run_publish(request, properties, now)

    def _run_publish(self, request: ev.Publish, properties: BasicProperties, now: float) -> None:
        reply = self.dispatcher.publish(request, now)
        if reply is None:
            return
        rt = type(reply)
        if rt is ev.Ok:
            storage = self.node.storage
            session = self.session
            if storage is not None and session is not None:
                first, last = session.journal_span
                if last:  # gathered with this channel's other confirms of the read turn
                    storage.confirm_when_durable(first, last, self, request.id, now)
                    return
            self._ack_publish(request.id, None)
        elif isinstance(reply, ev.Returned):
            # RabbitMQ's reply text is the code's name alone (NO_ROUTE)
            text = reply_name(reply.code)
            self.link.send_content(
                self.number,
                m.BasicReturn(reply.code, text, request.exchange, request.key),
                properties,
                request.body,
            )
            if request.confirm:
                self._after_durable(request, functools.partial(self._ack_publish, request.id))
        elif isinstance(reply, ev.Nacked):
            self._nack_publish(request.id)
        elif isinstance(reply, ev.Error):
            self._fail_with(reply, m.BasicPublish)

    def confirmed(self, ids: list[int]) -> None:
        """The barrier released the confirms of publishes ``ids``, in order
        (:meth:`NodeStorage.confirm_when_durable`): acks due, written by
        :meth:`flush_confirms` as one ``basic.ack`` with ``multiple`` for each run of
        consecutive tags.

        Why it exists beside ``when_durable`` and a callback per publish: that made
        two partials, a waiter and a clock read per confirmed persistent message
        and released each one through three calls, about a tenth of the broker's CPU
        per AMQP message. The acks are the same, in the same order
        (tests/server/test_amqp_confirm_runs.py, hypothesis)."""
        if self._released or not ids:
            return  # the channel is gone: what it waited for the client cannot see
        if not self._acks_due:
            self.link.confirms_pending(self)
        self._acks_due += ids

    def refused(self, rid: int, text: str) -> None:
        """The disk dropped publish ``rid``'s message (or the HA promise failed it):
        nacked, after the acks due before it."""
        if self._released:
            return
        with contextlib.suppress(AmqliteError):
            self._nack_publish(rid)

    def _ack_publish(self, seq: int, lost: str | None) -> None:
        if lost is not None:
            self._nack_publish(seq)
            return
        if not self._acks_due:
            self.link.confirms_pending(self)
        self._acks_due.append(seq)

    def _nack_publish(self, seq: int) -> None:
        self.flush_confirms()  # the acks due before it go first
        self.link.send_method(self.number, m.BasicNack(seq, False, False))
        self._confirmed(seq)

    def _confirmed(self, seq: int) -> None:
        """``seq`` has had its ack or nack: move the watermark."""
        if seq == self._confirmed_upto + 1:
            upto = seq
            above = self._confirmed_above
            while above and upto + 1 in above:
                upto += 1
                above.remove(upto)
            self._confirmed_upto = upto
        elif seq > self._confirmed_upto:
            self._confirmed_above.add(seq)

    def flush_confirms(self) -> None:
        """Write the acks due, as RabbitMQ does: one ``basic.ack`` with ``multiple``
        for a run of publishes that are all acked now and follow every publish
        confirmed before (so it covers nothing acked or nacked earlier); a single
        ``basic.ack`` for each other one. A client publishing with a window gets
        one frame per batch instead of one per message, and pika's publisher then
        sends in batches too: ``amqlite bench --vs rabbitmq`` went from 0.48 to about
        0.7 of RabbitMQ's confirmed rate with it (benchmarks/README.md)."""
        acks = self._acks_due
        if not acks:
            return
        self._acks_due = []
        acks.sort()
        send, number = self.link.send_method, self.number
        run_start = run_end = 0  # a run of acks following _confirmed_upto, not yet written
        for seq in acks:
            if seq == self._confirmed_upto + 1:
                if not run_start:
                    run_start = seq
                run_end = seq
                self._confirmed(seq)
                if self._confirmed_upto != seq:  # it joined acks written earlier: end the run
                    send(number, m.BasicAck(run_end, run_end > run_start))
                    run_start = run_end = 0
            else:
                if run_start:
                    send(number, m.BasicAck(run_end, run_end > run_start))
                    run_start = run_end = 0
                send(number, m.BasicAck(seq, False))
                self._confirmed(seq)
        if run_start:
            send(number, m.BasicAck(run_end, run_end > run_start))

    def _after_durable(self, request: ev.Event, send: Callable[[str | None], None]) -> None:
        """Call ``send(None)`` once what ``request`` wrote to the journal is durable
        (at once when it wrote nothing), ``send(why)`` if the disk lost it."""
        storage = self.node.storage
        session = self.session
        if storage is not None and session is not None:
            first, last = session.journal_span
            if last:
                storage.when_durable(first, last, functools.partial(self._released_reply, send))
                return
        send(None)

    def _released_reply(self, send: Callable[[str | None], None], lost: str | None) -> None:
        if self._released:
            return  # the channel is gone: what it waited for the client cannot see
        with contextlib.suppress(AmqliteError):
            send(lost)

    def _request(self, request: ev.Event, method: Method, now: float) -> ev.Event | None:
        """Run a native request; an error closes the channel (or the connection)."""
        reply = self.dispatcher.handle(request, now)
        if isinstance(reply, ev.Error):
            self._fail_with(reply, type(method))
        return reply

    def _reply_durably(self, request: ev.Event, reply: Method) -> None:
        def send(lost: str | None) -> None:
            if lost is not None:
                error = AmqpError(lost, ReplyCode.INTERNAL_ERROR, channel=self.number)
                self.link.fail(error)
            else:
                self.link.send_method(self.number, reply)

        self._after_durable(request, send)

    # --- topology ----------------------------------------------------------------------

    def _exchange_declare(self, d: m.ExchangeDeclare, now: float) -> None:
        request = ev.ExchangeDeclare(
            0,
            d.exchange,
            d.exchange_type,
            durable=d.durable,
            auto_delete=d.auto_delete,
            internal=d.internal,
            passive=d.passive,
            arguments=self._arguments(d, d.arguments),
        )
        self._request(request, d, now)
        if not d.nowait:
            self._reply_durably(request, m.ExchangeDeclareOk())

    def _exchange_delete(self, d: m.ExchangeDelete, now: float) -> None:
        request = ev.ExchangeDelete(0, d.exchange, if_unused=d.if_unused)
        self._request(request, d, now)
        if not d.nowait:
            self._reply_durably(request, m.ExchangeDeleteOk())

    def _exchange_bind(self, b: m.ExchangeBind | m.ExchangeUnbind, now: float) -> None:
        self._fail(b, ReplyCode.NOT_IMPLEMENTED, "exchange-to-exchange bindings")

    def _queue_declare(self, d: m.QueueDeclare, now: float) -> None:
        request = ev.QueueDeclare(
            0,
            d.queue,
            durable=d.durable,
            exclusive=d.exclusive,
            auto_delete=d.auto_delete,
            passive=d.passive,
            arguments=self._arguments(d, d.arguments),
        )
        reply = self._request(request, d, now)
        if not d.nowait and isinstance(reply, ev.Ok):
            info = reply.info
            ok = m.QueueDeclareOk(info["queue"], info["messages"], info["consumers"])
            self._reply_durably(request, ok)

    def _queue_bind(self, b: m.QueueBind, now: float) -> None:
        args = self._arguments(b, b.arguments)
        request = ev.QueueBind(0, b.queue, b.exchange, b.routing_key, args)
        self._request(request, b, now)
        if not b.nowait:
            self._reply_durably(request, m.QueueBindOk())

    def _queue_unbind(self, b: m.QueueUnbind, now: float) -> None:
        args = self._arguments(b, b.arguments)
        request = ev.QueueUnbind(0, b.queue, b.exchange, b.routing_key, args)
        self._request(request, b, now)
        self._reply_durably(request, m.QueueUnbindOk())

    def _queue_purge(self, p: m.QueuePurge, now: float) -> None:
        request = ev.QueuePurge(0, p.queue)
        reply = self._request(request, p, now)
        if not p.nowait and isinstance(reply, ev.Ok):
            self._reply_durably(request, m.QueuePurgeOk(reply.info["messages"]))

    def _queue_delete(self, d: m.QueueDelete, now: float) -> None:
        request = ev.QueueDelete(0, d.queue, if_unused=d.if_unused, if_empty=d.if_empty)
        reply = self._request(request, d, now)
        if not d.nowait and isinstance(reply, ev.Ok):
            self._reply_durably(request, m.QueueDeleteOk(reply.info["messages"]))

    # --- consuming ---------------------------------------------------------------------

    def _qos(self, q: m.BasicQos, now: float) -> None:
        if q.prefetch_size:
            self._fail(q, ReplyCode.NOT_IMPLEMENTED, "prefetch_size (a byte limit)")
        # As RabbitMQ 3.x: global=false (pika's and kombu's default) is a limit for
        # each consumer the channel creates after it; global=true is one limit shared
        # by all the channel's consumers, present and future. Both may be in force.
        if q.global_:
            session = self.session
            if session is not None:
                session.set_channel_prefetch(q.prefetch_count, now=now)
        else:
            self.prefetch = q.prefetch_count
        self.link.send_method(self.number, m.BasicQosOk())

    def _consume(self, c: m.BasicConsume, now: float) -> None:
        arguments = self._arguments(c, c.arguments)
        selector = arguments.pop(SELECTOR_ARGUMENT, "")
        if not isinstance(selector, str):
            self._fail(
                c, ReplyCode.PRECONDITION_FAILED, f"invalid arg '{SELECTOR_ARGUMENT}': not text"
            )
        request = ev.Consume(
            0,
            c.queue,
            tag=c.consumer_tag,
            prefetch=self.prefetch,
            no_ack=c.no_ack,
            exclusive=c.exclusive,
            arguments=arguments,
            selector=selector,
        )
        reply = self._request(request, c, now)
        if not c.nowait and isinstance(reply, ev.Ok):
            self.link.send_method(self.number, m.BasicConsumeOk(reply.info["tag"]))

    def _cancel(self, c: m.BasicCancel, now: float) -> None:
        session = self.session
        if session is not None:
            with contextlib.suppress(AmqliteError):  # an unknown tag is fine (RabbitMQ)
                session.cancel(c.consumer_tag)
        self.push()  # the consumer's last deliveries go before its cancel-ok
        if not c.nowait:
            self.link.send_method(self.number, m.BasicCancelOk(c.consumer_tag))

    def _get(self, g: m.BasicGet, now: float) -> None:
        reply = self._request(ev.Get(0, g.queue, no_ack=g.no_ack), g, now)
        if isinstance(reply, ev.GetEmpty):
            self.link.send_method(self.number, m.BasicGetEmpty())
        elif isinstance(reply, ev.GetOk):
            props = from_native(reply.headers, reply.props)
            ok = m.BasicGetOk(
                reply.dtag, reply.redelivered, reply.exchange, reply.key, reply.remaining
            )
            got, storage = self.dispatcher.got_id, self.node.storage
            if storage is not None and storage.hold_get(got, self._held, self._push_replicated):
                # HA: it waits until the passive node holds its message, as a push
                # does (endpoints/client.py ``_hold_get``)
                send = functools.partial(self.link.send_content, self.number, ok, props, reply.body)
                self._held.append((got, "", 0, 0, send))
                return
            self.link.send_content(self.number, ok, props, reply.body)

    def _ack(self, a: m.BasicAck, now: float) -> None:
        if self.transactional:
            self._tx.append((self._settle, (a,)))
            return
        session = self.session
        if session is None:
            return
        try:
            if a.delivery_tag or not a.multiple:
                session.ack(a.delivery_tag, multiple=a.multiple, now=now)
            elif session.last_delivery_tag:  # 0 with multiple: everything so far
                session.ack(session.last_delivery_tag, multiple=True, now=now)
        except AmqliteError as exc:
            self._fail(a, exc.code, exc.text)

    def _nack(self, n: m.BasicNack, now: float) -> None:
        if self.transactional:
            self._tx.append((self._settle, (n,)))
        else:
            self._settle(n, now)

    def _reject(self, r: m.BasicReject, now: float) -> None:
        if self.transactional:
            self._tx.append((self._settle, (r,)))
        else:
            self._settle(r, now)

    def _settle(self, method: m.BasicAck | m.BasicNack | m.BasicReject, now: float) -> None:
        session = self.session
        if session is None:
            return
        try:
            if isinstance(method, m.BasicAck):
                self._ack(method, now)
            elif isinstance(method, m.BasicNack):
                dtag = method.delivery_tag
                if not dtag and method.multiple:  # 0 with multiple: everything so far
                    dtag = session.last_delivery_tag
                    if not dtag:
                        return
                session.nack(dtag, multiple=method.multiple, requeue=method.requeue, now=now)
            else:
                session.reject(method.delivery_tag, requeue=method.requeue, now=now)
        except AmqliteError as exc:
            self._fail(method, exc.code, exc.text)

    def _recover(self, r: m.BasicRecover | m.BasicRecoverAsync, now: float) -> None:
        if not r.requeue:
            self._fail(r, ReplyCode.NOT_IMPLEMENTED, "basic.recover with requeue=false")
        session = self.session
        if session is not None and session.last_delivery_tag:
            with contextlib.suppress(AmqliteError):  # nothing unacked: nothing to do
                session.nack(session.last_delivery_tag, multiple=True, requeue=True, now=now)
        if isinstance(r, m.BasicRecover):
            self.link.send_method(self.number, m.BasicRecoverOk())

    # --- modes -------------------------------------------------------------------------

    def _confirm_select(self, c: m.ConfirmSelect, now: float) -> None:
        if self.transactional:
            self._fail(c, ReplyCode.PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirming = True
        if not c.nowait:
            self.link.send_method(self.number, m.ConfirmSelectOk())

    def _tx_select(self, t: m.TxSelect, now: float) -> None:
        if self.confirming:
            self._fail(t, ReplyCode.PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        self.transactional = True
        self.link.send_method(self.number, m.TxSelectOk())

    def _tx_commit(self, t: m.TxCommit, now: float) -> None:
        if not self.transactional:
            self._fail(t, ReplyCode.PRECONDITION_FAILED, "channel is not transactional")
        work, self._tx = self._tx, []
        session = self.session
        first = last = 0  # the journal span of everything the transaction wrote
        self.transactional = False  # run the work now, not buffer it again
        try:
            for run, args in work:
                run(*args, now)
                if session is not None:
                    span_first, span_last = session.journal_span
                    if span_last:
                        first = first or span_first
                        # -1 is ALL_APPENDED: everything appended so far
                        last = -1 if -1 in (span_last, last) else max(span_last, last)
            if session is not None:  # the acks, when the node gathers them for later
                span_first, span_last = session.journal_marks()
                if span_last:
                    first = first or span_first
                    last = -1 if last == -1 else max(span_last, last)
        finally:
            self.transactional = True
        # commit-ok once everything the transaction wrote is durable
        storage = self.node.storage
        if storage is not None and last:
            storage.when_durable(
                first, last, functools.partial(self._released_reply, self._commit_ok)
            )
        else:
            self.link.send_method(self.number, m.TxCommitOk())

    def _commit_ok(self, lost: str | None) -> None:
        if lost is not None:
            self.link.fail(AmqpError(lost, ReplyCode.INTERNAL_ERROR, channel=self.number))
        else:
            self.link.send_method(self.number, m.TxCommitOk())

    def _tx_rollback(self, t: m.TxRollback, now: float) -> None:
        if not self.transactional:
            self._fail(t, ReplyCode.PRECONDITION_FAILED, "channel is not transactional")
        self._tx.clear()
        self.link.send_method(self.number, m.TxRollbackOk())

    def _channel_flow(self, f: m.ChannelFlow, now: float) -> None:
        if not f.active:
            self._fail(f, ReplyCode.NOT_IMPLEMENTED, "channel.flow active=false")
        self.link.send_method(self.number, m.ChannelFlowOk(True))

    # --- errors ------------------------------------------------------------------------

    def _fail(self, method: Method | type[Method], code: int, what: str) -> None:
        """Raise the AMQP error that closes this channel (or, for a hard code, the
        connection), texts as RabbitMQ writes them: ``NOT_FOUND - no queue 'q' ...``."""
        raise AmqpError(
            f"{reply_name(code)} - {what}",
            code,
            channel=self.number,
            class_id=method.CLASS_ID,
            method_id=method.METHOD_ID,
        )

    def _arguments(self, method: Method, arguments: dict[str, Any]) -> dict[str, Any]:
        """``arguments`` as the broker takes them, or 406 naming the one it cannot
        keep (a decimal, a timestamp, tables nested too deep)."""
        for name, value in arguments.items():
            if _unstorable(value):
                self._fail(
                    method,
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid arg '{name}': decimals, timestamps and tables nested "
                    f"{MAX_ARGUMENT_NESTING} deep are not supported in arguments",
                )
        return dict(arguments)

    def _fail_with(self, reply: ev.Error, kind: type[Method]) -> None:
        self._fail(kind, reply.code, reply.text)

    # --- pushes ------------------------------------------------------------------------

    def push(self) -> None:
        """Send the deliveries and cancellations the broker has for this channel."""
        session = self.session
        if session is None:
            return
        storage = self.node.storage
        gated = storage is not None and storage.replica_upto is not None
        held = self._held
        was_holding = bool(held)
        send_deliver = self._send_deliver
        for d in session.take_deliveries():
            if gated and storage is not None:
                # held pushes keep their place: the rare path pays for a partial
                journal_id, offset = d.message.journal_id, d.offset
                if offset is not None:
                    if held or not storage.stream_replicated(self.vhost, d.queue, offset):
                        held.append((0, d.queue, offset, 0, functools.partial(send_deliver, d)))
                        continue
                else:
                    position = group_record_position(d.message)
                    if (
                        held
                        or (journal_id and not storage.replicated(journal_id))
                        or (position and not storage.position_replicated(position))
                    ):
                        send = functools.partial(send_deliver, d)
                        held.append((journal_id, "", 0, position, send))
                        continue
            send_deliver(d)
        for tag, _code, _text in session.take_cancellations():
            send = functools.partial(self._send_cancel, tag)
            if held:
                held.append((0, "", 0, 0, send))
            else:
                send()
        if held and not was_holding and storage is not None:
            storage.when_replicated(self._push_replicated)
        self.link.flow()

    def _send_deliver(self, d: Delivery) -> None:
        message = d.message
        headers = message.headers
        if d.offset is not None:
            headers = {**headers, STREAM_OFFSET_HEADER: d.offset}
        self.link.send_deliver(
            self.number,
            d.ctag,
            d.dtag,
            d.redelivered,
            message.exchange,
            message.routing_key,
            from_native(headers, message.properties),
            message.body,
        )

    def _send_cancel(self, tag: str) -> None:
        # consumer_cancel_notify: the queue went away under the consumer
        self.link.send_method(self.number, m.BasicCancel(tag, True))

    def _push_replicated(self) -> None:
        held = self._held
        storage = self.node.storage
        while held:
            journal_id, stream, offset, position, send = held[0]
            if storage is not None and (
                (journal_id and not storage.replicated(journal_id))
                or (stream and not storage.stream_replicated(self.vhost, stream, offset))
                or (position and not storage.position_replicated(position))
            ):
                break
            held.popleft()
            with contextlib.suppress(AmqliteError):
                send()
        if not held and storage is not None:
            storage.discard_waiter(self._push_replicated)
        self.link.flow()

    def set_writable(self, flag: bool) -> None:
        if self.session is not None:
            self.session.set_writable(flag)

    # --- the end -----------------------------------------------------------------------

    def close(self, now: float) -> None:
        """The channel is closed (either end) or its connection is gone: requeue its
        unacked messages (redelivered), cancel its consumers. Called once."""
        if self._released:
            return
        with contextlib.suppress(AmqliteError):  # acks due, if the channel can carry them
            self.flush_confirms()
        self._released = True
        self._tx.clear()
        storage: NodeStorage | None = self.node.storage
        if self._held:
            self._held.clear()  # unacked in the session, which requeues them
            if storage is not None:
                storage.discard_waiter(self._push_replicated)
        if self.session is not None:
            self.session.close(now)
            self.session = None


#: How deep the broker stores nested arguments (amqlite.protocol's plain data).
MAX_ARGUMENT_NESTING = 8
_PLAIN = frozenset((str, int, float, bool, bytes, type(None)))


def _unstorable(value: Any, depth: int = 1) -> bool:
    """True when the broker cannot keep ``value`` as an argument: plain data only
    (scalars, lists, text-keyed tables), at most MAX_ARGUMENT_NESTING deep."""
    t = type(value)
    if t in _PLAIN:
        return False
    if depth >= MAX_ARGUMENT_NESTING:
        return True
    if t is list:
        return any(_unstorable(x, depth + 1) for x in value)
    if t is dict:
        return any(_unstorable(x, depth + 1) for x in value.values())
    return True


def reply_name(code: int) -> str:
    """``NOT_FOUND`` for 404: the name RabbitMQ puts in front of a reply text."""
    try:
        return ReplyCode(code).name
    except ValueError:
        return str(code)
