"""pika against the broker: publish, consume, acknowledge, confirm, return, get, tx."""

from __future__ import annotations

import uuid
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, NackError, UnroutableError

from .conftest import WAIT, AmqpServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _receive(ch: BlockingChannel, queue: str, n: int, **kwargs: Any) -> list[Any]:
    """Consume until ``n`` messages arrived (fails on a quiet WAIT), then cancel."""
    got = []
    for method, props, body in ch.consume(queue, inactivity_timeout=WAIT, **kwargs):
        assert method is not None, f"only {len(got)} of {n} messages arrived"
        got.append((method, props, body))
        if len(got) == n:
            break
    ch.cancel()
    return got


def test_blocking_publish_consume_ack(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("basic")
    ch.queue_declare(q)
    for i in range(10):
        ch.basic_publish("", q, f"m{i}".encode())
    got = _receive(ch, q, 10)
    assert [body for _, _, body in got] == [f"m{i}".encode() for i in range(10)]
    assert [m.delivery_tag for m, _, _ in got] == list(range(1, 11))
    assert all(not m.redelivered and m.routing_key == q and m.exchange == "" for m, _, _ in got)
    for m, _, _ in got:
        ch.basic_ack(m.delivery_tag)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_select_connection_publish_consume_ack(server: AmqpServer) -> None:
    q = _name("select")
    received: list[bytes] = []
    state: dict[str, Any] = {}

    def on_open(connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_channel(ch: Any) -> None:
        state["ch"] = ch
        ch.queue_declare(q, callback=on_declared)

    def on_declared(_frame: Any) -> None:
        ch = state["ch"]
        ch.basic_consume(q, on_message)
        for i in range(5):
            ch.basic_publish("", q, b"s%d" % i)

    def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        received.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(received) == 5:
            ch.queue_delete(q, callback=lambda frame: state.update(deleted=frame))
            ch.connection.close()

    def on_close(connection: pika.SelectConnection, reason: Exception) -> None:
        state["closed"] = reason
        connection.ioloop.stop()

    connection = pika.SelectConnection(
        server.parameters(),
        on_open_callback=on_open,
        on_open_error_callback=lambda c, e: on_close(c, e),
        on_close_callback=on_close,
    )
    timer = connection.ioloop.call_later(WAIT, connection.ioloop.stop)
    connection.ioloop.start()
    connection.ioloop.remove_timeout(timer)
    assert received == [b"s%d" % i for i in range(5)]
    assert isinstance(state["closed"], pika.exceptions.ConnectionClosedByClient)
    assert state["deleted"].method.message_count == 0


def test_confirms_on_a_durable_queue(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = _name("durable")
    ch.queue_declare(q, durable=True)
    props = pika.BasicProperties(delivery_mode=2, headers={"n": 1})
    for i in range(20):
        ch.basic_publish("", q, b"p%d" % i, props)  # raises unless acked
    assert ch.queue_declare(q, passive=True).method.message_count == 20
    ch.queue_delete(q)


def test_reject_publish_overflow_nacks(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = _name("full")
    ch.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"3")
    assert ch.is_open
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    got = ch.basic_get(q, auto_ack=True)
    assert got[2] == b"1"
    ch.basic_publish("", q, b"4")  # room again


def test_mandatory_unroutable_is_returned_before_the_ack(server: AmqpServer) -> None:
    # raw frame order, read with a SelectConnection-free check: BlockingChannel
    # raises UnroutableError only if the return came before the ack
    connection = server.connect()
    ch = connection.channel()
    ch.confirm_delivery()
    with pytest.raises(UnroutableError) as caught:
        ch.basic_publish("", _name("nowhere"), b"lost", mandatory=True)
    (returned,) = caught.value.messages
    assert returned.method.reply_code == 312
    assert returned.method.reply_text == "NO_ROUTE"
    assert returned.body == b"lost"
    ch.basic_publish("amq.direct", "nobody", b"x")  # not mandatory: dropped silently
    connection.close()


def test_mandatory_return_without_confirms(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    returned: list[Any] = []
    ch.add_on_return_callback(lambda _ch, method, props, body: returned.append((method, body)))
    ch.basic_publish(
        "amq.topic", "no.such.key", b"r", pika.BasicProperties(message_id="m1"), mandatory=True
    )
    ch.queue_declare("", exclusive=True)  # a round trip: the return is in by now
    conn.process_data_events(time_limit=0)  # pika runs the callbacks of what came in
    assert [(m.reply_code, m.exchange, m.routing_key, b) for m, b in returned] == [
        (312, "amq.topic", "no.such.key", b"r")
    ]


def test_basic_get_and_get_empty(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("get")
    ch.queue_declare(q)
    assert ch.basic_get(q) == (None, None, None)
    for i in range(3):
        ch.basic_publish("", q, b"g%d" % i)
    method, _props, body = ch.basic_get(q)
    assert (body, method.message_count, method.redelivered) == (b"g0", 2, False)
    ch.basic_ack(method.delivery_tag)
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.message_count) == (b"g1", 1)
    ch.queue_delete(q)


def test_nack_and_reject_requeue_set_redelivered(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("requeue")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    method, _, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"a", False)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"a", True)
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"a", True)
    ch.basic_reject(method.delivery_tag, requeue=False)  # dropped
    method, _, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"b", False)
    ch.basic_nack(method.delivery_tag, requeue=False)
    assert ch.basic_get(q) == (None, None, None)


def test_ack_multiple(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("multi")
    ch.queue_declare(q)
    for i in range(6):
        ch.basic_publish("", q, b"%d" % i)
    got = _receive(ch, q, 6)
    ch.basic_ack(got[3][0].delivery_tag, multiple=True)  # 1..4
    ch.close()  # 5 and 6 go back
    ch = conn.channel()
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    got = _receive(ch, q, 2)
    assert [(b, m.redelivered) for m, _, b in got] == [(b"4", True), (b"5", True)]
    ch.basic_ack(0, multiple=True)  # all so far
    ch.close()
    ch = conn.channel()
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_prefetch_limits_unacked_deliveries(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("qos")
    ch.queue_declare(q)
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=3)
    held: list[Any] = []
    ch.basic_consume(q, lambda _c, method, _p, body: held.append((method, body)))
    conn.process_data_events(time_limit=0.3)  # ample for more than 3 to arrive
    assert [b for _, b in held] == [b"0", b"1", b"2"]
    ch.basic_ack(held[0][0].delivery_tag)
    while len(held) < 4:
        conn.process_data_events(time_limit=WAIT)
    conn.process_data_events(time_limit=0.2)
    assert [b for _, b in held] == [b"0", b"1", b"2", b"3"]
    ch.basic_ack(held[-1][0].delivery_tag, multiple=True)
    while len(held) < 7:
        conn.process_data_events(time_limit=WAIT)
    assert [b for _, b in held] == [b"%d" % i for i in range(7)]


def test_client_cancel_stops_deliveries(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("cancel")
    ch.queue_declare(q)
    got: list[bytes] = []
    tag = ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"1")
    while not got:
        conn.process_data_events(time_limit=WAIT)
    ch.basic_cancel(tag)
    ch.basic_publish("", q, b"2")
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    assert got == [b"1"]
    ch.basic_cancel("no-such-tag")  # RabbitMQ answers cancel-ok for an unknown tag
    assert ch.is_open


def test_server_cancels_consumer_when_queue_is_deleted(server: AmqpServer) -> None:
    consuming = server.connect()
    ch = consuming.channel()
    q = _name("doomed")
    ch.queue_declare(q)
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    other = server.connect()
    other.channel().queue_delete(q)
    other.close()
    while not cancelled:
        consuming.process_data_events(time_limit=WAIT)
        assert consuming.is_open
    assert cancelled == [tag]
    assert ch.is_open
    consuming.close()


def test_tx_commit_and_rollback(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("tx")
    ch.queue_declare(q)
    ch.tx_select()
    ch.basic_publish("", q, b"t1")
    ch.basic_publish("", q, b"t2")
    watcher = conn.channel()
    assert watcher.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    assert watcher.queue_declare(q, passive=True).method.message_count == 2
    ch.basic_publish("", q, b"t3")
    ch.tx_rollback()
    ch.tx_commit()
    assert watcher.queue_declare(q, passive=True).method.message_count == 2
    # acks are transactional too
    method, _, body = ch.basic_get(q)
    assert body == b"t1"
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()  # the ack is discarded: t1 stays unacked
    ch.close()  # ... and goes back to the queue
    assert watcher.queue_declare(q, passive=True).method.message_count == 2


def test_confirm_after_tx_is_refused_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.tx_select()
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.confirm_delivery()
    assert caught.value.reply_code == 406
    assert conn.channel().is_open


def test_tx_commit_of_persistent_messages_on_durable_queues(
    conn: pika.BlockingConnection,
) -> None:
    ch = conn.channel()
    x, q1, q2 = _name("txx"), _name("txq"), _name("txq")
    ch.exchange_declare(x, "fanout", durable=True)
    for q in (q1, q2):
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, x)
    ch.tx_select()
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(50):
        ch.basic_publish(x, "", b"%d" % i, persistent)
    ch.tx_commit()
    for q in (q1, q2):
        assert ch.queue_declare(q, passive=True).method.message_count == 50
    method, _, _ = ch.basic_get(q1)
    ch.basic_ack(method.delivery_tag, multiple=True)
    ch.tx_commit()
    assert ch.queue_declare(q1, passive=True).method.message_count == 49
    for q in (q1, q2):
        ch.queue_delete(q)
    ch.exchange_delete(x)


def test_confirms_with_many_in_flight(server: AmqpServer) -> None:
    """SelectConnection publishes 500 persistent messages without waiting: every
    sequence number is acked exactly once (multiple acks counted)."""
    q = _name("inflight")
    n = 500
    acked: set[int] = set()
    state: dict[str, Any] = {}

    def on_open(connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_channel(ch: Any) -> None:
        state["ch"] = ch
        ch.confirm_delivery(
            on_confirm, callback=lambda _f: ch.queue_declare(q, durable=True, callback=on_declared)
        )

    def on_declared(_frame: Any) -> None:
        for i in range(n):
            state["ch"].basic_publish("", q, b"%d" % i, pika.BasicProperties(delivery_mode=2))

    def on_confirm(frame: Any) -> None:
        method = frame.method
        assert isinstance(method, pika.spec.Basic.Ack), method
        tags = (
            range(max(acked, default=0) + 1, method.delivery_tag + 1)
            if method.multiple
            else [method.delivery_tag]
        )
        for tag in tags:
            assert tag not in acked
            acked.add(tag)
        if len(acked) == n:
            state["ch"].queue_delete(q, callback=lambda f: state["ch"].connection.close())

    connection = pika.SelectConnection(
        server.parameters(),
        on_open_callback=on_open,
        on_close_callback=lambda c, r: c.ioloop.stop(),
    )
    timer = connection.ioloop.call_later(WAIT, connection.ioloop.stop)
    connection.ioloop.start()
    connection.ioloop.remove_timeout(timer)
    assert acked == set(range(1, n + 1))
