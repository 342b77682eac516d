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

from collections import OrderedDict

#: Keys remembered per vhost: many times any client's in-flight window.
DEFAULT_WINDOW = 100_000


class PublishKeys:
    """The publish keys of the last ``capacity`` routed messages of one vhost."""

    __slots__ = ("_keys", "capacity", "duplicates")

    def __init__(self, capacity: int = DEFAULT_WINDOW) -> None:
        if capacity < 1:
            raise ValueError(f"the publish key window must hold at least 1 key, got {capacity}")
        self.capacity = capacity
        self.duplicates = 0  # publishes answered as duplicates
        self._keys: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: str) -> None:
        keys = self._keys
        if key in keys:
            return
        keys[key] = None
        if len(keys) > self.capacity:
            keys.popitem(last=False)
