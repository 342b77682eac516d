"""Session lifecycle: close, exclusive and auto-delete queues, cancellations."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from amqlite.broker import Broker, Session
from amqlite.errors import BrokerError, NotFound, ReplyCode

from .support import bodies, drain, msg, publish, queue_status


def test_close_requeues_unacked_in_order_as_redelivered(s: Session, t: Session) -> None:
    s.declare_queue("q")
    for i in range(5):
        publish(t, "", "q", str(i).encode())
    s.consume("q", prefetch=3, now=0)
    first = s.take_deliveries()
    s.ack(first[1].dtag)  # frees credit: "3" is pushed
    assert bodies(s.take_deliveries()) == [b"3"]
    s.close(now=1.0)
    assert drain_with_flags(t, "q") == [(b"0", True), (b"2", True), (b"3", True), (b"4", False)]


def drain_with_flags(s: Session, queue: str) -> list[tuple[bytes, bool]]:
    out = []
    while (got := s.get(queue, no_ack=True, now=0)) is not None:
        out.append((got[0].message.body, got[0].redelivered))
    return out


def test_close_hands_unacked_to_other_consumers(s: Session, t: Session, broker: Broker) -> None:
    s.declare_queue("q")
    s.consume("q", prefetch=2, now=0)
    t.consume("q", prefetch=1, now=0)
    for i in range(3):
        publish(s, "", "q", str(i).encode())
    assert bodies(s.take_deliveries()) == [b"0", b"2"]
    [d] = t.take_deliveries()
    broker.take_ready()
    s.close(now=0)
    assert broker.take_ready() == []  # t has no credit until it acks
    t.ack(d.dtag)
    assert broker.take_ready() == [t]
    [again] = t.take_deliveries()
    assert (again.message.body, again.redelivered) == (b"0", True)


def test_close_drops_pending_pushes_and_leaves_take_ready(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    s.consume("q", now=0)
    publish(s, "", "q")
    s.close(now=0)
    assert broker.take_ready() == []
    assert s.take_deliveries() == []
    assert s.closed


def test_closed_session_refuses_requests(s: Session) -> None:
    s.declare_queue("q")
    s.close(now=0)
    requests: list[Callable[[], object]] = [
        lambda: s.declare_queue("q2"),
        lambda: s.declare_exchange("x", "direct"),
        lambda: s.delete_exchange("x"),
        lambda: s.delete_queue("q"),
        lambda: s.purge_queue("q"),
        lambda: s.bind("q", "amq.direct"),
        lambda: s.unbind("q", "amq.direct"),
        lambda: s.publish(msg("", "q"), now=0),
        lambda: s.consume("q", now=0),
        lambda: s.cancel("c"),
        lambda: s.ack(1),
        lambda: s.nack(1, now=0),
        lambda: s.reject(1, now=0),
        lambda: s.get("q", now=0),
    ]
    for request in requests:
        with pytest.raises(BrokerError) as err:
            request()
        assert err.value.code == ReplyCode.CHANNEL_ERROR
    s.close(now=0)  # twice is fine
    s.set_writable(True)


def test_exclusive_queue_dies_with_its_session(s: Session, t: Session) -> None:
    s.declare_queue("x", exclusive=True)
    publish(t, "", "x")
    s.close(now=0)
    with pytest.raises(NotFound):
        t.declare_queue("x", passive=True)
    t.declare_queue("x", exclusive=True)


def test_deleted_exclusive_queue_is_forgotten_by_its_owner(s: Session, t: Session) -> None:
    s.declare_queue("x", exclusive=True)
    s.delete_queue("x")
    t.declare_queue("x")
    s.close(now=0)
    assert t.declare_queue("x", passive=True).name == "x"


def test_channels_of_one_connection_share_its_exclusive_queues(broker: Broker, t: Session) -> None:
    """AMQP: each channel is a session, the connection's holder session holds the
    exclusive queues: any channel may use them, another connection may not, and
    they live until the connection (the holder) closes."""
    holder = broker.open_session("/")
    one = broker.open_session("/", holder=holder)
    two = broker.open_session("/", holder=holder)
    one.declare_queue("x", exclusive=True)
    publish(t, "", "x")  # publishing to it is allowed to anyone, as in RabbitMQ
    assert two.declare_queue("x", exclusive=True, passive=True).messages == 1
    two.consume("x", now=0)
    with pytest.raises(BrokerError) as caught:
        t.consume("x", now=0)
    assert caught.value.code == ReplyCode.RESOURCE_LOCKED
    one.close(now=0)
    two.close(now=0)
    three = broker.open_session("/", holder=holder)  # a channel opened later
    assert three.declare_queue("x", passive=True).name == "x"  # outlived its channels
    holder.close(now=0)
    with pytest.raises(NotFound):
        t.declare_queue("x", passive=True)


def test_a_holder_must_be_on_the_same_vhost(broker: Broker) -> None:
    holder = broker.open_session("/")
    with pytest.raises(ValueError, match="holder"):
        broker.open_session("other", holder=holder)


def test_auto_delete_queue_goes_with_its_last_consumer(s: Session, t: Session) -> None:
    s.declare_queue("a", auto_delete=True)
    c1 = s.consume("a", now=0)
    c2 = t.consume("a", now=0)
    s.cancel(c1)
    t.declare_queue("a", auto_delete=True, passive=True)
    t.cancel(c2)
    with pytest.raises(NotFound):
        t.declare_queue("a", passive=True)


def test_auto_delete_queue_without_consumers_ever_stays(s: Session, broker: Broker) -> None:
    s.declare_queue("a", auto_delete=True)
    publish(s, "", "a")
    s.close(now=0)
    assert queue_status(broker, "a")["messages"] == 1


def test_close_deletes_auto_delete_queues_it_was_last_consumer_of(s: Session, t: Session) -> None:
    t.declare_queue("a", auto_delete=True)
    s.consume("a", now=0)
    s.close(now=0)
    with pytest.raises(NotFound):
        t.declare_queue("a", passive=True)


def test_queue_deletion_cancels_consumers_of_every_session(
    s: Session, t: Session, broker: Broker
) -> None:
    s.declare_queue("q")
    s.consume("q", tag="mine", now=0)
    t.consume("q", tag="theirs", now=0)
    s.delete_queue("q")
    text = "queue 'q' in vhost '/' deleted"
    assert set(broker.take_ready()) == {s, t}
    assert s.take_cancellations() == [("mine", ReplyCode.NOT_FOUND, text)]
    assert t.take_cancellations() == [("theirs", ReplyCode.NOT_FOUND, text)]
    assert t.take_cancellations() == []
    s.declare_queue("q")
    s.consume("q", tag="mine", now=0)  # the tag is free again


def test_exclusive_queue_deletion_on_close_does_not_notify_the_closer(
    s: Session, broker: Broker
) -> None:
    s.declare_queue("x", exclusive=True)
    s.consume("x", now=0)
    s.close(now=0)
    assert broker.take_ready() == []


def test_status_shape(s: Session, t: Session, broker: Broker) -> None:
    s.declare_exchange("logs", "topic", durable=True)
    s.declare_queue("q", durable=True, arguments={"x-max-length": 10})
    s.bind("q", "logs", "a.#")
    s.bind("q", "amq.headers", "", {"x-match": "any", "h": 1})
    publish(s, "logs", "a.b")
    publish(s, "logs", "a.c")
    t.consume("q", prefetch=1, now=0)
    status = broker.status()
    assert status["node_id"] == "node-test"
    assert [v["name"] for v in status["vhosts"]] == ["/", "other"]
    root = status["vhosts"][0]
    logs = next(e for e in root["exchanges"] if e["name"] == "logs")
    assert logs == {
        "name": "logs",
        "type": "topic",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "bindings": [{"queue": "q", "key": "a.#", "arguments": {}}],
    }
    headers = next(e for e in root["exchanges"] if e["name"] == "amq.headers")
    assert headers["bindings"] == [
        {"queue": "q", "key": "", "arguments": {"x-match": "any", "h": 1}}
    ]
    assert root["queues"] == [
        {
            "vhost": "/",
            "name": "q",
            "messages": 1,
            "unacked": 1,
            "consumers": 1,
            "durable": True,
            "exclusive": False,
            "auto_delete": False,
            "type": "classic",
            "arguments": {"x-max-length": 10},
            "stats": {"publish": 2, "deliver_get": 1, "redeliver": 0, "ack": 0},
        }
    ]


def test_message_stats_count_what_moved(s: Session, broker: Broker) -> None:
    """RabbitMQ's message_stats: publish counts messages the queue took (not one a
    full reject-publish queue refused), deliver_get pushes and gets (redelivered
    ones in redeliver too), ack settlements (not requeues)."""
    s.declare_queue("q", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    for _ in range(3):
        publish(s, "", "q")
    got = s.get("q", now=0)
    assert got is not None
    s.nack(got[0].dtag, requeue=True, now=0)
    again = s.get("q", now=0)
    assert again is not None and again[0].redelivered
    s.ack(again[0].dtag)
    tag = s.consume("q", prefetch=5, now=0)
    (pushed,) = s.take_deliveries()
    s.nack(pushed.dtag, requeue=False, now=0)
    s.cancel(tag)
    assert queue_status(broker, "q")["stats"] == {
        "publish": 2,
        "deliver_get": 3,
        "redeliver": 1,
        "ack": 1,
    }


def test_status_is_a_snapshot(s: Session, broker: Broker) -> None:
    s.declare_queue("q", arguments={"a": 1})
    status = broker.status()
    status["vhosts"][0]["queues"][0]["arguments"]["a"] = 2
    assert queue_status(broker, "q")["arguments"] == {"a": 1}


def test_drain_helper_agrees_with_status(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    publish(s, "", "q", b"x")
    assert queue_status(broker, "q")["messages"] == 1
    assert drain(s, "q") == [b"x"]
    assert queue_status(broker, "q")["messages"] == 0


def test_close_gives_back_pushes_never_taken(s: Session, t: Session) -> None:
    s.declare_queue("q")
    publish(t, "", "q", b"seen")
    s.consume("q", no_ack=True, now=0)
    assert bodies(s.take_deliveries()) == [b"seen"]
    s.consume("q", no_ack=True, now=0)
    s.consume("q", now=0)
    for body in (b"a", b"b", b"c"):
        publish(t, "", "q", body)
    s.close(now=0)
    assert drain_with_flags(t, "q") == [(b"a", False), (b"b", False), (b"c", False)]
