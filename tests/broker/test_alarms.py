"""The alarm state machine: every (state, reading) pair, and hysteresis properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqlite.broker.alarms import (
    TRANSITIONS,
    Alarm,
    AlarmChange,
    Alarms,
    AlarmState,
    Change,
    Reading,
    Resource,
    blocking,
)

LIMIT = 1_000_000

# (state, reading) -> (next state, change): the whole table, written out
TABLE = [
    (AlarmState.CLEAR, Reading.PAST, AlarmState.RAISED, Change.RAISE),
    (AlarmState.CLEAR, Reading.BAND, AlarmState.CLEAR, None),
    (AlarmState.CLEAR, Reading.BACK, AlarmState.CLEAR, None),
    (AlarmState.RAISED, Reading.PAST, AlarmState.RAISED, None),
    (AlarmState.RAISED, Reading.BAND, AlarmState.RAISED, None),
    (AlarmState.RAISED, Reading.BACK, AlarmState.CLEAR, Change.CLEAR),
]


def test_the_table_covers_every_pair() -> None:
    assert set(TRANSITIONS) == {(s, r) for s in AlarmState for r in Reading}


@pytest.mark.parametrize(("state", "reading", "after", "change"), TABLE)
def test_transitions(
    state: AlarmState, reading: Reading, after: AlarmState, change: Change | None
) -> None:
    assert TRANSITIONS[(state, reading)] == (after, change)


# value -> reading, for a memory mark of 1,000,000 bytes and a 5% band
MEMORY_READINGS = [
    (0, Reading.BACK),
    (949_999, Reading.BACK),
    (950_000, Reading.BAND),
    (999_999, Reading.BAND),
    (1_000_000, Reading.PAST),
    (5_000_000, Reading.PAST),
]
# free bytes -> reading, for a disk limit of 1,000,000 bytes
DISK_READINGS = [
    (0, Reading.PAST),
    (999_999, Reading.PAST),
    (1_000_000, Reading.BAND),
    (1_049_999, Reading.BAND),
    (1_050_000, Reading.BACK),
    (10**12, Reading.BACK),
]


@pytest.mark.parametrize(("value", "reading"), MEMORY_READINGS)
def test_memory_readings(value: int, reading: Reading) -> None:
    assert Alarm(Resource.MEMORY, LIMIT).reading(value) is reading


@pytest.mark.parametrize(("value", "reading"), DISK_READINGS)
def test_disk_readings(value: int, reading: Reading) -> None:
    assert Alarm(Resource.DISK, LIMIT).reading(value) is reading


def test_a_disk_limit_of_zero_never_raises() -> None:
    alarm = Alarm(Resource.DISK, 0)
    assert alarm.measure(0) is None
    assert not alarm.raised


def test_memory_raise_then_clear_report_the_measurement() -> None:
    alarms = Alarms(memory_limit=LIMIT, disk_free_limit=LIMIT)
    raised = alarms.measure(Resource.MEMORY, 1_200_000)
    assert raised == AlarmChange(Resource.MEMORY, Change.RAISE, 1_200_000, LIMIT)
    assert raised.raised
    assert alarms.raised == {Resource.MEMORY}
    assert alarms.measure(Resource.MEMORY, 1_100_000) is None  # still raised: no news
    assert alarms.measure(Resource.MEMORY, 960_000) is None  # in the band: still raised
    cleared = alarms.measure(Resource.MEMORY, 900_000)
    assert cleared == AlarmChange(Resource.MEMORY, Change.CLEAR, 900_000, LIMIT)
    assert alarms.raised == frozenset()
    memory, disk = alarms.status()
    assert memory == {"resource": "memory", "raised": False, "value": 900_000, "limit": LIMIT}
    assert disk["value"] is None


def test_the_two_alarms_are_independent() -> None:
    alarms = Alarms(memory_limit=LIMIT, disk_free_limit=LIMIT)
    alarms.measure(Resource.DISK, 10)
    assert alarms.raised == {Resource.DISK}
    alarms.measure(Resource.MEMORY, 2 * LIMIT)
    assert alarms.raised == {Resource.MEMORY, Resource.DISK}
    alarms.measure(Resource.DISK, 2 * LIMIT)
    assert alarms.raised == {Resource.MEMORY}


BLOCKING = [
    # raised, published, persistent -> blocked by
    (set(), True, True, None),
    ({Resource.MEMORY}, False, False, None),  # a pure consumer is never blocked
    ({Resource.MEMORY}, True, False, Resource.MEMORY),
    ({Resource.MEMORY}, True, True, Resource.MEMORY),
    ({Resource.DISK}, True, False, None),  # transient publishers go on under the disk alarm
    ({Resource.DISK}, True, True, Resource.DISK),
    ({Resource.MEMORY, Resource.DISK}, True, True, Resource.MEMORY),
    ({Resource.MEMORY, Resource.DISK}, False, False, None),
]


@pytest.mark.parametrize(("raised", "published", "persistent", "by"), BLOCKING)
def test_blocking(
    raised: set[Resource], published: bool, persistent: bool, by: Resource | None
) -> None:
    assert blocking(frozenset(raised), published=published, persistent=persistent) is by


def test_reasons_are_rabbitmqs() -> None:
    assert Resource.MEMORY.reason == "low on memory"
    assert Resource.DISK.reason == "low on disk"


# --- properties ----------------------------------------------------------------------

limits = st.integers(min_value=1_000, max_value=10**12)
hysteresis = st.floats(min_value=0.01, max_value=0.5)
fractions = st.lists(st.floats(min_value=0.0, max_value=3.0), max_size=50)
resources = st.sampled_from(list(Resource))


def _value(resource: Resource, limit: int, fraction: float) -> int:
    return int(limit * fraction)


@given(resources, limits, hysteresis, fractions)
def test_a_reading_past_the_mark_always_leaves_it_raised(
    resource: Resource, limit: int, band: float, values: list[float]
) -> None:
    alarm = Alarm(resource, limit, band)
    for fraction in values:
        alarm.measure(_value(resource, limit, fraction))
    past = limit if resource is Resource.MEMORY else limit - 1
    alarm.measure(past)
    assert alarm.raised


@given(resources, limits, hysteresis, fractions)
def test_a_reading_clearly_back_always_clears_it(
    resource: Resource, limit: int, band: float, values: list[float]
) -> None:
    alarm = Alarm(resource, limit, band)
    for fraction in values:
        alarm.measure(_value(resource, limit, fraction))
    if resource is Resource.MEMORY:
        back = int(limit * (1 - band)) - 1
    else:
        back = int(limit * (1 + band)) + 1
    alarm.measure(back)
    assert not alarm.raised


@given(resources, limits, hysteresis, st.booleans(), st.lists(st.floats(0.0, 1.0), max_size=50))
def test_it_never_flaps_within_the_band(
    resource: Resource, limit: int, band: float, start_raised: bool, positions: list[float]
) -> None:
    """However a measurement wanders inside the band, nothing changes."""
    alarm = Alarm(resource, limit, band)
    if start_raised:
        alarm.measure(0 if resource is Resource.DISK else limit)
    state = alarm.state
    if resource is Resource.MEMORY:
        low, high = limit * (1 - band), limit - 1  # [low, limit)
    else:
        low, high = limit, limit * (1 + band)  # [limit, high)
    for position in positions:
        value = int(low + (high - low) * position)
        if not low <= value < max(high, low + 1) or alarm.reading(value) is not Reading.BAND:
            continue  # rounding took it out of the band
        assert alarm.measure(value) is None
        assert alarm.state is state


@given(resources, limits, hysteresis, fractions)
def test_changes_alternate_and_match_the_state(
    resource: Resource, limit: int, band: float, values: list[float]
) -> None:
    alarm = Alarm(resource, limit, band)
    raised = False
    for fraction in values:
        change = alarm.measure(_value(resource, limit, fraction))
        if change is not None:
            assert change.raised is not raised  # raise, clear, raise...
            raised = change.raised
        assert alarm.raised is raised
