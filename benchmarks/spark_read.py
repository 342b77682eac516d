"""Stream -> Spark read rate, side by side with Spark reading the same rows from
Parquet in the same run, and the DataFrame -> exchange write rate.

    .venv/bin/python benchmarks/spark_read.py [--messages 1000000] [--body 100] \\
        [--master local[2]] [--partitions 2] [--runs 3]

Starts a broker in-process (a thread of its own, no journal, a free loopback
port), fills a stream queue with N messages of ``--body`` bytes (with a
message_id each), then, ``--runs`` times alternately:

- reads the whole stream with ``spark.read.format("amqlite")`` into Spark's
  ``noop`` sink (every row is produced, nothing is collected to the driver);
- reads the same rows, written once to Parquet beforehand, the same way;

and reports the median rates and their ratio (amqlite / Parquet). Then it writes
N rows with ``df.write.format("amqlite")`` (confirms, to a stream queue bound to
amq.direct) and reports that rate. Prints one JSON object at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

import amqlite
from amqlite.server.background import BackgroundNode


def fill(servers: str, queue: str, n: int, body: bytes) -> float:
    async def run() -> float:
        async with amqlite.connect(servers, max_in_flight=5000) as conn:
            await conn.declare_queue(queue, durable=True, arguments={"x-queue-type": "stream"})
            started = time.perf_counter()
            for i in range(n):
                await conn.publish_nowait("", queue, body, properties={"message_id": str(i)})
            await conn.wait_for_confirms()
            return time.perf_counter() - started

    return trio.run(run)


def timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=100)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    n = args.messages
    work = Path(tempfile.mkdtemp(prefix="amqlite-spark-bench-"))
    broker = BackgroundNode(work / "broker", **{"storage.persist": False}).start()
    try:
        from amqlite.spark import session

        fill_s = fill(broker.servers, "bench", n, b"x" * args.body)
        print(f"filled {n} messages in {fill_s:.1f}s ({n / fill_s:,.0f} msg/s)", file=sys.stderr)
        spark = session(args.master, "amqlite-bench", {"spark.sql.shuffle.partitions": "2"})
        spark.sparkContext.setLogLevel("ERROR")

        def source() -> Any:
            return (
                spark.read.format("amqlite")
                .option("servers", broker.servers)
                .option("queue", "bench")
                .option("partitions", str(args.partitions))
                .option("minPartitionSize", "1000")
                .load()
            )

        parquet = str(work / "bench.parquet")
        source().write.mode("overwrite").parquet(parquet)
        assert spark.read.parquet(parquet).count() == n

        def read_amqlite() -> None:
            source().write.format("noop").mode("overwrite").save()

        def read_parquet() -> None:
            spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()

        amq_s, pq_s = [], []
        for _ in range(args.runs):
            amq_s.append(timed(read_amqlite))
            pq_s.append(timed(read_parquet))
        amq_rate = n / statistics.median(amq_s)
        pq_rate = n / statistics.median(pq_s)

        async def sink(conn: amqlite.Connection) -> None:
            await conn.declare_queue("sink", durable=True, arguments={"x-queue-type": "stream"})
            await conn.bind("sink", "amq.direct", "k")

        broker.call(sink)
        rows = spark.range(n, numPartitions=args.partitions).selectExpr(
            "'k' AS routing_key",
            f"repeat('x', {args.body}) AS body",
            "CAST(id AS STRING) AS message_id",
        )
        rows.cache().count()
        write_s = timed(
            lambda: (
                rows.write.format("amqlite")
                .option("servers", broker.servers)
                .option("exchange", "amq.direct")
                .mode("append")
                .save()
            )
        )

        async def count(conn: amqlite.Connection) -> int:
            status = await conn.status()
            q = next(q for v in status["vhosts"] for q in v["queues"] if q["name"] == "sink")
            return int(q["next_offset"])

        written = broker.call(count)
        assert written == n, f"the sink stream holds {written} messages, not {n}"
        result = {
            "messages": n,
            "body_bytes": args.body,
            "master": args.master,
            "partitions": args.partitions,
            "runs": args.runs,
            "amqlite_read_s": amq_s,
            "parquet_read_s": pq_s,
            "amqlite_read_msg_s": round(amq_rate),
            "parquet_read_msg_s": round(pq_rate),
            "read_ratio_amqlite_over_parquet": round(amq_rate / pq_rate, 4),
            "write_s": write_s,
            "write_msg_s": round(n / write_s),
            "fill_msg_s": round(n / fill_s),
            "cpus": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
