"""Dead-lettering: headers of the copy, routing key, missing DLX, cycle rule."""

from __future__ import annotations

from typing import Any

import pytest

from amqlite.broker import Broker, Message, Session

from .support import drain, publish, queue_status


def _dlq(s: Session, **dl_args: Any) -> None:
    """Queue "q" dead-letters through fanout "dlx" into "dead"."""
    s.declare_exchange("dlx", "fanout")
    s.declare_queue("dead")
    s.bind("dead", "dlx")
    s.declare_queue("q", arguments={"x-dead-letter-exchange": "dlx", **dl_args})


def _take(s: Session, queue: str, now: float = 0.0) -> Message:
    got = s.get(queue, no_ack=True, now=now)
    assert got is not None
    return got[0].message


def _die(s: Session, broker: Broker, reason: str) -> None:
    """Make the one message in "q" die for ``reason``."""
    if reason == "expired":
        broker.tick(100.0)
    elif reason == "rejected":
        got = s.get("q", now=0)
        assert got is not None
        s.reject(got[0].dtag, requeue=False)
    else:
        raise AssertionError(reason)


@pytest.mark.parametrize("reason", ["expired", "rejected"])
def test_dead_letter_copy_carries_the_death(s: Session, broker: Broker, reason: str) -> None:
    _dlq(s, **({"x-message-ttl": 10} if reason == "expired" else {}))
    s.bind("q", "amq.direct", "orig-key")
    publish(s, "amq.direct", "orig-key", b"body", headers={"user": "kept"}, now=0, message_id="m1")
    _die(s, broker, reason)
    dead = _take(s, "dead", now=100.0)
    assert (dead.exchange, dead.routing_key, dead.body) == ("dlx", "orig-key", b"body")
    assert dead.headers == {
        "user": "kept",
        "x-death-reason": reason,
        "x-death-queue": "q",
        "x-death-exchange": "amq.direct",
        "x-death-count": 1,
    }
    assert dead.properties == {"message_id": "m1"}
    assert queue_status(broker, "q")["messages"] == 0


def test_dead_letter_routing_key_replaces_the_key(s: Session) -> None:
    s.declare_queue("target")
    s.declare_queue(
        "q", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "target"}
    )
    publish(s, "", "q", b"m")
    got = s.get("q", now=0)
    assert got is not None
    s.nack(got[0].dtag, requeue=False)
    assert _take(s, "target").routing_key == "target"


def test_expiration_is_removed_and_the_original_untouched(s: Session, broker: Broker) -> None:
    _dlq(s)
    original = Message("", "q", b"m", {"h": 1}, {"expiration": 10, "priority": 1})
    s.publish(original, now=0)
    broker.tick(1.0)
    dead = _take(s, "dead", now=1.0)
    assert dead.properties == {"priority": 1}
    assert original.headers == {"h": 1}
    assert original.properties == {"expiration": 10, "priority": 1}


def test_missing_dead_letter_exchange_drops(s: Session, broker: Broker) -> None:
    s.declare_queue("q", arguments={"x-dead-letter-exchange": "nowhere", "x-message-ttl": 1})
    publish(s, "", "q", now=0)
    broker.tick(1.0)
    assert queue_status(broker, "q")["messages"] == 0


def test_dead_letter_exchange_may_be_internal(s: Session, broker: Broker) -> None:
    s.declare_exchange("dlx", "fanout", internal=True)
    s.declare_queue("dead")
    s.bind("dead", "dlx")
    s.declare_queue("q", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 1})
    publish(s, "", "q", b"m", now=0)
    broker.tick(1.0)
    assert drain(s, "dead") == [b"m"]


def test_dead_letter_goes_straight_to_a_waiting_consumer(
    s: Session, t: Session, broker: Broker
) -> None:
    _dlq(s, **{"x-message-ttl": 5})
    t.consume("dead", now=0)
    publish(s, "", "q", b"m", now=0)
    broker.tick(1.0)
    assert broker.take_ready() == [t]
    [d] = t.take_deliveries()
    assert d.message.headers["x-death-reason"] == "expired"


def test_death_count_increments(s: Session) -> None:
    s.declare_queue("q", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q"})
    publish(s, "", "q", b"m")
    counts = []
    got = s.get("q", now=0)
    for _ in range(3):
        assert got is not None
        s.reject(got[0].dtag, requeue=False)
        got = s.get("q", now=0)
        assert got is not None
        counts.append(got[0].message.headers["x-death-count"])
    assert counts == [1, 2, 3]


def test_expiry_cycle_into_the_same_queue_is_dropped(s: Session, broker: Broker) -> None:
    s.declare_queue(
        "q",
        arguments={
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "q",
            "x-message-ttl": 10,
        },
    )
    publish(s, "", "q", now=0)
    broker.tick(1.0)
    assert queue_status(broker, "q")["messages"] == 0


def test_expiry_cycle_through_two_queues_is_dropped(s: Session, broker: Broker) -> None:
    for name, other in (("q1", "q2"), ("q2", "q1")):
        s.declare_queue(
            name,
            arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": other,
                "x-message-ttl": 10,
            },
        )
    publish(s, "", "q1", b"m", now=0)
    broker.tick(1.0)
    assert (queue_status(broker, "q1")["messages"], queue_status(broker, "q2")["messages"]) == (
        0,
        1,
    )
    broker.tick(2.0)
    assert (queue_status(broker, "q1")["messages"], queue_status(broker, "q2")["messages"]) == (
        0,
        0,
    )


def test_cycle_with_a_rejection_in_it_continues(s: Session, broker: Broker) -> None:
    s.declare_queue(
        "q1",
        arguments={
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "q2",
            "x-message-ttl": 10,
        },
    )
    s.declare_queue(
        "q2", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q1"}
    )
    publish(s, "", "q2", b"m", now=0)
    for _ in range(2):
        got = s.get("q2", now=0)
        assert got is not None
        s.reject(got[0].dtag, requeue=False)  # -> q1
        broker.tick(1.0)  # expires in q1 -> q2, allowed: it was rejected in q2 since
    assert queue_status(broker, "q2")["messages"] == 1
    broker.tick(2.0)
    assert _take(s, "q2", now=2.0).headers["x-death-count"] == 4


def test_cycle_detection_ignores_user_headers(s: Session, broker: Broker) -> None:
    s.declare_queue(
        "q0", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q1"}
    )
    s.declare_queue("q1")
    publish(s, "", "q0", b"m", headers={"x-death-queue": "q1", "x-death-reason": "expired"})
    got = s.get("q0", now=0)
    assert got is not None
    s.reject(got[0].dtag, requeue=False)
    assert drain(s, "q1") == [b"m"]
