"""The broker trace sees AMQP traffic as it sees native traffic: a pika publish,
its delivery and its ack each leave a record in ``amq.trace``, which a pika
stream consumer reads back (the Spark source and the audit read the same stream)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pytest

from .conftest import WAIT, AmqpServer, start_amqp_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpServer]:
    tmp = tmp_path_factory.mktemp("traced")
    config = tmp / "trace.toml"
    config.write_text("[server]\ntrace = true\n")
    server = start_amqp_server(tmp / "data", "--config", str(config))
    try:
        yield server
    finally:
        server.stop()


def test_publish_deliver_and_ack_over_amqp_are_traced(traced: AmqpServer) -> None:
    conn = traced.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("traced-q", durable=True)
        ch.basic_publish(
            "", "traced-q", b"x", pika.BasicProperties(message_id="t-1", delivery_mode=2)
        )
        method, _, body = ch.basic_get("traced-q")
        assert method is not None and body == b"x"
        ch.basic_ack(method.delivery_tag)

        ch.basic_qos(prefetch_count=100)
        records: list[dict[str, Any]] = []
        for m, props, _ in ch.consume(
            "amq.trace", arguments={"x-stream-offset": "first"}, inactivity_timeout=WAIT
        ):
            assert m is not None, f"trace records so far: {records}"
            ch.basic_ack(m.delivery_tag)
            if props.headers.get("message_id") == "t-1":
                records.append(props.headers)
            if len(records) == 3:
                break
        ch.cancel()
    finally:
        conn.close()
    assert [r["event"] for r in records] == ["publish", "deliver", "ack"]
    assert {r["queue"] for r in records} == {"traced-q"}
    assert records[0]["outcome"] == "routed"
