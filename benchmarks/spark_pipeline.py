"""Issue 17: the Spark pipeline against Spark's own Parquet, in the same run.

    .venv/bin/python benchmarks/spark_pipeline.py [--messages 1000000] [--body 100] \\
        [--keys 16] [--master local[2]] [--runs 3] [--consumer-path] \\
        [--stream-seconds 60 --stream-rate 50000]

Starts a broker in-process (a thread of its own, no journal, a free loopback
port), fills a stream queue with N messages of ``--body`` bytes over ``--keys``
routing keys (``publish_many``), writes the same rows once to Parquet, then
``--runs`` times alternately (medians reported):

- read + ``groupBy(routing_key).count()``: ``format("amqlite")`` (the JVM reader
  when its jar is loaded) vs ``format("amqlite_python")`` (the Python source's
  fast reader) vs Parquet, each also in CPU-seconds of this process and all its
  descendants (the broker, the driver, the JVM, Spark's Python workers) and of
  the rest of the machine (other processes: a shared machine shows here)
  (and once before: the first read of the stream, when the broker encodes the
  fetch blocks it keeps for the reads after, timed on its own);
- read + ``count()`` of the stream with 2 and 4 partitions;
- write N rows of a cached DataFrame: ``format("amqlite")`` (the JVM writer when
  the jar is loaded) and ``format("amqlite_python")`` to a stream bound to
  ``amq.direct`` (confirmed) vs Parquet (checked: the stream then holds 2N more);

and the ratios amqlite / Parquet. ``--consumer-path`` also times the read with
``fetch`` false (the stream-consumer path, the reader before ``stream.fetch``).
``--stream-seconds S`` runs a ``readStream`` query (1 s trigger) while a publisher
sends ``--stream-rate`` msg/s for S seconds and reports whether it kept up and the
publish -> sink latency (p50/p99; the sink is ``foreachBatch``, stamping each
micro-batch's arrival). Prints one JSON object at the end.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

import amqlite
from amqlite.log import configure_logging
from amqlite.server.background import BackgroundNode
from amqlite.server.main import GC_THRESHOLDS

STREAM = {"x-queue-type": "stream"}


def fill(servers: str, queue: str, n: int, body: int, keys: int) -> float:
    async def run() -> float:
        async with amqlite.connect(servers) as conn:
            await conn.declare_queue(queue, durable=True, arguments=STREAM)
            await conn.declare_exchange(f"{queue}-in", "fanout")
            await conn.bind(queue, f"{queue}-in")
            payload = b"x" * body
            started = time.perf_counter()
            step = 100_000
            for at in range(0, n, step):
                msgs = [(f"k{i % keys}", payload) for i in range(at, min(n, at + step))]
                await conn.publish_many(f"{queue}-in", msgs)
            return time.perf_counter() - started

    return trio.run(run)


def timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


_TICK = os.sysconf("SC_CLK_TCK")


def _tree_pids() -> list[int]:
    """This process and all its descendants (the JVM and its Python workers)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def cpu_seconds() -> tuple[float, float]:
    """CPU-seconds so far of this process tree, and of the whole machine (all cores;
    the difference is everything else running)."""
    ours = 0
    for pid in _tree_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ours += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    busy = sum(cpu) - cpu[3] - cpu[4]  # less idle and iowait
    return ours / _TICK, busy / _TICK


def timed_cpu(action: Any, into: dict[str, list[float]]) -> float:
    """:func:`timed`, with the CPU-seconds of this process tree and of the rest of
    the machine appended to ``into``'s ``tree`` and ``other``."""
    tree0, all0 = cpu_seconds()
    took = timed(action)
    tree1, all1 = cpu_seconds()
    into.setdefault("tree", []).append(round(tree1 - tree0, 2))
    into.setdefault("other", []).append(round(max(0.0, (all1 - all0) - (tree1 - tree0)), 2))
    return took


def median_rate(n: int, runs: list[float]) -> float:
    return n / statistics.median(runs)


def streaming(spark: Any, broker: BackgroundNode, seconds: float, rate: int, body: int) -> dict:
    """A readStream query with a 1 s trigger while a publisher sends ``rate`` msg/s."""
    queue = "live"

    async def declare(conn: amqlite.Connection) -> None:
        await conn.declare_queue(queue, durable=True, arguments=STREAM)

    broker.call(declare)
    latencies: list[float] = []
    counted = [0]
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        arrived = time.time()
        sent = [struct.unpack(">d", r.body[:8])[0] for r in df.select("body").collect()]
        with lock:
            counted[0] += len(sent)
            latencies.extend(arrived - s for s in sent)

    query = (
        spark.readStream.format("amqlite")
        .option("servers", broker.servers)
        .option("queue", queue)
        .option("startingOffset", "next")
        .option("partitions", "2")
        .option("minPartitionSize", "1000")
        .load()
        .writeStream.trigger(processingTime="1 second")
        .foreachBatch(sink)
        .start()
    )
    published = [0]

    async def publish() -> None:
        async with amqlite.connect(broker.servers) as conn:
            pad = b"x" * max(0, body - 8)
            started = time.monotonic()
            tick = 0.05
            while (elapsed := time.monotonic() - started) < seconds:
                due = int(rate * (elapsed + tick)) - published[0]
                if due > 0:
                    now = struct.pack(">d", time.time())
                    await conn.publish_many("", [(queue, now + pad)] * due)
                    published[0] += due
                await trio.sleep(max(0.0, started + elapsed + tick - time.monotonic()))

    try:
        while query.status["message"].startswith("Initializing"):
            time.sleep(0.1)  # the query's first (empty) batch: the stream's start is fixed
        begun = time.monotonic()
        trio.run(publish)
        publish_s = time.monotonic() - begun
        deadline = time.monotonic() + 60
        while counted[0] < published[0] and time.monotonic() < deadline:
            time.sleep(0.2)  # the query drains what is left
    finally:
        query.stop()
    latencies.sort()

    def pct(p: float) -> float | None:
        return round(latencies[int(p * (len(latencies) - 1))], 3) if latencies else None

    return {
        "seconds": seconds,
        "rate_asked": rate,
        "published": published[0],
        "publish_msg_s": round(published[0] / publish_s),
        "read": counted[0],
        "kept_up": counted[0] == published[0],
        "latency_p50_s": pct(0.5),
        "latency_p99_s": pct(0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=100)
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--consumer-path", action="store_true")
    parser.add_argument("--stream-seconds", type=float, default=0)
    parser.add_argument("--stream-rate", type=int, default=50_000)
    args = parser.parse_args()
    n = args.messages
    configure_logging(level="warning")  # the broker's per-connection lines: not here
    # the collector's thresholds `amqlite server` sets (amqlite.server.main): with the
    # default ones a broker holding millions of stream messages in this process
    # spent a third of a publish in collections of the young generations
    gc.set_threshold(*GC_THRESHOLDS)
    work = Path(tempfile.mkdtemp(prefix="amqlite-spark-pipeline-"))
    broker = BackgroundNode(work / "broker", **{"storage.persist": False}).start()
    try:
        from amqlite.spark import session

        fill_s = fill(broker.servers, "bench", n, args.body, args.keys)
        print(f"filled {n} messages in {fill_s:.1f}s ({n / fill_s:,.0f} msg/s)", file=sys.stderr)
        spark = session(
            args.master,
            "amqlite-pipeline-bench",
            {"spark.sql.shuffle.partitions": "2"},
            log_file=work / "spark.log",
        )
        spark.sparkContext.setLogLevel("ERROR")

        from amqlite.spark.jar import loaded

        jvm_reader = loaded(spark)

        def source(
            partitions: int = 2, fetch: bool = True, fmt: str = "amqlite", **options: str
        ) -> Any:
            return (
                spark.read.format(fmt)
                .option("servers", broker.servers)
                .option("queue", "bench")
                .option("partitions", str(partitions))
                .option("minPartitionSize", "1000")
                .option("fetch", str(fetch).lower())
                .options(**options)
                .load()
            )

        # warm Spark up (its first jobs, the Python workers) on the first 1,000 rows,
        # then time the first read of the whole stream: the broker encodes each fetch
        # block then (the reads after get the kept replies)
        for _ in range(2):
            source(endingOffset="1000").groupBy("routing_key").count().collect()
            source(endingOffset="1000", fmt="amqlite_python").groupBy(
                "routing_key"
            ).count().collect()
        first_s = timed(lambda: source().groupBy("routing_key").count().collect())
        parquet = str(work / "bench.parquet")
        source().write.mode("overwrite").parquet(parquet)
        assert spark.read.parquet(parquet).count() == n
        expected = sorted(
            (r["routing_key"], r["count"])
            for r in spark.read.parquet(parquet).groupBy("routing_key").count().collect()
        )

        def grouped(df: Any) -> list[tuple[str, int]]:
            return sorted(
                (r["routing_key"], r["count"]) for r in df.groupBy("routing_key").count().collect()
            )

        def read_amqlite() -> None:
            assert grouped(source()) == expected

        def read_python() -> None:
            assert grouped(source(fmt="amqlite_python")) == expected

        def read_parquet() -> None:
            assert grouped(spark.read.parquet(parquet)) == expected

        amq_s, py_s, pq_s, count2_s, count4_s, consumer_s = [], [], [], [], [], []
        cpu: dict[str, dict[str, list[float]]] = {"amqlite": {}, "python": {}, "parquet": {}}
        for _ in range(args.runs):
            amq_s.append(timed_cpu(read_amqlite, cpu["amqlite"]))
            py_s.append(timed_cpu(read_python, cpu["python"]))
            pq_s.append(timed_cpu(read_parquet, cpu["parquet"]))
            count2_s.append(timed(lambda: source(2).count()))
            count4_s.append(timed(lambda: source(4).count()))
            if args.consumer_path:
                consumer_s.append(timed(lambda: grouped(source(2, fetch=False))))

        async def sink(conn: amqlite.Connection) -> None:
            await conn.declare_queue("sink", durable=True, arguments=STREAM)
            await conn.bind("sink", "amq.direct", "k")

        broker.call(sink)
        rows = spark.range(n, numPartitions=2).selectExpr(
            "'k' AS routing_key", f"repeat('x', {args.body}) AS body"
        )
        rows.cache().count()
        out = str(work / "out.parquet")
        write_s, write_py_s, write_pq_s = [], [], []
        wcpu: dict[str, dict[str, list[float]]] = {"amqlite": {}, "python": {}, "parquet": {}}
        for _ in range(args.runs):
            write_py_s.append(
                timed_cpu(
                    lambda: (
                        rows.write.format("amqlite_python")
                        .option("servers", broker.servers)
                        .option("exchange", "amq.direct")
                        .mode("append")
                        .save()
                    ),
                    wcpu["python"],
                )
            )
            write_s.append(
                timed_cpu(
                    lambda: (
                        rows.write.format("amqlite")
                        .option("servers", broker.servers)
                        .option("exchange", "amq.direct")
                        .mode("append")
                        .save()
                    ),
                    wcpu["amqlite"],
                )
            )
            write_pq_s.append(
                timed_cpu(lambda: rows.write.mode("overwrite").parquet(out), wcpu["parquet"])
            )

        async def count(conn: amqlite.Connection) -> int:
            status = await conn.status()
            q = next(q for v in status["vhosts"] for q in v["queues"] if q["name"] == "sink")
            return int(q["next_offset"])

        written = broker.call(count)
        assert written == 2 * n * args.runs, (
            f"the sink holds {written} messages, not {2 * n * args.runs}"
        )
        read_rate, pq_rate = median_rate(n, amq_s), median_rate(n, pq_s)
        py_rate = median_rate(n, py_s)
        write_rate, write_pq_rate = median_rate(n, write_s), median_rate(n, write_pq_s)
        result: dict[str, Any] = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
            "messages": n,
            "body_bytes": args.body,
            "routing_keys": args.keys,
            "master": args.master,
            "runs": args.runs,
            "cpus": os.cpu_count(),
            "fill_publish_many_msg_s": round(n / fill_s),
            "read_groupby_amqlite_s": amq_s,
            "read_groupby_parquet_s": pq_s,
            "read_groupby_amqlite_msg_s": round(read_rate),
            "read_groupby_parquet_msg_s": round(pq_rate),
            "read_ratio": round(read_rate / pq_rate, 3),
            "jvm_reader": jvm_reader,
            "read_groupby_python_s": py_s,
            "read_groupby_python_msg_s": round(py_rate),
            "read_ratio_python": round(py_rate / pq_rate, 3),
            "read_groupby_cpu_s": {
                k: {"tree": v["tree"], "other": v["other"]} for k, v in cpu.items()
            },
            "load_average": os.getloadavg(),
            "read_groupby_first_read_msg_s": round(n / first_s),
            "read_count_2_partitions_msg_s": round(median_rate(n, count2_s)),
            "read_count_4_partitions_msg_s": round(median_rate(n, count4_s)),
            "write_amqlite_s": write_s,
            "write_parquet_s": write_pq_s,
            "write_amqlite_msg_s": round(write_rate),
            "write_parquet_msg_s": round(write_pq_rate),
            "write_ratio": round(write_rate / write_pq_rate, 3),
            "write_python_s": write_py_s,
            "write_python_msg_s": round(median_rate(n, write_py_s)),
            "write_ratio_python": round(median_rate(n, write_py_s) / write_pq_rate, 3),
            "write_cpu_s": wcpu,
        }
        if consumer_s:
            result["read_groupby_consumer_path_msg_s"] = round(median_rate(n, consumer_s))
        if args.stream_seconds > 0:
            result["streaming"] = streaming(
                spark, broker, args.stream_seconds, args.stream_rate, args.body
            )
        print(json.dumps(result, indent=2))
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
