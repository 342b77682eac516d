"""Arrow record batches from fetched stream records, column by column.

A ``stream.records`` reply carries keys, exchange names and bodies end to end
with their end positions (Arrow's binary layout), so the ``routing_key``,
``exchange`` and ``body`` columns are Arrow arrays over the reply's own buffers,
and ``offset`` a numpy range: no Python object per row. Only records with
headers or properties (``extras``) are looked at one by one, for the
``headers``, ``timestamp``, ``message_id``, ``correlation_id`` and
``content_type`` columns; without any, those are empty maps and nulls.

The rows are the ones :func:`amqlite.spark.bridge.delivery_row` makes from
deliveries of the same records (the consumer path), value for value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from amqlite.client.bulk import BatchColumns, StreamBatch

from .bridge import _text, _when

_PROPERTY_COLUMNS = ("message_id", "correlation_id", "content_type")


def record_batch(batch: StreamBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` as a record batch of the source's schema (``READ_COLUMNS``)."""
    n = batch.count
    r = batch.records
    types = {f.name: f.type for f in schema}
    offsets = pa.array(np.arange(batch.first, batch.first + n, dtype=np.int64))
    exchange = _binary(types["exchange"], n, r.exchange_ends, r.exchanges)
    key = _binary(types["routing_key"], n, r.key_ends, r.keys)
    body = _binary(types["body"], n, r.body_ends, r.bodies)
    headers, timestamp, texts = _extras(batch, types)
    columns = [
        offsets,
        exchange,
        key,
        headers,
        body,
        timestamp,
        *(texts[name] for name in _PROPERTY_COLUMNS),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _binary(kind: pa.DataType, n: int, ends: bytes, values: bytes) -> pa.Array:
    """A string or binary array over the reply's buffers (32-bit offsets: the ends
    are below 2**31, a frame being far smaller)."""
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(ends), pa.py_buffer(values)])


def _extras(
    batch: StreamBatch, types: dict[str, pa.DataType]
) -> tuple[pa.Array, pa.Array, dict[str, pa.Array]]:
    n = batch.count
    extras = batch.extras
    if not extras:
        empty = pa.MapArray.from_arrays(
            pa.array(np.zeros(n + 1, dtype=np.int32)),
            pa.array([], type=pa.string()),
            pa.array([], type=pa.string()),
        )
        return (
            empty.cast(types["headers"]),
            pa.nulls(n, type=types["timestamp"]),
            {name: pa.nulls(n, type=types[name]) for name in _PROPERTY_COLUMNS},
        )
    counts = np.zeros(n + 1, dtype=np.int32)
    keys: list[str] = []
    values: list[str | None] = []
    when: list[Any] = [None] * n
    texts: dict[str, list[str | None]] = {name: [None] * n for name in _PROPERTY_COLUMNS}
    for i in sorted(extras):
        headers, props = extras[i]
        if headers:
            counts[i + 1] = len(headers)
            for k, v in headers.items():
                keys.append(str(k))
                values.append(_text(v))
        if props:
            when[i] = _when(props.get("timestamp"))
            for name in _PROPERTY_COLUMNS:
                texts[name][i] = _text(props.get(name))
    ends = np.cumsum(counts, dtype=np.int32)
    headers_array = pa.MapArray.from_arrays(
        pa.array(ends), pa.array(keys, type=pa.string()), pa.array(values, type=pa.string())
    ).cast(types["headers"])
    return (
        headers_array,
        pa.array(when, type=types["timestamp"]),
        {name: pa.array(texts[name], type=types[name]) for name in _PROPERTY_COLUMNS},
    )


# --- writing: rows of a record batch -> publish.batch messages ------------------------


#: messages per columnar frame at most (the broker answers one list per frame)
FRAME_MESSAGES = 16384


def publish_frames(rb: pa.RecordBatch, limit: int) -> list[BatchColumns] | list[list[list[Any]]]:
    """The ``publish.batch`` frames (about ``limit`` bytes each) for the rows of
    ``rb``: columnar frames (:class:`~amqlite.client.bulk.BatchColumns`) sliced from
    its Arrow buffers when no row has headers or a message id, else lists of wire
    messages (:func:`wire_messages`, one Python list per row). Either way the
    broker gets the same messages: ``tests/spark/test_source.py`` checks it."""
    names = rb.schema.names
    if ("headers" in names and _has_values(rb.column("headers"))) or (
        "message_id" in names and rb.column("message_id").null_count < rb.num_rows
    ):
        from .bridge import _frames

        return list(_frames(wire_messages(rb), limit))
    return column_frames(rb, limit)


def _has_values(headers: pa.Array) -> bool:
    """Whether any row of a map column has an entry (a null or empty map: none)."""
    if len(headers) == 0 or headers.null_count == len(headers):
        return False
    ends = headers.offsets  # of this slice of the column
    return bool(ends[len(ends) - 1].as_py() > ends[0].as_py())


def column_frames(rb: pa.RecordBatch, limit: int) -> list[BatchColumns]:
    """The routing keys and bodies of ``rb`` (a null key is "", a null body empty,
    as :func:`wire_messages` makes them) as columnar frames of about ``limit``
    bytes, from the Arrow buffers (one copy of each frame's bytes, no Python
    object per row)."""
    import pyarrow.compute as pc

    n = rb.num_rows
    if n == 0:
        return []
    names = rb.schema.names
    if "routing_key" in names:
        keys = pc.fill_null(rb.column("routing_key").cast(pa.string()), "")
    else:
        keys = pa.array(np.full(n, "", dtype=object), type=pa.string())
    body = rb.column("body")
    if not pa.types.is_binary(body.type):
        body = body.cast(pa.binary())
    bodies = pc.fill_null(body, b"")
    key_ends, key_data = _layout(keys)
    body_ends, body_data = _layout(bodies)
    # bytes before row j: keys, bodies and 8 bytes of end positions per row
    before = (key_ends - key_ends[0]) + (body_ends - body_ends[0]) + 8 * np.arange(n + 1)
    frames = []
    start = 0
    while start < n:
        end = int(np.searchsorted(before, before[start] + limit, side="right")) - 1
        end = min(n, max(end, start + 1), start + FRAME_MESSAGES)
        frames.append(
            BatchColumns(
                end - start,
                _slice(key_data, key_ends[start], key_ends[end]),
                _ends(key_ends[start : end + 1]),
                _slice(body_data, body_ends[start], body_ends[end]),
                _ends(body_ends[start : end + 1]),
            )
        )
        start = end
    return frames


def _layout(array: pa.Array) -> tuple[Any, Any]:
    """The ``len + 1`` offsets (numpy int64) and the data buffer of a string or
    binary array."""
    _, offsets, data = array.buffers()
    at = array.offset
    ends = np.frombuffer(offsets, dtype=np.int32)[at : at + len(array) + 1].astype(np.int64)
    return ends, data


def _slice(data: Any, lo: int, hi: int) -> bytes:
    if data is None or hi <= lo:
        return b""
    return memoryview(data)[lo:hi].tobytes()


def _ends(ends: Any) -> bytes:
    data: bytes = (ends - ends[0]).astype("<u4").tobytes()
    return data


def wire_messages(rb: pa.RecordBatch) -> list[list[Any]]:
    """The ``publish.batch`` messages (``[key, body]`` or ``[key, body, headers,
    props]``) for the rows of ``rb`` (columns ``routing_key``, ``body`` binary or
    text, optional ``headers`` map and ``message_id``), as the row writer makes
    them: a null key is "", a null body empty."""
    import pyarrow.compute as pc

    names = rb.schema.names
    n = rb.num_rows
    if "routing_key" in names:
        keys = pc.fill_null(rb.column("routing_key").cast(pa.string()), "").to_pylist()
    else:
        keys = [""] * n
    body = rb.column("body")
    if not pa.types.is_binary(body.type):
        body = body.cast(pa.binary())
    bodies = pc.fill_null(body, b"").to_pylist()
    headers = rb.column("headers").to_pylist() if "headers" in names else None
    ids = rb.column("message_id").to_pylist() if "message_id" in names else None
    if headers is None and ids is None:
        return list(map(list, zip(keys, bodies, strict=True)))
    out: list[list[Any]] = []
    for i in range(n):
        h = headers[i] if headers is not None else None
        mid = ids[i] if ids is not None else None
        if not h and mid is None:
            out.append([keys[i], bodies[i]])
            continue
        h_map = dict(h) if h else None
        props = {"message_id": str(mid)} if mid is not None and mid != "" else None
        out.append([keys[i], bodies[i], h_map, props])
    return out
