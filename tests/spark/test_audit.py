"""The delivery audit over a real broker trace: it finds a message that was
deliberately dropped and one deliberately duplicated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import amqlite
from amqlite.spark.audit import audit, parse_since, print_report, write_outputs

from .conftest import ThreadedBroker

pytestmark = pytest.mark.spark


def test_audit_finds_a_dropped_and_a_duplicated_message(
    spark: Any, broker: ThreadedBroker, name: str, tmp_path: Path
) -> None:
    async def scenario(conn: amqlite.Connection) -> None:
        assert await conn.trace(True) is True
        try:
            await conn.declare_queue(name)
            await conn.bind(name, "amq.direct", name)
            ids = [f"{name}-m{i}" for i in range(5)]
            for message_id in [*ids, ids[3]]:  # ids[3] published twice: a duplicate
                await conn.publish(
                    "amq.direct", name, b"x", properties={"message_id": message_id}, confirm=True
                )
            got = 0
            async with await conn.consume(name) as consumer:
                async for d in consumer:
                    await d.ack()
                    got += 1
                    if got == 6:
                        break
            # a message routed to the queue and dropped before any delivery
            await conn.publish(
                "amq.direct", name, b"x", properties={"message_id": f"{name}-dropped"}, confirm=True
            )
            assert await conn.purge_queue(name) == 1
            await conn.status()  # a round trip: acks go out before it, so all are applied
        finally:
            await conn.trace(False)

    broker.call(scenario)
    report = audit(spark, {"servers": broker.servers}, since=None)
    row = report.row("amq.direct", name)
    assert row is not None
    assert (row.published, row.delivered, row.acked) == (7, 6, 6)
    assert (row.lost, row.lost_ids) == (1, [f"{name}-dropped"])
    assert (row.duplicated, row.duplicated_ids) == (1, [f"{name}-m3"])
    assert row.latency_p50_ms is not None and 0 <= row.latency_p50_ms <= row.latency_p99_ms  # type: ignore[operator]
    assert report.throughput and sum(t["publish_per_s"] for t in report.throughput) > 0
    assert report.failovers == []  # one node wrote every record

    written = write_outputs(spark, report, tmp_path / "out")
    assert (tmp_path / "out" / "audit.png").stat().st_size > 1000
    summary = spark.read.parquet(str(written[0]))
    assert summary.where(f"queue = '{name}'").first()["lost"] == 1

    from io import StringIO

    text = StringIO()
    print_report(report, file=text)
    assert f"lost from '{name}': {name}-dropped" in text.getvalue()


def test_parse_since() -> None:
    assert parse_since("15m", now=1000.0) == 100.0
    assert parse_since("1700000000") == 1700000000.0
    assert parse_since("2026-01-01T00:00:00Z") == 1767225600.0
    assert parse_since(None) is None
    with pytest.raises(ValueError, match="--since must be"):
        parse_since("yesterday")


def test_audit_command_line_reports_a_clear_error_for_unreachable_servers() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "amqlite", "audit", "-s", "127.0.0.1:1", "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 1
    assert "cannot connect to servers '127.0.0.1:1'" in out.stderr


SPARK_NOISE = ("Using incubator modules", "NativeCodeLoader", "log4j", "WARN ", "setLogLevel")


@pytest.mark.timeout(300)  # the subprocess's own limit: it starts a JVM of its own
def test_audit_command_line_prints_progress_and_the_report_and_logs_spark_to_a_file(
    broker: ThreadedBroker, name: str, tmp_path: Path
) -> None:
    async def scenario(conn: amqlite.Connection) -> None:
        assert await conn.trace(True) is True
        try:
            await conn.declare_queue(name)
            await conn.publish("", name, b"x", properties={"message_id": name}, confirm=True)
        finally:
            await conn.trace(False)

    broker.call(scenario)
    command = [
        "audit",
        "-s",
        broker.servers,
        "--master",
        "local[1]",
        "--out",
        str(tmp_path / "out"),
    ]
    out = subprocess.run(
        [sys.executable, "-m", "amqlite", *command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    log = (tmp_path / "out" / "spark.log").resolve()
    progress = out.stderr.splitlines()
    assert progress[0] == f"starting Spark (local[1]); its log: {log}"
    assert progress[1].startswith("reading amq.trace (")
    assert all(line.startswith("wrote ") for line in progress[2:]), progress
    for noise in SPARK_NOISE:
        assert noise not in out.stdout and noise not in out.stderr, noise
    assert "amqlite delivery audit" in out.stdout and name in out.stdout
    # the JVM's start-up warning happened, and went to the log named above
    assert "Using incubator modules" in log.read_text()
    assert (tmp_path / "out" / "audit.png").exists()
