"""``x-expires`` through pika against a broker process: an unused queue goes away."""

from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from .conftest import WAIT


def _gone(conn: pika.BlockingConnection, name: str) -> bool:
    ch = conn.channel()
    try:
        ch.queue_declare(name, passive=True)
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return True
    ch.close()
    return False


def test_an_unused_queue_is_deleted(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.queue_declare("expiring", durable=True, arguments={"x-expires": 300})
    ch.basic_publish("", "expiring", b"m", pika.BasicProperties(delivery_mode=2))
    deadline = time.monotonic() + WAIT
    while not _gone(conn, "expiring"):  # bounded wait on the condition
        assert time.monotonic() < deadline, "the queue was never deleted"
        conn.process_data_events(time_limit=0.05)


def test_a_queue_with_a_consumer_stays(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.queue_declare("kept", arguments={"x-expires": 100})
    ch.basic_consume("kept", lambda *a: None)
    # the broker checks every 0.1 s: after 10x the expiry it would long be gone
    conn.process_data_events(time_limit=1.0)
    assert not _gone(conn, "kept")
    ch.queue_delete("kept")


def test_zero_is_refused_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as caught:
        ch.queue_declare("bad", arguments={"x-expires": 0})
    assert caught.value.reply_code == 406
