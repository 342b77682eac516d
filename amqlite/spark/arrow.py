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

from amqlite.client.bulk import StreamBatch

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
