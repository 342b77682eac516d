"""Each limit of ``[limits]`` that AMQP has, refused to pika as RabbitMQ refuses it:
connections (per node, per user) with connection.close 530 at connection.open,
one channel past channel_max with connection.close 530, one consumer too many with
connection.close 530, one queue past the vhost's limit with channel.close 406, a
body over max_message_size with channel.close 406 -- each text naming the setting.
Against a real broker process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pika
import pika.exceptions
import pytest

from amqlite.amqp import methods as m
from amqlite.auth import hash_password

from .conftest import AmqpServer, start_amqp_server
from .rawamqp import RawAmqp

PASSWORD = "pw"
_HASH = hash_password(PASSWORD, salt=b"0123456789abcdef", n=2**4)


def _user(name: str) -> str:
    grants = "".join(
        f'[users.permissions."{vhost}"]\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
        for vhost in ("/", "queues")
    )
    return f'[[users]]\nname = "{name}"\npassword_hash = "{_HASH}"\n{grants}'


CONFIG = f"""
[server]
vhosts = ["/", "queues"]
[amqp]
channel_max = 3
[limits]
max_connections = 3
max_connections_per_user = 2
max_consumers_per_connection = 2
max_queues_per_vhost = 2
max_message_size = 1000
{_user("ann")}
{_user("bob")}
"""


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpServer]:
    where = tmp_path_factory.mktemp("limits")
    config = Path(where / "limits.toml")
    config.write_text(CONFIG, encoding="utf-8")
    server = start_amqp_server(None, "--config", str(config))
    try:
        yield server
    finally:
        server.stop()


def _connect(server: AmqpServer, login: str, vhost: str = "/") -> pika.BlockingConnection:
    return server.connect(
        credentials=pika.PlainCredentials(login, PASSWORD),
        virtual_host=vhost,
        connection_attempts=1,
    )


def _refusal(server: AmqpServer, login: str) -> str:
    """What pika reports of the broker's connection.close at connection.open (it
    takes a close at that stage for a probable access denial and keeps the text)."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        _connect(server, login)
    return str(info.value)


def test_connections_past_the_user_and_the_node_limit_are_530(limited: AmqpServer) -> None:
    with ExitStack() as stack:
        for _ in range(2):
            stack.callback(_connect(limited, "ann").close)
        refused = _refusal(limited, "ann")
        assert refused.startswith("ConnectionClosedByBroker: (530) ")
        assert refused[33:-1] == (
            "NOT_ALLOWED - user connection limit (2) of user 'ann' is reached "
            "(limits.max_connections_per_user)"
        )
        stack.callback(_connect(limited, "bob").close)  # the node's third
        refused = _refusal(limited, "bob")
        assert refused.startswith("ConnectionClosedByBroker: (530) ")
        assert refused[33:-1] == (
            "NOT_ALLOWED - node connection limit (3) is reached (limits.max_connections)"
        )
        limited.wait_for_log(
            "amqp_connection_refused",
            reason="node connection limit (3) is reached (limits.max_connections)",
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpServer]:
    """Limits per connection and per vhost, none on connections."""
    where = tmp_path_factory.mktemp("limits-per-connection")
    config = Path(where / "limits.toml")
    config.write_text(
        CONFIG.replace(
            "max_connections = 3", "max_connections = 100\nhandshake_timeout = 1.0"
        ).replace("max_connections_per_user = 2", "max_connections_per_user = 0"),
        encoding="utf-8",
    )
    amqp_server = start_amqp_server(None, "--config", str(config))
    try:
        yield amqp_server
    finally:
        amqp_server.stop()


def test_a_channel_past_channel_max_closes_the_connection_530(server: AmqpServer) -> None:
    connection = _connect(server, "ann")
    assert connection._impl.params.channel_max == 3  # what tune offered
    for _ in range(3):
        connection.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        connection.channel(channel_number=4)  # pika would not pick it: we do
    assert info.value.reply_code == 530
    assert info.value.reply_text == (
        "NOT_ALLOWED - channel 4 is above the negotiated channel_max (3)"
    )


def test_a_consumer_past_the_connection_limit_closes_it_530(server: AmqpServer) -> None:
    connection = _connect(server, "ann")
    one, two = connection.channel(), connection.channel()
    one.queue_declare("consumed", auto_delete=True)
    one.basic_consume("consumed", lambda *args: None)
    two.basic_consume("consumed", lambda *args: None)  # counted over the channels
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        two.basic_consume("consumed", lambda *args: None)
    assert info.value.reply_code == 530
    assert info.value.reply_text == (
        "NOT_ALLOWED - reached maximum (2) of consumers per connection "
        "(limits.max_consumers_per_connection)"
    )


def test_a_queue_past_the_vhost_limit_closes_the_channel_406(server: AmqpServer) -> None:
    connection = _connect(server, "ann", vhost="queues")
    try:
        channel = connection.channel()
        channel.queue_declare("first", exclusive=True)
        channel.queue_declare("", exclusive=True)  # server-named ones count too
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare("third", exclusive=True)
        assert info.value.reply_code == 406
        assert info.value.reply_text == (
            "PRECONDITION_FAILED - cannot declare queue 'third': queue limit in vhost "
            "'queues' (2) is reached (limits.max_queues_per_vhost)"
        )
        channel = connection.channel()  # the connection goes on
        channel.queue_declare("first", passive=True)
    finally:
        connection.close()


def test_a_body_over_max_message_size_closes_the_channel_406(server: AmqpServer) -> None:
    connection = _connect(server, "ann")
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("sized", auto_delete=True)
        channel.basic_consume("sized", lambda *args: None)  # keeps it while we publish
        channel.basic_publish("", "sized", b"x" * 1000)  # at the limit: fine
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.basic_publish("", "sized", b"x" * 1001)
        assert info.value.reply_code == 406
        assert info.value.reply_text == (
            "PRECONDITION_FAILED - message size 1001 is larger than configured max size "
            "1000 (limits.max_message_size)"
        )
        other = connection.channel()
        other.confirm_delivery()
        other.basic_publish("", "", b"still served")
    finally:
        connection.close()


def test_a_handshake_stalled_before_connection_open_is_closed(server: AmqpServer) -> None:
    """Tuned, then silent: the handshake timeout runs until ``connection.open-ok``."""
    since = len(server.records)
    raw = RawAmqp(server.amqp_port)
    raw.send(raw.proto.send_protocol_header())
    assert isinstance(raw.next_method(), m.ConnectionStart)
    credentials = f"\0ann\0{PASSWORD}".encode()
    raw.send(raw.proto.send_method(0, m.ConnectionStartOk({}, "PLAIN", credentials, "en_US")))
    tune = raw.next_method()
    assert isinstance(tune, m.ConnectionTune)
    raw.send(raw.proto.send_method(0, m.ConnectionTuneOk(0, tune.frame_max, 0)))
    assert raw.receive_raw() == b""  # closed, within WAIT
    record = server.wait_for_log("handshake_timeout", since=since, listener="amqp")
    assert record["timeout_s"] == 1.0
    raw.close()
