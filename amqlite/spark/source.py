"""The ``amqlite`` PySpark data source (Python Data Source API, Spark 4).

Read (batch and streaming) a stream queue; write (batch and streaming) rows to an
exchange. Importing this module imports pyspark: use
:func:`amqlite.spark.register`, which imports it only when called.

Offsets in Spark are the stream's own: ``{"offset": N}`` means "the next message
to read is N". Spark checkpoints the end offset of each micro-batch before it runs
it, so a query restarted from its checkpoint reads exactly what it had not yet
processed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import datasource as _datasource
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .bridge import (
    FETCH_BYTES,
    FETCHES_IN_FLIGHT,
    ServerAccess,
    SparkSourceError,
    fetch_range,
    publish_rows,
    publish_wire,
    read_chunks,
    resolve_end,
    resolve_start,
    split_range,
    stream_bounds,
)

try:  # Spark >= 4.2: admission control (read limits) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    _READ_LIMITS = True
except ImportError:  # pragma: no cover - Spark 4.0 / 4.1
    _READ_LIMITS = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Not in Spark < 4.2: there the mixin is inert."""


# Writers that get Arrow record batches (Spark >= 4.0; streaming >= 4.1), else Rows
_BatchWriterBase: Any = getattr(_datasource, "DataSourceArrowWriter", DataSourceWriter)
_StreamWriterBase: Any = getattr(_datasource, "DataSourceStreamArrowWriter", DataSourceStreamWriter)


NAME = "amqlite"
PYTHON_NAME = "amqlite_python"  # amqlite.spark.AmqliteProvider.PYTHON_NAME
_READ_SCHEMA = StructType(
    [
        StructField("offset", LongType()),
        StructField("exchange", StringType()),
        StructField("routing_key", StringType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("body", BinaryType()),
        StructField("timestamp", TimestampType()),
        StructField("message_id", StringType()),
        StructField("correlation_id", StringType()),
        StructField("content_type", StringType()),
    ]
)  # READ_COLUMNS, built without a JVM (the workers have none)


@dataclass(frozen=True)
class ReadOptions:
    """The read options, parsed once on the driver (see ``docs/spark.md``)."""

    access: ServerAccess
    queue: str
    starting: str
    ending: str | None
    max_per_batch: int | None
    partitions: int
    min_partition_size: int
    idle_timeout: float
    fetch: bool = True
    fetch_bytes: int = FETCH_BYTES
    fetches_in_flight: int = FETCHES_IN_FLIGHT
    fail_on_data_loss: bool = False


@dataclass(frozen=True)
class WriteOptions:
    access: ServerAccess
    exchange: str
    mandatory: bool
    persistent: bool


def _option(options: Any, name: str, default: str | None = None) -> str | None:
    value = options.get(name)
    if value is None:
        value = options.get(name.lower(), default)
    return None if value is None else str(value)


def _number(options: Any, name: str, default: str | None, low: float) -> float | None:
    text = _option(options, name, default)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SparkSourceError(f"amqlite: option {name} must be a number, got {text!r}") from None
    if value < low:
        raise SparkSourceError(f"amqlite: option {name} must be at least {low:g}, got {text!r}")
    return value


def _flag(options: Any, name: str, default: bool) -> bool:
    text = _option(options, name, str(default).lower())
    assert text is not None
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise SparkSourceError(f"amqlite: option {name} must be true or false, got {text!r}")


def _server_access(options: Any) -> ServerAccess:
    servers = _option(options, "servers")
    if not servers:
        raise SparkSourceError(
            "amqlite: option servers is required, e.g. .option('servers', 'host:5555,host:6666')"
        )
    return ServerAccess(
        servers=servers,
        vhost=_option(options, "vhost", "/") or "/",
        login=_option(options, "login", "guest") or "guest",
        password=_option(options, "password", "guest") or "guest",
        connect_timeout=_number(options, "connectTimeout", "5", 0.1) or 5.0,
        tls=_flag(options, "tls", False),
        ca=_option(options, "ca", "") or "",
    )


def read_options(options: Any) -> ReadOptions:
    access = _server_access(options)
    queue = _option(options, "queue")
    if not queue:
        raise SparkSourceError("amqlite: option queue (a stream queue to read) is required")
    per_batch = _number(options, "maxMessagesPerBatch", None, 1)
    return ReadOptions(
        access=access,
        queue=queue,
        starting=_option(options, "startingOffset", "first") or "first",
        ending=_option(options, "endingOffset"),
        max_per_batch=None if per_batch is None else int(per_batch),
        partitions=int(_number(options, "partitions", "4", 1) or 4),
        min_partition_size=int(_number(options, "minPartitionSize", "10000", 1) or 10000),
        idle_timeout=_number(options, "readTimeout", "30", 0.1) or 30.0,
        fetch=_flag(options, "fetch", True),
        fetch_bytes=int(_number(options, "fetchBytes", str(FETCH_BYTES), 1024) or FETCH_BYTES),
        fetches_in_flight=int(
            _number(options, "fetchesInFlight", str(FETCHES_IN_FLIGHT), 1) or FETCHES_IN_FLIGHT
        ),
        fail_on_data_loss=_flag(options, "failOnDataLoss", False),
    )


def write_options(options: Any) -> WriteOptions:
    exchange = _option(options, "exchange")
    if exchange is None:
        raise SparkSourceError(
            'amqlite: option exchange is required ("" names the default exchange)'
        )
    return WriteOptions(
        access=_server_access(options),
        exchange=exchange,
        mandatory=_flag(options, "mandatory", True),
        persistent=_flag(options, "persistent", False),
    )


class OffsetRange(InputPartition):
    """Offsets ``[start, end)`` of one stream, read by one Spark task."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class AmqliteDataSource(DataSource):
    """``spark.read.format("amqlite")`` and friends; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return _READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return AmqliteBatchReader(read_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return AmqliteStreamReader(read_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return AmqliteBatchWriter(write_options(self.options), _check_write_schema(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return AmqliteStreamWriter(write_options(self.options), _check_write_schema(schema))


class AmqlitePythonDataSource(AmqliteDataSource):
    """The same source under the name the JVM reader hands streaming reads, writes
    and batch reads it does not do (``fetch`` false, TLS) to (``docs/spark.md``,
    "The JVM reader")."""

    @classmethod
    def name(cls) -> str:
        return PYTHON_NAME


def _read(opts: ReadOptions, partition: InputPartition) -> Iterator[Any]:
    """Arrow record batches: by default one per ``stream.fetch`` reply, its columns
    built over the reply's buffers (:mod:`.arrow`); with ``fetch`` false, one per
    chunk of rows from a stream consumer (the general path)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    assert isinstance(partition, OffsetRange)
    schema = to_arrow_schema(_READ_SCHEMA, timezone="UTC")
    if opts.fetch:
        from .arrow import record_batch

        for batch in fetch_range(
            opts.access,
            opts.queue,
            partition.start,
            partition.end,
            idle_timeout=opts.idle_timeout,
            max_bytes=opts.fetch_bytes,
            in_flight=opts.fetches_in_flight,
            fail_on_data_loss=opts.fail_on_data_loss,
        ):
            yield record_batch(batch, schema)
        return
    types = [f.type for f in schema]
    for chunk in read_chunks(
        opts.access, opts.queue, partition.start, partition.end, idle_timeout=opts.idle_timeout
    ):
        columns = list(zip(*chunk, strict=True))
        headers = columns[3]
        columns[3] = tuple(list(h.items()) for h in headers)
        arrays = [pa.array(col, type=t) for col, t in zip(columns, types, strict=True)]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


class AmqliteBatchReader(DataSourceReader):
    """Offsets ``startingOffset`` to ``endingOffset`` (default: what the stream
    holds when the query is planned), split into ranges."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        bounds = stream_bounds(opts.access, opts.queue)
        self.start = resolve_start(opts.starting, bounds)
        self.end = max(self.start, resolve_end(opts.ending, bounds))

    def partitions(self) -> Sequence[InputPartition]:
        ranges = split_range(
            self.start, self.end, self.opts.partitions, self.opts.min_partition_size
        )
        return [OffsetRange(s, e) for s, e in ranges] or [OffsetRange(self.start, self.start)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)


class AmqliteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over a stream queue; at most ``maxMessagesPerBatch`` each.
    With ``trigger(availableNow=True)`` it reads what the stream holds when the
    query starts (in as many micro-batches as the limit asks) and stops."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        bounds = stream_bounds(opts.access, opts.queue)  # fails fast on a bad queue
        self._initial = resolve_start(opts.starting, bounds)
        self._planned = self._initial  # Spark 4.0/4.1 call latestOffset() without a start
        self._target: int | None = None  # Trigger.AvailableNow: read no further

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = stream_bounds(self.opts.access, self.opts.queue).next

    def initialOffset(self) -> dict[str, int]:
        return {"offset": self._initial}

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: Any = None
    ) -> dict[str, int]:
        begin = self._planned if start is None else int(start["offset"])
        bounds = stream_bounds(self.opts.access, self.opts.queue)
        end = max(begin, bounds.next)
        if self._target is not None:
            end = max(begin, min(end, self._target))
        cap = self.opts.max_per_batch
        if _READ_LIMITS and isinstance(limit, ReadMaxRows):
            cap = int(limit.max_rows)
        elif _READ_LIMITS and isinstance(limit, ReadAllAvailable):
            cap = None
        if cap is not None:
            end = min(end, begin + cap)
        return {"offset": end}

    def getDefaultReadLimit(self) -> Any:
        if not _READ_LIMITS:  # pragma: no cover - not called before Spark 4.2
            return None
        if self.opts.max_per_batch is not None:
            return ReadMaxRows(self.opts.max_per_batch)
        return ReadAllAvailable()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        s, e = int(start["offset"]), int(end["offset"])
        self._planned = max(self._planned, e)
        ranges = split_range(s, e, self.opts.partitions, self.opts.min_partition_size)
        return [OffsetRange(a, b) for a, b in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the stream keeps its messages for other readers."""


# --- writing ---------------------------------------------------------------------------


@dataclass
class Published(WriterCommitMessage):
    """What one task published (every one confirmed)."""

    count: int


def _check_write_schema(schema: StructType) -> list[str]:
    names = list(schema.fieldNames())
    if "body" not in names:
        raise SparkSourceError(
            f"amqlite: writing needs a body column (binary or string); the columns are {names}"
        )
    allowed = {"routing_key", "body", "headers", "message_id"}
    if extra := [n for n in names if n not in allowed]:
        raise SparkSourceError(
            f"amqlite: cannot write columns {extra}: use routing_key, body, headers, message_id"
        )
    return names


def _publish(opts: WriteOptions, iterator: Iterator[Any]) -> Published:
    """Arrow record batches (Spark's Arrow writers) go as ``publish.batch``
    frames; Rows (older Sparks) one publish each."""
    import pyarrow as pa

    first = next(iterator, None)
    if first is None:
        return Published(0)
    if isinstance(first, pa.RecordBatch):
        from .arrow import publish_frames

        done = publish_wire(
            opts.access,
            opts.exchange,
            itertools.chain([first], iterator),
            mandatory=opts.mandatory,
            persistent=opts.persistent,
            encode=publish_frames,
        )
        return Published(done.published)
    rows = (row.asDict() for row in itertools.chain([first], iterator))
    summary = publish_rows(
        opts.access,
        opts.exchange,
        rows,
        mandatory=opts.mandatory,
        persistent=opts.persistent,
    )
    return Published(summary.published)


class AmqliteBatchWriter(_BatchWriterBase):  # type: ignore[misc]
    """Each task publishes its rows with confirms and fails on the first error;
    a retried task publishes its rows again (at least once)."""

    def __init__(self, opts: WriteOptions, columns: list[str]) -> None:
        self.opts = opts
        self.columns = columns

    def write(self, iterator: Iterator[Any]) -> Published:
        return _publish(self.opts, iterator)


class AmqliteStreamWriter(_StreamWriterBase):  # type: ignore[misc]
    def __init__(self, opts: WriteOptions, columns: list[str]) -> None:
        self.opts = opts
        self.columns = columns

    def write(self, iterator: Iterator[Any]) -> Published:
        return _publish(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row was confirmed by the broker before its task finished."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Published rows cannot be taken back; a failed batch runs again (at least once)."""
