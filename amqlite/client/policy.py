"""When and how long a connection reconnects: :class:`ReconnectPolicy`.

Pure arithmetic: the shell draws the random number and does the sleeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """Jittered exponential backoff between passes through the server list, and a
    deadline per outage.

    The first pass starts at once when the link breaks; before pass ``n`` (n >= 1)
    the connection waits a random time in ``[cap / 2, cap]`` with
    ``cap = min(max_delay, initial_delay * 2 ** (n - 1))``: with the defaults 25-50 ms,
    50-100 ms, ... up to 1-2 s. Each pass tries every address in order, the primary
    first. ``give_up_after`` seconds after the loss (``None``: never) the connection
    gives up: it closes, and everything waiting on it raises ConnectionClosed.
    """

    initial_delay: float = 0.05
    max_delay: float = 2.0
    give_up_after: float | None = 60.0

    def __post_init__(self) -> None:
        if not (self.initial_delay > 0 and math.isfinite(self.initial_delay)):
            raise ValueError(f"initial_delay must be positive, got {self.initial_delay!r}")
        if not (self.max_delay >= self.initial_delay and math.isfinite(self.max_delay)):
            raise ValueError(
                f"max_delay must be at least initial_delay ({self.initial_delay!r}), "
                f"got {self.max_delay!r}"
            )
        if self.give_up_after is not None and not self.give_up_after > 0:
            raise ValueError(f"give_up_after must be positive or None, got {self.give_up_after!r}")

    def cap(self, attempt: int) -> float:
        """The longest pause before pass ``attempt`` (0 for the first pass)."""
        if attempt <= 0:
            return 0.0
        return min(self.max_delay, self.initial_delay * 2.0 ** min(attempt - 1, 62))

    def delay(self, attempt: int, rand: float) -> float:
        """The pause before pass ``attempt``, for ``rand`` drawn uniformly from [0, 1)."""
        cap = self.cap(attempt)
        return cap * (0.5 + 0.5 * rand)

    def deadline(self, lost_at: float) -> float:
        """When an outage that began at ``lost_at`` is given up (``inf``: never)."""
        return math.inf if self.give_up_after is None else lost_at + self.give_up_after


def resolve_policy(
    reconnect: bool | ReconnectPolicy | None, addresses: int
) -> ReconnectPolicy | None:
    """``connect(reconnect=...)`` -> the policy, or None for no reconnecting.

    ``None`` (the default) reconnects when the server list names more than one
    address (an HA pair), ``True`` always, ``False`` never.
    """
    if isinstance(reconnect, ReconnectPolicy):
        return reconnect
    if reconnect is None:
        reconnect = addresses > 1
    return ReconnectPolicy() if reconnect else None
