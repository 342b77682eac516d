"""Heartbeat bookkeeping for one connection, sans-IO: time comes in as ``now``.

Each end sends a heartbeat when it has sent nothing else for one interval, and
declares the other end dead when nothing at all has arrived for ``misses``
intervals. Any frame counts as a sign of life. An interval of 0 disables both.

One clock serves every link: a client connection and the server's side of it
(``heartbeat`` frames, driven by :class:`amqlite.link.FramedLink`) and a peering
link (``peer.heartbeat`` maps, driven by :class:`amqlite.peering.PeeringLink`). Both
ends of a connection use the interval :func:`negotiate_heartbeat` gives.
"""

from dataclasses import dataclass, field

INF = float("inf")


@dataclass(slots=True)
class HeartbeatClock:
    """When to send the next heartbeat and whether the other end has gone silent."""

    interval: float
    misses: int = 3
    last_received: float = field(default=0.0)
    last_sent: float = field(default=0.0)
    #: how many reasons we have not to read the other end now (an alarm blocking
    #: the connection, a full peering link holding its publisher back): its silence
    #: then proves nothing, so it is not held against it. Pauses nest.
    pauses: int = field(default=0)

    def start(self, now: float) -> None:
        self.last_received = now
        self.last_sent = now

    def received(self, now: float) -> None:
        self.last_received = now

    def sent(self, now: float) -> None:
        self.last_sent = now

    @property
    def paused(self) -> bool:
        return self.pauses > 0

    def pause(self) -> None:
        """Stop watching the other end's silence (we stopped reading it), until the
        matching :meth:`resume`."""
        self.pauses += 1

    def resume(self, now: float) -> None:
        """End one :meth:`pause`; once none is left, watch again, counting the
        silence from ``now``."""
        if self.pauses > 0:
            self.pauses -= 1
        if not self.pauses:
            self.last_received = now

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    # Each test compares ``now`` with the very sum next_deadline() returns, so a
    # shell that sleeps until the deadline always finds the event due (computing
    # ``now - last >= interval`` instead can miss by a rounding error, and spin).

    def send_due(self, now: float) -> bool:
        """True when we have been quiet for a whole interval."""
        return self.enabled and now >= self.last_sent + self.interval

    def remote_silent(self, now: float) -> bool:
        """True when the other end has been silent for ``misses`` intervals (never
        while paused)."""
        return (
            self.enabled
            and not self.paused
            and now >= self.last_received + self.interval * self.misses
        )

    def next_deadline(self) -> float:
        """The earliest time at which :meth:`send_due` or :meth:`remote_silent` may turn
        true (it depends on the recorded times only)."""
        if not self.enabled:
            return INF
        if self.paused:
            return self.last_sent + self.interval
        return min(self.last_sent + self.interval, self.last_received + self.interval * self.misses)


def negotiate_heartbeat(ours: float, theirs: float) -> float:
    """The interval both ends use: the smaller one, or whichever is nonzero (0: off)."""
    if ours <= 0 or theirs <= 0:
        return max(ours, theirs, 0.0)
    return min(ours, theirs)
