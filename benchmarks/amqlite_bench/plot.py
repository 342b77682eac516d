"""``amqlite bench --plot FILE.png``: the results as one picture (matplotlib, Agg).

Left: msgs/s per throughput scenario, one bar per system, the amqlite/other ratio
written over the other systems' bars when there is one amqlite row to compare
with. Right: the latency run's p50 / p99 / p99.9 per system (log scale).
matplotlib is imported only here (a dependency of the harness:
``pip install -e benchmarks/``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from .contenders import is_amqlite
from .scenarios import RunResult

_COLOURS = {
    "amqlite": "#1f77b4",
    "amqlite-fsync-batch": "#4a98d3",
    "amqlite-fsync-always": "#9cc7ea",
    "amqlite-amqp": "#9467bd",
    "amqlite-amqp-fsync-batch": "#b294d0",
    "amqlite-amqp-fsync-always": "#d1c2e6",
    "raw-trio": "#7f7f7f",
    "rabbitmq": "#ff7f0e",
    "nats": "#2ca02c",
}


def _colour(system: str, i: int) -> str:
    fallback = ["#8c564b", "#e377c2", "#bcbd22", "#17becf"]
    return _COLOURS.get(system, fallback[i % len(fallback)])


def plot_results(results: Sequence[RunResult], path: str, title: str = "amqlite bench") -> None:
    """Write the chart to ``path`` (PNG). Raises ImportError without matplotlib."""
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")

    throughput = [r for r in results if r.p99_ms is None]
    latency = [r for r in results if r.p99_ms is not None]
    scenarios = list(dict.fromkeys(r.scenario for r in throughput))
    systems = list(dict.fromkeys(r.system for r in results))
    by_key = {(r.system, r.scenario): r for r in results}

    panels = (1 if scenarios else 0) + (1 if latency else 0)
    fig, axes = plt.subplots(1, max(1, panels), figsize=(7.5 * max(1, panels), 5.2), squeeze=False)
    ax_iter = iter(axes[0])
    if scenarios:
        ax = next(ax_iter)
        width = 0.8 / max(
            1, max(len([r for r in throughput if r.scenario == sc]) for sc in scenarios)
        )
        labelled: set[str] = set()
        for j, scenario in enumerate(scenarios):
            present = [s for s in systems if (s, scenario) in by_key]
            left = j - width * len(present) / 2
            for k, system in enumerate(present):
                y = by_key[(system, scenario)].msgs_per_s or 0.0
                bars = ax.bar(
                    [left + width * (k + 0.5)],
                    [y],
                    width,
                    label=None if system in labelled else system,
                    color=_colour(system, systems.index(system)),
                )
                labelled.add(system)
                ax.bar_label(bars, labels=[f"{y / 1000:.1f}k"], fontsize=7)
        ax.set_xticks(range(len(scenarios)), scenarios, fontsize=8)
        ax.set_ylabel("messages/s (median run)")
        ax.set_title("throughput (higher is better)")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        _ratio_notes(ax, throughput, scenarios)
    if latency:
        ax = next(ax_iter)
        lat_systems = list(dict.fromkeys(r.system for r in latency))
        labels = ("p50", "p99", "p99.9")
        width = 0.8 / len(lat_systems)
        for i, system in enumerate(lat_systems):
            r = next(x for x in latency if x.system == system)
            values = [r.p50_ms or 0.0, r.p99_ms or 0.0, r.p999_ms or 0.0]
            xs = [j - 0.4 + width * (i + 0.5) for j in range(len(labels))]
            bars = ax.bar(xs, values, width, label=system, color=_colour(system, i))
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_yscale("log")
        ax.set_ylabel("publish -> delivery latency, ms (log)")
        ax.set_title(f"{latency[0].scenario} (lower is better)")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ratio_notes(ax: Any, results: Sequence[RunResult], scenarios: list[str]) -> None:
    """Under each scenario: amqlite's ratio to every other system that ran it."""
    lines = []
    for scenario in scenarios:
        rows = [r for r in results if r.scenario == scenario]
        mine = [r for r in rows if is_amqlite(r.system)]
        theirs = [r for r in rows if not is_amqlite(r.system) and (r.msgs_per_s or 0) > 0]
        parts = [
            f"{m.system}/{t.system} {(m.msgs_per_s or 0.0) / (t.msgs_per_s or 1.0):.2f}"
            for m in mine
            for t in theirs
        ]
        if parts:
            lines.append(f"{scenario}: " + ", ".join(parts))
    if lines:
        ax.text(
            0.0,
            -0.14,
            "\n".join(lines),
            transform=ax.transAxes,
            fontsize=7,
            va="top",
            family="monospace",
        )
