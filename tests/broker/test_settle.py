"""ack / nack / reject: single and multiple, unknown tags, requeue order, get."""

from __future__ import annotations

import pytest

from amqlite.broker import Broker, Delivery, Session
from amqlite.errors import PreconditionFailed

from .support import bodies, drain, publish, queue_status


def _deliver(s: Session, n: int, queue: str = "q") -> list[Delivery]:
    """Declare ``queue``, publish n messages b"0".."n-1" and consume them (manual ack)."""
    s.declare_queue(queue)
    for i in range(n):
        publish(s, "", queue, str(i).encode())
    s.consume(queue, now=0)
    return s.take_deliveries()


# (method, dtag, multiple) -> bodies settled out of b"0".."4" (dtags 1..5)
SETTLE_CASES = [
    ("ack", 3, False, [b"2"]),
    ("ack", 3, True, [b"0", b"1", b"2"]),
    ("ack", 5, True, [b"0", b"1", b"2", b"3", b"4"]),
    ("ack", 0, True, [b"0", b"1", b"2", b"3", b"4"]),
    ("nack", 1, False, [b"0"]),
    ("nack", 4, True, [b"0", b"1", b"2", b"3"]),
    ("nack", 0, True, [b"0", b"1", b"2", b"3", b"4"]),
]


@pytest.mark.parametrize(("method", "dtag", "multiple", "settled"), SETTLE_CASES)
def test_which_tags_are_settled(
    s: Session, broker: Broker, method: str, dtag: int, multiple: bool, settled: list[bytes]
) -> None:
    deliveries = _deliver(s, 5)
    if method == "ack":
        s.ack(dtag, multiple=multiple)
    else:
        s.nack(dtag, multiple=multiple, requeue=False)
    left = [d for d in deliveries if d.message.body not in settled]
    assert queue_status(broker, "q")["unacked"] == len(left)
    for d in left:
        s.ack(d.dtag)
    for d in deliveries:
        if d.message.body in settled:
            with pytest.raises(PreconditionFailed, match=f"unknown delivery tag {d.dtag}"):
                s.ack(d.dtag)


@pytest.mark.parametrize(
    ("method", "dtag", "multiple"),
    [
        ("ack", 9, False),
        ("ack", 9, True),
        ("ack", 0, False),
        ("nack", 9, False),
        ("nack", 9, True),
        ("reject", 9, False),
    ],
)
def test_unknown_tag_fails_and_settles_nothing(
    s: Session, broker: Broker, method: str, dtag: int, multiple: bool
) -> None:
    _deliver(s, 3)
    with pytest.raises(PreconditionFailed, match=f"unknown delivery tag {dtag}"):
        if method == "reject":
            s.reject(dtag)
        else:
            getattr(s, method)(dtag, multiple=multiple)
    assert queue_status(broker, "q")["unacked"] == 3


def test_acking_twice_fails(s: Session) -> None:
    [d] = _deliver(s, 1)
    s.ack(d.dtag)
    with pytest.raises(PreconditionFailed):
        s.ack(d.dtag)


def test_requeue_goes_to_the_head_in_original_order(s: Session) -> None:
    s.declare_queue("q")
    for i in range(5):
        publish(s, "", "q", str(i).encode())
    tag = s.consume("q", prefetch=3, now=0)
    deliveries = s.take_deliveries()
    assert bodies(deliveries) == [b"0", b"1", b"2"]
    s.cancel(tag)
    s.nack(deliveries[2].dtag, multiple=True)
    got = [s.get("q", no_ack=True, now=0) for _ in range(5)]
    assert [(g[0].message.body, g[0].redelivered) for g in got if g] == [
        (b"0", True),
        (b"1", True),
        (b"2", True),
        (b"3", False),
        (b"4", False),
    ]


@pytest.mark.parametrize("method", ["nack", "reject"])
def test_requeued_message_is_redelivered_to_a_consumer(s: Session, method: str) -> None:
    [d] = _deliver(s, 1)
    assert d.redelivered is False
    getattr(s, method)(d.dtag, requeue=True)
    [again] = s.take_deliveries()
    assert (again.message, again.redelivered) == (d.message, True)
    assert again.dtag > d.dtag


@pytest.mark.parametrize("method", ["nack", "reject"])
def test_not_requeued_without_dlx_is_dropped(s: Session, broker: Broker, method: str) -> None:
    [d] = _deliver(s, 1)
    getattr(s, method)(d.dtag, requeue=False)
    status = queue_status(broker, "q")
    assert (status["messages"], status["unacked"]) == (0, 0)
    assert s.take_deliveries() == []


def test_settling_deliveries_of_a_deleted_queue_is_a_no_op(
    s: Session, t: Session, broker: Broker
) -> None:
    deliveries = _deliver(s, 3)
    t.delete_queue("q")
    assert s.take_cancellations() == [("ctag-1", 404, "queue 'q' in vhost '/' deleted")]
    s.ack(deliveries[0].dtag)
    s.nack(deliveries[1].dtag, requeue=True)
    s.reject(deliveries[2].dtag, requeue=False)
    s.declare_queue("q")
    assert queue_status(broker, "q")["unacked"] == 0
    assert drain(s, "q") == []


# --- get -------------------------------------------------------------------------------


def test_get_returns_none_when_empty(s: Session) -> None:
    s.declare_queue("q")
    assert s.get("q", now=0) is None


def test_get_takes_in_order_with_remaining_count(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    for body in (b"a", b"b", b"c"):
        publish(s, "", "q", body)
    got = s.get("q", now=0)
    assert got is not None
    d, remaining = got
    assert (d.ctag, d.dtag, d.queue, d.message.body, d.redelivered, remaining) == (
        "",
        1,
        "q",
        b"a",
        False,
        2,
    )
    assert queue_status(broker, "q")["unacked"] == 1
    s.ack(d.dtag)
    assert queue_status(broker, "q")["unacked"] == 0


def test_get_no_ack_needs_no_ack(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    publish(s, "", "q")
    got = s.get("q", no_ack=True, now=0)
    assert got is not None
    assert queue_status(broker, "q")["unacked"] == 0
    with pytest.raises(PreconditionFailed):
        s.ack(got[0].dtag)


def test_get_delivery_requeued_is_redelivered(s: Session) -> None:
    s.declare_queue("q")
    publish(s, "", "q", b"m")
    got = s.get("q", now=0)
    assert got is not None
    s.reject(got[0].dtag)
    again = s.get("q", now=0)
    assert again is not None
    assert (again[0].message.body, again[0].redelivered, again[0].dtag) == (b"m", True, 2)
