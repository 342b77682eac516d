"""Requests -> broker calls -> replies, for one authenticated client session.

This is the glue between the wire events and the sans-IO broker: it checks the
user's permissions, calls the broker session and returns the reply event (or
None when the request gets no reply). It does no I/O, so the connection shell
can run a whole batch of requests without a checkpoint.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from amqlite.auth import AuthenticatedUser, ConstrainedAction, ResourceType, Tag, require_tag
from amqlite.broker import Message, PublishOutcome, Session
from amqlite.broker import stream as stream_module
from amqlite.broker.limits import check_message_size
from amqlite.errors import AccessRefused, AmqliteError, BrokerError, ReplyCode
from amqlite.protocol import PublishRun, codec
from amqlite.protocol import events as ev

from .status_view import visible_status

DEFAULT_EXCHANGE_RESOURCE = "amq.default"

if TYPE_CHECKING:
    from .peering import PublishHook

Reply = ev.Event | None

log = structlog.get_logger("amqlite.server")

_UNROUTABLE = PublishOutcome.UNROUTABLE  # (an enum attribute look-up per publish is slow)
_ROUTED = PublishOutcome.ROUTED


class RequestDispatcher:
    """Runs one session's requests against the broker with the user's permissions."""

    def __init__(
        self,
        session: Session,
        user: AuthenticatedUser,
        vhost: str,
        status: Callable[[], dict[str, Any]],
        instance: str = "",
        peered: Mapping[str, PublishHook] | None = None,
    ) -> None:
        self.session = session
        session.instance = instance  # names its consumers as message-group owners
        # publish keys (amqlite.broker.dedup) for confirmed publishes: "instance:id"
        self._key_prefix = f"{instance}:" if instance else ""
        self.user = user.name
        self.vhost = vhost
        self.permissions = user.permissions
        self._login = user
        self._status = status
        self._peered: Mapping[str, PublishHook] = peered if peered is not None else {}
        #: peered exchanges published to since :meth:`held_back` last found none full
        self.peered_sent: set[str] = set()
        self._write_ok: dict[str, bool] = {}  # publish permission, per exchange
        # a queue's send constraint applies to publishes through the default exchange
        self._queues_send = user.constraints.queues_send
        self._max_message_size = session.limits.max_message_size  # 0: no limit
        #: the largest reply frame a ``stream.fetch`` may get (the shell sets it to
        #: the connection's frame limit)
        self.max_reply_bytes = 4 * 1024 * 1024
        #: HA: (vhost, queue) -> the first offset of the stream the passive node
        #: does not hold yet (None: it holds them all); a fetch reads below it
        self.stream_visible: Callable[[str, str], int | None] | None = None
        #: the journal id of the message the last ``get`` returned (0: transient, or
        #: none): on an HA active node its reply waits until the passive node holds
        #: it, as a push does (each endpoint holds it)
        self.got_id = 0
        self._handlers: dict[type[ev.Event], Callable[[Any, float], Reply]] = {
            ev.Publish: self._publish,
            ev.Ack: self._ack,
            ev.Nack: self._nack,
            ev.Reject: self._reject,
            ev.ExchangeDeclare: self._exchange_declare,
            ev.ExchangeDelete: self._exchange_delete,
            ev.QueueDeclare: self._queue_declare,
            ev.QueueDelete: self._queue_delete,
            ev.QueuePurge: self._queue_purge,
            ev.QueueBind: self._queue_bind,
            ev.QueueUnbind: self._queue_unbind,
            ev.Consume: self._consume,
            ev.Cancel: self._cancel,
            ev.Get: self._get,
            ev.Status: self._status_request,
            ev.OffsetStore: self._offset_store,
            ev.OffsetQuery: self._offset_query,
            ev.StreamFetch: self._stream_fetch,
            ev.PublishBatch: self._publish_batch,
            ev.PublishColumns: self._publish_batch,
            ev.Trace: self._trace,
        }

    def handle(self, event: ev.Event, now: float) -> Reply:
        """The reply to ``event``; broker refusals become ``error`` replies."""
        handler = self._handlers.get(type(event))
        if handler is None:
            rid = getattr(event, "id", None)
            return ev.Error(rid, ReplyCode.COMMAND_INVALID, f"{event.METHOD!r} is not a request")
        try:
            return handler(event, now)
        except AmqliteError as exc:
            return ev.Error(getattr(event, "id", None), exc.code, exc.text)

    def publish(self, p: ev.Publish, now: float) -> Reply:
        """:meth:`handle` of a ``publish``: the same reply, without the look-up of
        its handler. Why it exists: a publish is the per-message request, and the
        client endpoint's call through :meth:`handle` was about 2% of a broker's
        time per transient message; tests/server/test_dispatch_publish.py checks
        both give the same replies and effects."""
        try:
            return self._publish(p, now)
        except AmqliteError as exc:
            return ev.Error(p.id, exc.code, exc.text)

    def publish_run(self, run: PublishRun, now: float) -> bool:
        """:meth:`publish` of each of ``run``'s publishes (plain: no replies but
        refusals), in one go through :meth:`Session.publish_run`; False when it did
        nothing because one of them could be refused or needs more than routing (the
        write permission not yet known or refused, a queue-send constraint, a body
        over the size limit, a peered exchange unless its publishes get stamps or
        are only forwarded (:meth:`_publish_stamped_run`), a missing, internal or
        headers exchange, a closed session, a trace hook): the caller then takes
        each through :meth:`publish`.

        Why it exists: a publisher's messages arrive as runs (see
        ``Connection.events_with_publish_runs``), and the checks and calls
        :meth:`publish` makes per message were about a third of a broker's time per
        transient message; here they are made once a run.
        tests/server/test_dispatch_publish.py checks the replies and queues agree
        with :meth:`publish` of each."""
        exchange = run.exchange
        if not self._write_ok.get(exchange):
            return False
        if not exchange and self._queues_send:
            return False
        hook = self._peered.get(exchange) if self._peered else None
        limit = self._max_message_size
        if limit and max(map(len, run.bodies)) > limit:
            return False
        if hook is not None:
            return self._publish_stamped_run(hook, run, now)
        return self.session.publish_run(exchange, run.key, run.bodies, now=now)

    def _publish_stamped_run(self, hook: PublishHook, run: PublishRun, now: float) -> bool:
        """:meth:`publish_run` on a peered exchange: where :meth:`_publish` would
        give each of the run's plain publishes a stamp (``hook.stamps()``: no link
        end takes offers, a subscriber's remote) and route it (a queue is bound:
        not a forward-only site), the stamps are minted as one range
        (``PeeredExchange.stamp_run``) once the session takes the run; where it
        would only forward each (no queue bound here: ``Session.routes_nowhere``,
        a sending site), the run's keys and bodies join the hook's waiting run as
        they were read (``PublishHook.forwarded_run``).

        Why it exists: on a subscriber's remote every client publish went through
        :meth:`_publish` alone (a Message, a routing and a stamp each), about
        two thirds of that broker's time per message in mode subscribe
        (benchmarks/peering_core_micro.py subscribe); on a sending site each
        went alone through :meth:`_publish` (an event made for it, the checks,
        the hook's call), about a quarter of that broker's time per peered
        message (py-spy of ``benchmarks/peering_cpu.py``'s site A).
        tests/server/test_peering_applier.py checks a run and each of its
        publishes give the same stamps or mesh ids, queues, frames, held
        messages, push-back and replies."""
        exchange = run.exchange
        if self.session.routes_nowhere(exchange):
            self.peered_sent.add(exchange)
            hook.forwarded_run(run.key, run.bodies)
            return True
        if not hook.stamps():
            return False
        self.peered_sent.add(exchange)
        return self.session.publish_run(
            exchange, run.key, run.bodies, now=now, meshes=hook.px.stamp_run
        )

    # --- permissions ---------------------------------------------------------------

    def _check(self, kind: str, what: str, name: str) -> None:
        resource = name or DEFAULT_EXCHANGE_RESOURCE if what == "exchange" else name
        if not self.permissions.allows(kind, resource):  # type: ignore[arg-type]
            raise AccessRefused(
                f"{kind} access to {what} {name!r} in vhost {self.vhost!r} refused "
                f"for user {self.user!r}"
            )

    def _constrain(self, action: ConstrainedAction, what: ResourceType, name: str) -> None:
        """Raise 403 (and log it) when a role constraint stops this user."""
        refusal = self._login.refusal(action, what, name)
        if refusal is not None:
            log.warning(
                "constraint_refused",
                user=self.user,
                vhost=self.vhost,
                action=action,
                resource=f"{what} {name!r}",
                reason=refusal,
            )
            raise AccessRefused(refusal)

    def held_back(self) -> bool:
        """Whether a ``block`` link of a peered exchange this session published to is
        full (it refuses messages until it has room again): the connection reads
        nothing more meanwhile, so TCP pushes back on the publisher instead of the
        broker holding what it sends in memory (RabbitMQ's flow control)."""
        sent = self.peered_sent
        if not sent:
            return False
        peered = self._peered
        for name in sent:
            hook = peered.get(name)
            if hook is not None and hook.refusing():
                return True
        sent.clear()
        return False

    def runs_waiting(self) -> bool:
        """Whether client publishes of this session wait in a peered exchange's
        run to be offered to its links (``PublishHook.forwarded_run``): the
        connection's reader then goes on with its read before it yields, as
        while its deliveries are spread thin over consumers, so the service's
        flusher sends the read's publishes as fewer, larger ``peer.forwards``."""
        peered = self._peered
        for name in self.peered_sent:
            hook = peered.get(name)
            if hook is not None and (hook.plain_bodies or hook.run):
                return True
        return False

    # --- the hot path ------------------------------------------------------------------

    def _publish(self, p: ev.Publish, now: float, span: bool = True) -> Reply:
        allowed = self._write_ok.get(p.exchange)
        if allowed is None:
            resource = p.exchange or DEFAULT_EXCHANGE_RESOURCE
            allowed = self._write_ok[p.exchange] = self.permissions.allows("write", resource) and (
                self._login.refusal("send", "exchange", p.exchange) is None
            )
        if not allowed:
            self._check("write", "exchange", p.exchange)
            self._constrain("send", "exchange", p.exchange)
        if not p.exchange and self._queues_send:
            self._constrain("send", "queue", p.key)
        if self._max_message_size and len(p.body) > self._max_message_size:
            check_message_size(len(p.body), self._max_message_size)
        hook = self._peered.get(p.exchange) if self._peered else None
        if hook is not None:
            self.peered_sent.add(p.exchange)
        if (
            hook is not None
            and not (p.mandatory or p.confirm)
            and self.session.routes_nowhere(p.exchange)
            and not p.props.get("persistent")
        ):
            # Only forwarded (a sending site: no queue bound here): no reply, no
            # Message, no routing, just the envelope joining the read's run. Why it
            # exists beside the general path below: on the sending broker the Message
            # and Session.publish finding no queue were a tenth of its time per
            # peered message (tests/server/test_dispatch_publish.py checks the
            # two give the same replies, forwards and queues).
            if p.headers or p.props:
                hook.published_later(hook.mint(p.key, p.body, p.headers, p.props), _UNROUTABLE)
            else:  # the usual case: minted as the links take it, one envelope each
                hook.forwarded_later(p)
            return None
        message = Message(p.exchange, p.key, p.body, p.headers, p.props)
        if p.confirm and self._key_prefix:
            message.publish_key = f"{self._key_prefix}{p.id}"
        if hook is not None:
            if not (p.confirm or p.mandatory or p.headers or p.props) and hook.stamps():
                # No link end takes offers (a subscriber's remote): the identity
                # is all that is kept, for a peering queue to send the message on
                # (PeeredExchange.stamp says why a stamp, not an envelope); the
                # reply is None whatever the outcome, and published_later would
                # do nothing (it leaves a publish no end takes)
                message.mesh = hook.px.stamp()
                self.session.publish(message, now=now, span=span)
                return None
            envelope = hook.mint(p.key, p.body, p.headers, p.props)  # (its mesh id)
            message.mesh = envelope  # kept if a subscriber's peering queue takes it
            if p.confirm and not hook.has_room(envelope):
                return ev.Nacked(
                    p.id,
                    ReplyCode.RESOURCE_ERROR,
                    f"a peering link of exchange {p.exchange!r} is full (overflow = block)",
                )
        outcome = self.session.publish(message, mandatory=p.mandatory, now=now, span=span)
        if hook is not None and outcome is not PublishOutcome.DUPLICATE:
            # (a publish sent again went on before)
            if not p.mandatory and not p.props.get("persistent"):
                # the reply does not depend on the links, and no durable log's record
                # must be in its journal span: offered with the rest of the read
                hook.published_later(envelope, outcome)
            elif (
                hook.published(envelope, outcome, now, message.publish_key)
                and outcome is PublishOutcome.UNROUTABLE
            ):
                outcome = PublishOutcome.ROUTED  # no queue here, but a link took it
        if outcome is _ROUTED or outcome is PublishOutcome.DUPLICATE:
            # a publish sent again: its ok vouches for the first copy, whose journal
            # position the session's span names
            return ev.Ok(p.id) if p.confirm else None
        if outcome is PublishOutcome.UNROUTABLE:
            if p.mandatory:
                return ev.Returned(
                    p.id,
                    ReplyCode.NO_ROUTE,
                    f"no queue bound to exchange {p.exchange!r} matches key {p.key!r}",
                )
            return ev.Ok(p.id) if p.confirm else None
        if p.confirm:
            return ev.Nacked(
                p.id,
                ReplyCode.PRECONDITION_FAILED,
                "a queue refused the message (x-overflow = reject-publish and it is full)",
            )
        return None

    def _publish_batch(self, b: ev.PublishBatch | ev.PublishColumns, now: float) -> Reply:
        """Each message as the confirmed publish ``id + i``; one ``ok`` {count,
        refused} for them all, whose journal span covers every one routed:
        ``refused`` lists ``[i, code, text, kind]`` for each message ``returned``,
        ``nacked`` or failed (``error``); the others are confirmed. A
        ``publish.columns`` is the same with its messages as columns. An exchange
        with peering links takes each message through :meth:`_publish`; any other,
        a loop making the messages and :meth:`Session.publish_batch` routing them
        (each routing key once, the messages for a stream appended together)."""
        self.session.new_span()
        exchange, mandatory, rid = b.exchange, b.mandatory, b.id
        if self._peered and exchange in self._peered:
            return self._publish_batch_each(b, now)
        self._check_write(exchange)
        refused: list[list[Any]] = []
        persistent = {"persistent": True} if b.persistent else None
        plain_props: dict[str, Any] = persistent or {}
        limit = self._max_message_size
        prefix = self._key_prefix
        messages: list[Message] = []
        indexes: list[int] | None = None  # of messages, when some were refused early
        size = b.count if isinstance(b, ev.PublishColumns) else len(b.msgs)
        if (
            isinstance(b, ev.PublishColumns)
            and not b.extras
            and not (limit and len(b.bodies) > limit)  # then no body is over the limit
        ):
            # the columns as messages, without a list per message in between
            keys, bodies = codec.batch_columns(b)
            messages = [
                Message(exchange, key, body, {}, plain_props)
                for key, body in zip(keys, bodies, strict=True)
            ]
            if prefix:
                for i, message in enumerate(messages, rid):
                    message.publish_key = f"{prefix}{i}"
        for i, m in enumerate(() if messages else codec.batch_rows(b)):
            key, body = m[0], m[1]
            if len(m) == 2:
                headers: dict[str, Any] = {}
                props = plain_props
            else:
                headers = m[2] or {}
                props = m[3] or {}
                if persistent:
                    props = {**props, **persistent}
            if limit and len(body) > limit:
                try:
                    check_message_size(len(body), limit)
                except AmqliteError as exc:
                    refused.append([i, int(exc.code), exc.text, "error"])
                    if indexes is None:
                        indexes = list(range(i))
                    continue
            message = Message(exchange, key, body, headers, props)
            if prefix:
                message.publish_key = f"{prefix}{rid + i}"
            messages.append(message)
            if indexes is not None:
                indexes.append(i)
        outcomes = self.session.publish_batch(exchange, messages, now=now)
        routed, duplicate = PublishOutcome.ROUTED, PublishOutcome.DUPLICATE
        for j, outcome in enumerate(outcomes):
            if outcome is routed or outcome is duplicate:
                continue
            i = j if indexes is None else indexes[j]
            if outcome is PublishOutcome.UNROUTABLE:
                if mandatory:
                    key = messages[j].routing_key
                    text = f"no queue bound to exchange {exchange!r} matches key {key!r}"
                    refused.append([i, int(ReplyCode.NO_ROUTE), text, "returned"])
                continue
            text = "a queue refused the message (x-overflow = reject-publish and it is full)"
            refused.append([i, int(ReplyCode.PRECONDITION_FAILED), text, "nacked"])
        refused.sort(key=operator.itemgetter(0))
        return self._batch_ok(rid, size, refused)

    def _check_write(self, exchange: str) -> None:
        allowed = self._write_ok.get(exchange)
        if allowed is None:
            resource = exchange or DEFAULT_EXCHANGE_RESOURCE
            allowed = self._write_ok[exchange] = self.permissions.allows("write", resource)
        if not allowed:
            self._check("write", "exchange", exchange)

    @staticmethod
    def _batch_ok(rid: int, count: int, refused: list[list[Any]]) -> ev.Ok:
        info: dict[str, Any] = {"count": count}
        if refused:
            info["refused"] = refused
        return ev.Ok(rid, info)

    def _publish_batch_each(self, b: ev.PublishBatch | ev.PublishColumns, now: float) -> Reply:
        """:meth:`_publish_batch` through :meth:`_publish`, message by message (an
        exchange with peering links)."""
        refused: list[list[Any]] = []
        exchange, mandatory, rid = b.exchange, b.mandatory, b.id
        persistent = {"persistent": True} if b.persistent else None
        rows = codec.batch_rows(b)
        size = len(rows)
        for i, m in enumerate(rows):
            if len(m) == 2:
                headers: dict[str, Any] = {}
                props: dict[str, Any] = persistent or {}
            else:
                headers = m[2] or {}
                props = m[3] or {}
                if persistent:
                    props = {**props, **persistent}
            p = ev.Publish(rid + i, exchange, m[0], m[1], headers, props, mandatory, True)
            try:
                reply = self._publish(p, now, span=False)
            except AmqliteError as exc:
                if i == 0 and exc.code == ReplyCode.ACCESS_REFUSED:
                    raise  # the whole batch is refused
                refused.append([i, int(exc.code), exc.text, "error"])
                continue
            if type(reply) is not ev.Ok:
                assert isinstance(reply, ev.Returned | ev.Nacked)
                refused.append([i, int(reply.code), reply.text, reply.METHOD])
        return self._batch_ok(rid, size, refused)

    def _ack(self, a: ev.Ack, now: float) -> Reply:
        self.session.ack(a.dtag, multiple=a.multiple)
        return None

    def _nack(self, n: ev.Nack, now: float) -> Reply:
        self.session.nack(n.dtag, multiple=n.multiple, requeue=n.requeue, now=now)
        return None

    def _reject(self, r: ev.Reject, now: float) -> Reply:
        self.session.reject(r.dtag, requeue=r.requeue, now=now)
        return None

    # --- topology --------------------------------------------------------------------

    def _exchange_declare(self, d: ev.ExchangeDeclare, now: float) -> Reply:
        if not d.passive:
            self._check("configure", "exchange", d.exchange)
        self.session.declare_exchange(
            d.exchange,
            d.type,
            durable=d.durable,
            auto_delete=d.auto_delete,
            internal=d.internal,
            passive=d.passive,
            arguments=d.arguments,
        )
        if not d.passive:
            self._log("exchange_declared", exchange=d.exchange, type=d.type, durable=d.durable)
        return ev.Ok(d.id)

    def _log(self, event: str, **fields: Any) -> None:
        log.info(event, user=self.user, vhost=self.vhost, **fields)

    def _exchange_delete(self, d: ev.ExchangeDelete, now: float) -> Reply:
        self._check("configure", "exchange", d.exchange)
        self.session.delete_exchange(d.exchange, if_unused=d.if_unused)
        self._write_ok.clear()
        self._log("exchange_deleted", exchange=d.exchange)
        return ev.Ok(d.id)

    def _queue_declare(self, d: ev.QueueDeclare, now: float) -> Reply:
        if d.queue and not d.passive:
            self._check("configure", "queue", d.queue)
        info = self.session.declare_queue(
            d.queue,
            durable=d.durable,
            exclusive=d.exclusive,
            auto_delete=d.auto_delete,
            passive=d.passive,
            arguments=d.arguments,
        )
        if not d.passive:
            self._log("queue_declared", queue=info.name, durable=d.durable, exclusive=d.exclusive)
        return ev.Ok(
            d.id, {"queue": info.name, "messages": info.messages, "consumers": info.consumers}
        )

    def _queue_delete(self, d: ev.QueueDelete, now: float) -> Reply:
        self._check("configure", "queue", d.queue)
        n = self.session.delete_queue(d.queue, if_unused=d.if_unused, if_empty=d.if_empty)
        self._log("queue_deleted", queue=d.queue, messages=n)
        return ev.Ok(d.id, {"messages": n})

    def _queue_purge(self, d: ev.QueuePurge, now: float) -> Reply:
        self._check("read", "queue", d.queue)
        return ev.Ok(d.id, {"messages": self.session.purge_queue(d.queue)})

    def _queue_bind(self, b: ev.QueueBind, now: float) -> Reply:
        self._check("write", "queue", b.queue)
        self._check("read", "exchange", b.exchange)
        self._constrain("subscribe", "exchange", b.exchange)
        self.session.bind(b.queue, b.exchange, b.key, b.arguments)
        self._log("queue_bound", queue=b.queue, exchange=b.exchange, key=b.key)
        return ev.Ok(b.id)

    def _queue_unbind(self, b: ev.QueueUnbind, now: float) -> Reply:
        self._check("write", "queue", b.queue)
        self._check("read", "exchange", b.exchange)
        self.session.unbind(b.queue, b.exchange, b.key, b.arguments)
        self._log("queue_unbound", queue=b.queue, exchange=b.exchange, key=b.key)
        return ev.Ok(b.id)

    # --- consuming -------------------------------------------------------------------

    def _consume(self, c: ev.Consume, now: float) -> Reply:
        self._check("read", "queue", c.queue)
        self._constrain("subscribe", "queue", c.queue)
        tag = self.session.consume(
            c.queue,
            tag=c.tag,
            prefetch=c.prefetch,
            no_ack=c.no_ack,
            exclusive=c.exclusive,
            arguments=c.arguments,
            selector=c.selector or None,
            now=now,
        )
        return ev.Ok(c.id, {"tag": tag})

    def _cancel(self, c: ev.Cancel, now: float) -> Reply:
        self.session.cancel(c.tag)
        return ev.Ok(c.id)

    def _get(self, g: ev.Get, now: float) -> Reply:
        self._check("read", "queue", g.queue)
        self._constrain("subscribe", "queue", g.queue)
        got = self.session.get(g.queue, no_ack=g.no_ack, now=now)
        if got is None:
            return ev.GetEmpty(g.id)
        delivery, remaining = got
        m = delivery.message
        self.got_id = m.journal_id
        return ev.GetOk(
            g.id,
            delivery.dtag,
            m.exchange,
            m.routing_key,
            m.body,
            m.headers,
            m.properties,
            delivery.redelivered,
            remaining,
            delivery.queue,
        )

    def _offset_store(self, o: ev.OffsetStore, now: float) -> Reply:
        self._check("read", "queue", o.queue)
        self.session.store_offset(o.queue, o.name, o.offset)
        return ev.Ok(o.id)

    def _offset_query(self, o: ev.OffsetQuery, now: float) -> Reply:
        self._check("read", "queue", o.queue)
        return ev.Ok(o.id, {"offset": self.session.query_offset(o.queue, o.name)})

    def _stream_fetch(self, f: ev.StreamFetch, now: float) -> Reply:
        self._check("read", "queue", f.queue)
        limit = self.max_reply_bytes - codec.RECORDS_OVERHEAD
        budget = max(1, min(f.max_bytes, limit))
        visible = self.stream_visible(self.vhost, f.queue) if self.stream_visible else None
        q, block = self.session.fetch_block(f.queue, f.start, f.end, visible=visible)
        if block is not None:
            # A whole block: its reply is encoded once and kept (the stream drops it
            # with retention), so readers and replays after the first get a copy
            # instead of encoding each record again. tests/server checks the
            # replies are those of the path below, record for record.
            kept = q.blocks.get(block)
            average = q.bytes // max(1, len(q))  # (not made for a fetch whose budget
            if kept is None and average * stream_module.FETCH_BLOCK <= budget:  # it exceeds)
                reply = codec.stream_records(
                    0, f.start, q.block_messages(block), dropped=0, kept_first=0, kept_next=0
                )
                size = codec.records_size(reply)
                kept = (reply, size) if size <= limit else (None, 0)
                q.keep_block(block, *kept)
            cached, size = kept or (None, 0)
            if cached is not None and size <= budget + codec.RECORDS_OVERHEAD:
                answer: ev.StreamRecords = dataclasses.replace(
                    cached, re=f.id, kept_first=q.first, kept_next=q.next
                )
                return answer
        end = f.end
        if q.first <= f.start < q.next and f.start % stream_module.FETCH_BLOCK:
            # stop at the next block's start: the fetches after this one read whole blocks
            end = q.block_end(f.start) if end is None else min(end, q.block_end(f.start))
        q, first, messages, dropped = self.session.fetch_stream(
            f.queue, f.start, end, budget, visible=visible, now=now
        )
        while True:
            reply = codec.stream_records(
                f.id, first, messages, dropped=dropped, kept_first=q.first, kept_next=q.next
            )
            # within the frame, and within what the client asked (it may take no
            # larger frames): read() estimated headers and properties
            if codec.records_size(reply) <= min(limit, budget + codec.RECORDS_OVERHEAD):
                return reply
            if len(messages) <= 1:
                if codec.records_size(reply) <= limit:
                    return reply  # one record (or none): sent whatever the budget
                raise BrokerError(
                    f"the record at offset {first} of stream {f.queue!r} does not fit in "
                    f"a frame of {self.max_reply_bytes} bytes",
                    ReplyCode.CONTENT_TOO_LARGE,
                )
            messages = messages[: len(messages) // 2]

    def _trace(self, t: ev.Trace, now: float) -> Reply:
        # the trace covers every vhost of the node: a node-wide switch
        self._require("administrator", f"switching the trace {'on' if t.enabled else 'off'}")
        enabled = self.session.set_trace(bool(t.enabled))
        log.info("trace_switched", enabled=enabled, user=self.user)
        return ev.Ok(t.id, {"enabled": enabled})

    def _status_request(self, s: ev.Status, now: float) -> Reply:
        if self._login.has_tag("monitoring"):
            return ev.Ok(s.id, self._status())
        return ev.Ok(s.id, visible_status(self._status(), self._login))

    def _require(self, tag: Tag, action: str) -> None:
        try:
            require_tag(self._login, tag, action)
        except AccessRefused as exc:
            log.warning("privilege_refused", user=self.user, vhost=self.vhost, reason=exc.text)
            raise
