"""The delivery audit: read the broker trace (``amq.trace``) through the ``amqlite``
data source and report, per exchange and queue, what was published, delivered,
acked, lost and duplicated, with publish -> delivery latency and throughput over
time.

Run it as ``amqlite audit -s SERVERS`` or ``python -m amqlite.spark.audit`` (so
``spark-submit`` can run this file). Definitions, per (exchange, queue) and over
the records kept in the trace (after ``--since``):

- published / delivered / acked: trace records of each kind (an unroutable
  publish counts under queue "");
- lost: message ids published to the queue and never delivered from it (still
  waiting in the queue counts too: the report is as of the last record);
- duplicated: message ids published more than once to the queue, or delivered
  more than once from it (a redelivery after a nack or a lost consumer counts);
- latency: first delivery minus first publish of each message id, p50 and p99.

Messages without a ``message_id`` are counted but cannot be matched; they are
left out of lost, duplicated and latency.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .timeline import MIN_BUCKET, bucket_count, choose_bucket, plot, series

TRACE_QUEUE = "amq.trace"
SAMPLE_IDS = 20


@dataclass
class QueueAudit:
    exchange: str
    queue: str
    published: int
    delivered: int
    acked: int
    lost: int
    duplicated: int
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    lost_ids: list[str] = field(default_factory=list)
    duplicated_ids: list[str] = field(default_factory=list)


@dataclass
class AuditReport:
    queues: list[QueueAudit]
    records: int
    #: one row per bucket from the first record to the last, empty buckets included:
    #: time (bucket start, Unix s), publish_per_s, deliver_per_s, ack_per_s, and
    #: latency_p50_ms / latency_p99_ms of the messages first delivered in the bucket
    #: (None when none was)
    throughput: list[dict[str, Any]]
    #: the bucket's length, seconds: see timeline.choose_bucket
    bucket_seconds: float
    #: (time, node) where the trace's records start coming from another node
    failovers: list[tuple[float, str]]

    def row(self, exchange: str, queue: str) -> QueueAudit | None:
        return next((q for q in self.queues if (q.exchange, q.queue) == (exchange, queue)), None)


def parse_since(text: str | None, now: float | None = None) -> float | None:
    """``--since``: a duration back from now (``90s``, ``15m``, ``2h``, ``1d``), a Unix
    time, or an ISO-8601 time (no zone: UTC)."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text)
    if match:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        return (time.time() if now is None else now) - float(match.group(1)) * unit
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--since must be a duration (15m, 2h), a Unix time or an ISO-8601 time, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def load_trace(spark: Any, options: dict[str, str], since: float | None = None) -> Any:
    """The trace as a DataFrame: offset, event, message_id, exchange, routing_key,
    queue, node, time (double, Unix s), redelivered."""
    from pyspark.sql import functions as F

    df = (
        spark.read.format("amqlite")
        .options(**options)
        .option("queue", TRACE_QUEUE)
        .option("startingOffset", "first")
        .load()
    )
    h = F.col("headers")
    trace = df.select(
        "offset",
        h["event"].alias("event"),
        F.coalesce(h["message_id"], F.lit("")).alias("message_id"),
        F.coalesce(h["exchange"], F.lit("")).alias("exchange"),
        h["routing_key"].alias("routing_key"),
        F.coalesce(h["queue"], F.lit("")).alias("queue"),
        h["node"].alias("node"),
        h["time"].cast("double").alias("time"),
        (F.lower(F.coalesce(h["redelivered"], F.lit("false"))) == "true").alias("redelivered"),
    )
    if since is not None:
        trace = trace.where(F.col("time") >= F.lit(since))
    return trace


def audit(spark: Any, options: dict[str, str], since: float | None = None) -> AuditReport:
    """Run the audit; ``options`` are the data source's connection options
    (servers, vhost, login, password)."""
    from pyspark.sql import functions as F

    trace = load_trace(spark, options, since).cache()
    try:
        return _audit(trace, F)
    finally:
        trace.unpersist()


def _audit(trace: Any, F: Any) -> AuditReport:
    key = ["exchange", "queue"]
    counts = trace.groupBy(*key).agg(
        F.sum((F.col("event") == "publish").cast("long")).alias("published"),
        F.sum((F.col("event") == "deliver").cast("long")).alias("delivered"),
        F.sum((F.col("event") == "ack").cast("long")).alias("acked"),
    )
    ided = trace.where(F.col("message_id") != "")
    per_message = ided.groupBy(*key, "message_id").agg(
        F.sum((F.col("event") == "publish").cast("long")).alias("pubs"),
        F.sum((F.col("event") == "deliver").cast("long")).alias("dels"),
        F.min(F.when(F.col("event") == "publish", F.col("time"))).alias("first_pub"),
        F.min(F.when(F.col("event") == "deliver", F.col("time"))).alias("first_del"),
    )
    per_message = per_message.withColumn(
        "latency_ms", (F.col("first_del") - F.col("first_pub")) * 1000.0
    )
    lost = F.col("pubs") > 0
    lost = lost & (F.col("dels") == 0)
    dup = (F.col("pubs") > 1) | (F.col("dels") > 1)
    verdicts = per_message.groupBy(*key).agg(
        F.sum(lost.cast("long")).alias("lost"),
        F.sum(dup.cast("long")).alias("duplicated"),
        F.percentile_approx("latency_ms", 0.5).alias("p50"),
        F.percentile_approx("latency_ms", 0.99).alias("p99"),
        F.slice(
            F.sort_array(F.collect_list(F.when(lost, F.col("message_id")))), 1, SAMPLE_IDS
        ).alias("lost_ids"),
        F.slice(
            F.sort_array(F.collect_list(F.when(dup, F.col("message_id")))), 1, SAMPLE_IDS
        ).alias("duplicated_ids"),
    )
    rows = counts.join(verdicts, on=key, how="left").orderBy(*key).collect()
    queues = [
        QueueAudit(
            exchange=r["exchange"],
            queue=r["queue"],
            published=int(r["published"] or 0),
            delivered=int(r["delivered"] or 0),
            acked=int(r["acked"] or 0),
            lost=int(r["lost"] or 0),
            duplicated=int(r["duplicated"] or 0),
            latency_p50_ms=None if r["p50"] is None else float(r["p50"]),
            latency_p99_ms=None if r["p99"] is None else float(r["p99"]),
            lost_ids=list(r["lost_ids"] or []),
            duplicated_ids=list(r["duplicated_ids"] or []),
        )
        for r in rows
    ]

    span = trace.agg(F.min("time").alias("t0"), F.max("time").alias("t1"), F.count("*")).first()
    records = int(span[2])
    t0, t1 = span["t0"], span["t1"]
    throughput: list[dict[str, Any]] = []
    bucket = MIN_BUCKET
    failovers: list[tuple[float, str]] = []
    if records:
        bucket = choose_bucket(t1 - t0)
        buckets = bucket_count(t1 - t0, bucket)

        def index(column: str) -> Any:
            return F.floor((F.col(column) - F.lit(t0)) / F.lit(bucket)).cast("long")

        lat = (
            per_message.where(F.col("latency_ms").isNotNull())
            .groupBy(index("first_del").alias("i"))
            .agg(
                F.percentile_approx("latency_ms", 0.5).alias("p50"),
                F.percentile_approx("latency_ms", 0.99).alias("p99"),
            )
        )
        counts_by_bucket = (
            trace.groupBy(index("time").alias("i"))
            .pivot("event", ["publish", "deliver", "ack"])
            .count()
        )
        counted = {
            int(r["i"]): (r["publish"] or 0, r["deliver"] or 0, r["ack"] or 0)
            for r in counts_by_bucket.collect()
        }
        latencies = {int(r["i"]): (float(r["p50"]), float(r["p99"])) for r in lat.collect()}
        throughput = series(t0, bucket, buckets, counted, latencies)
        firsts = trace.groupBy("node").agg(F.min("time").alias("since")).orderBy("since").collect()
        failovers = [(float(r["since"]), str(r["node"])) for r in firsts[1:]]
    return AuditReport(queues, records, throughput, bucket, failovers)


# --- output -------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_report(report: AuditReport, file: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"amqlite delivery audit ({report.records} trace records)")
    for name in ("exchange", "queue", "published", "delivered", "acked", "lost", "duplicated"):
        table.add_column(name, justify="left" if name in ("exchange", "queue") else "right")
    table.add_column("p50 ms", justify="right")
    table.add_column("p99 ms", justify="right")
    for q in report.queues:
        table.add_row(
            q.exchange or '""',
            q.queue or "(unroutable)",
            str(q.published),
            str(q.delivered),
            str(q.acked),
            f"[red]{q.lost}[/red]" if q.lost else "0",
            f"[yellow]{q.duplicated}[/yellow]" if q.duplicated else "0",
            _ms(q.latency_p50_ms),
            _ms(q.latency_p99_ms),
        )
    out = file or sys.stdout
    # rich takes 80 columns when not on a terminal: too few for the table
    console = Console(file=out, width=None if out.isatty() else 140)
    console.print(table)
    for q in report.queues:
        if q.lost_ids:
            console.print(f"lost from {q.queue!r}: {', '.join(q.lost_ids)}", soft_wrap=True)
        if q.duplicated_ids:
            console.print(
                f"duplicated in {q.queue!r}: {', '.join(q.duplicated_ids)}", soft_wrap=True
            )
    for when, node in report.failovers:
        stamp = datetime.datetime.fromtimestamp(when, tz=datetime.UTC).isoformat()
        console.print(f"failover: records from {node} from {stamp}", soft_wrap=True)


def write_outputs(spark: Any, report: AuditReport, out: Path) -> list[Path]:
    """``summary.parquet`` and ``throughput.parquet`` (directories Spark writes) and
    ``audit.png`` under ``out``; returns what was written."""
    out.mkdir(parents=True, exist_ok=True)
    summary_schema = (
        "exchange string, queue string, published long, delivered long, acked long, "
        "lost long, duplicated long, latency_p50_ms double, latency_p99_ms double, "
        "lost_ids array<string>, duplicated_ids array<string>"
    )
    rows = [
        (
            q.exchange,
            q.queue,
            q.published,
            q.delivered,
            q.acked,
            q.lost,
            q.duplicated,
            q.latency_p50_ms,
            q.latency_p99_ms,
            q.lost_ids,
            q.duplicated_ids,
        )
        for q in report.queues
    ]
    written = []
    summary = out / "summary.parquet"
    spark.createDataFrame(rows, summary_schema).coalesce(1).write.mode("overwrite").parquet(
        str(summary.resolve())
    )
    written.append(summary)
    series = out / "throughput.parquet"
    spark.createDataFrame(
        [
            (
                t["time"],
                t["publish_per_s"],
                t["deliver_per_s"],
                t["ack_per_s"],
                t["latency_p50_ms"],
                t["latency_p99_ms"],
            )
            for t in report.throughput
        ],
        "time double, publish_per_s double, deliver_per_s double, ack_per_s double, "
        "latency_p50_ms double, latency_p99_ms double",
    ).coalesce(1).write.mode("overwrite").parquet(str(series.resolve()))
    written.append(series)
    written.append(plot(report, out / "audit.png"))
    return written


# --- command line -------------------------------------------------------------------------


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master",
        default="local[*]",
        metavar="URL",
        help="Spark master (default local[*]; e.g. spark://host:7077)",
    )
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only records from then on: 15m, 2h, 1d, a Unix time or an ISO-8601 time",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="write summary/throughput Parquet and audit.png here"
    )
    parser.add_argument(
        "--spark-log",
        metavar="FILE",
        help="where Spark's own output and warnings go (default: spark.log in --out, "
        "else a new amqlite-audit-*.log in the temporary directory)",
    )


def _parser() -> argparse.ArgumentParser:
    from amqlite.connection_args import connection_options

    parser = argparse.ArgumentParser(
        prog="python -m amqlite.spark.audit",
        description="Audit deliveries from the broker trace (amq.trace) with Spark.",
        parents=[connection_options()],
    )
    add_audit_arguments(parser)
    return parser


def _spark_log(args: argparse.Namespace) -> Path:
    if args.spark_log:
        return Path(args.spark_log).resolve()
    if args.out:
        return (Path(args.out) / "spark.log").resolve()
    fd, name = tempfile.mkstemp(prefix="amqlite-audit-", suffix=".log")
    os.close(fd)
    return Path(name)


def run_from_args(args: argparse.Namespace) -> int:
    from . import SparkEnvironmentError, SparkSourceError, session
    from .jvm_log import jvm_started

    try:
        since = parse_since(args.since)
    except ValueError as exc:
        print(f"amqlite: error: {exc}", file=sys.stderr)
        return 2
    from .bridge import ServerAccess, stream_bounds

    access = ServerAccess(
        args.servers,
        args.vhost,
        args.login,
        args.password,
        args.connect_timeout,
        tls=args.tls,
        ca=args.ca or "",
    )
    try:  # before starting a JVM: unreachable servers or no trace fail in a moment
        bounds = stream_bounds(access, TRACE_QUEUE)
    except SparkSourceError as exc:
        hint = " (turn the trace on with `amqlite trace on`)" if "no queue" in str(exc) else ""
        print(f"amqlite: error: {str(exc).removeprefix('amqlite: ')}{hint}", file=sys.stderr)
        return 1
    if bounds.next == bounds.first:
        print("amqlite: the trace (amq.trace) holds no records", file=sys.stderr)
    if args.master.startswith("local"):  # no "hostname resolves to a loopback" warning
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log_file = _spark_log(args)
    if jvm_started():  # under spark-submit: its console is spark-submit's business
        print("using the running Spark", file=sys.stderr)
    else:
        print(f"starting Spark ({args.master}); its log: {log_file}", file=sys.stderr)
    try:  # the report is the output: no progress bars, JVM or log4j lines from Spark
        spark = session(
            args.master,
            "amqlite-audit",
            {"spark.ui.showConsoleProgress": "false"},
            log_file=log_file,
        )
    except SparkEnvironmentError as exc:
        print(f"amqlite: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the JVM did not start: the reason is in its log
        print(f"amqlite: error: Spark did not start ({exc}); see {log_file}", file=sys.stderr)
        return 1
    kept = bounds.next - bounds.first
    print(f"reading {TRACE_QUEUE} ({kept:,} records kept)", file=sys.stderr)
    options = {
        "servers": args.servers,
        "vhost": args.vhost,
        "login": args.login,
        "password": args.password,
        "connectTimeout": str(args.connect_timeout),
    }
    try:
        report = audit(spark, options, since)
    except Exception as exc:  # Spark wraps our errors: show the one line that matters
        text = str(exc)
        line = next(
            (ln for ln in text.splitlines() if "SparkSourceError:" in ln), text.splitlines()[0]
        )
        if isinstance(exc, SparkSourceError):
            line = text
        text = line.split("SparkSourceError: ")[-1].removeprefix("amqlite: ")
        print(f"amqlite: error: {text}", file=sys.stderr)
        return 1
    print_report(report)
    if args.out:
        for path in write_outputs(spark, report, Path(args.out)):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_from_args(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
