"""The broker trace (amq.trace): off by default; when on, one record per publish
(per queue reached), delivery and ack, and nothing about amq.trace itself."""

from __future__ import annotations

from typing import Any

from amqlite.broker import Broker, Message, Session
from amqlite.broker.stream import StreamQueue
from amqlite.broker.trace import TRACE_QUEUE, set_trace


def trace_of(broker: Broker, vhost: str = "/") -> list[dict[str, Any]]:
    host = broker.vhost(vhost)
    assert host is not None
    q = host.queues.get(TRACE_QUEUE)
    if q is None:
        return []
    assert isinstance(q, StreamQueue)
    return [dict(m.headers) for m in q._log[q._head :]]


def brief(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["event"], r["message_id"], r["queue"]) for r in records]


def publish(s: Session, key: str, message_id: str, exchange: str = "", now: float = 1.0) -> None:
    s.publish(Message(exchange, key, b"x", {}, {"message_id": message_id}), now=now)


def test_off_by_default_records_nothing(broker: Broker, s: Session) -> None:
    s.declare_queue("q")
    publish(s, "q", "m1")
    assert broker.tracer is None
    assert trace_of(broker) == []
    assert TRACE_QUEUE not in broker.vhost("/").queues  # type: ignore[union-attr]


def test_publish_deliver_ack_each_make_one_record(broker: Broker, s: Session) -> None:
    assert s.set_trace(True) is True
    broker.wall_offset = 1000.0
    s.declare_queue("q")
    publish(s, "q", "m1", now=2.0)
    s.consume("q", now=3.0)
    (d,) = s.take_deliveries()
    s.ack(d.dtag, now=4.0)
    records = trace_of(broker)
    assert brief(records) == [("publish", "m1", "q"), ("deliver", "m1", "q"), ("ack", "m1", "q")]
    pub = records[0]
    assert pub["node"] == "node-test" and pub["routing_key"] == "q" and pub["exchange"] == ""
    assert pub["outcome"] == "routed" and pub["time"] == 1002.0
    assert records[1]["redelivered"] is False


def test_a_fanout_publish_records_each_queue_and_unroutable_records_none(
    broker: Broker, s: Session
) -> None:
    set_trace(broker, True)
    for name in ("a", "b"):
        s.declare_queue(name)
        s.bind(name, "amq.fanout", "")
    publish(s, "", "fan", exchange="amq.fanout")
    publish(s, "nowhere", "lost")
    assert brief(trace_of(broker)) == [
        ("publish", "fan", "a"),
        ("publish", "fan", "b"),
        ("publish", "lost", ""),
    ]
    assert trace_of(broker)[-1]["outcome"] == "unroutable"


def test_requeue_then_redeliver_is_two_deliveries_and_multiple_ack_records_each(
    broker: Broker, s: Session
) -> None:
    set_trace(broker, True)
    s.declare_queue("q")
    publish(s, "q", "m1")
    publish(s, "q", "m2")
    s.consume("q", now=1.0)
    first = s.take_deliveries()
    s.nack(first[0].dtag, requeue=True)
    again = s.take_deliveries()
    s.ack(0, multiple=True)
    records = brief(trace_of(broker))
    assert records.count(("deliver", "m1", "q")) == 2
    assert records[-2:] == [("ack", "m2", "q"), ("ack", "m1", "q")]  # delivery-tag order
    assert [d.redelivered for d in again] == [True]


def test_reading_amq_trace_is_not_traced_and_off_stops_recording(
    broker: Broker, s: Session, t: Session
) -> None:
    set_trace(broker, True)
    s.declare_queue("q")
    publish(s, "q", "m1")
    t.consume(TRACE_QUEUE, arguments={"x-stream-offset": "first"}, now=1.0)
    got = t.take_deliveries()
    assert [d.message.headers["event"] for d in got] == ["publish"]
    assert brief(trace_of(broker)) == [("publish", "m1", "q")]
    assert s.set_trace(False) is False
    publish(s, "q", "m2")
    assert brief(trace_of(broker)) == [("publish", "m1", "q")]


def test_each_vhost_has_its_own_trace(broker: Broker) -> None:
    set_trace(broker, True)
    other = broker.open_session("other", owner="o")
    other.declare_queue("q")
    publish(other, "q", "m-other")
    assert brief(trace_of(broker, "other")) == [("publish", "m-other", "q")]
    assert trace_of(broker, "/") == []


def test_a_publish_sent_again_is_traced_once(broker: Broker, s: Session) -> None:
    s.set_trace(True)
    s.declare_queue("q")
    for _ in range(2):  # the same publish key: a client's re-send after a reconnect
        message = Message("", "q", b"x", {}, {"message_id": "m1"})
        message.publish_key = "c1:1"
        s.publish(message, now=1.0)
    assert brief(trace_of(broker)) == [("publish", "m1", "q")]


def test_a_stream_fetch_traces_each_record_read_as_a_delivery(broker: Broker, s: Session) -> None:
    set_trace(broker, True)
    s.declare_queue("st", durable=True, arguments={"x-queue-type": "stream"})
    for i in range(3):
        publish(s, "st", f"m{i}")
    q, first, messages, dropped = s.fetch_stream("st", 1, None, 1 << 20, now=2.0)
    assert (first, [m.properties["message_id"] for m in messages], dropped) == (1, ["m1", "m2"], 0)
    delivered = [r for r in trace_of(broker) if r["event"] == "deliver"]
    assert brief(delivered) == [("deliver", "m1", "st"), ("deliver", "m2", "st")]
    assert q.first == 0 and q.next == 3 and not q.consumers  # the read changed nothing


def test_a_batch_and_a_whole_fetch_block_are_traced_message_by_message(
    broker: Broker, s: Session, monkeypatch: Any
) -> None:
    """The batch paths (``publish_batch``, kept fetch blocks) step aside while the
    trace is on: each publish and each record read is traced, as one by one."""
    import amqlite.broker.stream as stream_module

    monkeypatch.setattr(stream_module, "FETCH_BLOCK", 2)
    set_trace(broker, True)
    s.declare_queue("st", durable=True, arguments={"x-queue-type": "stream"})
    batch = [Message("", "st", b"x", {}, {"message_id": f"m{i}"}) for i in range(4)]
    s.publish_batch("", batch, now=1.0)
    assert brief(trace_of(broker)) == [("publish", f"m{i}", "st") for i in range(4)]
    q, block = s.fetch_block("st", 2, None)
    assert block is None  # not from a kept block: read (and traced) record by record
    q.keep_block(1, object(), 10)  # even when one is kept
    assert s.fetch_block("st", 2, None)[1] is None
    set_trace(broker, False)
    assert s.fetch_block("st", 2, None)[1] == 1
