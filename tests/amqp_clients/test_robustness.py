"""What real clients never send: the broker answers as the spec says, closes that
one connection, and every other client goes on."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import pika
import pytest

from amqlite.amqp import (
    PROTOCOL_HEADER,
    BasicProperties,
    ContentReceived,
    HeartbeatReceived,
    MethodReceived,
)
from amqlite.amqp import methods as m
from amqlite.amqp.frames import encode_method_frame

from .conftest import WAIT, AmqpServer
from .rawamqp import RawAmqp

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.fixture
def bystander(server: AmqpServer) -> Iterator[pika.BlockingConnection]:
    """A pika client connected throughout; each test checks it still works."""
    connection = server.connect()
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    yield connection
    ch.basic_publish("", q, b"still here")
    assert ch.basic_get(q, auto_ack=True)[2] == b"still here"
    connection.close()


@pytest.mark.parametrize(
    "opening",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
        pytest.param(b"AMQP\x00\x00\x08\x00", id="amqp-0-8"),
        pytest.param(b"AMQP\x03\x01\x00\x00", id="amqp-1.0-sasl"),
        pytest.param(b"AMQP\x00\x00\x09\x02", id="amqp-0-9-2"),
        pytest.param(b"\x00" * 64, id="zeros"),
    ],
)
def test_wrong_protocol_header_is_answered_with_ours(
    server: AmqpServer, bystander: pika.BlockingConnection, opening: bytes
) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.send(opening)
    assert raw.receive_raw() == PROTOCOL_HEADER
    raw.close()


def test_an_oversized_frame_is_501(server: AmqpServer, bystander: pika.BlockingConnection) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.open_channel(1)
    size = raw.proto.frame_max  # payload + 8 bytes of overhead: one too many
    raw.send(struct.pack(">BHI", 3, 1, size))
    close = raw.next_method()
    assert isinstance(close, m.ConnectionClose)
    assert close.reply_code == 501
    assert close.reply_text.startswith("FRAME_ERROR - ")
    raw.send(raw.proto.send_method(0, m.ConnectionCloseOk()))
    assert raw.receive_raw() == b""
    raw.close()


def test_an_oversized_frame_before_tune_is_501(
    server: AmqpServer, bystander: pika.BlockingConnection
) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.send(raw.proto.send_protocol_header())
    assert isinstance(raw.next_method(), m.ConnectionStart)
    raw.send(struct.pack(">BHI", 1, 0, 10_000_000))
    close = raw.next_method()
    assert isinstance(close, m.ConnectionClose)
    assert close.reply_code == 501
    raw.close()


def test_a_frame_on_an_unopened_channel_is_504(
    server: AmqpServer, bystander: pika.BlockingConnection
) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.open_channel(1)
    # our client core would refuse to send it: write the frame by hand
    raw.send(encode_method_frame(5, m.BasicQos(0, 10, False)))
    close = raw.next_method()
    assert isinstance(close, m.ConnectionClose)
    assert close.reply_code == 504
    assert (close.class_id, close.method_id) == (60, 10)
    raw.close()


def test_garbage_after_the_handshake_is_a_frame_error(
    server: AmqpServer, bystander: pika.BlockingConnection
) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.send(b"\x09\x00\x00\x00\x00\x00\x00\xce")  # frame type 9 does not exist
    close = raw.next_method()
    assert isinstance(close, m.ConnectionClose)
    assert close.reply_code == 501
    raw.close()


def test_a_bad_frame_end_is_501(server: AmqpServer, bystander: pika.BlockingConnection) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.send(b"\x08\x00\x00\x00\x00\x00\x00\x00")  # a heartbeat ending 0x00, not 0xCE
    close = raw.next_method()
    assert isinstance(close, m.ConnectionClose)
    assert close.reply_code == 501
    raw.close()


def test_an_unknown_method_is_540(server: AmqpServer, bystander: pika.BlockingConnection) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.open_channel(1)
    raw.send(b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x00\x63\xce")  # basic, method 99
    close = raw.next_method()
    assert isinstance(close, m.ConnectionClose)
    assert close.reply_code == 540
    raw.close()


def test_content_without_its_method_is_505(
    server: AmqpServer, bystander: pika.BlockingConnection
) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.open_channel(1)
    raw.send(b"\x03\x00\x01\x00\x00\x00\x02hi\xce")  # a body frame out of the blue
    close = raw.next_method()
    assert isinstance(close, m.ConnectionClose)
    assert close.reply_code == 505
    raw.close()


def test_a_dropped_socket_requeues_unacked_messages(server: AmqpServer) -> None:
    connection = server.connect()
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=False, auto_delete=False).method.queue
    ch.basic_publish("", q, b"unacked")
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.open_channel(1)
    got = raw.request(1, m.BasicGet(0, q, False))
    assert isinstance(got, ContentReceived) and got.body == b"unacked"
    raw.close()  # no close handshake
    deadline = time.monotonic() + WAIT
    while (message := ch.basic_get(q, auto_ack=True))[0] is None:
        assert time.monotonic() < deadline
        connection.process_data_events(time_limit=0.01)
    assert message[0].redelivered is True
    assert message[2] == b"unacked"
    ch.queue_delete(q)
    connection.close()


def test_heartbeats_flow_and_a_silent_client_is_dropped(server: AmqpServer) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.handshake(heartbeat=1)
    assert raw.proto.heartbeat == 1
    started = time.monotonic()
    beats = 0
    with pytest.raises((EOFError, ConnectionResetError)):
        while True:
            event = raw.next_event()
            if isinstance(event, HeartbeatReceived):
                beats += 1
            else:
                assert isinstance(event, MethodReceived)
    silent_for = time.monotonic() - started
    assert beats >= 1
    assert 1.0 <= silent_for <= 3 * WAIT / 2
    raw.close()


def test_channel_close_handshake_from_server_then_reuse(
    server: AmqpServer, bystander: pika.BlockingConnection
) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.open_channel(1)
    close = raw.request(1, m.QueueDeclare(0, "no-such-queue-raw", passive=True))
    assert isinstance(close, MethodReceived) and isinstance(close.method, m.ChannelClose)
    assert close.method.reply_code == 404
    assert (close.method.class_id, close.method.method_id) == (50, 10)
    # frames on the closing channel are dropped until our close-ok
    raw.send(raw.proto.send_method(1, m.ChannelCloseOk()))
    raw.open_channel(1)  # the number is free again
    ok = raw.request(1, m.QueueDeclare(0, "", exclusive=True))
    assert isinstance(ok, MethodReceived) and isinstance(ok.method, m.QueueDeclareOk)
    raw.send(raw.proto.send_method(0, m.ConnectionClose(200, "bye", 0, 0)))
    assert isinstance(raw.next_method(), m.ConnectionCloseOk)
    raw.close()


def test_an_unsigned_64_bit_header_is_delivered_as_it_came(server: AmqpServer) -> None:
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.open_channel(1)
    ok = raw.request(1, m.QueueDeclare(0, "", exclusive=True))
    assert isinstance(ok, MethodReceived) and isinstance(ok.method, m.QueueDeclareOk)
    q = ok.method.queue
    # the spec's `L`, which RabbitMQ's dialect lacks: hand-made content header
    table = b"\x03bigL" + struct.pack(">Q", 2**64 - 1)
    header = struct.pack(">HHQH", 60, 0, 2, 0x2000) + struct.pack(">I", len(table)) + table
    raw.send(
        encode_method_frame(1, m.BasicPublish(0, "", q, False, False))
        + struct.pack(">BHI", 2, 1, len(header))
        + header
        + b"\xce"
        + struct.pack(">BHI", 3, 1, 2)
        + b"hi\xce"
    )
    got = raw.request(1, m.BasicGet(0, q, True))
    assert isinstance(got, ContentReceived)
    assert (got.body, got.properties.headers) == (b"hi", {"big": 2**64 - 1})
    raw.close()


def test_acks_due_go_out_before_a_channel_error_closes_the_channel(server: AmqpServer) -> None:
    """Confirms are written when the connection next writes (coalesced); a channel
    error in the same read must not swallow the acks already due."""
    raw = RawAmqp(server.amqp_port)
    raw.handshake()
    raw.open_channel(1)
    reply = raw.request(1, m.ConfirmSelect())
    assert isinstance(reply, MethodReceived) and isinstance(reply.method, m.ConfirmSelectOk)
    props = BasicProperties()
    # one write: a publish acked at once (unroutable, not mandatory), then one to
    # an exchange that does not exist (404 closes the channel in the same turn)
    data = raw.proto.send_content(1, m.BasicPublish(0, "", "no-such-queue"), props, b"a")
    data += raw.proto.send_content(1, m.BasicPublish(0, "no-such-exchange", "k"), props, b"b")
    raw.send(data)
    assert raw.next_method() == m.BasicAck(1, False)
    close = raw.next_method()
    assert isinstance(close, m.ChannelClose) and close.reply_code == 404
    raw.close()
