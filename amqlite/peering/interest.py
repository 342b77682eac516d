"""Interest: which (key, arguments) pairs are bound on an exchange, on each side.

The end of a link that *receives* messages advertises its interest: the distinct
(key, arguments) pairs bound on its exchange, kept by a reference-counted
:class:`BindingMirror` (one entry per distinct pair, however many queues bind it;
gone with the last). The end that *sends* keeps the advertised set in a
:class:`RemoteInterest` and asks it, per message, whether the remote exchange would
route it anywhere. Matching reuses the broker's own code
(:class:`~amqlite.broker.TopicMatcher`, :class:`~amqlite.broker.HeadersRule`), so
both sides agree on what matches. However many remote bindings match, the answer is
one yes: one copy per remote broker.

Both sides keep an order-independent digest of their set; the advertiser sends it
with every advertisement and periodically, and the sender asks for the full set
again when its own digest differs (drift repair).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, NamedTuple

from amqlite.broker import HeadersRule, TopicMatcher
from amqlite.errors import PreconditionFailed

from .errors import PeeringProtocolError

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
_VERDICTS_MAX = 4096  # routing keys whose topic verdict a RemoteInterest remembers
_MASK64 = (1 << 64) - 1


class _FrozenList(tuple[Any, ...]):
    __slots__ = ()


class _FrozenMap(tuple[tuple[str, Any], ...]):
    __slots__ = ()


class _Scalar(tuple[str, Any]):
    """A value with its type name: ``1``, ``1.0`` and ``True`` are equal in Python
    but three different values to headers matching, so three different bindings."""

    __slots__ = ()


def _freeze(value: object) -> Hashable:
    if isinstance(value, list | tuple):
        return _FrozenList(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return _FrozenMap(sorted(((str(k), _freeze(v)) for k, v in value.items()), key=_name))
    if not isinstance(value, Hashable):
        raise TypeError(f"binding argument value {value!r} cannot be compared")
    return _Scalar((type(value).__name__, value))


def _name(item: tuple[str, Any]) -> str:
    return item[0]


def _thaw(value: Any) -> Any:
    if isinstance(value, _FrozenMap):
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, _FrozenList):
        return [_thaw(v) for v in value]
    if isinstance(value, _Scalar):
        return value[1]
    return value


class BindingKey(NamedTuple):
    """One distinct binding as the remote sees it: a key and frozen arguments."""

    key: str
    arguments: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, key: str, arguments: Mapping[str, Any] | None = None) -> BindingKey:
        if not isinstance(key, str):
            raise TypeError(f"binding key must be a string, got {key!r}")
        items = (arguments or {}).items()
        args = tuple(sorted(((str(k), _freeze(v)) for k, v in items), key=_name))
        return cls(key, args)

    def arguments_map(self) -> dict[str, Any]:
        return {name: _thaw(value) for name, value in self.arguments}

    def fingerprint(self) -> int:
        """A 64-bit hash that is the same in every process (unlike ``hash``)."""
        text = repr((self.key, self.arguments)).encode()
        return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


class InterestDigest:
    """Sum of fingerprints mod 2**64: order-independent and updated per delta."""

    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0

    def add(self, key: BindingKey) -> None:
        self.count += 1
        self.total = (self.total + key.fingerprint()) & _MASK64

    def remove(self, key: BindingKey) -> None:
        self.count -= 1
        self.total = (self.total - key.fingerprint()) & _MASK64

    @property
    def hex(self) -> str:
        return f"{self.total:016x}"


class BindingMirror:
    """The local exchange's bindings, reference counted per distinct (key, arguments).

    A binding is (queue, key, arguments); adding one twice is a no-op, as in the
    broker. :meth:`add` returns the :class:`BindingKey` when its first binding
    appears (the remote must add it), :meth:`remove` when its last one goes (the
    remote must remove it), None otherwise.
    """

    __slots__ = ("_by_key", "_by_queue", "digest")

    def __init__(self) -> None:
        self._by_key: dict[BindingKey, set[str]] = {}
        self._by_queue: dict[str, set[BindingKey]] = {}
        self.digest = InterestDigest()

    def add(
        self, queue: str, key: str, arguments: Mapping[str, Any] | None = None
    ) -> BindingKey | None:
        bkey = BindingKey.of(key, arguments)
        queues = self._by_key.get(bkey)
        if queues is None:
            queues = self._by_key[bkey] = set()
        elif queue in queues:
            return None
        queues.add(queue)
        self._by_queue.setdefault(queue, set()).add(bkey)
        if len(queues) == 1:
            self.digest.add(bkey)
            return bkey
        return None

    def remove(
        self, queue: str, key: str, arguments: Mapping[str, Any] | None = None
    ) -> BindingKey | None:
        return self._remove(queue, BindingKey.of(key, arguments))

    def remove_queue(self, queue: str) -> list[BindingKey]:
        """Every binding of a deleted queue; the keys that lost their last binding."""
        gone = []
        for bkey in sorted(self._by_queue.get(queue, ())):
            if self._remove(queue, bkey) is not None:
                gone.append(bkey)
        return gone

    def _remove(self, queue: str, bkey: BindingKey) -> BindingKey | None:
        queues = self._by_key.get(bkey)
        if queues is None or queue not in queues:
            return None
        queues.discard(queue)
        mine = self._by_queue[queue]
        mine.discard(bkey)
        if not mine:
            del self._by_queue[queue]
        if queues:
            return None
        del self._by_key[bkey]
        self.digest.remove(bkey)
        return bkey

    def keys(self) -> frozenset[BindingKey]:
        return frozenset(self._by_key)

    def refcount(self, key: str, arguments: Mapping[str, Any] | None = None) -> int:
        return len(self._by_key.get(BindingKey.of(key, arguments), ()))

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, item: object) -> bool:
        return item in self._by_key


class RemoteInterest:
    """The remote exchange's advertised bindings, indexed for its exchange type.

    Until the first full advertisement arrives the interest is *unknown* and every
    message matches: the link keeps what it cannot yet judge rather than lose it
    (the remote drops what it cannot route). The set survives link cuts: the last
    known interest is the best guess while the remote is away.
    """

    __slots__ = (
        "_direct",
        "_headers",
        "_keys",
        "_topic",
        "_verdicts",
        "digest",
        "exchange_type",
        "known",
    )

    def __init__(self, exchange_type: str) -> None:
        if exchange_type not in EXCHANGE_TYPES:
            raise ValueError(
                f"exchange type must be one of {', '.join(EXCHANGE_TYPES)}, got {exchange_type!r}"
            )
        self.exchange_type = exchange_type
        self.known = False
        self._keys: set[BindingKey] = set()
        self._direct: Counter[str] = Counter()
        self._topic: TopicMatcher[BindingKey] = TopicMatcher()
        self._headers: list[tuple[HeadersRule, BindingKey]] = []
        self._verdicts: dict[str, bool] = {}  # topic: routing key -> matches (bounded)
        self.digest = InterestDigest()

    def replace(self, keys: Iterable[BindingKey]) -> None:
        """A full advertisement: the remote's whole set."""
        for bkey in list(self._keys):
            self.remove(bkey)
        for bkey in keys:
            self.add(bkey)
        self.known = True

    def add(self, bkey: BindingKey) -> None:
        if bkey in self._keys:
            return
        self._verdicts.clear()
        kind = self.exchange_type
        if kind == "headers":
            try:
                rule = HeadersRule.from_arguments(bkey.arguments_map())
            except PreconditionFailed as exc:
                raise PeeringProtocolError(f"advertised headers binding: {exc.text}") from None
            self._headers.append((rule, bkey))
        elif kind == "topic":
            self._topic.add(bkey.key, bkey)
        elif kind == "direct":
            self._direct[bkey.key] += 1
        self._keys.add(bkey)
        self.digest.add(bkey)

    def remove(self, bkey: BindingKey) -> None:
        if bkey not in self._keys:
            return
        self._verdicts.clear()
        kind = self.exchange_type
        if kind == "headers":
            self._headers = [(r, k) for r, k in self._headers if k != bkey]
        elif kind == "topic":
            self._topic.remove(bkey.key, bkey)
        elif kind == "direct":
            self._direct[bkey.key] -= 1
            if not self._direct[bkey.key]:
                del self._direct[bkey.key]
        self._keys.discard(bkey)
        self.digest.remove(bkey)

    def matches(self, routing_key: str, headers: Mapping[str, Any]) -> bool:
        """Would the remote exchange route this message to at least one queue?"""
        if not self.known:
            return True
        kind = self.exchange_type
        if kind == "topic":
            verdict = self._verdicts.get(routing_key)
            if verdict is None:
                verdict = bool(self._topic.match(routing_key))
                if len(self._verdicts) >= _VERDICTS_MAX:
                    self._verdicts.clear()
                self._verdicts[routing_key] = verdict
            return verdict
        if kind == "direct":
            return routing_key in self._direct
        if kind == "fanout":
            return bool(self._keys)
        return any(rule.matches(headers) for rule, _ in self._headers)

    def keys(self) -> frozenset[BindingKey]:
        return frozenset(self._keys)

    def __len__(self) -> int:
        return len(self._keys)
