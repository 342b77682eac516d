"""Messages across the broker: every property, nested tables, big bodies, and
between AMQP and native clients both ways."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from types import NoneType
from typing import Any

import pika
import pytest
import trio

import amqlite
from amqlite.amqp.mapping import TABLE_HEADER
from amqlite.amqp.values import decode_table

from .conftest import WAIT, AmqpServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

HEADERS: dict[str, Any] = {
    "str": "text é",
    "bytes": b"\x00\xffraw",
    "int": 42,
    "negative": -7,
    "big": 2**40,
    "decimal": Decimal("3.14"),
    "bool": True,
    "false": False,
    "none": None,
    "when": datetime(2026, 11, 25, 12, 30, 0, tzinfo=UTC),
    "list": [1, "two", [3, {"four": 4}], b"five"],
    "nested": {"a": {"b": {"c": [True, None, Decimal("-0.5")]}}, "empty": {}},
}
# pika cannot encode a float in a table, and decodes one truncated to an int:
# floats are checked with aio-pika (test_aio_pika.py)

PROPERTIES = pika.BasicProperties(
    content_type="application/json",
    content_encoding="utf-8",
    headers=HEADERS,
    delivery_mode=2,
    priority=7,
    correlation_id="corr-1",
    reply_to="replies",
    expiration="600000",
    message_id="msg-1",
    timestamp=1_764_070_000,
    type="order.created",
    user_id="guest",
    app_id="shop",
    cluster_id="cluster-a",
)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _assert_pika_properties(props: pika.BasicProperties) -> None:
    for name in (
        "content_type",
        "content_encoding",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    ):
        assert getattr(props, name) == getattr(PROPERTIES, name), name
    assert props.headers == HEADERS


def test_every_property_survives_amqp_to_amqp(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"{}", PROPERTIES)
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"{}"
    _assert_pika_properties(props)
    # and by basic.deliver
    ch.basic_publish("", q, b"{}", PROPERTIES)
    for method, props, _ in ch.consume(q, auto_ack=True, inactivity_timeout=WAIT):
        assert method is not None
        _assert_pika_properties(props)
        break
    ch.cancel()


def test_absent_properties_stay_absent(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"")
    _, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b""
    assert props.headers is None and props.delivery_mode is None
    assert props.content_type is None and props.timestamp is None


@pytest.mark.parametrize("size", [1 << 20, 131072 - 8, 131072 - 7, 5 * 4096 + 1])
def test_bodies_larger_than_frame_max(server: AmqpServer, size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    # the server's frame_max (131072), and a client that asks for the smallest
    for frame_max in (None, 4096):
        kwargs = {} if frame_max is None else {"frame_max": frame_max}
        connection = server.connect(**kwargs)
        ch = connection.channel()
        ch.confirm_delivery()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, body)
        ch.basic_publish("", q, body)
        _, _, got = ch.basic_get(q, auto_ack=True)
        assert got == body
        for method, _, got in ch.consume(q, auto_ack=True, inactivity_timeout=WAIT):
            assert method is not None
            assert got == body
            break
        connection.close()


def test_amqp_publish_reaches_a_native_consumer(server: AmqpServer) -> None:
    connection = server.connect()
    ch = connection.channel()
    ch.confirm_delivery()
    q = _name("to-native")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"from pika", PROPERTIES)
    connection.close()

    async def consume() -> Any:
        async with amqlite.connect(f"127.0.0.1:{server.port}") as native:
            with trio.fail_after(WAIT):
                async for d in await native.consume(q):
                    await d.ack()
                    await native.delete_queue(q)
                    return d

    d = trio.run(consume)
    assert d.body == b"from pika"
    # native headers are scalars: the rest comes as one AMQP table in bytes
    scalars = {k: v for k, v in HEADERS.items() if type(v) in (str, bytes, int, bool, NoneType)}
    rest = {k: v for k, v in HEADERS.items() if k not in scalars}
    assert set(rest) == {"decimal", "when", "list", "nested"}
    table = d.headers.pop(TABLE_HEADER)
    assert d.headers == scalars
    assert decode_table(table, 0) == (rest, len(table))
    assert d.properties == {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "persistent": True,
        "priority": 7,
        "correlation_id": "corr-1",
        "reply_to": "replies",
        "expiration": 600000,
        "message_id": "msg-1",
        "timestamp": 1_764_070_000_000,  # native: milliseconds
        "type": "order.created",
        "user_id": "guest",
        "app_id": "shop",
        "cluster_id": "cluster-a",
    }


def test_native_publish_reaches_an_amqp_consumer(server: AmqpServer) -> None:
    q = _name("from-native")
    native_props = {
        "content_type": "text/plain",
        "content_encoding": "utf-8",
        "priority": 3,
        "correlation_id": "c9",
        "reply_to": "back",
        "expiration": 600000,
        "message_id": "n-1",
        "timestamp": 1_764_070_000_999,
        "type": "t",
        "user_id": "guest",
        "app_id": "native-app",
        "cluster_id": "cl",
        "group_id": "g1",
    }

    async def publish() -> None:
        async with amqlite.connect(f"127.0.0.1:{server.port}") as native:
            await native.declare_queue(q)
            await native.publish(
                "",
                q,
                b"from native",
                headers={"k": "v", "n": 5, "yes": True, "b": b"\x00"},
                properties=native_props,
                persistent=True,
                confirm=True,
            )
            await native.publish("", q, b"plain", confirm=True)

    trio.run(publish)
    connection = server.connect()
    ch = connection.channel()
    _, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"from native"
    assert props.headers == {"k": "v", "n": 5, "yes": True, "b": b"\x00", "JMSXGroupID": "g1"}
    assert props.delivery_mode == 2
    assert props.timestamp == 1_764_070_000  # seconds
    assert props.expiration == "600000"
    for name in (
        "content_type",
        "content_encoding",
        "priority",
        "correlation_id",
        "reply_to",
        "message_id",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    ):
        assert getattr(props, name) == native_props[name], name
    _, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"plain"
    assert props.delivery_mode == 2 or props.delivery_mode is None
    ch.queue_delete(q)
    connection.close()


@pytest.mark.parametrize(
    ("props", "mentions"),
    [
        ({"priority": 256}, "'priority' must be at most 255"),
        ({"timestamp": 253_402_300_800_000}, "'timestamp' must be at most"),
        ({"timestamp": 2**64}, "'timestamp' must be at most"),
        ({"message_id": "m" * 256}, "'message_id' is longer than 255 bytes"),
    ],
    ids=["priority", "timestamp-after-9999", "timestamp-2**64", "message-id"],
)
def test_a_property_no_amqp_consumer_could_take_is_refused_at_the_publish(
    server: AmqpServer, props: dict[str, Any], mentions: str
) -> None:
    """A native publish whose integer property an AMQP delivery cannot carry (an
    octet's priority, a timestamp after 9999) is refused with a clear error, and
    the largest ones that fit reach a pika consumer as they were sent. (Such a
    message used to be accepted, and then closed every AMQP connection it was
    delivered to with 541.)"""
    q = _name("edge-props")
    largest = {"priority": 255, "timestamp": 253_402_300_799_999}

    async def publish() -> str:
        async with amqlite.connect(f"127.0.0.1:{server.port}") as native:
            await native.declare_queue(q)
            try:
                await native.publish("", q, b"refused", properties=props, confirm=True)
            except ValueError as exc:  # the client checks first; the broker too
                refusal = str(exc)  # (tests/protocol/test_protocol_bad_input.py)
            else:
                refusal = ""
            await native.publish("", q, b"largest", properties=largest, confirm=True)
            return refusal

    assert mentions in trio.run(publish)
    connection = server.connect()
    ch = connection.channel()
    _, got, body = ch.basic_get(q, auto_ack=True)
    assert body == b"largest"
    assert (got.priority, got.timestamp) == (255, 253_402_300_799)
    assert ch.basic_get(q, auto_ack=True) == (None, None, None)  # nothing else queued
    connection.close()


@pytest.mark.parametrize(
    ("headers", "key", "mentions"),
    [
        ({"big": 2**70}, "", "value of 'big' must fit in 64 bits"),
        ({"k" * 256: 1}, "", "is longer than 255 bytes"),
        ({}, "r" * 256, "field 'key' must be text of at most 255 bytes"),
    ],
    ids=["header-int", "header-key", "routing-key"],
)
def test_a_message_no_amqp_consumer_could_take_is_refused_and_the_queue_keeps_serving(
    server: AmqpServer, headers: dict[str, Any], key: str, mentions: str
) -> None:
    """A native publish an AMQP delivery cannot carry (a header integer beyond 64
    bits, a header key or a routing key beyond a short string's 255 bytes) is
    refused (by the client, which checks headers first, or by the broker with 502),
    and a pika consumer of the queue it was meant for goes on getting the messages
    that were taken."""
    q = _name("edge-msgs")
    x = _name("edge-x")

    async def publish() -> str:
        async with amqlite.connect(f"127.0.0.1:{server.port}") as native:
            await native.declare_queue(q)
            await native.declare_exchange(x, "topic")
            await native.bind(q, x, "#")
            try:
                await native.publish(x, key or "k", b"refused", headers=headers, confirm=True)
            except (ValueError, amqlite.AmqliteError) as exc:  # the client's check, the broker's
                refusal = str(exc)
            else:
                refusal = ""
            await native.publish(x, "r" * 255, b"taken", headers={"n": 2**63 - 1}, confirm=True)
            return refusal

    assert mentions in trio.run(publish)
    connection = server.connect()
    ch = connection.channel()
    method, got, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.routing_key, got.headers) == (b"taken", "r" * 255, {"n": 2**63 - 1})
    assert ch.basic_get(q, auto_ack=True) == (None, None, None)
    connection.close()
