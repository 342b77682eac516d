"""The broker side of the Spark data source and its environment checks, without a JVM."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import amqlite
from amqlite.spark import SparkEnvironmentError, check_java, check_python_workers
from amqlite.spark.bridge import (
    SparkSourceError,
    StreamBounds,
    delivery_row,
    resolve_end,
    resolve_start,
    split_range,
)


def test_importing_amqlite_spark_does_not_import_pyspark() -> None:
    code = "import amqlite, amqlite.spark, sys; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert amqlite.__version__


@pytest.mark.parametrize(
    ("start", "end", "parts", "min_size", "expected"),
    [
        (0, 0, 4, 1, []),
        (5, 6, 4, 1, [(5, 6)]),
        (0, 10, 4, 100, [(0, 10)]),
        (0, 10, 3, 1, [(0, 4), (4, 7), (7, 10)]),
        (100, 200, 2, 50, [(100, 150), (150, 200)]),
        (0, 99, 8, 50, [(0, 99)]),
    ],
)
def test_split_range_covers_the_range_once_in_order(
    start: int, end: int, parts: int, min_size: int, expected: list[tuple[int, int]]
) -> None:
    assert split_range(start, end, parts, min_size) == expected


def test_offsets_resolve_into_what_the_stream_keeps() -> None:
    bounds = StreamBounds(first=10, next=20)
    assert resolve_start("first", bounds) == 10
    assert resolve_start("last", bounds) == 19
    assert resolve_start("next", bounds) == 20
    assert resolve_start("3", bounds) == 10  # dropped by retention: the oldest kept
    assert resolve_start("15", bounds) == 15
    assert resolve_start("99", bounds) == 20
    assert resolve_start("last", StreamBounds(0, 0)) == 0
    assert resolve_end(None, bounds) == 20
    assert resolve_end("17", bounds) == 17
    assert resolve_end("170", bounds) == 20
    with pytest.raises(SparkSourceError, match="startingOffset must be"):
        resolve_start("tomorrow", bounds)
    with pytest.raises(SparkSourceError, match="must not be negative"):
        resolve_end("-1", bounds)


def test_delivery_row_columns() -> None:
    row = delivery_row(
        7,
        "ex",
        "rk",
        {"n": 1, "ok": True},
        b"body",
        {"timestamp": 0, "message_id": "m", "correlation_id": 5, "content_type": "t"},
    )
    offset, exchange, key, headers, body, when, message_id, cid, ctype = row
    assert (offset, exchange, key, body, message_id, cid, ctype) == (
        7,
        "ex",
        "rk",
        b"body",
        "m",
        "5",
        "t",
    )
    assert headers == {"n": "1", "ok": "True"}
    assert when is not None and when.timestamp() == 0


def test_java_check_names_the_install_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkEnvironmentError, match="apt-get install -y openjdk-17-jdk-headless"):
        check_java()
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    fake.chmod(0o755)
    with pytest.raises(SparkEnvironmentError, match="is Java 11"):
        check_java()


def test_worker_python_without_pyarrow_fails_fast(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bare = tmp_path / "python"
    bare.write_text("#!/bin/sh\necho pyarrow pandas amqlite\n")  # finds none of them
    bare.chmod(0o755)
    monkeypatch.setenv("PYSPARK_PYTHON", str(bare))
    with pytest.raises(SparkEnvironmentError, match="lacks pyarrow, pandas, amqlite"):
        check_python_workers()
    monkeypatch.delenv("PYSPARK_PYTHON")
    if all(importlib.util.find_spec(m) for m in ("pyarrow", "pandas", "amqlite")):
        # with the spark extra installed: this interpreter is the workers'
        assert check_python_workers() == sys.executable
        assert os.environ["PYSPARK_PYTHON"] == sys.executable
