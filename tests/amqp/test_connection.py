"""The connection and channel state machines: a client and a server object wired
in memory, the tables themselves, and bad orders refused with the right code."""

from __future__ import annotations

import struct

import pytest

from amqlite.amqp import (
    NEED_DATA,
    PROTOCOL_HEADER,
    AmqpConnection,
    AmqpError,
    AmqpLocalError,
    BasicProperties,
    ChannelState,
    ConnState,
    ContentReceived,
    Event,
    HeartbeatReceived,
    MethodReceived,
    ProtocolHeaderMismatch,
    ProtocolHeaderReceived,
    Role,
    is_connection_error,
)
from amqlite.amqp import methods as m
from amqlite.amqp.frames import (
    encode_body_frame,
    encode_header_frame,
    encode_heartbeat_frame,
    encode_method_frame,
)
from amqlite.amqp.states import (
    CHANNEL_TRANSITIONS,
    CONNECTION_TRANSITIONS,
    ChannelTrigger,
    ConnTrigger,
)


def events(conn: AmqpConnection, data: bytes) -> list[Event]:
    conn.receive_data(data)
    out = []
    while (event := conn.next_event()) is not NEED_DATA:
        assert isinstance(event, Event)
        out.append(event)
    return out


def refused(conn: AmqpConnection, data: bytes) -> AmqpError:
    with pytest.raises(AmqpError) as caught:
        events(conn, data)
    return caught.value


def handshake(
    frame_max: int = 131072, channel_max: int = 2047
) -> tuple[AmqpConnection, AmqpConnection]:
    client = AmqpConnection(Role.CLIENT)
    server = AmqpConnection(Role.SERVER, frame_max=frame_max, channel_max=channel_max)
    assert events(server, client.send_protocol_header()) == [ProtocolHeaderReceived()]
    start = m.ConnectionStart(server_properties={"product": "amqlite"}, mechanisms="PLAIN AMQPLAIN")
    assert events(client, server.send_method(0, start)) == [MethodReceived(0, start)]
    start_ok = m.ConnectionStartOk({"product": "test"}, "PLAIN", b"\0guest\0guest")
    assert events(server, client.send_method(0, start_ok)) == [MethodReceived(0, start_ok)]
    tune = m.ConnectionTune(channel_max, frame_max, 60)
    assert events(client, server.send_method(0, tune)) == [MethodReceived(0, tune)]
    tune_ok = m.ConnectionTuneOk(channel_max, frame_max, 30)
    assert events(server, client.send_method(0, tune_ok)) == [MethodReceived(0, tune_ok)]
    assert events(server, client.send_method(0, m.ConnectionOpen("/"))) == [
        MethodReceived(0, m.ConnectionOpen("/"))
    ]
    assert events(client, server.send_method(0, m.ConnectionOpenOk())) == [
        MethodReceived(0, m.ConnectionOpenOk())
    ]
    assert client.state is server.state is ConnState.OPEN
    return client, server


def open_channel(client: AmqpConnection, server: AmqpConnection, channel: int = 1) -> None:
    events(server, client.send_method(channel, m.ChannelOpen()))
    events(client, server.send_method(channel, m.ChannelOpenOk()))
    assert client.channel_state(channel) is server.channel_state(channel) is ChannelState.OPEN


# --- the happy paths -------------------------------------------------------------------


def test_handshake_negotiates_tune_values() -> None:
    client, server = handshake(frame_max=8192, channel_max=16)
    for conn in (client, server):
        assert (conn.frame_max, conn.channel_max, conn.heartbeat) == (8192, 16, 30)


def test_a_message_crosses_both_ways_split_by_frame_max() -> None:
    client, server = handshake(frame_max=4096)
    open_channel(client, server)
    body = bytes(range(256)) * 100  # 25600 bytes: 7 body frames at 4096
    props = BasicProperties(content_type="text/plain", delivery_mode=2, headers={"a": [1, "b"]})
    publish = m.BasicPublish(exchange="amq.direct", routing_key="rk", mandatory=True)
    wire = client.send_content(1, publish, props, body)
    assert wire.count(b"\xce\x03\x00\x01") == 7  # each body frame follows a frame end
    got = events(server, wire)
    assert got == [ContentReceived(1, publish, props, body)]
    deliver = m.BasicDeliver("ctag", 1, False, "amq.direct", "rk")
    assert events(client, server.send_content(1, deliver, props, body)) == [
        ContentReceived(1, deliver, props, body)
    ]


def test_an_empty_body_completes_at_the_header() -> None:
    client, server = handshake()
    open_channel(client, server)
    publish = m.BasicPublish(routing_key="q")
    assert events(server, client.send_content(1, publish, BasicProperties(), b"")) == [
        ContentReceived(1, publish, BasicProperties(), b"")
    ]
    assert server.channel_state(1) is ChannelState.OPEN


def test_outgoing_traffic_interleaves_with_an_incoming_message() -> None:
    client, server = handshake()
    open_channel(client, server)
    events(server, encode_method_frame(1, m.BasicPublish(routing_key="q")))
    assert server.channel_state(1) is ChannelState.AWAIT_HEADER
    server.send_content(1, m.BasicDeliver("c", 1), BasicProperties(), b"x")
    server.send_method(1, m.BasicAck(3))
    assert server.channel_state(1) is ChannelState.AWAIT_HEADER
    assert events(server, encode_header_frame(1, 2) + encode_body_frame(1, b"hi")) == [
        ContentReceived(1, m.BasicPublish(routing_key="q"), BasicProperties(), b"hi")
    ]


def test_heartbeats_flow_once_started() -> None:
    client, server = handshake()
    assert events(server, client.send_heartbeat()) == [HeartbeatReceived()]
    assert events(client, server.send_heartbeat()) == [HeartbeatReceived()]


def test_channel_and_connection_close_both_ways() -> None:
    client, server = handshake()
    open_channel(client, server)
    close = m.ChannelClose(200, "bye")
    assert events(server, client.send_method(1, close)) == [MethodReceived(1, close)]
    assert server.channel_state(1) is ChannelState.CLOSE_RECEIVED
    events(client, server.send_method(1, m.ChannelCloseOk()))
    assert client.channel_state(1) is server.channel_state(1) is ChannelState.CLOSED
    open_channel(client, server)  # a closed channel number may be opened again
    events(client, server.send_method(0, m.ConnectionClose(320, "shutdown")))
    assert client.state is ConnState.CLOSE_RECEIVED
    events(server, client.send_method(0, m.ConnectionCloseOk()))
    assert client.state is server.state is ConnState.CLOSED


# --- the tables ------------------------------------------------------------------------


def test_every_connection_state_is_reachable_and_every_trigger_used() -> None:
    reached = {ConnState.AWAIT_PROTOCOL_HEADER} | set(CONNECTION_TRANSITIONS.values())
    assert reached == set(ConnState)
    assert {t for _, t in CONNECTION_TRANSITIONS} == set(ConnTrigger)


def test_every_channel_state_is_reachable_and_every_trigger_used() -> None:
    assert {ChannelState.CLOSED} | set(CHANNEL_TRANSITIONS.values()) == set(ChannelState)
    assert {t for _, t in CHANNEL_TRANSITIONS} == set(ChannelTrigger)


def test_nothing_leaves_closed_connections() -> None:
    assert not [key for key in CONNECTION_TRANSITIONS if key[0] is ConnState.CLOSED]


# --- bad orders, with RabbitMQ's reply codes -------------------------------------------


def test_a_wrong_protocol_header_is_answered_with_ours() -> None:
    server = AmqpConnection(Role.SERVER)
    error = refused(server, b"GET / HTTP/1.1\r\n")
    assert isinstance(error, ProtocolHeaderMismatch)
    assert server.send_close_for(error) == PROTOCOL_HEADER
    assert isinstance(
        refused(AmqpConnection(Role.SERVER), b"AMQP\x00\x00\x08\x00"), ProtocolHeaderMismatch
    )


def test_a_client_answered_with_a_protocol_header_knows_why() -> None:
    client = AmqpConnection(Role.CLIENT)
    client.send_protocol_header()
    error = refused(client, b"AMQP\x01\x01\x00\x0a")
    assert isinstance(error, ProtocolHeaderMismatch)


def _started_server() -> AmqpConnection:
    server = AmqpConnection(Role.SERVER, frame_max=8192)
    events(server, PROTOCOL_HEADER)
    server.send_method(0, m.ConnectionStart())
    return server


def test_handshake_methods_out_of_order_are_command_invalid() -> None:
    error = refused(_started_server(), encode_method_frame(0, m.ConnectionOpen("/")))
    assert error.code == 503
    assert (error.class_id, error.method_id) == (10, 40)


def test_a_method_only_the_server_sends_is_refused_from_a_client() -> None:
    client, server = handshake()
    open_channel(client, server)
    error = refused(server, encode_method_frame(1, m.BasicGetEmpty()))
    assert error.code == 503
    assert error.closes_connection


def test_channel_frames_before_the_connection_is_open_are_refused() -> None:
    error = refused(_started_server(), encode_method_frame(1, m.ChannelOpen()))
    assert error.code == 504


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        # a method on a channel that was never opened
        (encode_method_frame(2, m.BasicQos(0, 10)), 504),
        # channel.open twice
        (encode_method_frame(1, m.ChannelOpen()), 504),
        # a content header with no method before it
        (encode_header_frame(1, 3), 505),
        # a body with no header
        (encode_body_frame(1, b"x"), 505),
        # a method while the header is awaited
        (encode_method_frame(1, m.BasicPublish()) + encode_method_frame(1, m.BasicQos()), 505),
        # a method while the body is awaited
        (
            encode_method_frame(1, m.BasicPublish())
            + encode_header_frame(1, 5)
            + encode_body_frame(1, b"ab")
            + encode_method_frame(1, m.BasicQos()),
            505,
        ),
        # a body frame after the message is complete
        (
            encode_method_frame(1, m.BasicPublish())
            + encode_header_frame(1, 1)
            + encode_body_frame(1, b"a")
            + encode_body_frame(1, b"b"),
            505,
        ),
        # body frames carrying more than the header said
        (
            encode_method_frame(1, m.BasicPublish())
            + encode_header_frame(1, 2)
            + encode_body_frame(1, b"abc"),
            501,
        ),
        # a header naming another class than the method's
        (
            encode_method_frame(1, m.BasicPublish())
            + encode_header_frame(1, 2)[:7]
            + b"\x00\x32"
            + encode_header_frame(1, 2)[9:],
            505,
        ),
        # content frames on channel 0
        (encode_header_frame(0, 1), 505),
        # a connection method on a channel, a channel method on channel 0
        (encode_method_frame(1, m.ConnectionBlocked("x")), 503),
        (encode_method_frame(0, m.BasicQos()), 503),
        # a heartbeat on a channel
        (b"\x08\x00\x01\x00\x00\x00\x00\xce", 501),
        # an unknown frame type, a bad frame end, an unknown method
        (b"\x05\x00\x01\x00\x00\x00\x00\xce", 501),
        (encode_method_frame(1, m.BasicQos())[:-1] + b"\x00", 501),
        (b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x03\xe7\xce", 540),
        # arguments that do not decode
        (b"\x01\x00\x01\x00\x00\x00\x05\x00\x3c\x00\x0a\x01\xce", 502),
        # a frame larger than frame_max (8192 negotiated)
        (struct.pack(">BHI", 3, 1, 9000), 501),
        # a channel above channel_max
        (encode_method_frame(17, m.ChannelOpen()), 530),
    ],
)
def test_bad_frame_orders_close_the_connection_with_rabbitmqs_code(
    frames: bytes, code: int
) -> None:
    client, server = handshake(frame_max=8192, channel_max=16)
    open_channel(client, server)
    error = refused(server, frames)
    assert error.code == code
    assert error.closes_connection
    close = server.send_close_for(error)
    assert close.startswith(b"\x01\x00\x00")  # connection.close goes out on channel 0
    assert server.state is ConnState.CLOSE_SENT


@pytest.mark.parametrize(
    ("tune_ok", "problem"),
    [
        (m.ConnectionTuneOk(16, 16384, 0), "frame_max"),
        (m.ConnectionTuneOk(16, 1024, 0), "frame_max"),
        (m.ConnectionTuneOk(17, 8192, 0), "channel_max"),
    ],
)
def test_tune_ok_asking_more_than_offered_is_not_allowed(
    tune_ok: m.ConnectionTuneOk, problem: str
) -> None:
    server = _started_server()
    events(server, encode_method_frame(0, m.ConnectionStartOk()))
    server.send_method(0, m.ConnectionTune(16, 8192, 60))
    error = refused(server, encode_method_frame(0, tune_ok))
    assert error.code == 530
    assert problem in error.text


def test_a_too_large_message_closes_only_its_channel() -> None:
    client, server = handshake()
    server.max_body_size = 10
    open_channel(client, server)
    open_channel(client, server, 2)
    wire = client.send_content(1, m.BasicPublish(), BasicProperties(), b"x" * 11)
    error = refused(server, wire[: wire.index(b"\xce") + 1 + 30])
    assert (error.code, error.channel, error.closes_connection) == (406, 1, False)
    close = server.send_close_for(error)
    assert close.startswith(b"\x01\x00\x01")  # channel.close on channel 1
    assert server.channel_state(1) is ChannelState.CLOSE_SENT
    # the rest of the message and anything sent before the client saw the close
    # are dropped; the other channel and the connection carry on
    rest = wire[wire.index(b"\xce") + 1 + 30 :] + encode_method_frame(1, m.BasicQos())
    assert events(server, rest) == []
    assert events(server, encode_method_frame(2, m.BasicQos(prefetch_count=1))) == [
        MethodReceived(2, m.BasicQos(prefetch_count=1))
    ]
    events(server, encode_method_frame(1, m.ChannelCloseOk()))
    assert server.channel_state(1) is ChannelState.CLOSED
    assert server.state is ConnState.OPEN


def test_a_soft_broker_error_closes_its_channel_and_the_other_end_follows() -> None:
    client, server = handshake()
    open_channel(client, server)
    declare = m.QueueDeclare(queue="missing", passive=True)
    events(server, client.send_method(1, declare))
    error = AmqpError("no queue 'missing'", 404, channel=1, class_id=50, method_id=10)
    got = events(client, server.send_close_for(error))
    # the reply text as RabbitMQ writes it: the code's name in front
    text = "NOT_FOUND - no queue 'missing'"
    assert got == [MethodReceived(1, m.ChannelClose(404, text, 50, 10))]
    assert client.channel_state(1) is ChannelState.CLOSE_RECEIVED
    with pytest.raises(AmqpLocalError):  # nothing but close-ok may follow
        client.send_method(1, m.BasicQos())
    events(server, client.send_method(1, m.ChannelCloseOk()))
    assert client.channel_state(1) is server.channel_state(1) is ChannelState.CLOSED


def test_after_a_connection_close_only_close_and_close_ok_count() -> None:
    client, server = handshake()
    open_channel(client, server)
    server.send_method(0, m.ConnectionClose(320, "bye"))
    dropped = (
        encode_method_frame(1, m.BasicQos())
        + encode_method_frame(0, m.ConnectionUpdateSecret(b"token", "refresh"))
        + encode_heartbeat_frame()
    )
    assert events(server, dropped) == [HeartbeatReceived()]
    assert events(server, encode_method_frame(0, m.ConnectionCloseOk())) == [
        MethodReceived(0, m.ConnectionCloseOk())
    ]
    assert server.state is ConnState.CLOSED


def test_sending_out_of_turn_is_a_local_error() -> None:
    client, server = handshake()
    with pytest.raises(AmqpLocalError):
        server.send_method(0, m.ConnectionStartOk())  # the client's method
    with pytest.raises(AmqpLocalError):
        client.send_method(1, m.BasicQos())  # channel not open
    open_channel(client, server)
    with pytest.raises(AmqpLocalError):
        client.send_method(1, m.BasicPublish())  # content needs send_content
    with pytest.raises(AmqpLocalError):
        client.send_content(1, m.BasicQos(), BasicProperties(), b"")
    with pytest.raises(AmqpLocalError):
        client.send_method(0, m.ConnectionOpen())  # handshake is over


@pytest.mark.parametrize(
    ("code", "hard"),
    [
        (311, False),
        (312, False),
        (313, False),
        (403, False),
        (404, False),
        (405, False),
        (406, False),
        (320, True),
        (402, True),
        (501, True),
        (502, True),
        (503, True),
        (504, True),
        (505, True),
        (506, True),
        (530, True),
        (540, True),
        (541, True),
    ],
)
def test_reply_codes_map_to_channel_or_connection_closes(code: int, hard: bool) -> None:
    assert is_connection_error(code) is hard
    assert AmqpError("x", code, channel=3).closes_connection is hard
    assert AmqpError("x", code, channel=0).closes_connection  # nothing smaller to close
