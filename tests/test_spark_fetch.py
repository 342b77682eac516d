"""The Spark source's fast reader (``stream.fetch`` into Arrow columns) against the
general consumer path, without a JVM: for the same offset range they yield the same
rows, value for value; plus retention and a range the stream does not hold."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import amqlite
from amqlite.server.background import BackgroundNode
from amqlite.spark.bridge import (
    ServerAccess,
    SparkSourceError,
    fetch_range,
    read_range,
)
from tests.spark_messages import messages

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402

from amqlite.spark.arrow import record_batch  # noqa: E402
from amqlite.spark.source import _READ_SCHEMA  # noqa: E402

SCHEMA = to_arrow_schema(_READ_SCHEMA, timezone="UTC")
STREAM = {"x-queue-type": "stream"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundNode]:
    node = BackgroundNode(tmp_path_factory.mktemp("broker")).start()
    yield node
    node.stop()


def _access(node: BackgroundNode) -> ServerAccess:
    return ServerAccess(f"127.0.0.1:{node.port}")


def _publish(node: BackgroundNode, queue: str, messages: list[dict[str, Any]], **args: Any) -> None:
    async def run() -> None:
        async with amqlite.connect(f"127.0.0.1:{node.port}") as conn:
            await conn.declare_queue(queue, durable=True, arguments={**STREAM, **args})
            await conn.declare_exchange(f"{queue}-x", "fanout")
            await conn.bind(queue, f"{queue}-x")
            for m in messages:  # every key routed (fanout), whatever it is
                await conn.publish_nowait(f"{queue}-x", m.pop("key", queue), **m)
            await conn.wait_for_confirms()

    trio.run(run)


def _fast_rows(node: BackgroundNode, queue: str, start: int, end: int, **kw: Any) -> list[tuple]:
    rows = []
    kw.setdefault("idle_timeout", 5)
    for batch in fetch_range(_access(node), queue, start, end, **kw):
        rb = record_batch(batch, SCHEMA)
        assert rb.schema == SCHEMA
        rb.validate(full=True)
        for r in rb.to_pylist():
            r["headers"] = dict(r["headers"])
            rows.append(tuple(r[f.name] for f in SCHEMA))
    return rows


def _consumer_rows(node: BackgroundNode, queue: str, start: int, end: int) -> list[tuple]:
    return list(read_range(_access(node), queue, start, end, idle_timeout=5))


_message = messages(infinities=False)
_names = iter(range(10**6))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    messages=st.lists(_message, min_size=1, max_size=60),
    data=st.data(),
    fetch_bytes=st.sampled_from([1, 200, 5000, 1 << 20]),
    in_flight=st.integers(1, 4),
)
def test_the_fast_reader_yields_the_consumer_paths_rows(
    broker: BackgroundNode,
    messages: list[dict[str, Any]],
    data: st.DataObject,
    fetch_bytes: int,
    in_flight: int,
) -> None:
    queue = f"same-rows-{next(_names)}"
    _publish(broker, queue, [dict(m) for m in messages])
    start = data.draw(st.integers(0, len(messages) - 1))
    end = data.draw(st.integers(start + 1, len(messages)))
    fast = _fast_rows(broker, queue, start, end, max_bytes=fetch_bytes, in_flight=in_flight)
    general = _consumer_rows(broker, queue, start, end)
    assert [r[0] for r in fast] == list(range(start, end))
    assert fast == general


def test_retention_gaps_are_skipped_or_fail_on_data_loss(broker: BackgroundNode) -> None:
    _publish(broker, "kept-5", [{"body": b"%d" % i} for i in range(12)], **{"x-max-length": 5})
    rows = _fast_rows(broker, "kept-5", 0, 12, max_bytes=10)
    assert [r[0] for r in rows] == list(range(7, 12))
    assert rows == _consumer_rows(broker, "kept-5", 0, 12)
    assert _fast_rows(broker, "kept-5", 0, 4) == []
    with pytest.raises(SparkSourceError, match="offsets 0 to 6 of stream 'kept-5' were removed"):
        _fast_rows(broker, "kept-5", 0, 12, fail_on_data_loss=True)


def test_offsets_never_written_time_out_with_a_clear_error(broker: BackgroundNode) -> None:
    _publish(broker, "short", [{"body": b"x"}])
    with pytest.raises(SparkSourceError, match=r"gave nothing for 0\.2s"):
        _fast_rows(broker, "short", 0, 5, idle_timeout=0.2)


def test_timestamps_and_headers_become_arrow_values(broker: BackgroundNode) -> None:
    _publish(
        broker,
        "typed",
        [
            {"body": b"a"},
            {"body": b"b", "headers": {"n": 1, "t": True}, "properties": {"timestamp": 60}},
            {"body": b"c", "properties": {"message_id": "m"}},
        ],
    )
    rows = _fast_rows(broker, "typed", 0, 3)
    assert [r[3] for r in rows] == [{}, {"n": "1", "t": "True"}, {}]
    assert rows[1][5] == datetime.datetime(1970, 1, 1, 0, 1, tzinfo=datetime.UTC)
    assert [r[6] for r in rows] == [None, None, "m"]


def test_a_missing_queue_is_a_clear_error(broker: BackgroundNode, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no-such-queue"):
        _fast_rows(broker, "no-such-queue", 0, 3)


def test_arrow_rows_become_batch_messages_and_frames() -> None:
    from amqlite.spark.arrow import wire_messages
    from amqlite.spark.bridge import _frames

    rb = pa.RecordBatch.from_pydict(
        {
            "routing_key": ["a", None, "c"],
            "body": ["x", "y", None],
            "headers": pa.array([None, [("h", "1")], []], type=pa.map_(pa.string(), pa.string())),
            "message_id": [None, "m2", "m3"],
        }
    )
    assert wire_messages(rb) == [
        ["a", b"x"],
        ["", b"y", {"h": "1"}, {"message_id": "m2"}],
        ["c", b"", None, {"message_id": "m3"}],
    ]
    plain = pa.RecordBatch.from_pydict({"body": pa.array([b"1", b"2"])})
    assert wire_messages(plain) == [["", b"1"], ["", b"2"]]
    frames = list(_frames([["k", bytes(100)]] * 50, 1000))
    assert [len(f) for f in frames] == [8] * 6 + [2]
    big = list(_frames([["k", b"", {"h": "x" * 2000}, None], ["k", b""]], 1000))
    assert [len(f) for f in big] == [1, 1]


def test_publish_wire_confirms_every_row_and_fails_on_a_refused_one(
    broker: BackgroundNode,
) -> None:
    from amqlite.errors import PublishReturned
    from amqlite.spark.bridge import publish_wire

    async def declare(conn: amqlite.Connection) -> None:
        await conn.declare_queue("wire-sink")

    broker.call(declare)
    batches = [[["wire-sink", b"%d" % i] for i in range(j, j + 1000)] for j in range(0, 5000, 1000)]
    assert publish_wire(_access(broker), "", iter(batches)).published == 5000

    async def depth(conn: amqlite.Connection) -> int:
        return (await conn.declare_queue("wire-sink", passive=True)).messages

    assert broker.call(depth) == 5000
    bad = [[["wire-sink", b"a"], ["nowhere", b"b"]]]
    with pytest.raises(PublishReturned, match="message 1 of the batch"):
        publish_wire(_access(broker), "", iter(bad), mandatory=True)


_key_column = st.lists(st.one_of(st.none(), st.sampled_from(["a", "clé", "", "k" * 40])))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.one_of(st.none(), st.sampled_from(["a", "clé", "", "k" * 40])),
                  st.one_of(st.none(), st.binary(max_size=50))),
        min_size=1, max_size=80,
    ),
    text_body=st.booleans(),
    with_key=st.booleans(),
    cut=st.integers(0, 10),
    limit=st.sampled_from([1, 100, 1000, 1 << 20]),
)  # fmt: skip
def test_columnar_frames_carry_the_rows_wire_messages_makes(
    rows: list[tuple[str | None, bytes | None]],
    text_body: bool,
    with_key: bool,
    cut: int,
    limit: int,
) -> None:
    """The writer's fast path (``publish.columns`` frames sliced from the Arrow
    buffers) sends exactly the messages of the general one (``wire_messages``, a
    list per row), in order, in frames of about ``limit`` bytes."""
    from amqlite.protocol import codec
    from amqlite.spark.arrow import publish_frames, wire_messages

    bodies = [None if b is None else b.hex() if text_body else b for _, b in rows]
    columns = {"body": pa.array(bodies, type=pa.string() if text_body else pa.binary())}
    if with_key:
        columns["routing_key"] = pa.array([k for k, _ in rows], type=pa.string())
    rb = pa.RecordBatch.from_pydict(columns)
    rb = rb.slice(min(cut, rb.num_rows - 1))  # buffers that do not start at the batch
    frames = publish_frames(rb, limit)
    got = []
    for frame in frames:
        event = codec.publish_columns(0, "x", [["", b""]])  # the frame's bytes, decoded
        event = codec._publish_columns_from_map(
            {**codec.event_to_map(event), "count": frame.count, "keys": frame.keys,
             "key_ends": frame.key_ends, "bodies": frame.bodies, "body_ends": frame.body_ends}
        )  # fmt: skip
        assert frame.size <= max(limit, frame.size if frame.count == 1 else 0) + 1024
        got.extend(codec.batch_rows(event))
    assert got == wire_messages(rb)


def test_rows_with_headers_or_message_ids_go_as_lists() -> None:
    from amqlite.client.bulk import BatchColumns
    from amqlite.spark.arrow import publish_frames

    plain = pa.RecordBatch.from_pydict(
        {
            "body": [b"a"],
            "headers": pa.array([[]], type=pa.map_(pa.string(), pa.string())),
            "message_id": pa.array([None], type=pa.string()),
        }
    )
    assert all(isinstance(f, BatchColumns) for f in publish_frames(plain, 1000))
    tagged = pa.RecordBatch.from_pydict({"body": [b"a"], "message_id": ["m"]})
    assert publish_frames(tagged, 1000) == [[["", b"a", None, {"message_id": "m"}]]]


def test_publish_wire_sends_arrow_columns_confirmed_in_order(broker: BackgroundNode) -> None:
    from amqlite.errors import PublishReturned
    from amqlite.spark.arrow import publish_frames
    from amqlite.spark.bridge import publish_wire

    async def declare(conn: amqlite.Connection) -> None:
        await conn.declare_queue("columns-sink", durable=True, arguments=STREAM)

    broker.call(declare)
    batches = [
        pa.RecordBatch.from_pydict(
            {
                "routing_key": ["columns-sink"] * 1000,
                "body": [b"%d" % i for i in range(j, j + 1000)],
            }
        )
        for j in range(0, 5000, 1000)
    ]
    done = publish_wire(_access(broker), "", iter(batches), encode=publish_frames)
    assert done.published == 5000
    rows = _fast_rows(broker, "columns-sink", 0, 5000)
    assert [r[4] for r in rows] == [b"%d" % i for i in range(5000)]
    bad = pa.RecordBatch.from_pydict(
        {"routing_key": ["columns-sink", "nowhere"], "body": [b"a", b"b"]}
    )
    with pytest.raises(PublishReturned, match="message 1 of the batch"):
        publish_wire(_access(broker), "", iter([bad]), mandatory=True, encode=publish_frames)
