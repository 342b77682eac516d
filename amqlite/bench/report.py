"""Benchmark results as a rich table (for people) or JSON (for scripts).

``--json`` prints exactly ``{"results": [row, ...]}``; each row has ``system``,
``scenario``, ``msgs_per_s``, ``p50_ms`` and ``p99_ms`` (null without latency
stamps) plus the extra keys of :meth:`RunResult.to_json`, and amqlite rows carry
``ratio_vs_raw_trio``, their msgs/s over the baseline's in the same scenario.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from .scenarios import RunResult
from .systems import AMQLITE, RAW_TRIO


def ratios(results: Sequence[RunResult]) -> dict[str, float]:
    """scenario -> amqlite msgs/s / raw-trio msgs/s, for scenarios that ran on both."""
    by_key = {(r.system, r.scenario): r for r in results}
    out: dict[str, float] = {}
    for (system, scenario), r in by_key.items():
        base = by_key.get((RAW_TRIO, scenario))
        if system == AMQLITE and base is not None and base.msgs_per_s > 0:
            out[scenario] = r.msgs_per_s / base.msgs_per_s
    return out


def results_json(results: Sequence[RunResult]) -> dict[str, Any]:
    ratio = ratios(results)
    rows = []
    for r in results:
        row = r.to_json()
        if r.system == AMQLITE and r.scenario in ratio:
            row["ratio_vs_raw_trio"] = round(ratio[r.scenario], 4)
        rows.append(row)
    return {"results": rows}


def dumps(results: Sequence[RunResult]) -> str:
    return json.dumps(results_json(results), indent=2)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


#: Below this console width the table leaves out p99.9 and the CPU columns.
WIDE_TABLE = 130


def results_table(results: Sequence[RunResult], *, wide: bool = True) -> Table:
    ratio = ratios(results)
    table = Table(title="amqlite bench")
    table.add_column("system", no_wrap=True)
    table.add_column("scenario", no_wrap=True)
    table.add_column("msgs/s", justify="right", no_wrap=True)
    table.add_column("deliveries/s", justify="right", no_wrap=True)
    table.add_column("p50 ms", justify="right")
    table.add_column("p99 ms", justify="right")
    if wide:
        table.add_column("p99.9 ms", justify="right")
        table.add_column("server CPU", justify="right")
        table.add_column("client CPU", justify="right")
        table.add_column("other CPU", justify="right")
    table.add_column("amqlite/baseline" if wide else "ratio", justify="right")
    for r in results:
        shown = ratio.get(r.scenario) if r.system == AMQLITE else None
        cells = [
            r.system,
            r.scenario,
            f"{r.msgs_per_s:,.0f}",
            f"{r.deliveries_per_s:,.0f}",
            _ms(r.p50_ms),
            _ms(r.p99_ms),
        ]
        if wide:
            cells += [_ms(r.p999_ms), _pct(r.server_cpu), _pct(r.client_cpu), _pct(r.other_cpu)]
        cells.append("-" if shown is None else f"{shown:.2f}")
        table.add_row(*cells)
    return table


def print_report(results: Sequence[RunResult], notes: Sequence[str], console: Console) -> None:
    wide = console.width >= WIDE_TABLE
    console.print(results_table(results, wide=wide))
    for note in notes:
        console.print(f"  {note}", highlight=False)
    if not wide:
        console.print("  (a wider terminal, --markdown or --json shows p99.9 and CPU use)")


def markdown_table(results: Sequence[RunResult]) -> str:
    """The same table in Markdown (for benchmarks/README.md)."""
    ratio = ratios(results)
    lines = [
        "| system | scenario | msgs/s | deliveries/s | p50 ms | p99 ms | p99.9 ms "
        "| server CPU | client CPU | other CPU | amqlite/baseline |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        shown = ratio.get(r.scenario) if r.system == AMQLITE else None
        ratio_text = "-" if shown is None else f"{shown:.2f}"
        lines.append(
            f"| {r.system} | {r.scenario} | {r.msgs_per_s:,.0f} | {r.deliveries_per_s:,.0f} "
            f"| {_ms(r.p50_ms)} | {_ms(r.p99_ms)} | {_ms(r.p999_ms)} | {_pct(r.server_cpu)} "
            f"| {_pct(r.client_cpu)} | {_pct(r.other_cpu)} | {ratio_text} |"
        )
    return "\n".join(lines)
