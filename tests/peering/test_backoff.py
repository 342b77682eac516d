"""Backoff bounds and jitter (seeded random source), and the link's timers:
retry after backoff, the address list, connect and handshake timeouts, heartbeats."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqlite.peering import (
    Address,
    Backoff,
    Connect,
    Disconnect,
    Heartbeat,
    Hello,
    LinkSettings,
    LinkState,
    PeeredExchange,
    PeeringLink,
    PeeringMode,
    Send,
)
from amqlite.protocol.heartbeat import negotiate_heartbeat

S = LinkState
INF = float("inf")


@given(st.lists(st.floats(min_value=0.0, max_value=0.999999), min_size=1, max_size=40))
def test_every_delay_lies_in_its_attempt_bounds(draws: list[float]) -> None:
    it = iter(draws)
    b = Backoff(lambda: next(it))
    for n in range(len(draws)):
        c = min(5.0, 0.1 * 2 ** (n + 1))
        delay = b.next_delay()
        assert 0.1 <= delay <= 5.0
        assert max(0.1, c / 2) <= delay <= c


def test_first_waits_and_the_ceiling() -> None:
    low = Backoff(lambda: 0.0)
    high = Backoff(lambda: 0.999999)
    assert [round(low.next_delay(), 3) for _ in range(8)] == [
        0.1,
        0.2,
        0.4,
        0.8,
        1.6,
        2.5,
        2.5,
        2.5,
    ]
    assert [round(high.next_delay(), 3) for _ in range(8)] == [
        0.2,
        0.4,
        0.8,
        1.6,
        3.2,
        5.0,
        5.0,
        5.0,
    ]
    assert low.ceiling(10_000) == 5.0  # no overflow however long the outage


def test_jitter_spreads_links_cut_at_once() -> None:
    rng = random.Random(42)
    links = [Backoff(rng.random) for _ in range(50)]
    for attempt in range(10):
        delays = [b.next_delay() for b in links]
        assert len({round(d, 6) for d in delays}) == 50
        c = min(5.0, 0.1 * 2 ** (attempt + 1))
        assert min(delays) >= c / 2 - 1e-9 or attempt == 0
        assert max(delays) - min(delays) > c / 10  # really spread over the range


def test_same_seed_same_delays_and_reset() -> None:
    a, b = Backoff(random.Random(7).random), Backoff(random.Random(7).random)
    assert [a.next_delay() for _ in range(6)] == [b.next_delay() for _ in range(6)]
    a.reset()
    assert a.attempts == 0 and a.next_delay() <= 0.2


def test_bad_bounds() -> None:
    with pytest.raises(ValueError):
        Backoff(random.random, initial=0)
    with pytest.raises(ValueError):
        Backoff(random.random, initial=2, maximum=1)


# --- the link's timers -------------------------------------------------------------------

P, B = Address("primary", 5555), Address("backup", 6666)


def _dialer(**options: object) -> PeeringLink:
    px = PeeredExchange(
        node_id="A", epoch=1, exchange="x", exchange_type="topic", rand=random.Random(1).random
    )
    settings = LinkSettings(name="l", addresses=(P, B), **options)  # type: ignore[arg-type]
    return px.add_link(settings)


def _up(link: PeeringLink, now: float, heartbeat: float = 1.0) -> None:
    link.start(now)
    link.connected(now)
    hello = Hello("B", "l", "/", "x", "topic", PeeringMode.PUBLISH, 1, heartbeat=heartbeat)
    link.receive(hello, now)
    assert link.state is S.UP


def test_failures_walk_the_address_list_with_growing_jittered_waits() -> None:
    link = _dialer()
    now = 0.0
    assert [a for a in link.start(now) if isinstance(a, Connect)] == [Connect("l", P)]
    targets, waits = [], []
    for _ in range(8):
        link.connection_lost(now, "refused")
        assert link.state is S.BACKOFF
        retry_at = link.next_deadline()
        waits.append(retry_at - now)
        assert link.tick(retry_at - 1e-6) == []  # not yet
        now = retry_at
        connects = [a for a in link.tick(now) if isinstance(a, Connect)]
        assert link.state is S.CONNECTING
        targets.append(connects[0].address)
    assert targets == [B, P, B, P, B, P, B, P]
    assert all(0.1 <= w <= 5.0 for w in waits)
    assert waits[5:] == sorted(waits[5:]) or max(waits[5:]) <= 5.0
    assert waits[0] <= 0.2 and waits[-1] >= 2.5
    assert link.stats(now)["reconnects"] == 8


def test_success_resets_the_backoff() -> None:
    link = _dialer()
    link.start(0.0)
    for _ in range(6):
        link.connection_lost(0.0)
        link.tick(link.next_deadline())
    link.connected(100.0)
    link.receive(Hello("B", "l", "/", "x", "topic", PeeringMode.PUBLISH, 1), 100.0)
    link.connection_lost(100.0)
    assert link.next_deadline() - 100.0 <= 0.2


def test_connect_and_handshake_time_out() -> None:
    link = _dialer(connect_timeout=2.0, heartbeat=0.0)
    link.start(0.0)
    assert link.next_deadline() == 2.0
    actions = link.tick(2.0)
    assert isinstance(actions[0], Disconnect) and link.state is S.BACKOFF
    assert "connect timed out" in link.last_error
    link.tick(link.next_deadline())
    link.connected(10.0)
    assert link.next_deadline() == 12.0
    actions = link.tick(12.0)
    assert isinstance(actions[0], Disconnect) and "handshake" in link.last_error


def test_heartbeats_are_sent_when_quiet_and_a_silent_remote_is_dead() -> None:
    link = _dialer(heartbeat=1.0, heartbeat_misses=3)
    _up(link, 0.0)
    assert link.next_deadline() == 1.0
    sent = link.tick(1.0)
    assert [type(a.message) for a in sent if isinstance(a, Send)] == [Heartbeat]
    assert link.tick(1.5) == []
    link.receive({"type": "peer.heartbeat"}, 1.5)  # any message is a sign of life
    link.tick(2.0)
    assert link.state is S.UP
    assert link.next_deadline() == 3.0
    link.tick(3.0)
    link.tick(4.0)
    actions = link.tick(4.5)
    assert isinstance(actions[0], Disconnect) and link.state is S.BACKOFF
    assert "silent" in link.last_error


def test_heartbeat_interval_is_negotiated() -> None:
    assert negotiate_heartbeat(1.0, 0.5) == 0.5
    assert negotiate_heartbeat(0.0, 0.5) == 0.5
    assert negotiate_heartbeat(2.0, 0.0) == 2.0
    assert negotiate_heartbeat(0.0, 0.0) == 0.0
    link = _dialer(heartbeat=1.0)
    _up(link, 0.0, heartbeat=0.25)
    assert link.clock.interval == 0.25
    assert link.next_deadline() == 0.25


def test_no_deadline_when_idle_or_closed() -> None:
    link = _dialer()
    assert link.next_deadline() == INF
    link.close(0.0)
    assert link.next_deadline() == INF and link.tick(100.0) == []


@given(st.floats(min_value=0, max_value=1e6), st.sampled_from([0.2, 0.3, 1.0, 0.1]))
def test_the_deadline_is_never_missed_by_a_rounding_error(start: float, interval: float) -> None:
    """A shell sleeps until next_deadline(); the tick at that instant must act (a
    heartbeat is due), or the shell would spin."""
    link = _dialer(heartbeat=interval)
    _up(link, start, heartbeat=interval)
    deadline = link.next_deadline()
    assert deadline > start
    assert any(isinstance(a, Send) for a in link.tick(deadline))
