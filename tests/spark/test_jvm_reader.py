"""The JVM reader (``amqlite/spark/jvm``) behind ``format("amqlite")`` batch reads,
against a real broker on Spark ``local[2]``: for the same range it yields exactly
the rows of the Python source's fast reader (``amqlite_python``) and of the general
consumer path (``fetch`` false), whatever the messages carry; an empty range, a
range retention dropped, and the jar's fallback when there is no JDK."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import amqlite
from amqlite.spark import jar
from tests.spark_messages import messages, text

from .conftest import ThreadedBroker

pytestmark = pytest.mark.spark

STREAM = {"x-queue-type": "stream"}


def publish(
    broker: ThreadedBroker, queue: str, messages: list[dict[str, Any]], **args: Any
) -> None:
    async def run(conn: amqlite.Connection) -> None:
        await conn.declare_queue(queue, durable=True, arguments={**STREAM, **args})
        await conn.declare_exchange(f"{queue}-x", "fanout")
        await conn.bind(queue, f"{queue}-x")
        for m in messages:  # every key routed (fanout), whatever it is
            m = dict(m)
            await conn.publish_nowait(f"{queue}-x", m.pop("key", queue), **m)
        await conn.wait_for_confirms()

    broker.call(run)


def rows(
    spark: Any, broker: ThreadedBroker, queue: str, fmt: str = "amqlite", **options: str
) -> list[dict[str, Any]]:
    df = (
        spark.read.format(fmt)
        .option("servers", broker.servers)
        .option("queue", queue)
        .options(**options)
        .load()
    )
    return [r.asDict() for r in df.collect()]


def test_format_amqlite_batch_reads_run_in_the_jvm(
    spark: Any, broker: ThreadedBroker, name: str
) -> None:
    assert jar.loaded(spark)
    publish(broker, name, [{"body": b"x"}])
    df = spark.read.format("amqlite").option("servers", broker.servers).option("queue", name).load()
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "BatchScan amqlite" in plan and "ColumnarToRow" in plan  # the JVM's columnar scan
    python = spark.read.format("amqlite_python").option("servers", broker.servers)
    plan = python.option("queue", name).load()._jdf.queryExecution().executedPlan().toString()
    assert "ColumnarToRow" not in plan  # the Python source: rows over Arrow batches


_message = messages(infinities=True)
_names = iter(range(10**6))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    messages=st.lists(_message, min_size=1, max_size=60),
    data=st.data(),
    fetch_bytes=st.sampled_from(["1024", "5000", str(1 << 21)]),
    in_flight=st.sampled_from(["1", "3"]),
    partitions=st.sampled_from(["1", "3"]),
)
def test_the_jvm_reader_yields_the_python_readers_and_the_consumer_paths_rows(
    spark: Any,
    broker: ThreadedBroker,
    messages: list[dict[str, Any]],
    data: st.DataObject,
    fetch_bytes: str,
    in_flight: str,
    partitions: str,
) -> None:
    queue = f"jvm-same-rows-{next(_names)}"
    publish(broker, queue, messages)
    start = data.draw(st.integers(0, len(messages) - 1))
    end = data.draw(st.integers(start + 1, len(messages)))
    span = {"startingOffset": str(start), "endingOffset": str(end)}
    jvm = rows(
        spark, broker, queue, **span, fetchBytes=fetch_bytes, fetchesInFlight=in_flight,
        partitions=partitions, minPartitionSize="5",
    )  # fmt: skip
    assert [r["offset"] for r in jvm] == list(range(start, end))
    assert jvm == rows(spark, broker, queue, "amqlite_python", **span)
    assert jvm == rows(spark, broker, queue, **span, fetch="false")  # the consumer path


def test_an_empty_range_reads_nothing(spark: Any, broker: ThreadedBroker, name: str) -> None:
    publish(broker, name, [{"body": b"%d" % i} for i in range(10)])
    assert rows(spark, broker, name, startingOffset="5", endingOffset="5") == []
    assert rows(spark, broker, name, startingOffset="next") == []
    assert rows(spark, broker, name, "amqlite_python", startingOffset="5", endingOffset="5") == []


def test_a_range_retention_dropped_is_skipped_or_fails_on_data_loss(
    spark: Any, broker: ThreadedBroker, name: str
) -> None:
    publish(broker, name, [{"body": b"%d" % i} for i in range(12)], **{"x-max-length": 5})
    # planned from 0 (startingOffset is clamped to what is kept, so ask for 0 by number
    # after a planning that saw it: the range below 7 is gone by the time it is read)
    jvm = rows(spark, broker, name, fetchBytes="1024")
    assert [r["offset"] for r in jvm] == list(range(7, 12))
    assert jvm == rows(spark, broker, name, "amqlite_python")
    assert rows(spark, broker, name, endingOffset="4") == []


def test_fail_on_data_loss_names_the_dropped_offsets(
    spark: Any, broker: ThreadedBroker, name: str
) -> None:
    """The JVM reader plans its range once per DataFrame (as Spark's Kafka reader
    does), so offsets retention removes between the plan and the read are named;
    the Python source plans again at each action, where the range starts at what
    is kept then."""
    kept = {"x-max-length": 5}
    publish(broker, name, [{"body": b"%d" % i} for i in range(3)], **kept)
    df = (
        spark.read.format("amqlite").option("servers", broker.servers).option("queue", name)
        .option("failOnDataLoss", "true").load()
    )  # fmt: skip
    df.explain()  # planned now: offsets 0 to 2
    publish(broker, name, [{"body": b"%d" % i} for i in range(3, 12)], **kept)  # 0-6 dropped
    with pytest.raises(Exception, match=f"offsets 0 to 2 of stream '{name}' were removed"):
        df.collect()


def test_without_a_jdk_there_is_no_jar_and_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(jar, "_tool", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="amqlite.spark"):
        assert jar.jar_path() is None
    assert [r.getMessage() for r in caplog.records] == [
        "amqlite: no javac and jar (a JDK) here, so no JVM reader: format('amqlite') reads "
        "through the Python data source"
    ]


def test_the_jar_is_built_once_per_source_hash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("AMQLITE_CACHE", str(tmp_path))
    built = jar.jar_path()
    assert built is not None and built.is_file() and str(built).startswith(str(tmp_path))
    mtime = built.stat().st_mtime_ns
    assert jar.jar_path() == built and built.stat().st_mtime_ns == mtime  # cached


# --- the JVM writer -----------------------------------------------------------------


def _sinks(broker: ThreadedBroker, name: str) -> None:
    async def run(conn: amqlite.Connection) -> None:
        for side in ("jvm", "py"):
            await conn.declare_queue(f"{name}-{side}", durable=True, arguments=STREAM)
            await conn.declare_exchange(f"{name}-{side}-x", "fanout")
            await conn.bind(f"{name}-{side}", f"{name}-{side}-x")

    broker.call(run)


_row = st.tuples(
    st.one_of(st.none(), st.sampled_from(["rk", "clé", ""])),
    st.one_of(st.none(), st.binary(max_size=50)),
    st.one_of(st.none(), st.dictionaries(text, st.one_of(st.none(), text), max_size=3)),
    st.one_of(st.none(), text),
)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.lists(_row, min_size=1, max_size=40), text_body=st.booleans())
def test_the_jvm_writer_publishes_what_the_python_writer_publishes(
    spark: Any, broker: ThreadedBroker, data: list[Any], text_body: bool
) -> None:
    name = f"jvm-write-{next(_names)}"
    _sinks(broker, name)
    if text_body:
        data = [(k, None if b is None else b.hex(), h, m) for k, b, h, m in data]
    body = "string" if text_body else "binary"
    df = spark.createDataFrame(
        data, f"routing_key string, body {body}, headers map<string,string>, message_id string"
    )
    for side, fmt in (("jvm", "amqlite"), ("py", "amqlite_python")):
        df.write.format(fmt).option("servers", broker.servers).option(
            "exchange", f"{name}-{side}-x"
        ).mode("append").save()

    def got(side: str) -> list[Any]:
        out = rows(spark, broker, f"{name}-{side}")
        for r in out:
            del r["offset"], r["exchange"]
        return sorted(out, key=repr)

    jvm = got("jvm")
    assert len(jvm) == len(data)
    assert jvm == got("py")


def test_an_unroutable_row_fails_the_jvm_writers_task(
    spark: Any, broker: ThreadedBroker, name: str
) -> None:
    df = spark.createDataFrame([("nowhere", b"x")], "routing_key string, body binary")
    with pytest.raises(Exception, match=r"message 0 of this task was returned: 312 NO_ROUTE"):
        df.write.format("amqlite").option("servers", broker.servers).option(
            "exchange", "amq.direct"
        ).mode("append").save()
