"""The audit's time axis and its chart (``audit.png``).

The throughput bucket follows the run's length: a 1 s run and a day-long one both
get 30 to 100 points (:func:`choose_bucket`), except that a bucket is never shorter
than 10 ms, so runs under about 0.3 s get fewer. Buckets are "round" lengths
(10/20/50 ms, 1/2/5/10/15/30 s, 1/2/5/10/15/30 min, hours, days) so the axis
reads plainly. Nothing here needs Spark; only :func:`plot` needs matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .audit import AuditReport

MIN_BUCKET = 0.01
MIN_POINTS = 30
MAX_POINTS = 100

_MINUTE = 60.0
_HOUR = 3600.0
_DAY = 86400.0
#: round bucket lengths up to a day, seconds; each at most 2.5x the one before, so
#: the first that gives at most MAX_POINTS gives at least MAX_POINTS / 2.5 = 40
_ROUND_BUCKETS = (
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0,
    _MINUTE, 2 * _MINUTE, 5 * _MINUTE, 10 * _MINUTE, 15 * _MINUTE, 30 * _MINUTE,
    _HOUR, 2 * _HOUR, 3 * _HOUR, 6 * _HOUR, 12 * _HOUR, _DAY,
)  # fmt: skip


def bucket_count(duration: float, bucket: float) -> int:
    """How many buckets of ``bucket`` seconds cover records spread over ``duration``
    seconds: the first record starts bucket 0, the last falls in bucket
    ``floor(duration / bucket)``."""
    return math.floor(max(duration, 0.0) / bucket) + 1


def _round_buckets() -> Iterator[float]:
    yield from _ROUND_BUCKETS
    days = 1
    while True:  # then 2, 5, 10, 20, 50 ... days
        for step in (2, 5, 10):
            yield float(days * step) * _DAY
        days *= 10


def choose_bucket(duration: float) -> float:
    """The throughput bucket (seconds) for records spread over ``duration`` seconds:
    the shortest round length that gives at most MAX_POINTS buckets. That gives at
    least MIN_POINTS, unless it is the MIN_BUCKET floor (runs under ~0.3 s)."""
    if not math.isfinite(duration) or duration < 0:
        raise ValueError(f"a run's duration must be a finite number >= 0, got {duration!r}")
    for bucket in _round_buckets():
        if bucket_count(duration, bucket) <= MAX_POINTS:
            return float(bucket)
    raise AssertionError("unreachable: the round buckets grow without bound")


def format_seconds(seconds: float) -> str:
    """A bucket length for a label: ``10 ms``, ``2 s``, ``15 min``, ``6 h``, ``2 d``."""
    for unit, size in (("d", _DAY), ("h", _HOUR), ("min", _MINUTE), ("s", 1.0)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds * 1000:g} ms"


def time_unit(duration: float) -> tuple[str, float]:
    """The x axis' unit for a run of ``duration`` seconds: (name, seconds in one)."""
    if duration < 3 * _MINUTE:
        return "s", 1.0
    if duration < 3 * _HOUR:
        return "min", _MINUTE
    if duration < 3 * _DAY:
        return "h", _HOUR
    return "days", _DAY


def series(
    t0: float,
    bucket: float,
    buckets: int,
    counts: Mapping[int, tuple[int, int, int]],
    latencies: Mapping[int, tuple[float, float]],
) -> list[dict[str, Any]]:
    """The audit's throughput rows, one per bucket from ``t0`` on, empty buckets
    included (a pause reads as zero, not as a line across it). ``counts`` maps a
    bucket's index to its (published, delivered, acked) records and ``latencies`` to
    the (p50, p99) ms of the messages first delivered in it; an index outside
    ``0..buckets-1`` (float rounding at the ends) counts in the nearest bucket."""
    rows: list[dict[str, Any]] = [
        {
            "time": t0 + i * bucket,
            "publish_per_s": 0.0,
            "deliver_per_s": 0.0,
            "ack_per_s": 0.0,
            "latency_p50_ms": None,
            "latency_p99_ms": None,
        }
        for i in range(buckets)
    ]

    def at(i: int) -> dict[str, Any]:
        return rows[min(max(i, 0), buckets - 1)]

    for i, (published, delivered, acked) in counts.items():
        row = at(i)
        row["publish_per_s"] += published / bucket
        row["deliver_per_s"] += delivered / bucket
        row["ack_per_s"] += acked / bucket
    for i, (p50, p99) in latencies.items():
        row = at(i)
        row["latency_p50_ms"], row["latency_p99_ms"] = p50, p99
    return rows


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def plot(report: AuditReport, path: Path) -> Path:
    """Write :func:`figure` to ``path`` (PNG)."""
    fig = figure(report)
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def figure(report: AuditReport) -> Any:
    """The chart as a matplotlib Figure: two panels over a shared time axis,
    failovers marked by dashed lines. Top: events per second of each kind
    (published, delivered, acked) per bucket. Bottom: the publish -> delivery
    latency of the messages first delivered in each bucket, a p50 line inside a
    p50-p99 band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: Sequence[dict[str, Any]] = report.throughput
    bucket = report.bucket_seconds
    t0 = rows[0]["time"] if rows else 0.0
    duration = (rows[-1]["time"] - t0 + bucket) if rows else bucket
    unit, size = time_unit(duration)
    xs = [(t["time"] - t0) / size for t in rows]
    marker = "o" if len(rows) < MIN_POINTS else None

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for key, label in (
        ("publish_per_s", "published"),
        ("deliver_per_s", "delivered"),
        ("ack_per_s", "acked"),
    ):
        top.plot(xs, [t[key] for t in rows], label=label, marker=marker, markersize=3)
    top.set_ylabel("events/s")
    top.set_ylim(bottom=0)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    top.set_title(
        f"amqlite audit: {report.records:,} trace records, {format_seconds(bucket)} buckets"
    )
    top.grid(alpha=0.3)

    p50 = [_nan(t.get("latency_p50_ms")) for t in rows]
    p99 = [_nan(t.get("latency_p99_ms")) for t in rows]
    bottom.fill_between(xs, p50, p99, color="tab:red", alpha=0.25, linewidth=0, label="p50 to p99")
    bottom.plot(xs, p99, color="tab:red", linewidth=0.8, alpha=0.6, marker=marker, markersize=2)
    bottom.plot(xs, p50, color="tab:red", label="p50", marker=marker, markersize=3)
    known = [v for v in p99 if not math.isnan(v)]
    note = None
    if not known:
        note = "no latency: no message with a message_id was delivered"
    elif max(known) == 0:  # a flat line on the axis would read as "no data"
        note = "p50 and p99 are 0 ms in every bucket"
    if note:
        bottom.text(0.5, 0.5, note, transform=bottom.transAxes, ha="center", va="center")
    bottom.set_ylabel("publish -> delivery (ms)")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.grid(alpha=0.3)
    bottom.set_xlabel(f"time since the first record ({unit})")
    for when, node in report.failovers:
        x = (when - t0) / size
        for ax in (top, bottom):
            ax.axvline(x, color="black", linestyle="--")
        top.annotate(
            f"failover to {node}",
            (x, 0.05),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=8,
            va="bottom",
            ha="right",
        )
    fig.tight_layout()
    return fig
