"""The source and sink on a Spark standalone cluster (``spark://``): a master and a
worker started by the test, a driver in a process of its own (the suite's shared
session is ``local[2]``), reading a stream with ``stream.fetch`` over 4 tasks and
writing the rows back (the JVM reader and writer when
``session()`` built their jar, the Python source otherwise). Slow (a JVM master, worker,
executor and driver start): marked soak, run with ``-m soak``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqlite.server.background import BackgroundNode
from tests.waiting import poll_until

from ..ports import fixed_port

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.soak]

CHECKOUT = Path(__file__).resolve().parents[2]
N = 20_000

DRIVER = """
import json, sys
from amqlite.spark import session
master, servers, checkout = sys.argv[1:4]
spark = session(master, "amqlite-cluster-test", {
    "spark.executorEnv.PYTHONPATH": checkout,
    "spark.executor.cores": "2",
    "spark.cores.max": "2",
})
df = (spark.read.format("amqlite").option("servers", servers).option("queue", "cluster-in")
      .option("partitions", "4").option("minPartitionSize", "1000").load())
offsets = [r.offset for r in df.select("offset").collect()]
tasks = df.rdd.getNumPartitions()
(df.selectExpr("'k' AS routing_key", "body").write.format("amqlite")
   .option("servers", servers).option("exchange", "amq.direct").mode("append").save())
print(json.dumps({"offsets": sorted(offsets) == list(range(len(offsets))),
                  "count": len(offsets), "tasks": tasks}))
spark.stop()
"""


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    pytest.importorskip("pyspark")
    port, ui, worker_ui = fixed_port(), fixed_port(), fixed_port()
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(CHECKOUT),
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
    }
    master = f"spark://127.0.0.1:{port}"
    procs = [
        subprocess.Popen(
            [spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui)],
            env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "master.log").open("wb"),
        ),
        subprocess.Popen(
            [spark_class(), "org.apache.spark.deploy.worker.Worker", master, "--cores", "2",
             "--memory", "1g", "--webui-port", str(worker_ui)],
            env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "worker.log").open("wb"),
        ),
    ]  # fmt: skip
    try:

        def alive() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    return bool(json.load(r).get("aliveworkers", 0) >= 1)
            except OSError:
                return False

        # (two JVMs start: a slow poll)
        poll_until(alive, "the standalone cluster's worker", deadline=90, every=0.5)
        yield master
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def test_read_and_write_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    broker = BackgroundNode(tmp_path / "broker").start()
    try:

        async def prepare(conn: Any) -> None:
            stream = {"x-queue-type": "stream"}
            await conn.declare_queue("cluster-in", durable=True, arguments=stream)
            await conn.declare_queue("cluster-out", durable=True, arguments=stream)
            await conn.bind("cluster-out", "amq.direct", "k")
            await conn.publish_many("", [("cluster-in", b"%d" % i) for i in range(N)])

        broker.call(prepare)
        out = subprocess.run(
            [sys.executable, "-c", DRIVER, cluster, broker.servers, str(CHECKOUT)],
            env={**os.environ, "PYTHONPATH": str(CHECKOUT), "SPARK_LOCAL_IP": "127.0.0.1"},
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result == {"offsets": True, "count": N, "tasks": 4}

        async def written(conn: Any) -> list[bytes]:
            at, bodies = 0, []
            while (batch := await conn.fetch_stream("cluster-out", at)).count:
                bodies += batch.body_list()
                at = batch.next
            return bodies

        assert sorted(broker.call(written)) == sorted(b"%d" % i for i in range(N))
    finally:
        broker.stop()
