"""AMQP clients on two peered sites: a message pika publishes on site A reaches a
pika consumer on site B over a ``[[cluster_mta]]`` link (mode publish), exactly
once, with its properties; what nobody on B bound for stays home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.waiting import poll_until

from .conftest import CHECKOUT, WAIT, AmqpServer, start_amqp_server

pytestmark = pytest.mark.e2e

EXCHANGE = "events"


def _status(server: AmqpServer) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "amqlite", "status", "--json", "-s", f"127.0.0.1:{server.port}"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
    )
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def _dialer_link(server: AmqpServer) -> dict[str, Any]:
    return next(link for link in _status(server)["links"] if link["role"] == "dialer")


def _wait_link(server: AmqpServer, check: Any) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        link = _dialer_link(server)
        return link if check(link) else None

    return poll_until(ready, "the dialer link's state", deadline=3 * WAIT, every=0.05)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AmqpServer, AmqpServer]]:
    tmp = tmp_path_factory.mktemp("sites")
    b_config = tmp / "b.toml"
    b_config.write_text('[server]\nnode_id = "site-b"\n')
    b = start_amqp_server(tmp / "data-b", "--config", str(b_config))
    a_config = tmp / "a.toml"
    a_config.write_text(
        '[server]\nnode_id = "site-a"\n\n[[cluster_mta]]\n'
        f'name = "{EXCHANGE}"\nhost = "127.0.0.1:{b.port}"\nmode = "publish"\n'
        'login = "guest"\npassword = "guest"\ntype = "topic"\n'
    )
    try:
        a = start_amqp_server(tmp / "data-a", "--config", str(a_config))
    except BaseException:
        b.stop()
        raise
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_pika_publishes_on_a_and_a_pika_consumer_on_b_gets_each_once(
    sites: tuple[AmqpServer, AmqpServer], tmp_path: Path
) -> None:
    a, b = sites
    consumer = b.connect()
    publisher = a.connect()
    try:
        cb = consumer.channel()
        # the peered exchange exists on B once the link is up; declaring it is the
        # same declaration (topic), as an application would do
        cb.exchange_declare(EXCHANGE, "topic")
        queue = cb.queue_declare("", exclusive=True).method.queue
        cb.queue_bind(queue, EXCHANGE, "orders.#")
        _wait_link(a, lambda link: link["interest_size"] >= 1)

        pa = publisher.channel()
        pa.confirm_delivery()
        for i in range(50):
            props = pika.BasicProperties(
                message_id=f"m{i}", delivery_mode=2, headers={"i": i}, content_type="text/plain"
            )
            pa.basic_publish(EXCHANGE, "orders.eu", b"order %d" % i, props)
            pa.basic_publish(EXCHANGE, "invoices.eu", b"not wanted on b", props)

        got: list[tuple[bytes, str | None, dict[str, Any] | None, str | None]] = []
        for method, properties, body in cb.consume(queue, inactivity_timeout=WAIT):
            assert method is not None, f"only {len(got)} of 50 arrived"
            got.append((body, properties.message_id, properties.headers, properties.content_type))
            cb.basic_ack(method.delivery_tag)
            if len(got) == 50:
                break
        cb.cancel()
        assert [g[0] for g in got] == [b"order %d" % i for i in range(50)]
        assert [g[1] for g in got] == [f"m{i}" for i in range(50)]
        assert all(g[2] is not None and g[2]["i"] == i for i, g in enumerate(got))
        assert {g[3] for g in got} == {"text/plain"}
        # nothing more comes: the invoices had no interest on B and were not sent
        link = _wait_link(a, lambda link: link["lag_messages"] == 0)
        assert link["forwarded"] == 50
        assert link["skipped"]["no-interest"] == 50
        extra = cb.basic_get(queue, auto_ack=True)
        assert extra == (None, None, None)
    finally:
        consumer.close()
        publisher.close()
