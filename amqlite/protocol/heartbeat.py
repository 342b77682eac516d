"""Heartbeat bookkeeping for one connection, sans-IO: time comes in as ``now``.

Both sides send a ``heartbeat`` frame when they have sent nothing else for one
interval, and declare the peer dead when nothing at all has arrived for
``misses`` intervals. Any frame counts as a sign of life.
"""

from dataclasses import dataclass, field


@dataclass(slots=True)
class PeerClock:
    """When to send the next heartbeat and whether the peer has gone silent."""

    interval: float
    misses: int = 3
    last_received: float = field(default=0.0)
    last_sent: float = field(default=0.0)

    def start(self, now: float) -> None:
        self.last_received = now
        self.last_sent = now

    def received(self, now: float) -> None:
        self.last_received = now

    def sent(self, now: float) -> None:
        self.last_sent = now

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    def send_due(self, now: float) -> bool:
        """True when we have been quiet for a whole interval."""
        # compared exactly as next_deadline computes it, so that waking at the
        # deadline always finds the heartbeat due (``now - last >= interval``
        # can be off by one rounding step and make a shell spin)
        return self.enabled and now >= self.last_sent + self.interval

    def peer_dead(self, now: float) -> bool:
        """True when the peer has been silent for ``misses`` intervals."""
        return self.enabled and now >= self.last_received + self.interval * self.misses

    def next_deadline(self, now: float) -> float:
        """The earliest time at which :meth:`send_due` or :meth:`peer_dead` may change."""
        if not self.enabled:
            return float("inf")
        return min(self.last_sent + self.interval, self.last_received + self.interval * self.misses)
