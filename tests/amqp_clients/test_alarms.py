"""pika and the memory alarm: connection.blocked / connection.unblocked, a consumer
draining on its own connection meanwhile, and not one message lost.

The server's memory measurement is injected through the test-only environment
variable ``AMQLITE_TEST_MEMORY_FILE`` (amqlite.server.alarms): no gigabytes are
allocated."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from amqlite.server.alarms import TEST_MEMORY_FILE_ENV

from .conftest import WAIT, AmqpServer, start_amqp_server, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

OVER = 2**60  # bytes "used": past any watermark
UNDER = 1


@pytest.fixture
def memory_file(tmp_path: Path) -> Path:
    path = tmp_path / "memory-used"
    path.write_text(str(UNDER))
    return path


@pytest.fixture
def alarmed(tmp_path: Path, memory_file: Path) -> Iterator[AmqpServer]:
    server = start_amqp_server(None, env={TEST_MEMORY_FILE_ENV: str(memory_file)})
    try:
        yield server
    finally:
        server.stop()


def _pump(conn: pika.BlockingConnection, until: list[str], count: int) -> None:
    """Let pika read (its callbacks run in process_data_events) until ``until`` has
    ``count`` entries."""

    def ready() -> bool:
        conn.process_data_events(time_limit=0.01)
        return len(until) >= count

    wait_until(ready, WAIT)


def test_pika_is_blocked_then_unblocked_and_loses_nothing(
    alarmed: AmqpServer, memory_file: Path
) -> None:
    notices: list[str] = []
    pub = alarmed.connect()
    pub.add_on_connection_blocked_callback(
        lambda _conn, frame: notices.append(f"blocked: {frame.method.reason}")
    )
    pub.add_on_connection_unblocked_callback(lambda _conn, _frame: notices.append("unblocked"))
    sub = alarmed.connect()
    try:
        confirmed = pub.channel()
        confirmed.confirm_delivery()
        confirmed.queue_declare("alarmed")
        plain = pub.channel()  # opened now: a blocked connection is not read at all
        for i in range(50):
            confirmed.basic_publish("", "alarmed", str(i).encode())

        since = len(alarmed.records)
        memory_file.write_text(str(OVER))
        _pump(pub, notices, 1)
        assert notices == ["blocked: low on memory"]
        alarmed.wait_for_log("alarm_raised", since, resource="memory")
        alarmed.wait_for_log("amqp_connection_blocked", since, reason="low on memory")

        # sent while blocked: the server does not handle them until it unblocks
        for i in range(50, 100):
            plain.basic_publish("", "alarmed", str(i).encode())

        # a consumer on its own connection drains what was accepted
        got: list[int] = []
        ch = sub.channel()
        ch.basic_qos(prefetch_count=20)

        def on_message(channel: object, method: object, _props: object, body: bytes) -> None:
            got.append(int(body))
            ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

        ch.basic_consume("alarmed", on_message)
        wait_until(lambda: (sub.process_data_events(time_limit=0.01), len(got) >= 50)[1])
        sub.process_data_events(time_limit=0.2)
        assert got == list(range(50))  # nothing sent while blocked got through

        since = len(alarmed.records)
        memory_file.write_text(str(UNDER))
        _pump(pub, notices, 2)
        assert notices == ["blocked: low on memory", "unblocked"]
        alarmed.wait_for_log("alarm_cleared", since, resource="memory")
        wait_until(lambda: (sub.process_data_events(time_limit=0.01), len(got) >= 100)[1])
        assert got == list(range(100))  # every message once, in order
        confirmed.basic_publish("", "alarmed", b"100")  # confirmed again at once
    finally:
        for conn in (pub, sub):
            if conn.is_open:
                conn.close()
