"""Exchanges: bindings and routing, one class per exchange type.

``route(message)`` returns each matching queue once, however many bindings match
(a message reaches a queue at most once per publish). Routing is the hot path, so
each type keeps an index shaped for it: direct a dict key -> queues, fanout the
queue set, topic a :class:`TopicMatcher` with a result cache, headers a list of
compiled rules.

A binding is identified by (queue, key, arguments); binding twice is a no-op.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, ClassVar, NamedTuple, Protocol

from .headers import HeadersRule
from .message import Message
from .queue import Queue
from .topic import TopicMatcher


class Binding(NamedTuple):
    queue: Queue
    key: str
    arguments: dict[str, Any]


def binding_id(queue: Queue, key: str, arguments: Mapping[str, Any]) -> tuple[Any, ...]:
    """A hashable identity for a binding (unhashable argument values by repr)."""
    items = []
    for name in sorted(arguments):
        value = arguments[name]
        try:
            hash(value)
        except TypeError:
            value = repr(value)
        items.append((name, value))
    return (queue, key, tuple(items))


_NO_QUEUES: tuple[Queue, ...] = ()


class BindingWatcher(Protocol):
    """Told of every binding added to or removed from one exchange, whatever the
    cause (a request, a deleted queue, a deleted exchange): exchange peering
    mirrors bindings through it. It must not raise."""

    def bound(self, queue: str, key: str, arguments: Mapping[str, Any]) -> None: ...

    def unbound(self, queue: str, key: str, arguments: Mapping[str, Any]) -> None: ...


class Exchange:
    """Common state and binding bookkeeping; subclasses index and route."""

    kind: ClassVar[str] = ""

    __slots__ = ("arguments", "auto_delete", "bindings", "durable", "internal", "name", "watcher")

    def __init__(
        self,
        name: str,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments: dict[str, Any] = arguments if arguments is not None else {}
        self.bindings: dict[tuple[Any, ...], Binding] = {}
        self.watcher: BindingWatcher | None = None

    def bind(self, queue: Queue, key: str, arguments: dict[str, Any]) -> tuple[Any, ...] | None:
        """Add a binding; its identity when new, None when it already existed."""
        ident = binding_id(queue, key, arguments)
        if ident in self.bindings:
            return None
        binding = Binding(queue, key, dict(arguments))
        self._index(binding)
        self.bindings[ident] = binding
        if self.watcher is not None:
            self.watcher.bound(queue.name, key, binding.arguments)
        return ident

    def unbind(self, ident: tuple[Any, ...]) -> bool:
        binding = self.bindings.pop(ident, None)
        if binding is None:
            return False
        self._unindex(binding)
        if self.watcher is not None:
            self.watcher.unbound(binding.queue.name, binding.key, binding.arguments)
        return True

    def check_binding(self, key: str, arguments: Mapping[str, Any]) -> None:
        """Raise when this type cannot take such a binding (headers: bad x-match)."""

    def route(self, message: Message) -> Collection[Queue]:
        raise NotImplementedError

    def _index(self, binding: Binding) -> None:
        raise NotImplementedError

    def _unindex(self, binding: Binding) -> None:
        raise NotImplementedError


def _count_in(counts: dict[Queue, int], queue: Queue) -> None:
    counts[queue] = counts.get(queue, 0) + 1


def _count_out(counts: dict[Queue, int], queue: Queue) -> None:
    n = counts[queue]
    if n > 1:
        counts[queue] = n - 1
    else:
        del counts[queue]


class DefaultExchange(Exchange):
    """The nameless exchange: routes to the queue named by the routing key.
    It holds no bindings; the virtual host refuses to bind to it."""

    kind = "direct"
    __slots__ = ("_queues",)

    def __init__(self, queues: Mapping[str, Queue]) -> None:
        super().__init__("", durable=True)
        self._queues = queues

    def route(self, message: Message) -> Collection[Queue]:
        queue = self._queues.get(message.routing_key)
        return _NO_QUEUES if queue is None else (queue,)

    def _index(self, binding: Binding) -> None:
        raise AssertionError("the default exchange takes no bindings")

    _unindex = _index


class DirectExchange(Exchange):
    kind = "direct"
    __slots__ = ("_by_key",)

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self._by_key: dict[str, dict[Queue, int]] = {}

    def route(self, message: Message) -> Collection[Queue]:
        return self._by_key.get(message.routing_key, _NO_QUEUES)

    def _index(self, binding: Binding) -> None:
        _count_in(self._by_key.setdefault(binding.key, {}), binding.queue)

    def _unindex(self, binding: Binding) -> None:
        queues = self._by_key[binding.key]
        _count_out(queues, binding.queue)
        if not queues:
            del self._by_key[binding.key]


class FanoutExchange(Exchange):
    kind = "fanout"
    __slots__ = ("_queues",)

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self._queues: dict[Queue, int] = {}

    def route(self, message: Message) -> Collection[Queue]:
        return self._queues

    def _index(self, binding: Binding) -> None:
        _count_in(self._queues, binding.queue)

    def _unindex(self, binding: Binding) -> None:
        _count_out(self._queues, binding.queue)


class TopicExchange(Exchange):
    kind = "topic"
    __slots__ = ("_matcher",)

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self._matcher: TopicMatcher[Queue] = TopicMatcher()

    def route(self, message: Message) -> Collection[Queue]:
        return self._matcher.match(message.routing_key)

    def _index(self, binding: Binding) -> None:
        self._matcher.add(binding.key, binding.queue)

    def _unindex(self, binding: Binding) -> None:
        self._matcher.remove(binding.key, binding.queue)


class HeadersExchange(Exchange):
    kind = "headers"
    __slots__ = ("_rules",)

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self._rules: list[tuple[HeadersRule, Queue]] = []

    def check_binding(self, key: str, arguments: Mapping[str, Any]) -> None:
        HeadersRule.from_arguments(arguments)

    def route(self, message: Message) -> Collection[Queue]:
        headers = message.headers
        found: dict[Queue, None] = {}
        for rule, queue in self._rules:
            if queue not in found and rule.matches(headers):
                found[queue] = None
        return found

    def _index(self, binding: Binding) -> None:
        self._rules.append((HeadersRule.from_arguments(binding.arguments), binding.queue))

    def _unindex(self, binding: Binding) -> None:
        self._rules = [
            (HeadersRule.from_arguments(b.arguments), b.queue)
            for b in self.bindings.values()
            if b is not binding
        ]


EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    "direct": DirectExchange,
    "fanout": FanoutExchange,
    "topic": TopicExchange,
    "headers": HeadersExchange,
}
