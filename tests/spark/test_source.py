"""The ``amqlite`` data source against a real broker, on Spark ``local[2]``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import amqlite

from .conftest import ThreadedBroker

pytestmark = pytest.mark.spark

STREAM = {"x-queue-type": "stream"}


def declare_stream(broker: ThreadedBroker, name: str, count: int = 0, first: int = 0) -> None:
    async def run(conn: amqlite.Connection) -> None:
        await conn.declare_queue(name, durable=True, arguments=STREAM)
        for i in range(first, first + count):
            await conn.publish_nowait(
                "",
                name,
                f"m{i}".encode(),
                headers={"n": i},
                properties={"message_id": f"id-{i}", "content_type": "text/plain"},
            )
        await conn.wait_for_confirms()

    broker.call(run)


def append(broker: ThreadedBroker, name: str, first: int, count: int) -> None:
    declare_stream(broker, name, count, first)


def drain(broker: ThreadedBroker, queue: str, expected: int) -> list[amqlite.Delivery]:
    """Get every message of a classic queue (waiting, bounded, for ``expected``)."""

    async def run(conn: amqlite.Connection) -> list[amqlite.Delivery]:
        got: list[amqlite.Delivery] = []
        with trio.move_on_after(20):
            async with await conn.consume(queue, no_ack=True) as consumer:
                async for d in consumer:
                    got.append(d)
                    if len(got) >= expected:
                        break
        return got

    result: list[amqlite.Delivery] = broker.call(run)
    return result


def reader(spark: Any, broker: ThreadedBroker, queue: str, **options: str) -> Any:
    r = spark.read.format("amqlite").option("servers", broker.servers).option("queue", queue)
    return r.options(**options)


def test_batch_read_returns_every_message_in_offset_order(
    spark: Any, broker: ThreadedBroker, name: str
) -> None:
    declare_stream(broker, name, 120)
    df = reader(spark, broker, name, minPartitionSize="25", partitions="3").load()
    assert df.rdd.getNumPartitions() == 3  # the offset range is split
    rows = df.collect()
    assert [r.offset for r in rows] == list(range(120))
    assert [r.body for r in rows] == [f"m{i}".encode() for i in range(120)]
    first = rows[0]
    assert (first.exchange, first.routing_key, first.message_id) == ("", name, "id-0")
    assert first.headers == {"n": "0"}
    assert first.content_type == "text/plain"


def test_batch_read_honours_starting_and_ending_offsets(
    spark: Any, broker: ThreadedBroker, name: str
) -> None:
    declare_stream(broker, name, 30)
    rows = reader(spark, broker, name, startingOffset="10", endingOffset="20").load().collect()
    assert [r.offset for r in rows] == list(range(10, 20))
    last = reader(spark, broker, name, startingOffset="last").load().collect()
    assert [r.offset for r in last] == [29]


def _collecting_query(
    spark: Any, broker: ThreadedBroker, queue: str, checkpoint: Path, batches: list[Any]
) -> Any:
    def keep(df: Any, batch_id: int) -> None:
        batches.append((batch_id, [r.offset for r in df.collect()]))

    stream = (
        spark.readStream.format("amqlite")
        .option("servers", broker.servers)
        .option("queue", queue)
        .option("startingOffset", "first")
        .option("maxMessagesPerBatch", "6")
        .load()
    )
    return (
        stream.writeStream.foreachBatch(keep).option("checkpointLocation", str(checkpoint)).start()
    )


def test_streaming_read_in_micro_batches_and_restart_from_checkpoint(
    spark: Any, broker: ThreadedBroker, name: str, tmp_path: Path
) -> None:
    declare_stream(broker, name, 10)
    checkpoint = tmp_path / "checkpoint"
    batches: list[Any] = []
    query = _collecting_query(spark, broker, name, checkpoint, batches)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    non_empty = [offsets for _, offsets in batches if offsets]
    assert non_empty == [list(range(0, 6)), list(range(6, 10))]  # two micro-batches

    append(broker, name, 10, 5)
    again: list[Any] = []
    query = _collecting_query(spark, broker, name, checkpoint, again)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    seen = [o for _, offsets in again for o in offsets]
    assert seen == list(range(10, 15))  # exactly the new messages: no loss, no repeats
    assert min(b for b, _ in again) > max(b for b, _ in batches)


def test_available_now_reads_what_is_there_in_limited_batches_and_stops(
    spark: Any, broker: ThreadedBroker, name: str, tmp_path: Path
) -> None:
    declare_stream(broker, name, 10)
    batches: list[list[int]] = []
    query = (
        spark.readStream.format("amqlite")
        .option("servers", broker.servers)
        .option("queue", name)
        .option("maxMessagesPerBatch", "4")
        .load()
        .writeStream.foreachBatch(lambda df, _: batches.append([r.offset for r in df.collect()]))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120) is True  # it stops by itself
    assert [b for b in batches if b] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def bind_queue(broker: ThreadedBroker, queue: str, key: str) -> None:
    async def run(conn: amqlite.Connection) -> None:
        await conn.declare_queue(queue, durable=True)
        await conn.bind(queue, "amq.direct", key)

    broker.call(run)


def test_batch_write_lands_every_row_in_the_bound_queue(
    spark: Any, broker: ThreadedBroker, name: str
) -> None:
    bind_queue(broker, name, "k")
    rows = [("k", f"row-{i}", f"mid-{i}", {"i": str(i)}) for i in range(40)]
    df = spark.createDataFrame(
        rows, "routing_key string, body string, message_id string, headers map<string,string>"
    ).repartition(2)
    df.write.format("amqlite").option("servers", broker.servers).option(
        "exchange", "amq.direct"
    ).mode("append").save()
    got = drain(broker, name, 40)
    assert sorted(d.body for d in got) == sorted(f"row-{i}".encode() for i in range(40))
    by_id = {d.properties["message_id"]: d for d in got}
    assert by_id["mid-7"].headers == {"i": "7"}


def test_streaming_write_lands_every_row_in_the_bound_queue(
    spark: Any, broker: ThreadedBroker, name: str, tmp_path: Path
) -> None:
    source = f"{name}-in"
    declare_stream(broker, source, 25)
    bind_queue(broker, name, "out")
    stream = (
        spark.readStream.format("amqlite")
        .option("servers", broker.servers)
        .option("queue", source)
        .option("startingOffset", "first")
        .load()
        .selectExpr("'out' AS routing_key", "body", "message_id")
    )
    query = (
        stream.writeStream.format("amqlite")
        .option("servers", broker.servers)
        .option("exchange", "amq.direct")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    got = drain(broker, name, 25)
    assert sorted(d.properties["message_id"] for d in got) == sorted(f"id-{i}" for i in range(25))


def test_a_failed_publish_fails_the_job(spark: Any, broker: ThreadedBroker, name: str) -> None:
    df = spark.createDataFrame([("nowhere", "x")], "routing_key string, body string")
    with pytest.raises(Exception, match=r"312 NO_ROUTE"):
        df.write.format("amqlite").option("servers", broker.servers).option(
            "exchange", "amq.direct"
        ).mode("append").save()
    with pytest.raises(Exception, match="exchange 'no-such-exchange'"):
        df.write.format("amqlite").option("servers", broker.servers).option(
            "exchange", "no-such-exchange"
        ).mode("append").save()


def _error_text(exc: pytest.ExceptionInfo[BaseException]) -> str:
    return str(exc.value)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"queue": "no-such-queue"}, "no queue 'no-such-queue'"),
        ({"queue": "CLASSIC"}, "is a classic queue, not a stream"),
        ({}, "option queue (a stream queue to read) is required"),
        ({"queue": "x", "servers": "127.0.0.1:1"}, "cannot connect to servers '127.0.0.1:1'"),
        ({"queue": "STREAM", "startingOffset": "soon"}, "startingOffset must be"),
    ],
)
def test_bad_read_options_give_a_clear_error(
    spark: Any, broker: ThreadedBroker, name: str, options: dict[str, str], expected: str
) -> None:
    async def run(conn: amqlite.Connection) -> None:
        await conn.declare_queue(f"{name}-classic")
        await conn.declare_queue(f"{name}-stream", durable=True, arguments=STREAM)

    broker.call(run)
    opts = {"servers": broker.servers, **options}
    if opts.get("queue") == "CLASSIC":
        opts["queue"] = f"{name}-classic"
    if opts.get("queue") == "STREAM":
        opts["queue"] = f"{name}-stream"
    with pytest.raises(Exception) as caught:
        spark.read.format("amqlite").options(**opts).load().collect()
    assert expected in _error_text(caught)
