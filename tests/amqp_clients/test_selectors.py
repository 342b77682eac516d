"""Selectors against a real broker process: pika's basic.consume with ``x-selector``,
the native client's ``consume(selector=...)``, and messages crossing between the two
(AMQP headers and properties are what a native selector sees, and the reverse)."""

from __future__ import annotations

import uuid
from typing import Any

import pika
import pytest
import trio
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker

import amqlite
from amqlite.errors import PreconditionFailed

from .conftest import WAIT, AmqpServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _receive(ch: BlockingChannel, queue: str, n: int, **kwargs: Any) -> list[bytes]:
    got: list[bytes] = []
    for method, _, body in ch.consume(queue, inactivity_timeout=WAIT, **kwargs):
        assert method is not None, f"only {len(got)} of {n} messages arrived"
        ch.basic_ack(method.delivery_tag)
        got.append(body)
        if len(got) == n:
            break
    ch.cancel()
    return got


def _publish(ch: BlockingChannel, queue: str, body: str, **props: Any) -> None:
    ch.basic_publish("", queue, body.encode(), pika.BasicProperties(**props))


def test_pika_consumer_with_x_selector(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("sel")
    ch.queue_declare(q)
    _publish(ch, q, "eu-low", headers={"region": "eu"}, priority=1)
    _publish(ch, q, "us-high", headers={"region": "us"}, priority=9)
    _publish(ch, q, "eu-high", headers={"region": "eu"}, priority=8)
    _publish(ch, q, "none", priority=9)
    selector = "region = 'eu' AND JMSPriority > 4 OR region IS NULL"
    got = _receive(ch, q, 2, arguments={"x-selector": selector})
    assert got == [b"eu-high", b"none"]
    # what nobody selected is still there, in order
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    assert _receive(ch, q, 2) == [b"eu-low", b"us-high"]


def test_pika_bad_selector_closes_the_channel_with_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("bad")
    ch.queue_declare(q)
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.basic_consume(q, lambda *a: None, arguments={"x-selector": "region = 'eu' AND"})
    assert caught.value.reply_code == 406
    assert caught.value.reply_text == (
        "PRECONDITION_FAILED - selector error at position 17: "
        "expected a value, found end of selector"
    )
    assert conn.is_open
    with pytest.raises(ChannelClosedByBroker) as caught:
        conn.channel().basic_consume(q, lambda *a: None, arguments={"x-selector": 5})
    assert caught.value.reply_code == 406
    assert "x-selector" in caught.value.reply_text


def test_native_selector_over_amqp_published_messages(
    server: AmqpServer, conn: pika.BlockingConnection
) -> None:
    """A native consumer's selector reads headers and properties that came over AMQP;
    a bad one fails its consume with 406 and the position."""
    ch = conn.channel()
    q = _name("native")
    ch.queue_declare(q)
    for i, kind in enumerate(["order", "refund", "order", "audit"]):
        _publish(ch, q, f"{i}", type=kind, headers={"amount": i * 10}, message_id=f"m{i}")

    async def consume() -> tuple[list[bytes], PreconditionFailed]:
        async with amqlite.connect(f"127.0.0.1:{server.port}") as native:
            with pytest.raises(PreconditionFailed) as bad:
                await native.consume(q, selector="amount BETWEEN 1 AND")
            got = []
            consumer = await native.consume(
                q, selector="JMSType = 'order' AND amount >= 10 OR message_id LIKE '%3'"
            )
            with trio.fail_after(WAIT):
                async for d in consumer:
                    got.append(d.body)
                    await d.ack()
                    if len(got) == 2:
                        break
            await consumer.cancel()
            return got, bad.value

    got, bad = trio.run(consume)
    assert got == [b"2", b"3"]
    assert bad.code == 406
    assert "selector error at position 20" in bad.text
    assert _receive(ch, q, 2) == [b"0", b"1"]


def test_pika_message_groups_flag_the_first_delivery(conn: pika.BlockingConnection) -> None:
    """A group (AMQP header JMSXGroupID) goes to one consumer; its first delivery
    there has JMSXGroupFirstForConsumer, the others do not; a selector can name it."""
    ch = conn.channel()
    q = _name("groups")
    ch.queue_declare(q)
    for i, group in enumerate("abab"):
        _publish(ch, q, f"{i}{group}", headers={"JMSXGroupID": group})
    got = []
    arguments = {"x-selector": "JMSXGroupID = 'a'"}
    for method, props, body in ch.consume(q, inactivity_timeout=WAIT, arguments=arguments):
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        got.append((body, (props.headers or {}).get("JMSXGroupFirstForConsumer")))
        if len(got) == 2:
            break
    ch.cancel()
    assert got == [(b"0a", True), (b"2a", None)]


def test_native_group_moves_when_its_consumer_connection_closes(server: AmqpServer) -> None:
    """Two native connections consume one queue; the group's consumer goes (its
    connection closes with an unacked message): the group moves to the other
    connection, starting with the requeued message, flagged."""
    q = _name("grouped")
    address = f"127.0.0.1:{server.port}"

    async def scenario() -> list[tuple[bytes, bool, bool]]:
        async with amqlite.connect(address) as other:
            await other.declare_queue(q)
            async with amqlite.connect(address) as first_conn:
                first = await first_conn.consume(q, prefetch=10)  # first in round robin
                second = await other.consume(q, prefetch=10)
                for i in range(3):
                    await other.publish("", q, f"{i}".encode(), properties={"group_id": "g"},
                                        confirm=True)  # fmt: skip
                with trio.fail_after(WAIT):
                    d = await first.__anext__()  # the first consumer got the group
                assert d.body == b"0" and d.headers.get("JMSXGroupFirstForConsumer") is True
                assert second.buffered == 0
            # closed without acking: the group and its messages move
            got = []
            with trio.fail_after(WAIT):
                async for d in second:
                    got.append(
                        (d.body, d.redelivered, d.headers.get("JMSXGroupFirstForConsumer", False))
                    )
                    await d.ack()
                    if len(got) == 3:
                        break
            return got

    assert trio.run(scenario) == [(b"0", True, True), (b"1", True, False), (b"2", True, False)]
