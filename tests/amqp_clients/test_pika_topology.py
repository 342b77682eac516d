"""pika against the broker: queues, exchanges, bindings, exclusivity, their errors."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from .conftest import WAIT, AmqpServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _count(conn: pika.BlockingConnection, queue: str) -> int:
    ch = conn.channel()
    n = ch.queue_declare(queue, passive=True).method.message_count
    ch.close()
    return int(n)


def test_exclusive_queue(server: AmqpServer) -> None:
    owner = server.connect()
    a, b = owner.channel(), owner.channel()
    q = _name("excl")
    a.queue_declare(q, exclusive=True)
    b.basic_publish("", q, b"from b")  # another channel of the same connection
    _, _, body = b.basic_get(q, auto_ack=True)
    assert body == b"from b"
    b.queue_declare(q, exclusive=True)  # redeclare from a sibling channel

    stranger = server.connect()
    ch = stranger.channel()
    attempts: list[Callable[[BlockingChannel], object]] = [
        lambda c: c.queue_declare(q, passive=True),
        lambda c: c.basic_consume(q, lambda *a: None),
        lambda c: c.basic_get(q),
        lambda c: c.queue_delete(q),
    ]
    for attempt in attempts:
        with pytest.raises(ChannelClosedByBroker) as caught:
            attempt(ch)
        assert caught.value.reply_code == 405
        assert caught.value.reply_text.startswith("RESOURCE_LOCKED - ")
        ch = stranger.channel()
    assert stranger.is_open

    owner.close()
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare(q, passive=True)
    assert caught.value.reply_code == 404
    stranger.close()


def test_exclusive_queue_goes_when_channel_closes_only_with_connection(
    server: AmqpServer,
) -> None:
    owner = server.connect()
    ch = owner.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.close()  # the queue belongs to the connection, not the channel
    assert _count(owner, q) == 0
    owner.close()


def test_server_named_queue(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ok = ch.queue_declare("", exclusive=True).method
    assert ok.queue.startswith("amq.gen-")
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    ch.basic_publish("", ok.queue, b"x")
    assert ch.queue_declare(ok.queue, passive=True).method.message_count == 1


def test_passive_declare_of_a_missing_queue_closes_only_the_channel(
    conn: pika.BlockingConnection,
) -> None:
    ch = conn.channel()
    other = conn.channel()
    q = _name("missing")
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare(q, passive=True)
    assert caught.value.reply_code == 404
    assert caught.value.reply_text == f"NOT_FOUND - no queue '{q}' in vhost '/'"
    assert not ch.is_open
    assert other.is_open and conn.is_open
    other.queue_declare(_name("fine"), auto_delete=True)


def test_redeclare_with_other_arguments_is_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("args")
    ch.queue_declare(q, arguments={"x-max-length": 5})
    ch.queue_declare(q, arguments={"x-max-length": 5})  # the same: fine
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare(q, arguments={"x-max-length": 6})
    assert caught.value.reply_code == 406
    assert caught.value.reply_text.startswith("PRECONDITION_FAILED - ")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare(q, durable=True)
    assert caught.value.reply_code == 406
    conn.channel().queue_delete(q)


def test_message_ttl(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("ttl")
    ch.queue_declare(q, arguments={"x-message-ttl": 0})
    ch.basic_publish("", q, b"gone")
    assert ch.basic_get(q) == (None, None, None)
    q2 = _name("ttl")
    ch.queue_declare(q2, arguments={"x-message-ttl": 60_000})
    ch.basic_publish("", q2, b"kept")
    assert ch.basic_get(q2, auto_ack=True)[2] == b"kept"
    # the per-message expiration property too
    ch.basic_publish("", q2, b"gone", pika.BasicProperties(expiration="0"))
    assert ch.basic_get(q2) == (None, None, None)


def test_max_length_drops_the_head(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("maxlen")
    ch.queue_declare(q, arguments={"x-max-length": 2})
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    bodies = [ch.basic_get(q, auto_ack=True)[2] for _ in range(3)]
    assert bodies == [b"3", b"4", None]


def test_dead_letter_exchange(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    dlx, dead, q = _name("dlx"), _name("dead"), _name("live")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dead)
    ch.queue_bind(dead, dlx)
    ch.queue_declare(
        q, arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "rk"}
    )
    ch.basic_publish("", q, b"bad", pika.BasicProperties(headers={"k": "v"}))
    method, _, _ = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = ch.basic_get(dead, auto_ack=True)
    assert body == b"bad"
    assert method.routing_key == "rk"
    assert props.headers["k"] == "v"
    (death,) = props.headers["x-death"]
    assert death == {"count": 1, "reason": "rejected", "queue": q, "exchange": ""}


def test_purge_and_delete_conditions(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _name("purge")
    ch.queue_declare(q)
    for _ in range(4):
        ch.basic_publish("", q, b"p")
    assert ch.queue_purge(q).method.message_count == 4
    ch.basic_publish("", q, b"p")
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_delete(q, if_empty=True)
    assert caught.value.reply_code == 406
    ch = conn.channel()
    tag = ch.basic_consume(q, lambda c, m, p, b: None, auto_ack=True)
    user = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        user.queue_delete(q, if_unused=True)
    assert caught.value.reply_code == 406
    ch.basic_cancel(tag)
    assert conn.channel().queue_delete(q, if_unused=True).method.message_count == 0
    with pytest.raises(ChannelClosedByBroker) as caught:
        conn.channel().queue_purge(q)
    assert caught.value.reply_code == 404
    # deleting a queue that does not exist is fine (RabbitMQ: delete-ok, 0)
    assert conn.channel().queue_delete(q).method.message_count == 0


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic", "headers"])
def test_exchange_types(conn: pika.BlockingConnection, kind: str) -> None:
    ch = conn.channel()
    x = _name(kind)
    ch.exchange_declare(x, kind)
    ch.exchange_declare(x, kind, passive=True)
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    if kind == "headers":
        ch.queue_bind(q1, x, arguments={"x-match": "all", "a": "1", "b": "2"})
        ch.queue_bind(q2, x, arguments={"x-match": "any", "a": "1", "b": "2"})
        ch.basic_publish(x, "", b"both", pika.BasicProperties(headers={"a": "1", "b": "2"}))
        ch.basic_publish(x, "", b"any", pika.BasicProperties(headers={"a": "1"}))
        ch.basic_publish(x, "", b"none", pika.BasicProperties(headers={"a": "2"}))
        want = {q1: [b"both"], q2: [b"both", b"any"]}
    elif kind == "topic":
        ch.queue_bind(q1, x, "a.*")
        ch.queue_bind(q2, x, "a.#")
        for key in ("a.b", "a.b.c", "b.a"):
            ch.basic_publish(x, key, key.encode())
        want = {q1: [b"a.b"], q2: [b"a.b", b"a.b.c"]}
    elif kind == "fanout":
        ch.queue_bind(q1, x)
        ch.queue_bind(q2, x, "ignored")
        ch.basic_publish(x, "any", b"f")
        want = {q1: [b"f"], q2: [b"f"]}
    else:
        ch.queue_bind(q1, x, "k1")
        ch.queue_bind(q2, x, "k2")
        ch.queue_bind(q2, x, "k1")
        ch.basic_publish(x, "k1", b"one")
        ch.basic_publish(x, "k2", b"two")
        ch.basic_publish(x, "k3", b"three")
        want = {q1: [b"one"], q2: [b"one", b"two"]}
    for q, bodies in want.items():
        got = []
        while (body := ch.basic_get(q, auto_ack=True)[2]) is not None:
            got.append(body)
        assert got == bodies, q
    ch.exchange_delete(x)
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.exchange_declare(x, kind, passive=True)
    assert caught.value.reply_code == 404
    assert caught.value.reply_text == f"NOT_FOUND - no exchange '{x}' in vhost '/'"


def test_exchange_redeclare_with_another_type_is_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    x = _name("x")
    ch.exchange_declare(x, "direct")
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.exchange_declare(x, "topic")
    assert caught.value.reply_code == 406
    ch = conn.channel()
    # as RabbitMQ: an unknown type is a hard error that closes the connection
    with pytest.raises(ConnectionClosedByBroker) as closed:
        ch.exchange_declare(_name("x"), "no-such-type")
    assert closed.value.reply_code == 503
    assert closed.value.reply_text == "COMMAND_INVALID - unknown exchange type 'no-such-type'"


def test_publish_to_a_missing_exchange_is_404(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.basic_publish(_name("nox"), "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare("", exclusive=True)
    assert caught.value.reply_code == 404
    assert conn.is_open


def test_bind_and_unbind(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"1")
    ch.queue_unbind(q, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"2")
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_bind(q, _name("nox"), "k")
    assert caught.value.reply_code == 404


def test_exchange_delete_if_unused(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    x = _name("used")
    ch.exchange_declare(x, "fanout")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x)
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.exchange_delete(x, if_unused=True)
    assert caught.value.reply_code == 406
    ch = conn.channel()
    ch.queue_unbind(q, x)
    ch.exchange_delete(x, if_unused=True)


def test_default_exchange_is_protected(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.exchange_declare("amq.custom", "direct")
    assert caught.value.reply_code == 403
    assert conn.is_open


def test_many_channels(server: AmqpServer) -> None:
    connection = server.connect()
    channels = [connection.channel() for _ in range(50)]
    q = _name("many")
    channels[0].queue_declare(q)
    for ch in channels:
        ch.basic_publish("", q, str(ch.channel_number).encode())
    for ch in channels[::2]:
        ch.close()
    assert _count(connection, q) == 50
    connection.close()
    assert WAIT
