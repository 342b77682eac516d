"""Benchmark results as a rich table (for people) or JSON (for scripts).

``--json`` prints exactly ``{"results": [row, ...]}``; each row has ``system``,
``scenario``, ``msgs_per_s``, ``p50_ms`` and ``p99_ms`` (null without latency
stamps) plus the extra keys of :meth:`RunResult.to_json`. Every amqlite row
(``amqlite``, ``amqlite-fsync-batch``, ...) carries ``ratio_vs_<system>``, its
msgs/s over that system's in the same scenario of the same invocation, for each
other system that ran it (``ratio_vs_raw_trio``, ``ratio_vs_rabbitmq``,
``ratio_vs_nats``); rows with latencies also carry ``p99_ratio_vs_<system>``
(amqlite's p99 over the other's: below 1 is better). ``amqlite-tls`` rows also
carry ``ratio_vs_amqlite`` (and ``p99_ratio_vs_amqlite``): amqlite over TLS against
plain amqlite in the same scenario, shown to people in a table of their own
(:func:`tls_rows`).

With ``amqlite-amqp`` rows (amqlite over AMQP 0-9-1, pika clients) and RabbitMQ
rows in the same results, a second table puts them side by side per scenario:
msgs/s (p99 for the latency run), their ratio, and each server's CPU per delivery
(:func:`amqp_rows`).

The ``failover`` scenario's rows (``amqlite-pair``) are told apart: ``failover``
has no msgs/s (``null``) but ``failover_p50_ms`` / ``failover_p99_ms`` /
``failover_max_ms``, ``gap_p50_ms`` / ``gap_p99_ms`` / ``gap_max_ms``, ``kills``
and ``lost``; ``persistent-confirm-replicated`` carries ``ratio_vs_standalone``.
People get them in a table of their own, next to their targets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from .contenders import is_amqlite
from .failover import FAILOVER_P99_TARGET_S, GAP_P99_TARGET_S, RATIO_GOAL, REPLICATED
from .peers import RABBITMQ
from .scenarios import FAILOVER, RunResult
from .systems import AMQLITE, AMQLITE_AMQP, AMQLITE_TLS


def ratio_key(system: str, prefix: str = "ratio_vs_") -> str:
    return prefix + system.replace("-", "_")


def others(results: Sequence[RunResult]) -> list[str]:
    """The non-amqlite systems, in the order they first appear."""
    seen: list[str] = []
    for r in results:
        if not is_amqlite(r.system) and r.system not in seen:
            seen.append(r.system)
    return seen


def ratios(results: Sequence[RunResult]) -> dict[tuple[str, str], dict[str, float]]:
    """(amqlite system, scenario) -> {other system: amqlite msgs/s / its msgs/s}."""
    by_key = {(r.system, r.scenario): r for r in results}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for r in results:
        if not is_amqlite(r.system):
            continue
        for other in others(results):
            base = by_key.get((other, r.scenario))
            if r.msgs_per_s is not None and base is not None and base.msgs_per_s:
                out.setdefault((r.system, r.scenario), {})[other] = r.msgs_per_s / base.msgs_per_s
    for tls, plain in _tls_pairs(results):
        if tls.msgs_per_s is not None and plain.msgs_per_s:
            out.setdefault((tls.system, tls.scenario), {})[AMQLITE] = (
                tls.msgs_per_s / plain.msgs_per_s
            )
    return out


def p99_ratios(results: Sequence[RunResult]) -> dict[tuple[str, str], dict[str, float]]:
    """(amqlite system, scenario) -> {other system: amqlite p99 / its p99}."""
    by_key = {(r.system, r.scenario): r for r in results}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for r in results:
        if not is_amqlite(r.system) or r.p99_ms is None:
            continue
        for other in others(results):
            base = by_key.get((other, r.scenario))
            if base is not None and base.p99_ms:
                out.setdefault((r.system, r.scenario), {})[other] = r.p99_ms / base.p99_ms
    for tls, plain in _tls_pairs(results):
        if tls.p99_ms is not None and plain.p99_ms:
            out.setdefault((tls.system, tls.scenario), {})[AMQLITE] = tls.p99_ms / plain.p99_ms
    return out


def _tls_pairs(results: Sequence[RunResult]) -> list[tuple[RunResult, RunResult]]:
    """(amqlite-tls row, amqlite row) of each scenario both ran."""
    plain = {r.scenario: r for r in results if r.system == AMQLITE}
    return [
        (r, plain[r.scenario]) for r in results if r.system == AMQLITE_TLS and r.scenario in plain
    ]


def results_json(results: Sequence[RunResult]) -> dict[str, Any]:
    ratio = ratios(results)
    p99 = p99_ratios(results)
    rows = []
    for r in results:
        row = r.to_json()
        for other, x in ratio.get((r.system, r.scenario), {}).items():
            row[ratio_key(other)] = round(x, 4)
        for other, x in p99.get((r.system, r.scenario), {}).items():
            row[ratio_key(other, "p99_ratio_vs_")] = round(x, 4)
        rows.append(row)
    return {"results": rows}


def dumps(results: Sequence[RunResult]) -> str:
    return json.dumps(results_json(results), indent=2)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _mb(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.0f}"


def _ratio_cell(
    r: RunResult,
    other: str,
    ratio: dict[tuple[str, str], dict[str, float]],
    p99: dict[tuple[str, str], dict[str, float]],
) -> str:
    """Throughput runs: msgs/s ratio; paced latency runs: the p99 ratio."""
    if r.p99_ms is not None:
        x = p99.get((r.system, r.scenario), {}).get(other)
        return "-" if x is None else f"p99 {x:.2f}"
    x = ratio.get((r.system, r.scenario), {}).get(other)
    return "-" if x is None else f"{x:.2f}"


#: Below this console width the table leaves out p99.9 and the CPU columns.
WIDE_TABLE = 130


def results_table(results: Sequence[RunResult], *, wide: bool = True) -> Table:
    ratio = ratios(results)
    p99 = p99_ratios(results)
    vs = others(results)
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
        table.add_column("server us/msg", justify="right")
        table.add_column("client us/msg", justify="right")
        table.add_column("server peak MB", justify="right")
    for other in vs:
        table.add_column(f"vs {other}", justify="right")
    for r in _throughput(results):
        cells = [
            r.system,
            r.scenario,
            _rate(r.msgs_per_s),
            f"{r.deliveries_per_s:,.0f}",
            _ms(r.p50_ms),
            _ms(r.p99_ms),
        ]
        if wide:
            cells += [
                _ms(r.p999_ms),
                _pct(r.server_cpu),
                _pct(r.client_cpu),
                _pct(r.other_cpu),
                _us(r.per_delivery_us(r.server_cpu_s)),
                _us(r.per_delivery_us(r.client_cpu_s)),
                _mb(r.server_peak_rss_kib),
            ]
        cells += [_ratio_cell(r, other, ratio, p99) for other in vs]
        table.add_row(*cells)
    return table


AMQP_HEAD = (
    "system",
    "scenario",
    "amqlite-amqp",
    "rabbitmq",
    "amqlite-amqp / rabbitmq",
    "server us/msg amqlite-amqp",
    "server us/msg rabbitmq",
)


def _is_amqp(system: str) -> bool:
    return system == AMQLITE_AMQP or system.startswith(f"{AMQLITE_AMQP}-")


def amqp_rows(results: Sequence[RunResult]) -> list[list[str]]:
    """amqlite over AMQP 0-9-1 against RabbitMQ, both driven by pika: one row per
    ``amqlite-amqp*`` row that has a RabbitMQ row in its scenario. Throughput runs
    compare msgs/s (above 1: amqlite faster); the latency run its p99 (below 1:
    amqlite's is lower). Server us/msg is the broker's CPU per delivery."""
    peer = {r.scenario: r for r in results if r.system == RABBITMQ}
    rows: list[list[str]] = []
    for r in _throughput(results):
        base = peer.get(r.scenario)
        if not _is_amqp(r.system) or base is None:
            continue
        if r.p99_ms is not None and base.p99_ms:
            ours, theirs = f"p99 {r.p99_ms:.2f} ms", f"p99 {base.p99_ms:.2f} ms"
            ratio = f"p99 {r.p99_ms / base.p99_ms:.2f}"
        else:
            ours, theirs = f"{_rate(r.msgs_per_s)} msg/s", f"{_rate(base.msgs_per_s)} msg/s"
            ratio = f"{(r.msgs_per_s or 0.0) / base.msgs_per_s:.2f}" if base.msgs_per_s else "-"
        rows.append(
            [
                r.system,
                r.scenario,
                ours,
                theirs,
                ratio,
                _us(r.per_delivery_us(r.server_cpu_s)),
                _us(base.per_delivery_us(base.server_cpu_s)),
            ]
        )
    return rows


TLS_HEAD = (
    "scenario",
    "amqlite",
    "amqlite-tls",
    "TLS / plain",
    "server us/msg amqlite",
    "server us/msg amqlite-tls",
)


def tls_rows(results: Sequence[RunResult]) -> list[list[str]]:
    """amqlite over TLS against plain amqlite, the same clients: one row per scenario
    both ran. Throughput runs compare msgs/s (below 1: TLS is slower); the latency
    run its p99 (above 1: TLS's is higher). Server us/msg is the broker's CPU per
    delivery."""
    rows: list[list[str]] = []
    for tls, plain in _tls_pairs(results):
        if tls.p99_ms is not None and plain.p99_ms:
            ours, theirs = f"p99 {plain.p99_ms:.2f} ms", f"p99 {tls.p99_ms:.2f} ms"
            ratio = f"p99 {tls.p99_ms / plain.p99_ms:.2f}"
        else:
            ours, theirs = f"{_rate(plain.msgs_per_s)} msg/s", f"{_rate(tls.msgs_per_s)} msg/s"
            ratio = f"{(tls.msgs_per_s or 0.0) / plain.msgs_per_s:.2f}" if plain.msgs_per_s else "-"
        rows.append(
            [
                tls.scenario,
                ours,
                theirs,
                ratio,
                _us(plain.per_delivery_us(plain.server_cpu_s)),
                _us(tls.per_delivery_us(tls.server_cpu_s)),
            ]
        )
    return rows


def print_report(results: Sequence[RunResult], notes: Sequence[str], console: Console) -> None:
    wide = console.width >= WIDE_TABLE
    if _throughput(results):
        console.print(results_table(results, wide=wide))
    amqp = amqp_rows(results)
    if amqp:
        table = Table(title="AMQP 0-9-1, pika on both: amqlite-amqp vs rabbitmq")
        for name in AMQP_HEAD:
            table.add_column(name, justify="left" if name in ("system", "scenario") else "right")
        for row in amqp:
            table.add_row(*row)
        console.print(table)
    tls = tls_rows(results)
    if tls:
        table = Table(title="TLS against plain: amqlite-tls vs amqlite (the same clients)")
        for name in TLS_HEAD:
            table.add_column(name, justify="left" if name == "scenario" else "right")
        for row in tls:
            table.add_row(*row)
        console.print(table)
    ha = ha_rows(results)
    if ha:
        table = Table(title="amqlite bench: HA pair")
        for name in ("system", "measure", "p50", "p99", "max", "target", ""):
            table.add_column(name, justify="left" if name in ("system", "measure") else "right")
        for row in ha:
            table.add_row(*row)
        console.print(table)
    for note in notes:
        console.print(f"  {note}", highlight=False)
    if not wide:
        console.print("  (a wider terminal, --markdown or --json shows p99.9 and CPU use)")


def markdown_table(results: Sequence[RunResult]) -> str:
    """The same table in Markdown (for benchmarks/README.md)."""
    ratio = ratios(results)
    p99 = p99_ratios(results)
    vs = others(results)
    head = (
        "| system | scenario | msgs/s | deliveries/s | p50 ms | p99 ms | p99.9 ms "
        "| server CPU | client CPU | other CPU | server us/msg | client us/msg "
        "| server peak MB |"
    )
    head += "".join(f" vs {o} |" for o in vs)
    lines = [head, "|---|---|" + "---:|" * (11 + len(vs))]
    for r in _throughput(results):
        cells = [
            r.system,
            r.scenario,
            _rate(r.msgs_per_s),
            f"{r.deliveries_per_s:,.0f}",
            _ms(r.p50_ms),
            _ms(r.p99_ms),
            _ms(r.p999_ms),
            _pct(r.server_cpu),
            _pct(r.client_cpu),
            _pct(r.other_cpu),
            _us(r.per_delivery_us(r.server_cpu_s)),
            _us(r.per_delivery_us(r.client_cpu_s)),
            _mb(r.server_peak_rss_kib),
        ]
        cells += [_ratio_cell(r, other, ratio, p99) for other in vs]
        lines.append("| " + " | ".join(cells) + " |")
    amqp = amqp_rows(results)
    if amqp:
        lines.append("")
        lines.append("| " + " | ".join(AMQP_HEAD) + " |")
        lines.append("|---|---|" + "---:|" * (len(AMQP_HEAD) - 2))
        lines += ["| " + " | ".join(row) + " |" for row in amqp]
    tls = tls_rows(results)
    if tls:
        lines.append("")
        lines.append("| " + " | ".join(TLS_HEAD) + " |")
        lines.append("|---|" + "---:|" * (len(TLS_HEAD) - 1))
        lines += ["| " + " | ".join(row) + " |" for row in tls]
    ha = ha_rows(results)
    if ha:
        if len(lines) == 2:
            lines = []
        else:
            lines.append("")
        lines.append("| system | measure | p50 | p99 | max | target | |")
        lines.append("|---|---|---:|---:|---:|---:|---|")
        lines += ["| " + " | ".join(row) + " |" for row in ha]
    return "\n".join(lines)


# --- the failover scenario's rows ---------------------------------------------------------


def _throughput(results: Sequence[RunResult]) -> list[RunResult]:
    """The rows with a msgs/s (all but ``failover``)."""
    return [r for r in results if r.msgs_per_s is not None]


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _s(ms: Any) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def ha_rows(results: Sequence[RunResult]) -> list[list[str]]:
    """The HA table's rows: failover time, delivery gap, lost, replication ratio."""
    rows: list[list[str]] = []
    for r in results:
        e = r.extra
        if r.scenario == FAILOVER:
            kills = f"{r.system} ({e['kills']} kills)"
            for name, key, target_s in (
                ("kill -> first confirm on the new master", "failover", FAILOVER_P99_TARGET_S),
                ("longest delivery gap around a kill", "gap", GAP_P99_TARGET_S),
            ):
                p99 = e[f"{key}_p99_ms"]
                rows.append(
                    [
                        kills,
                        name,
                        _s(e[f"{key}_p50_ms"]),
                        _s(p99),
                        _s(e[f"{key}_max_ms"]),
                        f"p99 <= {target_s:g} s",
                        _verdict(p99 <= target_s * 1000),
                    ]
                )
            if "redundant_p99_ms" in e:
                rows.append(
                    [
                        kills,
                        "restart of the killed node -> pair redundant again",
                        _s(e["redundant_p50_ms"]),
                        _s(e["redundant_p99_ms"]),
                        _s(e["redundant_max_ms"]),
                        "-",
                        "",
                    ]
                )
            rows.append(
                [
                    kills,
                    f"confirmed and never delivered (of {e['confirmed']:,}; "
                    f"{e['duplicates']:,} duplicates, "
                    f"{e.get('unflagged_duplicates', 0):,} not flagged redelivered)",
                    "",
                    "",
                    f"{e['lost']:,}",
                    "0",
                    _verdict(e["lost"] == 0),
                ]
            )
        elif r.scenario == REPLICATED and e.get("ratio_vs_standalone") is not None:
            ratio = e["ratio_vs_standalone"]
            rows.append(
                [
                    r.system,
                    f"persistent confirmed msgs/s, backup attached / standalone "
                    f"({_rate(r.msgs_per_s)} / {_rate(e['standalone_msgs_per_s'])})",
                    "",
                    "",
                    f"{ratio:.2f}",
                    f">= {RATIO_GOAL:.2f}",
                    _verdict(ratio >= RATIO_GOAL),
                ]
            )
    return rows


def failover_lines(results: Sequence[RunResult]) -> list[str]:
    """One line per HA row, for the progress log."""
    out = []
    for r in results:
        e = r.extra
        if r.scenario == FAILOVER:
            out.append(
                f"{r.system} {FAILOVER}: {e['kills']} kills; kill -> first confirm p50 "
                f"{_s(e['failover_p50_ms'])}, p99 {_s(e['failover_p99_ms'])}, max "
                f"{_s(e['failover_max_ms'])} (target p99 <= {FAILOVER_P99_TARGET_S:g} s); "
                f"delivery gap p50 {_s(e['gap_p50_ms'])}, p99 {_s(e['gap_p99_ms'])}, max "
                f"{_s(e['gap_max_ms'])} (target p99 <= {GAP_P99_TARGET_S:g} s); lost "
                f"{e['lost']:,} of {e['confirmed']:,} confirmed"
            )
        elif r.scenario == REPLICATED and e.get("ratio_vs_standalone") is not None:
            out.append(
                f"{r.system} {REPLICATED}: {_rate(r.msgs_per_s)} msgs/s with the backup "
                f"attached, {_rate(e['standalone_msgs_per_s'])} standalone: ratio "
                f"{e['ratio_vs_standalone']:.2f} (goal >= {RATIO_GOAL:.2f})"
            )
    return out
