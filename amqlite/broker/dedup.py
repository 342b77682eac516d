"""Duplicate detection for publishes sent again after a reconnect or a failover.

A client that re-sends its unconfirmed publishes on a new connection cannot know
whether the broker (or, after a failover, the broker's passive peer) already holds
them. It marks each confirmed publish with a **publish key** (its instance token and
the publish's request id, the same on every re-send); the broker remembers the keys
of the messages it routed most recently, per vhost, and answers a key it has seen
with a confirm and no second copy. The keys travel in ``message.enqueue`` records,
so a restarted node and a passive HA node that takes over know them too.

The window is bounded (:data:`DEFAULT_WINDOW` keys per vhost, oldest forgotten
first): it has to cover what is in flight when a link breaks, not history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from .recording import ALL_APPENDED

#: Keys remembered per vhost: many times any client's in-flight window.
DEFAULT_WINDOW = 100_000


class PublishKeys:
    """The publish keys of the last ``capacity`` routed messages of one vhost."""

    __slots__ = ("_keys", "_order", "capacity", "duplicates", "known", "order", "window")

    def __init__(self, capacity: int = DEFAULT_WINDOW) -> None:
        if capacity < 1:
            raise ValueError(f"the publish key window must hold at least 1 key, got {capacity}")
        self.capacity = capacity
        self.duplicates = 0  # publishes answered as duplicates
        #: key -> journal position of the first copy's record (0: not journaled,
        #: ALL_APPENDED: learned from replayed records, position unknown). A plain
        #: dict and a deque of its keys, oldest first, rather than an OrderedDict:
        #: every keyed publish adds a key and forgets the oldest, on both nodes of
        #: an HA pair (the passive one as it follows), and this costs about half
        #: (issue 16 item 3). ``tests/broker/test_dedup.py`` checks with hypothesis
        #: that the window holds what an OrderedDict model holds, in its order.
        self._keys: dict[str, int] = {}
        self._order: deque[str] = deque()
        #: the keys (and their positions), read-only: ``key in keys.known`` is what a
        #: publish asks (a plain attribute, not ``__contains__``, which costs a Python
        #: call a keyed publish)
        self.known: Mapping[str, int] = self._keys
        #: the same dict and deque, for ``VirtualHost.publish``'s inline :meth:`add`
        #: (a keyed publish's; it must change them exactly as ``add`` does)
        self.window: dict[str, int] = self._keys
        self.order: deque[str] = self._order

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def position(self, key: str) -> int:
        """The journal position a publish sent again under ``key`` vouches for."""
        return self._keys.get(key, 0)

    def add_many(self, keys: Iterable[str], position: int = ALL_APPENDED) -> None:
        """:meth:`add` of each of ``keys``, in order (a ``publish.batch``'s)."""
        known, order, capacity = self._keys, self._order, self.capacity
        for key in keys:
            if key not in known:
                known[key] = position
                order.append(key)
                if len(order) > capacity:
                    del known[order.popleft()]

    def add(self, key: str, position: int = ALL_APPENDED) -> None:
        keys = self._keys
        if key in keys:
            return
        keys[key] = position
        order = self._order
        order.append(key)
        if len(order) > self.capacity:
            del keys[order.popleft()]
