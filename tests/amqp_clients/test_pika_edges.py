"""pika against the broker: the errors and corners applications run into."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from amqlite.amqp import MethodReceived
from amqlite.amqp import methods as m

from .conftest import WAIT, AmqpServer
from .rawamqp import RawAmqp

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_exclusive_consumer_refuses_a_second_one_403(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    other = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        other.basic_consume(q, lambda *a: None)
    assert caught.value.reply_code == 403
    assert caught.value.reply_text.startswith("ACCESS_REFUSED - ")
    assert ch.is_open


def test_consume_from_a_missing_queue_is_404(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.basic_consume(_name("none"), lambda *a: None)
    assert caught.value.reply_code == 404
    assert conn.is_open


def test_a_reused_consumer_tag_is_530(server: AmqpServer) -> None:
    # pika refuses to send it: a raw client does. RabbitMQ: a connection error
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.open_channel(1)
    ok = raw.request(1, m.QueueDeclare(0, "", exclusive=True))
    assert isinstance(ok, MethodReceived) and isinstance(ok.method, m.QueueDeclareOk)
    q = ok.method.queue
    first = raw.request(1, m.BasicConsume(0, q, "dup"))
    assert isinstance(first, MethodReceived) and isinstance(first.method, m.BasicConsumeOk)
    close = raw.request(1, m.BasicConsume(0, q, "dup"))
    assert isinstance(close, MethodReceived) and isinstance(close.method, m.ConnectionClose)
    assert close.method.reply_code == 530
    assert close.method.reply_text == "NOT_ALLOWED - attempt to reuse consumer tag 'dup'"
    raw.close()


def test_acking_an_unknown_tag_is_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    method, _, _ = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    ch.basic_ack(method.delivery_tag)  # twice
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare(q, passive=True)  # the error arrives in the meantime
    assert caught.value.reply_code == 406
    assert (
        caught.value.reply_text
        == f"PRECONDITION_FAILED - unknown delivery tag {method.delivery_tag}"
    )
    ch = conn.channel()
    ch.basic_nack(42)
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare(q, passive=True)
    assert caught.value.reply_code == 406
    assert conn.is_open


def test_auto_ack_get_then_ack_is_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    method, _, _ = ch.basic_get(q, auto_ack=True)
    ch.basic_ack(method.delivery_tag)
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare(q, passive=True)
    assert caught.value.reply_code == 406


def test_recover_redelivers_the_unacked(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    got: list[tuple[bytes, bool]] = []
    ch.basic_consume(q, lambda c, meth, p, b: got.append((b, meth.redelivered)))
    ch.basic_publish("", q, b"r1")
    ch.basic_publish("", q, b"r2")
    while len(got) < 2:
        conn.process_data_events(time_limit=WAIT)
    ch.basic_recover(requeue=True)
    while len(got) < 4:
        conn.process_data_events(time_limit=WAIT)
    assert got == [(b"r1", False), (b"r2", False), (b"r1", True), (b"r2", True)]


def test_consumer_count_and_auto_delete(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("autodel")
    ch.queue_declare(q, auto_delete=True)
    tags = [ch.basic_consume(q, lambda *a: None) for _ in range(2)]
    assert ch.queue_declare(q, passive=True).method.consumer_count == 2
    ch.basic_cancel(tags[0])
    assert ch.queue_declare(q, passive=True).method.consumer_count == 1
    ch.basic_cancel(tags[1])  # the last consumer: the queue goes
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare(q, passive=True)
    assert caught.value.reply_code == 404


def test_reserved_names_are_403(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare("amq.mine")
    assert caught.value.reply_code == 403
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.exchange_delete("amq.direct")
    assert caught.value.reply_code == 403
    assert conn.is_open


def test_publish_to_an_internal_exchange_is_403(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    x = _name("internal")
    ch.exchange_declare(x, "fanout", internal=True)
    ch.basic_publish(x, "", b"x")
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.exchange_declare(x, "fanout", passive=True)
    assert caught.value.reply_code == 403
    conn.channel().exchange_delete(x)


def test_exchange_to_exchange_bindings_are_refused_540(server: AmqpServer) -> None:
    connection = server.connect()
    assert connection._impl.server_capabilities["exchange_exchange_bindings"] is False
    ch = connection.channel()
    with pytest.raises((ConnectionClosedByBroker, ChannelClosedByBroker)) as caught:
        ch.exchange_bind("amq.fanout", "amq.direct", "k")
    assert caught.value.reply_code == 540


def test_many_consumers_round_robin(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    seen: dict[str, list[bytes]] = {}

    def make(name: str) -> Any:
        return lambda c, meth, p, b: (
            seen.setdefault(name, []).append(b),
            c.basic_ack(meth.delivery_tag),
        )

    ch.basic_consume(q, make("a"), consumer_tag="a")
    ch.basic_consume(q, make("b"), consumer_tag="b")
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    while sum(len(v) for v in seen.values()) < 10:
        conn.process_data_events(time_limit=WAIT)
    assert sorted(seen) == ["a", "b"]
    assert sorted(seen["a"] + seen["b"]) == sorted(b"%d" % i for i in range(10))


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(Decimal("1.5"), id="decimal"),
        pytest.param(datetime(2026, 1, 1, tzinfo=UTC), id="timestamp"),
        pytest.param({"a": {"b": {"c": {"d": {"e": {"f": {"g": {}}}}}}}}, id="deep"),
    ],
)
def test_arguments_the_broker_cannot_keep_are_406(
    conn: pika.BlockingConnection, value: object
) -> None:
    q = _name("args")
    attempts: list[Callable[[BlockingChannel], object]] = [
        lambda c: c.queue_declare(q, durable=True, arguments={"x-custom": value}),
        lambda c: c.exchange_declare(q, "headers", arguments={"x-custom": value}),
        lambda c: c.queue_bind(q, "amq.headers", arguments={"x-custom": value}),
        lambda c: c.basic_consume(q, lambda *a: None, arguments={"x-custom": value}),
    ]
    conn.channel().queue_declare(q, durable=True)
    for attempt in attempts:
        ch = conn.channel()
        with pytest.raises(ChannelClosedByBroker) as caught:
            attempt(ch)
        assert caught.value.reply_code == 406
        assert caught.value.reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-custom'")
    assert conn.channel().queue_delete(q).method.message_count == 0
    # nested tables a little less deep are fine
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-custom": {"a": {"b": [1, {"c": "d"}]}}})
    ch.queue_delete(q)


def test_x_max_priority_is_accepted_and_ignored(conn: pika.BlockingConnection) -> None:
    # a difference from RabbitMQ: no priority queues; the argument is kept (as
    # unknown arguments are) and messages stay in publish order
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True, arguments={"x-max-priority": 10}).method.queue
    for p in (1, 9, 5):
        ch.basic_publish("", q, b"%d" % p, pika.BasicProperties(priority=p))
    assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(3)] == [b"1", b"9", b"5"]


def test_stream_queue_consumed_from_an_offset(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("stream")
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(5):
        ch.basic_publish("", q, b"s%d" % i, pika.BasicProperties(delivery_mode=2))
    ch.basic_qos(prefetch_count=10)  # RabbitMQ requires a prefetch for streams
    got: list[tuple[bytes, object]] = []
    for method, props, body in ch.consume(
        q, arguments={"x-stream-offset": 2}, inactivity_timeout=WAIT
    ):
        assert method is not None
        got.append((body, props.headers["x-stream-offset"]))
        ch.basic_ack(method.delivery_tag)
        if len(got) == 3:
            break
    ch.cancel()
    assert got == [(b"s2", 2), (b"s3", 3), (b"s4", 4)]
    ch.queue_delete(q)
