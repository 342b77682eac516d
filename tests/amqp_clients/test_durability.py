"""What AMQP clients declare and publish durably survives a broker restart."""

from __future__ import annotations

import signal
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pika
import pytest

from .conftest import WAIT, start_amqp_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

HEADERS = {
    "plain": "x",
    "nested": {"a": [1, {"b": Decimal("1.25")}]},
    "when": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
}


def test_durable_topology_and_persistent_messages_survive_a_restart(tmp_path: Path) -> None:
    server = start_amqp_server(tmp_path)
    try:
        connection = server.connect()
        ch = connection.channel()
        ch.confirm_delivery()
        ch.exchange_declare("orders", "topic", durable=True)
        ch.queue_declare("kept", durable=True, arguments={"x-max-length": 100})
        ch.queue_bind("kept", "orders", "order.*")
        props = pika.BasicProperties(delivery_mode=2, headers=HEADERS, message_id="m1")
        ch.basic_publish("orders", "order.new", b"persistent", props)
        ch.basic_publish("orders", "order.new", b"transient", pika.BasicProperties())
        connection.close()
    finally:
        server.stop()
    server = start_amqp_server(tmp_path)
    try:
        connection = server.connect()
        ch = connection.channel()
        ok = ch.queue_declare("kept", durable=True, arguments={"x-max-length": 100})
        assert ok.method.message_count == 1
        method, props, body = ch.basic_get("kept", auto_ack=True)
        assert body == b"persistent"
        assert method.redelivered is False
        assert (props.delivery_mode, props.message_id) == (2, "m1")
        assert props.headers == HEADERS
        ch.basic_publish("orders", "order.again", b"routed")  # the binding is back
        assert ch.basic_get("kept", auto_ack=True)[2] == b"routed"
        connection.close()
    finally:
        server.stop()


def test_shutdown_closes_amqp_clients_with_320(tmp_path: Path) -> None:
    server = start_amqp_server(None)
    try:
        connection = server.connect()
        ch = connection.channel()
        ch.queue_declare("", exclusive=True)
        server.proc.send_signal(signal.SIGTERM)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
            connection.process_data_events(time_limit=WAIT)
            connection.process_data_events(time_limit=WAIT)
        assert caught.value.reply_code == 320
        assert caught.value.reply_text.startswith("CONNECTION_FORCED - ")
        assert server.proc.wait(WAIT) == 0
    finally:
        server.stop()


def test_a_big_backlog_reaches_a_slow_reader(tmp_path: Path) -> None:
    """More than the server's write buffer: pushes pause and resume, none lost."""
    server = start_amqp_server(None)
    try:
        connection = server.connect()
        ch = connection.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        body = b"b" * 2000
        n = 6000  # 12 MB: past the connection's high-water mark
        for i in range(n):
            ch.basic_publish("", q, body, pika.BasicProperties(message_id=str(i)))
        assert ch.queue_declare(q, passive=True).method.message_count == n
        messages = ch.consume(q, auto_ack=True, inactivity_timeout=WAIT)
        for seen, (method, props, got) in enumerate(messages, 1):
            assert method is not None, f"{seen - 1} of {n} arrived"
            assert props.message_id == str(seen - 1) and got == body
            if seen == n:
                break
        connection.close()
    finally:
        server.stop()
