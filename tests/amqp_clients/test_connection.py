"""Opening AMQP connections: credentials, vhosts, what the server announces."""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ProbableAccessDeniedError, ProbableAuthenticationError

from .conftest import AmqpServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def test_server_properties_and_tune(server: AmqpServer) -> None:
    connection = server.connect()
    impl = connection._impl
    props = impl.server_properties
    assert props["product"] == "amqlite"
    caps = props["capabilities"]
    for capability in (
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "exchange_exchange_bindings",
        "authentication_failure_close",
    ):
        assert capability in caps
    assert impl.params.frame_max == 131072
    assert impl.params.channel_max == 2047
    connection.close()


def test_client_asks_for_less(server: AmqpServer) -> None:
    connection = server.connect(frame_max=8192, channel_max=3, heartbeat=5)
    assert connection._impl.params.frame_max == 8192
    channels = [connection.channel() for _ in range(3)]
    assert [c.channel_number for c in channels] == [1, 2, 3]
    connection.close()


def test_wrong_password_is_refused_403(server: AmqpServer) -> None:
    since = len(server.records)
    credentials = pika.PlainCredentials("guest", "wrong")
    # RabbitMQ's authentication_failure_close: connection.close 403 at start-ok,
    # which pika reports as a probable authentication error carrying it
    with pytest.raises(ProbableAuthenticationError) as caught:
        server.connect(credentials=credentials)
    assert "(403) 'ACCESS_REFUSED - Login was refused" in str(caught.value)
    record = server.wait_for_log("amqp_connection_refused", since=since)
    assert record["login"] == "guest"
    server.connect().close()  # the listener goes on


def test_unknown_user_is_refused_403(server: AmqpServer) -> None:
    with pytest.raises(ProbableAuthenticationError) as caught:
        server.connect(credentials=pika.PlainCredentials("nobody", "x"))
    assert "(403) 'ACCESS_REFUSED" in str(caught.value)


def test_unknown_vhost_is_refused_530(server: AmqpServer) -> None:
    with pytest.raises(ProbableAccessDeniedError) as caught:
        server.connect(virtual_host="nope")
    assert "(530)" in str(caught.value)
    assert "NOT_ALLOWED - access to vhost 'nope' refused for user 'guest'" in str(caught.value)


def test_amqplain_mechanism(server: AmqpServer) -> None:
    # kombu's py-amqp speaks AMQPLAIN by default
    import amqp

    connection = amqp.Connection(
        f"127.0.0.1:{server.amqp_port}", userid="guest", password="guest", login_method="AMQPLAIN"
    )
    connection.connect()
    ch = connection.channel()
    q, _, _ = ch.queue_declare("", exclusive=True)
    ch.basic_publish(amqp.Message(b"hi"), routing_key=q)
    assert ch.basic_get(q, no_ack=True).body == b"hi"
    connection.close()

    bad = amqp.Connection(
        f"127.0.0.1:{server.amqp_port}", userid="guest", password="no", login_method="AMQPLAIN"
    )
    with pytest.raises(amqp.exceptions.AccessRefused):
        bad.connect()


def test_status_lists_amqp_connections(server: AmqpServer) -> None:
    import json

    import trio

    import amqlite

    connection = server.connect(client_properties={"product": "status-probe"})

    async def status() -> dict[str, object]:
        async with amqlite.connect(f"127.0.0.1:{server.port}") as native:
            return await native.status()

    info = trio.run(status)
    assert info["amqp_listen"] == f"127.0.0.1:{server.amqp_port}"
    text = json.dumps(info, default=str)
    assert "status-probe" in text
    assert "amqp-0-9-1" in text
    connection.close()
