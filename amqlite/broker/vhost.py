"""A virtual host: the exchanges and queues of one namespace, and the rules for
declaring, binding, deleting, publishing and dead-lettering inside it.

Predeclared in every virtual host: the default exchange ``""`` (routes by queue
name; cannot be declared, bound to or deleted) and ``amq.direct``, ``amq.fanout``,
``amq.topic``, ``amq.headers`` (durable; cannot be deleted). Names starting with
``amq.`` are reserved: clients cannot create such exchanges or queues.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from amqlite.errors import (
    AccessRefused,
    BrokerError,
    NotFound,
    PreconditionFailed,
    ReplyCode,
    ResourceLocked,
)

from .arguments import QueueSettings, parse_queue_arguments
from .backlog import Paging
from .dead_letter import dead_letter_copy, is_cycle
from .dedup import PublishKeys
from .exchange import EXCHANGE_TYPES, BindingWatcher, DefaultExchange, Exchange, binding_id
from .limits import queue_limit_error
from .message import Message, PublishOutcome, QueueInfo
from .queue import Queue
from .recording import is_persistent
from .stream import StreamQueue

if TYPE_CHECKING:
    from .recording import Recorder
    from .session import Session

PREDECLARED = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
}

_ABSENT = object()


def _first_difference(
    received: Mapping[str, Any], current: Mapping[str, Any]
) -> tuple[str, Any, Any] | None:
    for name in sorted(set(received) | set(current)):
        a, b = received.get(name, _ABSENT), current.get(name, _ABSENT)
        if a != b:
            return name, (None if a is _ABSENT else a), (None if b is _ABSENT else b)
    return None


class VirtualHost:
    __slots__ = (
        "_dead_lettering",
        "_dead_letters",
        "_new_queue_name",
        "_watchers",
        "exchanges",
        "group_resume_timeout",
        "max_queues",
        "name",
        "on_consumers",
        "paging",
        "publish_keys",
        "queues",
        "recorder",
        "reserving",
        "wall_offset",
    )

    def __init__(
        self, name: str, new_queue_name: Callable[[], str], recorder: Recorder | None = None
    ) -> None:
        self.name = name
        self.recorder = recorder
        self.wall_offset = 0.0  # wall clock = now + wall_offset (the shell sets it)
        #: clients may not declare a queue past this many (0: no limit)
        self.max_queues = 0
        #: how long a message group stays reserved for its owner of a previous life
        #: of the broker once a consumer wants it (seconds; docs/selectors.md)
        self.group_resume_timeout = 10.0
        #: queues with a group reservation whose wait is running (see Queue.lapse_reservations)
        self.reserving: set[Queue] = set()
        self._new_queue_name = new_queue_name
        self.queues: dict[str, Queue] = {}
        self.exchanges: dict[str, Exchange] = {"": DefaultExchange(self.queues)}
        for exchange, kind in PREDECLARED.items():
            self.exchanges[exchange] = EXCHANGE_TYPES[kind](exchange, durable=True)
        self._dead_letters: deque[tuple[Message, float]] = deque()
        self._dead_lettering = False
        self.publish_keys = PublishKeys()
        #: the broker's paging switch (shared by every vhost; see .backlog.Paging)
        self.paging = Paging()
        self._watchers: dict[str, BindingWatcher] = {}
        #: told of every queue that gained or lost a consumer (exchange peering
        #: mirrors its consumers' selectors); must not raise
        self.on_consumers: Callable[[Queue], None] | None = None

    # --- lookups ------------------------------------------------------------------

    def _inequivalent(
        self, what: str, name: str, arg: str, received: Any, current: Any
    ) -> PreconditionFailed:
        return PreconditionFailed(
            f"inequivalent arg {arg!r} for {what} {name!r} in vhost {self.name!r}: "
            f"received {received!r} but current is {current!r}"
        )

    def exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange {name!r} in vhost {self.name!r}")
        return exchange

    def queue(self, session: Session, name: str) -> Queue:
        """The queue ``name`` as ``session`` may use it: 404 missing, 405 locked."""
        queue = self.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue {name!r} in vhost {self.name!r}")
        self._check_owner(session, queue)
        return queue

    def _check_owner(self, session: Session, queue: Queue) -> None:
        if queue.owner is not None and queue.owner is not session.holder:
            raise ResourceLocked(
                f"cannot obtain exclusive access to locked queue {queue.name!r} "
                f"in vhost {self.name!r}"
            )

    # --- exchanges ----------------------------------------------------------------

    def consumers_changed(self, queue: Queue) -> None:
        """``queue`` gained or lost a consumer: tell ``on_consumers``."""
        if self.on_consumers is not None:
            self.on_consumers(queue)

    def watch(self, name: str, watcher: BindingWatcher | None) -> None:
        """Tell ``watcher`` of every binding on the exchange ``name``, now and after
        it is deleted and declared again (None stops watching). The exchange's
        current bindings are not replayed: the caller reads them itself."""
        if watcher is None:
            self._watchers.pop(name, None)
        else:
            self._watchers[name] = watcher
        exchange = self.exchanges.get(name)
        if exchange is not None:
            exchange.watcher = watcher

    def add_exchange(self, exchange: Exchange) -> None:
        """Put a new exchange in place (declared, or rebuilt from a record); a
        watcher of that name watches it from now on."""
        exchange.watcher = self._watchers.get(exchange.name)
        self.exchanges[exchange.name] = exchange

    def declare_exchange(
        self,
        name: str,
        kind: str,
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        passive: bool,
        arguments: Mapping[str, Any] | None,
    ) -> None:
        if passive:
            self.exchange(name)
            return
        if name == "":
            raise AccessRefused("the default exchange cannot be declared")
        cls = EXCHANGE_TYPES.get(kind)
        if cls is None:
            raise BrokerError(f"unknown exchange type {kind!r}", ReplyCode.COMMAND_INVALID)
        args = dict(arguments or {})
        existing = self.exchanges.get(name)
        if existing is not None:
            for arg, received, current in (
                ("type", kind, existing.kind),
                ("durable", durable, existing.durable),
                ("auto_delete", auto_delete, existing.auto_delete),
                ("internal", internal, existing.internal),
            ):
                if received != current:
                    raise self._inequivalent("exchange", name, arg, received, current)
            diff = _first_difference(args, existing.arguments)
            if diff is not None:
                raise self._inequivalent("exchange", name, *diff)
            return
        if name.startswith("amq."):
            raise AccessRefused(f"exchange name {name!r} contains reserved prefix 'amq.'")
        exchange = cls(
            name, durable=durable, auto_delete=auto_delete, internal=internal, arguments=args
        )
        self.add_exchange(exchange)
        if durable and self.recorder is not None:
            self.recorder.exchange_declared(self.name, exchange)

    def delete_exchange(self, name: str, *, if_unused: bool) -> None:
        """Delete an exchange and its bindings; a missing one is no error."""
        if name == "" or name in PREDECLARED:
            raise AccessRefused(f"cannot delete predeclared exchange {name!r}")
        exchange = self.exchanges.get(name)
        if exchange is None:
            return
        if if_unused and exchange.bindings:
            raise PreconditionFailed(f"exchange {name!r} in vhost {self.name!r} in use")
        self.remove_exchange(exchange)

    def remove_exchange(self, exchange: Exchange) -> None:
        """Delete unconditionally, with every binding from it (recorded when the
        exchange is durable)."""
        for ident, binding in list(exchange.bindings.items()):
            exchange.unbind(ident)
            binding.queue.bindings.discard((exchange, ident))
        del self.exchanges[exchange.name]
        if exchange.durable and self.recorder is not None:
            self.recorder.exchange_deleted(self.name, exchange.name)

    # --- queues -------------------------------------------------------------------

    def declare_queue(
        self,
        session: Session,
        name: str,
        *,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        passive: bool,
        arguments: Mapping[str, Any] | None,
        reserved: bool = False,
    ) -> QueueInfo:
        """Declare a queue; ``reserved`` lets the broker itself (exchange peering)
        use the ``amq.`` prefix, which clients may not."""
        if passive:
            return self._info(self.queue(session, name))
        args = dict(arguments or {})
        settings = parse_queue_arguments(args)
        if name:
            queue = self.queues.get(name)
            if queue is not None:
                self._check_owner(session, queue)
                for arg, received, current in (
                    ("durable", durable, queue.durable),
                    ("exclusive", exclusive, queue.owner is not None),
                    ("auto_delete", auto_delete, queue.auto_delete),
                ):
                    if received != current:
                        raise self._inequivalent("queue", name, arg, received, current)
                diff = settings.difference(queue.settings)
                if diff is not None:
                    raise self._inequivalent(
                        "queue", name, diff, args.get(diff), queue.arguments.get(diff)
                    )
                queue.used_at = None  # a redeclaration is a use (x-expires)
                return self._info(queue)
            if name.startswith("amq.") and not reserved:
                raise AccessRefused(f"queue name {name!r} contains reserved prefix 'amq.'")
        else:
            name = self._new_queue_name()
            while name in self.queues:
                name = self._new_queue_name()
        if self.max_queues and not reserved and len(self.queues) >= self.max_queues:
            raise queue_limit_error(name, self.name, self.max_queues)
        if settings.queue_type == "stream" and (exclusive or auto_delete or not durable):
            raise PreconditionFailed(
                f"stream queue {name!r} must be durable, non-exclusive and not auto-delete"
            )
        queue = self.new_queue(
            name,
            durable=durable,
            owner=session.holder if exclusive else None,
            auto_delete=auto_delete,
            arguments=args,
            settings=settings,
        )
        if exclusive:
            session.holder.own(queue)
        elif queue.journal is not None:
            queue.journal.queue_declared(self.name, queue)
        return self._info(queue)

    def new_queue(
        self,
        name: str,
        *,
        durable: bool,
        owner: Session | None,
        auto_delete: bool,
        arguments: dict[str, Any],
        settings: QueueSettings,
    ) -> Queue:
        """Create and register a queue of the type its settings name, wired to the
        journal when it is durable and not exclusive (recording nothing yet)."""
        cls = StreamQueue if settings.queue_type == "stream" else Queue
        queue = cls(
            self,
            name,
            durable=durable,
            owner=owner,
            auto_delete=auto_delete,
            arguments=arguments,
            settings=settings,
        )
        self.queues[name] = queue
        if durable and owner is None and self.recorder is not None:
            queue.journal = self.recorder
            if not queue.is_stream:
                queue.recorder = self.recorder
        return queue

    @staticmethod
    def _info(queue: Queue) -> QueueInfo:
        return QueueInfo(queue.name, queue.count(), len(queue.consumers))

    def delete_queue(self, session: Session, name: str, *, if_unused: bool, if_empty: bool) -> int:
        """Delete a queue; the number of ready messages dropped. Missing: 0."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        self._check_owner(session, queue)
        if if_unused and queue.consumers:
            raise PreconditionFailed(f"queue {name!r} in vhost {self.name!r} in use")
        if if_empty and queue.has_ready():
            raise PreconditionFailed(f"queue {name!r} in vhost {self.name!r} not empty")
        return self.remove_queue(queue)

    def remove_queue(self, queue: Queue) -> int:
        """Delete unconditionally: cancel consumers (telling their sessions), remove
        bindings (and auto-delete exchanges left without any), drop ready messages.
        Deliveries still unacknowledged stay with their sessions; settling them is
        a no-op."""
        queue.deleted = True
        del self.queues[queue.name]
        text = f"queue {queue.name!r} in vhost {self.name!r} deleted"
        for consumer in list(queue.consumers):
            consumer.session._cancelled_by_server(consumer, ReplyCode.NOT_FOUND, text)
        queue.consumers.clear()
        for exchange, ident in list(queue.bindings):
            exchange.unbind(ident)
            if exchange.auto_delete and not exchange.bindings:
                self.remove_exchange(exchange)
        queue.bindings.clear()
        if queue.owner is not None:
            queue.owner.disown(queue)
        journal = queue.journal
        if journal is not None:
            queue.journal = queue.recorder = None  # the delete record drops its messages
            journal.queue_deleted(self.name, queue.name)
        return queue.purge()

    def purge_queue(self, session: Session, name: str) -> int:
        queue = self.queue(session, name)
        if queue.is_stream:
            raise PreconditionFailed(
                f"queue {name!r} in vhost {self.name!r} is a stream: retention drops its "
                "messages (x-max-length, x-max-length-bytes, x-max-age), purge does not"
            )
        return queue.purge()

    def expire(self, now: float, *, queues: bool = True) -> None:
        """Expire messages past their TTL; with ``queues``, also delete the queues
        unused for their ``x-expires`` (a passive HA node leaves that to its
        master, whose delete it replays: its own queues have no consumers)."""
        for queue in list(self.queues.values()):
            queue.expire(now)
            limit = queue.settings.expires
            if limit is None or not queues or queue.deleted:
                continue
            if queue.consumers or queue.used_at is None:
                queue.used_at = now
            elif (now - queue.used_at) * 1000 >= limit:
                self.remove_queue(queue)
        if self.reserving:
            for queue in list(self.reserving):
                if queue.lapse_reservations(now) and not queue.deleted:
                    queue.dispatch(now)

    # --- bindings -----------------------------------------------------------------

    def bind(
        self,
        session: Session,
        queue_name: str,
        exchange_name: str,
        key: str,
        arguments: Mapping[str, Any] | None,
    ) -> None:
        if exchange_name == "":
            raise AccessRefused("operation not permitted on the default exchange")
        queue = self.queue(session, queue_name)
        exchange = self.exchange(exchange_name)
        args = dict(arguments or {})
        exchange.check_binding(key, args)
        ident = exchange.bind(queue, key, args)
        if ident is not None:
            queue.bindings.add((exchange, ident))
            if queue.journal is not None and exchange.durable:
                queue.journal.bound(self.name, queue.name, exchange.name, key, args)

    def unbind(
        self,
        session: Session,
        queue_name: str,
        exchange_name: str,
        key: str,
        arguments: Mapping[str, Any] | None,
    ) -> None:
        """Remove a binding; one that does not exist is no error."""
        if exchange_name == "":
            raise AccessRefused("operation not permitted on the default exchange")
        queue = self.queue(session, queue_name)
        exchange = self.exchange(exchange_name)
        ident = binding_id(queue, key, arguments or {})
        if exchange.unbind(ident):
            queue.bindings.discard((exchange, ident))
            if queue.journal is not None and exchange.durable:
                queue.journal.unbound(
                    self.name, queue.name, exchange.name, key, dict(arguments or {})
                )
            if exchange.auto_delete and not exchange.bindings:
                self.remove_exchange(exchange)

    # --- messages -----------------------------------------------------------------

    def publish(self, message: Message, now: float) -> PublishOutcome:
        """Route ``message``; a message whose ``publish_key`` was routed recently is
        not routed again (DUPLICATE)."""
        key = message.publish_key
        if not key:
            return self.route(message, now)
        keys = self.publish_keys
        if key in keys.known:
            keys.duplicates += 1
            return PublishOutcome.DUPLICATE
        outcome = self.route(message, now)
        if outcome is PublishOutcome.ROUTED:
            # PublishKeys.add, inline: every keyed publish (an HA pair's client's
            # confirmed ones) adds its key, and the call was a tenth of the key's
            # instructions (benchmarks/publish_key_core.py; tests/broker/test_dedup.py
            # checks the window against PublishKeys.add's with hypothesis)
            window = keys.window
            if key not in window:
                recorder = self.recorder
                window[key] = recorder.span_last if recorder is not None else 0
                order = keys.order
                order.append(key)
                if len(order) > keys.capacity:
                    del window[order.popleft()]
        return outcome

    def publish_batch(
        self, exchange_name: str, messages: list[Message], now: float
    ) -> list[PublishOutcome]:
        """:meth:`publish` of each of ``messages`` (all to ``exchange_name``: one
        ``publish.batch``), in order; the outcome of each.

        Why this exists next to :meth:`publish`: a batch of thousands of messages
        (``publish_many``, the Spark writer) spent most of its time in the calls
        one publish makes. Here each routing key is routed once per batch, and the
        messages that go only to streams are appended to each stream together
        (:meth:`StreamQueue.offer_many`), with their publish keys remembered after.
        A message reaching any classic queue goes through :meth:`publish` (TTL,
        overflow, dead letters, paging), after the stream appends before it, so
        every queue takes the batch's messages in the batch's order. A headers
        exchange (routing by more than the key) takes each through :meth:`publish`.
        ``tests/broker/test_stream.py`` checks the outcomes, the streams, the
        journal and the publish keys agree with :meth:`publish` one by one."""
        exchange: Exchange | None = None
        if exchange_name:
            exchange = self.exchanges.get(exchange_name)
            if exchange is None:
                raise NotFound(f"no exchange {exchange_name!r} in vhost {self.name!r}")
            if exchange.internal:
                raise AccessRefused(
                    f"cannot publish to internal exchange {exchange_name!r} in vhost {self.name!r}"
                )
            if exchange.kind == "headers":
                return [self.publish(m, now) for m in messages]
        routed, duplicate = PublishOutcome.ROUTED, PublishOutcome.DUPLICATE
        unroutable = PublishOutcome.UNROUTABLE
        keys = self.publish_keys
        known = keys.known
        recorder = self.recorder
        queues_by_name = self.queues
        # routing key -> (its queues, when all are streams the appends of the
        # lists of messages waiting for each, else None)
        routes: dict[str, tuple[tuple[Queue, ...], tuple[Callable[[Message], None], ...] | None]]
        routes = {}
        streamed: dict[StreamQueue, list[Message]] = {}  # the appends not made yet
        routed_keys: dict[str, None] = {}  # their publish keys
        outcomes: list[PublishOutcome] = []

        def flush() -> None:
            for stream, taken in streamed.items():
                if taken:
                    stream.offer_many(taken, now)
                    taken.clear()  # (the stream copied it) the routes keep the list
            if routed_keys:
                keys.add_many(routed_keys, recorder.span_last if recorder is not None else 0)
                routed_keys.clear()

        for message in messages:
            publish_key = message.publish_key
            if publish_key and (publish_key in known or publish_key in routed_keys):
                if publish_key in routed_keys:
                    flush()  # a key sent twice in one batch: the first copy is routed
                keys.duplicates += 1
                if recorder is not None:  # its reply vouches for the first copy
                    recorder.depend_on(keys.position(publish_key))
                outcomes.append(duplicate)
                continue
            route = routes.get(message.routing_key)
            if route is None:
                if exchange is None:
                    target = queues_by_name.get(message.routing_key)
                    targets: tuple[Queue, ...] = () if target is None else (target,)
                else:
                    targets = tuple(exchange.route(message))
                streams = [q for q in targets if isinstance(q, StreamQueue)]
                appends = tuple(streamed.setdefault(q, []).append for q in streams)
                route = routes[message.routing_key] = (
                    targets,
                    appends if len(streams) == len(targets) else None,
                )
            targets, appends_or_none = route
            if not targets:
                outcomes.append(unroutable)
                continue
            if appends_or_none is None:
                flush()
                outcomes.append(self.publish(message, now))
                continue
            # streams journal what they take themselves (recorder.enqueue would
            # record nothing for them) and take every message: routed
            for append in appends_or_none:
                append(message)
            if publish_key:
                routed_keys[publish_key] = None
            outcomes.append(routed)
        flush()
        return outcomes

    def publish_run(
        self,
        exchange_name: str,
        key: str,
        bodies: list[bytes],
        now: float,
        meshes: Callable[[int], Sequence[Any]] | None = None,
    ) -> bool:
        """:meth:`publish` of ``Message(exchange_name, key, body)`` for each of
        ``bodies`` in order, when none is mandatory or confirmed (their outcomes
        are not needed): False when it did nothing because the exchange is missing,
        internal or a headers one (the caller then takes each through
        :meth:`publish`, which refuses or routes it).

        Why it exists beside :meth:`publish`: a publisher's plain messages arrive
        in runs on one route (``protocol.PublishRun``); the route is looked up
        once a run here, each message then offered to its queues as :meth:`route`
        offers it (no expiration, not persistent: nothing for the recorder).
        tests/server/test_dispatch_publish.py checks the queues, deliveries and
        replies agree with :meth:`publish` one by one.

        ``meshes(n)`` (a peered exchange's run) gives the ``Message.mesh`` of each
        of the ``n`` messages; it is called once the run is known to be taken
        here (never when this returns False), whether or not a queue is bound."""
        if meshes is not None:
            return self._publish_meshed_run(exchange_name, key, bodies, now, meshes)
        if not exchange_name:
            target = self.queues.get(key)
            if target is None:
                return True  # unroutable, and none is mandatory
            offer = target.offer
            for body in bodies:
                offer(Message("", key, body), now, None)
            return True
        exchange = self.exchanges.get(exchange_name)
        if exchange is None or exchange.internal or exchange.kind == "headers":
            return False
        queues = tuple(exchange.route(Message(exchange_name, key, b"")))  # by the key alone
        if len(queues) == 1:
            offer = queues[0].offer
            for body in bodies:
                offer(Message(exchange_name, key, body), now, None)
        elif queues:
            for body in bodies:
                message = Message(exchange_name, key, body)
                for queue in queues:
                    queue.offer(message, now, None)
        return True

    def _publish_meshed_run(
        self,
        exchange_name: str,
        key: str,
        bodies: list[bytes],
        now: float,
        meshes: Callable[[int], Sequence[Any]],
    ) -> bool:
        """:meth:`publish_run` of messages each with its ``mesh`` (a named exchange)."""
        exchange = self.exchanges.get(exchange_name)
        if not exchange_name or exchange is None or exchange.internal or exchange.kind == "headers":
            return False
        ids = meshes(len(bodies))  # (minted whether routed or not, as publish would)
        queues = tuple(exchange.route(Message(exchange_name, key, b"")))  # by the key alone
        if len(queues) == 1:
            messages = []
            for body, mesh in zip(bodies, ids, strict=True):
                message = Message(exchange_name, key, body)
                message.mesh = mesh
                messages.append(message)
            queues[0].offer_run(messages, now)
        elif queues:
            for body, mesh in zip(bodies, ids, strict=True):
                message = Message(exchange_name, key, body)
                message.mesh = mesh
                for queue in queues:
                    queue.offer(message, now, None)
        return True

    def route(self, message: Message, now: float) -> PublishOutcome:
        properties = message.properties
        expiration = properties.get("expiration") if properties else None
        if not message.exchange:  # the default exchange, inlined: the commonest case
            target = self.queues.get(message.routing_key)
            if target is None:
                return PublishOutcome.UNROUTABLE
            recorder = target.recorder
            if recorder is not None and properties.get("persistent") is True:
                recorder.enqueue(self.name, message, (target,), now)
            if target.offer(message, now, expiration):
                return PublishOutcome.ROUTED
            if message.journal_id and recorder is not None:
                recorder.ack(message.journal_id, target.name)
            return PublishOutcome.REJECTED
        exchange = self.exchanges.get(message.exchange)
        if exchange is None:
            raise NotFound(f"no exchange {message.exchange!r} in vhost {self.name!r}")
        if exchange.internal:
            raise AccessRefused(
                f"cannot publish to internal exchange {message.exchange!r} in vhost {self.name!r}"
            )
        queues = exchange.route(message)
        if not queues:
            return PublishOutcome.UNROUTABLE
        recorder = self.recorder
        if recorder is not None and properties and properties.get("persistent") is True:
            recorder.enqueue(self.name, message, queues, now)
        rejected = False
        for queue in queues:
            if not queue.offer(message, now, expiration):
                rejected = True
                if message.journal_id and queue.recorder is not None:
                    queue.recorder.ack(message.journal_id, queue.name)
        return PublishOutcome.REJECTED if rejected else PublishOutcome.ROUTED

    def dead_letter(self, message: Message, queue: Queue, reason: str, now: float) -> None:
        """Republish a message that died in ``queue`` to its dead-letter exchange.

        Dead letters are routed one at a time from a FIFO, so a dead letter that
        causes another (a full target queue dropping its head) never recurses.
        A missing dead-letter exchange drops the message.
        """
        settings = queue.settings
        if settings.dead_letter_exchange is None:
            return
        copy = dead_letter_copy(
            message,
            queue.name,
            reason,
            settings.dead_letter_exchange,
            settings.dead_letter_routing_key,
        )
        self._dead_letters.append((copy, now))
        if self._dead_lettering:
            return
        self._dead_lettering = True
        try:
            while self._dead_letters:
                letter, at = self._dead_letters.popleft()
                exchange = self.exchanges.get(letter.exchange)
                if exchange is None:
                    continue
                targets = [t for t in exchange.route(letter) if not is_cycle(letter, t.name)]
                recorder = self.recorder
                if recorder is not None and targets and is_persistent(letter):
                    recorder.enqueue(self.name, letter, targets, at)
                for target in targets:
                    if not target.offer(letter, at, None) and letter.journal_id and target.recorder:
                        target.recorder.ack(letter.journal_id, target.name)
        finally:
            self._dead_lettering = False

    # --- status -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "duplicate_publishes": self.publish_keys.duplicates,
            "exchanges": [
                {
                    "name": ex.name,
                    "type": ex.kind,
                    "durable": ex.durable,
                    "auto_delete": ex.auto_delete,
                    "internal": ex.internal,
                    "bindings": [
                        {"queue": b.queue.name, "key": b.key, "arguments": dict(b.arguments)}
                        for b in ex.bindings.values()
                    ],
                }
                for ex in self.exchanges.values()
            ],
            "queues": [
                {
                    "vhost": self.name,
                    "name": q.name,
                    "messages": q.count(),
                    "unacked": q.unacked,
                    "consumers": len(q.consumers),
                    "durable": q.durable,
                    "exclusive": q.owner is not None,
                    "auto_delete": q.auto_delete,
                    "type": q.settings.queue_type,
                    "arguments": dict(q.arguments),
                    "stats": {
                        "publish": q.stat_publish,
                        "deliver_get": q.stat_deliver,
                        "redeliver": q.stat_redeliver,
                        "ack": q.stat_ack,
                    },
                    **(q.status_fields() if isinstance(q, StreamQueue) else {}),
                }
                for q in self.queues.values()
            ],
        }
