"""Heartbeat bookkeeping for one link connection; time comes in as ``now``.

An end sends a heartbeat when it has sent nothing for one interval, and declares
the other end dead when nothing at all arrived for ``misses`` intervals. Any
message counts as a sign of life. An interval of 0 disables both.
"""

from __future__ import annotations

from dataclasses import dataclass

INF = float("inf")


@dataclass(slots=True)
class HeartbeatClock:
    interval: float
    misses: int = 3
    last_received: float = 0.0
    last_sent: float = 0.0

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

    # Each test compares ``now`` with the very sum next_deadline() returns, so a
    # shell that sleeps until the deadline always finds the event due (computing
    # ``now - last >= interval`` instead can miss by a rounding error, and spin).

    def send_due(self, now: float) -> bool:
        return self.enabled and now >= self.last_sent + self.interval

    def remote_dead(self, now: float) -> bool:
        return self.enabled and now >= self.last_received + self.interval * self.misses

    def next_deadline(self) -> float:
        """When :meth:`send_due` or :meth:`remote_dead` next turns true."""
        if not self.enabled:
            return INF
        return min(self.last_sent + self.interval, self.last_received + self.interval * self.misses)


def negotiate_heartbeat(ours: float, theirs: float) -> float:
    """The interval both ends use: the smaller one, or whichever is nonzero."""
    if ours <= 0 or theirs <= 0:
        return max(ours, theirs, 0.0)
    return min(ours, theirs)
