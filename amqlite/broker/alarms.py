"""Memory and disk alarms, sans-IO: measurements in, "raise" or "clear" out.

Every state transition of an alarm lives in :data:`TRANSITIONS`, and nothing else
assigns an alarm's state. A measurement is first read against the alarm's mark
(:class:`Reading`): past it, inside the hysteresis band, or clearly back. An alarm
is raised by a reading past the mark and cleared only by one clearly back, so a
measurement that wanders inside the band never makes it flap::

    CLEAR --past--> RAISED --back--> CLEAR
    (band and the other pairs change nothing)

The memory alarm is past its mark when the memory used is at or above the
watermark, and clearly back below ``watermark * (1 - hysteresis)``. The disk
alarm is past its mark when the free space is below the limit, and clearly back
at ``limit * (1 + hysteresis)`` or more (a limit of 0 never raises it).

The shell (:mod:`amqlite.server.alarms`) measures on a timer, feeds
:meth:`Alarms.measure`, logs the changes and blocks publishers: :func:`blocking`
says which raised alarm blocks a connection, given what it has published.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

#: The band around a mark that keeps an alarm as it is (a fraction of the mark).
HYSTERESIS = 0.05


class Resource(Enum):
    """What an alarm watches."""

    MEMORY = "memory"
    DISK = "disk"

    @property
    def reason(self) -> str:
        """The reason a blocked connection is given (RabbitMQ's words)."""
        return "low on memory" if self is Resource.MEMORY else "low on disk"


class AlarmState(Enum):
    CLEAR = "clear"
    RAISED = "raised"


class Reading(Enum):
    """A measurement against an alarm's mark."""

    PAST = "past"  # past the mark: memory at or above it, free disk below it
    BAND = "band"  # not past it, but within the hysteresis band
    BACK = "back"  # clearly back on the safe side


class Change(Enum):
    RAISE = "raise"
    CLEAR = "clear"


S, R, C = AlarmState, Reading, Change

TRANSITIONS: dict[tuple[AlarmState, Reading], tuple[AlarmState, Change | None]] = {
    (S.CLEAR, R.PAST): (S.RAISED, C.RAISE),
    (S.CLEAR, R.BAND): (S.CLEAR, None),
    (S.CLEAR, R.BACK): (S.CLEAR, None),
    (S.RAISED, R.PAST): (S.RAISED, None),
    (S.RAISED, R.BAND): (S.RAISED, None),
    (S.RAISED, R.BACK): (S.CLEAR, C.CLEAR),
}


@dataclass(frozen=True, slots=True)
class AlarmChange:
    """An alarm was raised or cleared by a measurement of ``value`` (bytes)
    against ``limit`` (bytes)."""

    resource: Resource
    change: Change
    value: int
    limit: int

    @property
    def raised(self) -> bool:
        return self.change is Change.RAISE


class Alarm:
    """One resource's alarm: a mark in bytes, a hysteresis band, a state."""

    def __init__(self, resource: Resource, limit: int, hysteresis: float = HYSTERESIS) -> None:
        if not 0 <= hysteresis < 1:
            raise ValueError(f"hysteresis must be in [0, 1), got {hysteresis}")
        self.resource = resource
        self.limit = limit
        self.hysteresis = hysteresis
        self.state = AlarmState.CLEAR
        #: the last value measured (None: never measured)
        self.value: int | None = None

    @property
    def raised(self) -> bool:
        return self.state is AlarmState.RAISED

    def reading(self, value: int) -> Reading:
        """Where ``value`` lies against the mark."""
        limit = self.limit
        if self.resource is Resource.MEMORY:  # used memory: higher is worse
            if value >= limit:
                return Reading.PAST
            return Reading.BACK if value < limit * (1 - self.hysteresis) else Reading.BAND
        # free disk: lower is worse
        if value < limit:
            return Reading.PAST
        return Reading.BACK if value >= limit * (1 + self.hysteresis) else Reading.BAND

    def measure(self, value: int) -> AlarmChange | None:
        """Take a measurement; the change it makes, if any."""
        self.value = value
        self.state, change = TRANSITIONS[(self.state, self.reading(value))]
        if change is None:
            return None
        return AlarmChange(self.resource, change, value, self.limit)

    def status(self) -> dict[str, object]:
        return {
            "resource": self.resource.value,
            "raised": self.raised,
            "value": self.value,
            "limit": self.limit,
        }


class Alarms:
    """A node's memory and disk alarms."""

    def __init__(
        self, memory_limit: int, disk_free_limit: int, hysteresis: float = HYSTERESIS
    ) -> None:
        self.alarms = {
            Resource.MEMORY: Alarm(Resource.MEMORY, memory_limit, hysteresis),
            Resource.DISK: Alarm(Resource.DISK, disk_free_limit, hysteresis),
        }

    def measure(self, resource: Resource, value: int) -> AlarmChange | None:
        return self.alarms[resource].measure(value)

    @property
    def raised(self) -> frozenset[Resource]:
        return frozenset(r for r, alarm in self.alarms.items() if alarm.raised)

    def status(self) -> list[dict[str, object]]:
        return [alarm.status() for alarm in self.alarms.values()]


def blocking(raised: frozenset[Resource], *, published: bool, persistent: bool) -> Resource | None:
    """The raised alarm that blocks a connection, or None.

    The memory alarm blocks a connection that has published anything; the disk
    alarm one that has published a persistent message. A connection that only
    consumes is never blocked, so consumers keep draining.
    """
    if published and Resource.MEMORY in raised:
        return Resource.MEMORY
    if persistent and Resource.DISK in raised:
        return Resource.DISK
    return None
