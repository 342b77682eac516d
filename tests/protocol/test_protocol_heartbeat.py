"""HeartbeatClock: heartbeats due after one quiet interval, the peer dead after
``misses`` silent intervals; time only ever comes in as ``now``."""

from __future__ import annotations

import math

import pytest

from amqlite.protocol import HeartbeatClock


def test_send_due_after_one_quiet_interval() -> None:
    clock = HeartbeatClock(interval=10.0)
    clock.start(100.0)
    assert not clock.send_due(100.0)
    assert not clock.send_due(109.999)
    assert clock.send_due(110.0)
    assert clock.send_due(500.0)


def test_sending_anything_restarts_the_quiet_interval() -> None:
    clock = HeartbeatClock(interval=10.0)
    clock.start(100.0)
    clock.sent(108.0)
    assert not clock.send_due(110.0)
    assert not clock.send_due(117.9)
    assert clock.send_due(118.0)


def test_receiving_does_not_make_a_heartbeat_unnecessary() -> None:
    clock = HeartbeatClock(interval=10.0)
    clock.start(100.0)
    clock.received(109.0)
    assert clock.send_due(110.0)


def test_peer_dead_after_three_silent_intervals_by_default() -> None:
    clock = HeartbeatClock(interval=10.0)
    assert clock.misses == 3
    clock.start(100.0)
    assert not clock.remote_silent(129.999)
    assert clock.remote_silent(130.0)


def test_any_frame_from_the_peer_keeps_it_alive() -> None:
    clock = HeartbeatClock(interval=10.0)
    clock.start(100.0)
    clock.received(125.0)
    assert not clock.remote_silent(130.0)
    assert not clock.remote_silent(154.999)
    assert clock.remote_silent(155.0)


def test_sending_does_not_keep_the_peer_alive() -> None:
    clock = HeartbeatClock(interval=10.0)
    clock.start(100.0)
    for t in range(101, 131):
        clock.sent(float(t))
    assert clock.remote_silent(130.0)


@pytest.mark.parametrize("misses", [1, 2, 5])
def test_misses_is_configurable(misses: int) -> None:
    clock = HeartbeatClock(interval=2.0, misses=misses)
    clock.start(0.0)
    assert not clock.remote_silent(2.0 * misses - 0.001)
    assert clock.remote_silent(2.0 * misses)


def test_next_deadline_is_the_earlier_of_send_and_death() -> None:
    clock = HeartbeatClock(interval=10.0)
    clock.start(100.0)
    assert clock.next_deadline() == 110.0  # our heartbeat first
    clock.sent(125.0)
    assert clock.next_deadline() == 130.0  # the peer's death first
    clock.received(126.0)
    assert clock.next_deadline() == 135.0


def test_next_deadline_is_when_the_answers_change() -> None:
    clock = HeartbeatClock(interval=5.0)
    clock.start(0.0)
    clock.sent(3.0)
    clock.received(4.0)
    deadline = clock.next_deadline()
    assert deadline == 8.0
    assert not clock.send_due(deadline - 0.001) and clock.send_due(deadline)
    clock.sent(deadline)
    deadline = clock.next_deadline()
    assert deadline == 13.0
    clock.sent(13.0)
    assert clock.next_deadline() == 18.0
    clock.sent(18.0)
    assert clock.next_deadline() == 19.0  # 4.0 + 3 * 5.0
    assert not clock.remote_silent(18.999) and clock.remote_silent(19.0)


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_disabled_clock_never_fires(interval: float) -> None:
    clock = HeartbeatClock(interval=interval)
    clock.start(0.0)
    assert not clock.enabled
    assert not clock.send_due(1e12)
    assert not clock.remote_silent(1e12)
    assert math.isinf(clock.next_deadline())


def test_enabled_with_a_positive_interval() -> None:
    assert HeartbeatClock(interval=0.2).enabled


def test_waking_at_the_deadline_always_finds_it_due() -> None:
    """0.7 + 0.1 - 0.7 < 0.1 in floating point: a deadline computed one way and a
    check done the other way would make the watchdog spin."""
    from amqlite.protocol import HeartbeatClock

    for last in (0.7, 1.1, 3.3, 1e6 + 0.7):
        for interval in (0.1, 0.2, 0.3):
            clock = HeartbeatClock(interval)
            clock.start(last)
            deadline = clock.next_deadline()
            assert clock.send_due(deadline)
            clock.sent(deadline)
            clock.received(deadline)
            dead_at = deadline + interval * clock.misses
            assert clock.remote_silent(dead_at)


def test_a_paused_clock_holds_no_silence_against_the_other_end() -> None:
    clock = HeartbeatClock(interval=10.0)
    clock.start(100.0)
    clock.pause()  # we stopped reading (a connection blocked by an alarm)
    assert not clock.remote_silent(1_000.0)
    assert clock.send_due(110.0)  # our own heartbeats still go out
    clock.sent(1_000.0)
    assert clock.next_deadline() == 1_010.0  # only our next heartbeat
    clock.resume(1_000.0)  # silence counts from the resume
    assert not clock.remote_silent(1_029.9)
    assert clock.remote_silent(1_030.0)


def test_pauses_nest_and_the_silence_counts_from_the_last_resume() -> None:
    """An alarm and a full peering link may each stop a connection's reads: its
    silence is not held against it until both let go, and then counts from then."""
    clock = HeartbeatClock(interval=10.0)
    clock.start(100.0)
    clock.pause()  # an alarm
    clock.pause()  # a full peering link
    assert not clock.remote_silent(1000.0)
    clock.resume(1000.0)  # the alarm cleared: still not read
    assert clock.paused and not clock.remote_silent(5000.0)
    clock.resume(5000.0)
    assert not clock.paused
    assert not clock.remote_silent(5029.9)
    assert clock.remote_silent(5030.0)
    clock.resume(6000.0)  # an unmatched resume changes nothing but the start
    assert not clock.paused and clock.pauses == 0
