"""A streaming read of an HA pair's stream carries on across a kill -9 of the master:
every offset once, in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import amqlite
from amqlite.errors import AmqliteError

from ..ports import fixed_port
from ..waiting import poll_until

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

CHECKOUT = Path(__file__).resolve().parents[2]


def node_state(address: str) -> str | None:
    async def ask() -> str | None:
        try:
            with trio.fail_after(3):
                async with amqlite.connect(
                    address, role="monitor", reconnect=False, connect_timeout=1
                ) as conn:
                    return str((await conn.status())["state"])
        except (AmqliteError, trio.TooSlowError, OSError):
            return None

    return trio.run(ask)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[dict[str, Any]]:
    ports = {"primary": fixed_port(), "backup": fixed_port()}
    config = tmp_path / "pair.toml"
    config.write_text(
        f'[cluster]\nprimary_peer = "127.0.0.1:{ports["primary"]}"\n'
        f'backup_peer = "127.0.0.1:{ports["backup"]}"\n'
        "heartbeat_ms = 100\nfailover_timeout_ms = 600\n"
    )
    procs = {}
    for side, port in ports.items():
        procs[side] = subprocess.Popen(
            [
                sys.executable, "-m", "amqlite", "server", "--config", str(config),
                "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path / side),
                f"--is_{side}", "1",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"{side}.log").open("wb"),
            env={**os.environ, "PYTHONPATH": str(CHECKOUT)},  # this checkout's amqlite
        )  # fmt: skip
    addresses = {side: f"127.0.0.1:{port}" for side, port in ports.items()}
    try:
        poll_until(
            lambda: (
                (node_state(addresses["primary"]), node_state(addresses["backup"]))
                == ("active", "passive")
            ),
            "the pair coming up (active, passive)",
            deadline=30,
            every=0.05,
        )
        yield {"procs": procs, "servers": f"{addresses['primary']},{addresses['backup']}"}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def append(servers: str, first: int, count: int) -> str:
    """Publish offsets' worth of messages with confirms (retrying while the pair
    fails over); returns the node that took them."""

    async def run() -> str:
        with trio.fail_after(30):
            while True:
                try:
                    async with amqlite.connect(servers) as conn:
                        await conn.declare_queue(
                            "events", durable=True, arguments={"x-queue-type": "stream"}
                        )
                        for i in range(first, first + count):
                            await conn.publish_nowait(
                                "", "events", b"x", properties={"message_id": str(i)}
                            )
                        await conn.wait_for_confirms()
                        return conn.server_name
                except (amqlite.ConnectionRefused, amqlite.ConnectionClosed):
                    await trio.sleep(0.1)

    return trio.run(run)


def test_streaming_read_carries_on_across_a_failover(
    spark: Any, pair: dict[str, Any], tmp_path: Path
) -> None:
    servers = pair["servers"]
    before = append(servers, 0, 300)
    batches: list[tuple[int, list[int]]] = []

    def keep(df: Any, batch_id: int) -> None:
        batches.append((batch_id, [r.offset for r in df.collect()]))
        if batch_id == 1:
            pair["procs"]["primary"].send_signal(signal.SIGKILL)
            pair["procs"]["primary"].wait(timeout=10)

    query = (
        spark.readStream.format("amqlite")
        .option("servers", servers)
        .option("queue", "events")
        .option("startingOffset", "first")
        .option("maxMessagesPerBatch", "100")
        .load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
        after = append(servers, 300, 200)
        query.processAllAvailable()
    finally:
        query.stop()
    assert before != after  # the second lot went to the backup, now master
    seen = [offset for _, offsets in batches for offset in offsets]
    assert seen == list(range(500))  # every offset once, in order


def _fill(servers: str, queue: str, n: int) -> None:
    async def run() -> None:
        async with amqlite.connect(servers) as conn:
            await conn.declare_queue(queue, durable=True, arguments={"x-queue-type": "stream"})
            msgs = [(queue, b"x" * 100, None, {"message_id": str(i)}) for i in range(n)]
            await conn.publish_many("", msgs)

    trio.run(run)


def _kill_when_connected(pair: dict[str, Any], client: str, done: threading.Event) -> None:
    """kill -9 the master once a connection named ``client`` is open on it (or give
    up when ``done`` is set first)."""
    primary = pair["servers"].split(",")[0]

    async def connected() -> bool:
        try:
            with trio.fail_after(3):
                async with amqlite.connect(
                    primary, role="monitor", reconnect=False, connect_timeout=1
                ) as conn:
                    status = await conn.status()
        except (AmqliteError, trio.TooSlowError, OSError):
            return False
        return any(c.get("client") == client for c in status.get("connections", []))

    poll_until(lambda: done.is_set() or trio.run(connected), "the job's connection", deadline=600)
    if not done.is_set():
        pair["procs"]["primary"].send_signal(signal.SIGKILL)
        pair["procs"]["primary"].wait(timeout=10)
        pair["killed"] = True


def _read_all(servers: str, queue: str) -> list[tuple[int, bytes, str]]:
    async def run() -> list[tuple[int, bytes, str]]:
        out = []
        async with amqlite.connect(servers) as conn:
            at = 0
            while (batch := await conn.fetch_stream(queue, at)).count:
                out += [(o, b, p.get("message_id", "")) for o, _, _, b, _, p in batch.rows()]
                at = batch.next
        return out

    return trio.run(run)


def test_batch_read_finishes_across_a_kill_of_the_master(spark: Any, pair: dict[str, Any]) -> None:
    n = 100_000
    _fill(pair["servers"], "history", n)
    done = threading.Event()
    killer = threading.Thread(
        target=_kill_when_connected, args=(pair, "amqlite-spark-fetch", done), daemon=True
    )
    killer.start()
    try:
        df = (
            spark.read.format("amqlite")
            .option("servers", pair["servers"])
            .option("queue", "history")
            .option("partitions", "2")
            .option("minPartitionSize", "1000")
            .option("fetchBytes", "8192")  # many small fetches: the kill lands mid-read
            .option("fetchesInFlight", "1")
            .load()
        )
        offsets = [r.offset for r in df.select("offset").collect()]
    finally:
        done.set()
        killer.join(timeout=30)
    assert pair.get("killed"), "the master was not killed during the read"
    assert sorted(offsets) == list(range(n))  # every offset once


def test_batch_write_finishes_across_a_kill_of_the_master(spark: Any, pair: dict[str, Any]) -> None:
    n = 100_000

    async def declare() -> None:
        async with amqlite.connect(pair["servers"]) as conn:
            await conn.declare_queue("sink", durable=True, arguments={"x-queue-type": "stream"})
            await conn.bind("sink", "amq.direct", "k")

    trio.run(declare)
    rows = spark.range(n, numPartitions=2).selectExpr(
        "'k' AS routing_key", "repeat('x', 100) AS body", "CAST(id AS STRING) AS message_id"
    )
    rows.cache().count()
    done = threading.Event()
    killer = threading.Thread(
        target=_kill_when_connected, args=(pair, "amqlite-spark-write", done), daemon=True
    )
    killer.start()
    try:
        rows.write.format("amqlite").option("servers", pair["servers"]).option(
            "exchange", "amq.direct"
        ).mode("append").save()
    finally:
        done.set()
        killer.join(timeout=30)
    assert pair.get("killed"), "the master was not killed during the write"
    backup = pair["servers"].split(",")[1]
    ids = [mid for _, _, mid in _read_all(backup, "sink")]
    assert set(ids) == {str(i) for i in range(n)}  # every row at least once
