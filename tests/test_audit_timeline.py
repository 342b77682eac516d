"""The audit chart's time axis (amqlite/spark/timeline.py), without Spark: the bucket
follows the run's length, and the chart drawn from synthetic trace rows has one
point per bucket, a latency band and labelled units."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqlite.spark.audit import AuditReport
from amqlite.spark.timeline import (
    MAX_POINTS,
    MIN_BUCKET,
    MIN_POINTS,
    bucket_count,
    choose_bucket,
    format_seconds,
    series,
    time_unit,
)

DAY = 86400.0


@given(st.floats(min_value=0.0, max_value=400 * DAY, allow_nan=False))
def test_the_bucket_gives_30_to_100_points_or_is_at_its_10_ms_floor(duration: float) -> None:
    bucket = choose_bucket(duration)
    points = bucket_count(duration, bucket)
    assert points <= MAX_POINTS
    assert points >= MIN_POINTS or bucket == MIN_BUCKET
    assert bucket >= MIN_BUCKET


@given(st.floats(min_value=0.0, max_value=400 * DAY), st.floats(min_value=0.0, max_value=400 * DAY))
def test_a_longer_run_never_gets_a_shorter_bucket(a: float, b: float) -> None:
    short, long = sorted((a, b))
    assert choose_bucket(short) <= choose_bucket(long)


@pytest.mark.parametrize(
    ("duration", "bucket", "text"),
    [
        (0.0, 0.01, "10 ms"),
        (0.2, 0.01, "10 ms"),  # 21 points: the floor
        (1.0, 0.02, "20 ms"),  # 51 points
        (2.0, 0.05, "50 ms"),  # 41
        (60.0, 1.0, "1 s"),  # 61
        (3600.0, 60.0, "1 min"),  # 61
        (8 * 3600.0, 300.0, "5 min"),  # 97
        (7 * DAY, 2 * 3600.0, "2 h"),  # 85
        (365 * DAY, 5 * DAY, "5 d"),  # 74
    ],
)
def test_round_buckets_for_familiar_lengths(duration: float, bucket: float, text: str) -> None:
    assert choose_bucket(duration) == bucket
    assert format_seconds(bucket) == text


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_duration_must_be_finite_and_not_negative(bad: float) -> None:
    with pytest.raises(ValueError, match="duration"):
        choose_bucket(bad)


def test_the_axis_unit_follows_the_run() -> None:
    assert time_unit(2.0) == ("s", 1.0)
    assert time_unit(600.0) == ("min", 60.0)
    assert time_unit(8 * 3600.0) == ("h", 3600.0)
    assert time_unit(30 * DAY) == ("days", DAY)


def test_series_has_every_bucket_and_rates_per_second() -> None:
    rows = series(
        100.0, 0.5, 4, {0: (10, 5, 5), 3: (1, 2, 3), 4: (2, 0, 0)}, {3: (1.5, 9.0), -1: (2.0, 3.0)}
    )
    assert [r["time"] for r in rows] == [100.0, 100.5, 101.0, 101.5]
    assert [r["publish_per_s"] for r in rows] == [20.0, 0.0, 0.0, 6.0]  # index 4 counts in 3
    assert rows[1]["deliver_per_s"] == 0.0 and rows[1]["latency_p50_ms"] is None
    assert rows[0]["latency_p50_ms"] == 2.0  # index -1 counts in 0
    assert (rows[3]["latency_p50_ms"], rows[3]["latency_p99_ms"]) == (1.5, 9.0)


def synthetic_report(duration: float, rate: float, seed: int = 1) -> AuditReport:
    """What the audit computes, from made-up trace rows: messages published at
    ``rate``/s for ``duration`` s with a pause in the middle third, each delivered
    after a latency of a few ms (with a tail), and a failover at two thirds."""
    rng = random.Random(seed)
    t0 = 1_800_000_000.0
    bucket = choose_bucket(duration)
    buckets = bucket_count(duration, bucket)
    counts: dict[int, list[int]] = {}
    latencies: dict[int, list[float]] = {}
    n = int(duration * rate)
    for k in range(n):
        t = duration * k / max(n - 1, 1)
        if duration / 3 < t < duration / 2:
            continue  # a pause
        latency = rng.expovariate(1 / 2.0) + (40.0 if rng.random() < 0.02 else 0.0)
        delivered = min(t + latency / 1000, duration)
        for when, kind in ((t, 0), (delivered, 1), (delivered, 2)):
            counts.setdefault(math.floor(when / bucket), [0, 0, 0])[kind] += 1
        latencies.setdefault(math.floor(delivered / bucket), []).append(latency)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    rows = series(
        t0,
        bucket,
        buckets,
        {i: (c[0], c[1], c[2]) for i, c in counts.items()},
        {i: (pct(v, 0.5), pct(v, 0.99)) for i, v in latencies.items()},
    )
    return AuditReport([], 3 * n, rows, bucket, [(t0 + 2 * duration / 3, "node-b")])


@pytest.mark.parametrize(("duration", "unit"), [(2.0, "s"), (60.0, "s"), (5 * 3600.0, "h")])
def test_the_chart_has_a_point_per_bucket_a_latency_band_and_its_units(
    duration: float, unit: str, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from amqlite.spark.timeline import figure, plot

    report = synthetic_report(duration, rate=2000 if duration < 100 else 2)
    fig: Any = figure(report)
    top, bottom = fig.axes
    points = len(report.throughput)
    assert MIN_POINTS <= points <= MAX_POINTS
    assert all(len(line.get_xdata()) == points for line in top.get_lines()[:3])
    assert top.get_ylabel() == "events/s"
    assert format_seconds(report.bucket_seconds) + " buckets" in top.get_title()
    assert bottom.get_xlabel() == f"time since the first record ({unit})"
    assert bottom.get_ylabel() == "publish -> delivery (ms)"
    assert bottom.collections, "no p50-p99 band"
    assert max(top.get_lines()[0].get_xdata()) <= duration / time_unit(duration)[1]
    path = plot(report, tmp_path / "audit.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
