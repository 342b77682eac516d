"""``basic.qos`` global=true through pika: one prefetch shared by the channel's
consumers, as RabbitMQ 3.x does (checked against RabbitMQ 3.x by hand: the same
script gives the same counts there, see docs/amqp.md)."""

from __future__ import annotations

from typing import Any

import pika

from .conftest import WAIT


def _pump_until_quiet(conn: pika.BlockingConnection, got: list[Any], want: int) -> None:
    """Process events until ``want`` deliveries arrived, then a little longer to
    catch one too many (bounded by WAIT, never a fixed sleep to pass)."""
    deadline_rounds = 50
    while len(got) < want and deadline_rounds:
        conn.process_data_events(time_limit=WAIT / 50)
        deadline_rounds -= 1
    # a delivery beyond the limit would already be on its way: ask the broker a
    # synchronous question, so everything it sent before the answer has arrived
    conn.channel().close()
    conn.process_data_events(time_limit=0)


def test_global_qos_is_shared_by_the_channels_consumers(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    queues = [ch.queue_declare("", exclusive=True).method.queue for _ in range(2)]
    for q in queues:
        for i in range(3):
            ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=2, global_qos=True)
    got: list[Any] = []
    for q in queues:
        ch.basic_consume(q, lambda c, meth, p, b: got.append(meth))
    _pump_until_quiet(conn, got, 2)
    assert len(got) == 2  # per consumer it would be 4
    ch.basic_ack(got[0].delivery_tag)
    _pump_until_quiet(conn, got, 3)
    assert len(got) == 3
    ch.basic_ack(0, multiple=True)
    _pump_until_quiet(conn, got, 5)
    assert len(got) == 5


def test_global_and_per_consumer_qos_both_hold(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    queues = [ch.queue_declare("", exclusive=True).method.queue for _ in range(2)]
    for q in queues:
        for i in range(5):
            ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=1, global_qos=False)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got: list[Any] = []
    for q in queues:
        ch.basic_consume(q, lambda c, meth, p, b: got.append(meth))
    _pump_until_quiet(conn, got, 2)
    assert sorted(m.consumer_tag for m in got) == sorted(
        {m.consumer_tag for m in got}
    )  # one each: the per-consumer limit of 1 binds first
    assert len(got) == 2


def test_prefetch_size_is_refused_540(server: Any) -> None:
    connection = server.connect()
    ch = connection.channel()
    try:
        ch.basic_qos(prefetch_size=1024, prefetch_count=5)
    except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker) as e:
        assert e.reply_code == 540
    else:
        raise AssertionError("prefetch_size was accepted")
    finally:
        if connection.is_open:
            connection.close()
