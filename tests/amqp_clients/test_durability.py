"""What AMQP clients declare and publish durably survives a broker restart."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pika
import pytest

from .conftest import start_amqp_server

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
