"""Limits on what clients may hold, sans-IO: counts in, refusals out.

Two parts, both pure (the shell applies what they decide):

* :class:`BrokerLimits` is what the broker core enforces itself: queues per
  vhost (a declare past it is 406, RabbitMQ's ``max-queues``), consumers per
  connection (530, as RabbitMQ's ``consumer_max_per_channel``) and the largest
  message body (406, RabbitMQ's ``max_message_size``).
* :class:`ConnectionLimits` counts the node's sockets: those not through their
  handshake yet (bounded: past the bound the oldest one is evicted, so sockets
  that never finish their handshake cannot take every file descriptor and starve
  the accept loop), and the open connections, per node and per user. Its
  :meth:`~ConnectionLimits.admit` says whether a connection may open.

Every refusal names the setting that caused it (``limits.max_connections``...)
and its value, so an operator reading a client's error knows what to change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from amqlite.errors import NotAllowed, PreconditionFailed

__all__ = [
    "BrokerLimits",
    "ConnectionLimits",
    "LimitReached",
    "check_message_size",
    "message_size_text",
]


@dataclass(frozen=True, slots=True)
class BrokerLimits:
    """What the broker core refuses; 0 means no limit."""

    max_queues_per_vhost: int = 0
    max_consumers_per_connection: int = 0
    max_message_size: int = 0


def message_size_text(size: int, limit: int) -> str:
    """RabbitMQ's words for a body over ``max_message_size``, naming our setting."""
    return (
        f"message size {size} is larger than configured max size {limit} (limits.max_message_size)"
    )


def check_message_size(size: int, limit: int) -> None:
    """PreconditionFailed (406) when a body of ``size`` bytes is over ``limit``."""
    if limit and size > limit:
        raise PreconditionFailed(message_size_text(size, limit))


def queue_limit_error(queue: str, vhost: str, limit: int) -> PreconditionFailed:
    """A declare past ``max_queues_per_vhost`` (RabbitMQ: 406 on the channel)."""
    return PreconditionFailed(
        f"cannot declare queue {queue!r}: queue limit in vhost {vhost!r} ({limit}) "
        f"is reached (limits.max_queues_per_vhost)"
    )


def consumer_limit_error(limit: int) -> NotAllowed:
    """A consume past ``max_consumers_per_connection`` (RabbitMQ: 530)."""
    return NotAllowed(
        f"reached maximum ({limit}) of consumers per connection "
        f"(limits.max_consumers_per_connection)"
    )


@dataclass(frozen=True, slots=True)
class LimitReached:
    """Why a connection may not open: ``setting`` (its config key) is at ``limit``."""

    setting: str
    limit: int
    text: str

    @property
    def code(self) -> int:
        return NotAllowed.code


class ConnectionLimits:
    """The node's sockets, counted (see the module docstring).

    A socket is *pending* from :meth:`arrived` until :meth:`admit` lets it open
    or :meth:`left` forgets it. ``max_pending`` bounds the pending sockets:
    :meth:`arrived` returns the oldest one to close when a new one is over it.
    Open connections count against ``max_connections`` and, per user, against
    ``max_per_user`` (0: no per-user limit), unless admitted with
    ``counted=False`` (the HA pair's own link and monitors, which a full node
    must still take).
    """

    __slots__ = (
        "_open",
        "_pending",
        "_per_user",
        "evicted",
        "max_connections",
        "max_pending",
        "max_per_user",
    )

    def __init__(self, max_connections: int, max_per_user: int, max_pending: int) -> None:
        self.max_connections = max_connections
        self.max_per_user = max_per_user
        self.max_pending = max_pending
        #: pending sockets in the order they arrived (dicts keep insertion order)
        self._pending: dict[Hashable, None] = {}
        #: open, counted connections -> their user
        self._open: dict[Hashable, str] = {}
        self._per_user: Counter[str] = Counter()
        #: how many pending sockets were evicted to make room, ever
        self.evicted = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def open(self) -> int:
        return len(self._open)

    def user_connections(self, user: str) -> int:
        return self._per_user[user]

    def arrived(self, key: Hashable) -> Hashable | None:
        """A socket was accepted: it is pending. Returns the socket to close (the
        oldest pending one) when this one takes the pending count over the bound."""
        self._pending[key] = None
        if len(self._pending) <= self.max_pending:
            return None
        oldest = next(iter(self._pending))
        del self._pending[oldest]
        self.evicted += 1
        return oldest

    def admit(self, key: Hashable, user: str, *, counted: bool = True) -> LimitReached | None:
        """May pending ``key`` open as ``user``? None: yes, and it is now open (no
        longer pending); otherwise why not (it stays pending until :meth:`left`)."""
        if counted:
            if len(self._open) >= self.max_connections:
                limit = self.max_connections
                return LimitReached(
                    "limits.max_connections",
                    limit,
                    f"node connection limit ({limit}) is reached (limits.max_connections)",
                )
            per_user = self.max_per_user
            if per_user and self._per_user[user] >= per_user:
                return LimitReached(
                    "limits.max_connections_per_user",
                    per_user,
                    f"user connection limit ({per_user}) of user {user!r} is reached "
                    f"(limits.max_connections_per_user)",
                )
        self._pending.pop(key, None)
        if counted:
            self._open[key] = user
            self._per_user[user] += 1
        return None

    def left(self, key: Hashable) -> None:
        """``key`` closed (pending or open; unknown keys are no error)."""
        self._pending.pop(key, None)
        user = self._open.pop(key, None)
        if user is not None:
            count = self._per_user[user] - 1
            if count:
                self._per_user[user] = count
            else:
                del self._per_user[user]
