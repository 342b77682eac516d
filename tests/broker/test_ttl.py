"""Message TTL: queue and per-message, counted from enqueue ``now``."""

from __future__ import annotations

from typing import Any

import pytest

from amqlite.broker import Broker, Session

from .support import bodies, drain, publish, queue_status

# (queue x-message-ttl, message expiration, last moment still there, first moment gone)
TTL_CASES = [
    (1000, None, 10.999, 11.0),
    (None, 500, 10.499, 10.5),
    (1000, 500, 10.499, 10.5),
    (1000, 2000, 10.999, 11.0),
    (0, None, None, 10.0),
    (None, 0, None, 10.0),
]


@pytest.mark.parametrize(("queue_ttl", "expiration", "alive_at", "gone_at"), TTL_CASES)
def test_effective_ttl_is_the_smaller_one(
    s: Session,
    broker: Broker,
    queue_ttl: int | None,
    expiration: int | None,
    alive_at: float | None,
    gone_at: float,
) -> None:
    arguments = {} if queue_ttl is None else {"x-message-ttl": queue_ttl}
    s.declare_queue("q", arguments=arguments)
    props: dict[str, Any] = {} if expiration is None else {"expiration": expiration}
    publish(s, "", "q", b"m", now=10.0, **props)
    if alive_at is not None:
        broker.tick(alive_at)
        assert queue_status(broker, "q")["messages"] == 1
    broker.tick(gone_at)
    assert queue_status(broker, "q")["messages"] == 0


def test_ttl_zero_still_reaches_a_waiting_consumer(s: Session) -> None:
    s.declare_queue("q", arguments={"x-message-ttl": 0})
    s.consume("q", now=0)
    publish(s, "", "q", b"m", now=5.0)
    assert bodies(s.take_deliveries()) == [b"m"]


def test_without_ttl_messages_stay(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    publish(s, "", "q", now=0)
    broker.tick(1e9)
    assert queue_status(broker, "q")["messages"] == 1


def test_expired_messages_are_never_pushed(s: Session) -> None:
    s.declare_queue("q", arguments={"x-message-ttl": 1000})
    publish(s, "", "q", b"old", now=0.0)
    publish(s, "", "q", b"new", now=1.5)
    s.consume("q", now=2.0)
    assert bodies(s.take_deliveries()) == [b"new"]


def test_expired_messages_are_never_got(s: Session) -> None:
    s.declare_queue("q")
    publish(s, "", "q", b"short", now=0.0, expiration=100)
    publish(s, "", "q", b"long", now=0.0, expiration=10_000)
    got = s.get("q", now=1.0)
    assert got is not None
    assert (got[0].message.body, got[1]) == (b"long", 0)


def test_tick_removes_expired_messages_behind_the_head(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    publish(s, "", "q", b"a", now=0.0, expiration=5000)
    publish(s, "", "q", b"b", now=0.0, expiration=1000)
    publish(s, "", "q", b"c", now=0.0)
    publish(s, "", "q", b"d", now=0.0, expiration=2000)
    broker.tick(1.5)
    assert queue_status(broker, "q")["messages"] == 3
    broker.tick(2.5)
    assert drain(s, "q", now=2.5) == [b"a", b"c"]


def test_tick_with_queue_ttl_expires_from_the_head(s: Session, broker: Broker) -> None:
    s.declare_queue("q", arguments={"x-message-ttl": 1000})
    for i in range(10):
        publish(s, "", "q", str(i).encode(), now=i * 0.1)
    broker.tick(1.45)
    assert drain(s, "q", now=1.45) == [b"5", b"6", b"7", b"8", b"9"]


def test_requeued_message_keeps_its_expiry(s: Session, broker: Broker) -> None:
    s.declare_queue("q", arguments={"x-message-ttl": 1000})
    publish(s, "", "q", b"m", now=0.0)
    s.consume("q", now=0.0)
    [d] = s.take_deliveries()
    s.nack(d.dtag, now=2.0)
    assert s.take_deliveries() == []
    status = queue_status(broker, "q")
    assert (status["messages"], status["unacked"]) == (0, 0)


def test_ack_without_now_uses_the_latest_time_seen(s: Session, broker: Broker) -> None:
    s.declare_queue("q", arguments={"x-message-ttl": 1000})
    publish(s, "", "q", b"a", now=0.0)
    publish(s, "", "q", b"b", now=0.0)
    s.consume("q", prefetch=1, now=0.0)
    [d] = s.take_deliveries()
    broker.tick(5.0)  # "b" expires here already; tick also advances the clock
    publish(s, "", "q", b"c", now=5.0)
    s.ack(d.dtag)
    assert bodies(s.take_deliveries()) == [b"c"]
