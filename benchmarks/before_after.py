"""Before/after: the same `amqlite bench` scenarios on two checkouts, interleaved.

Runs ``python -m amqlite bench --json`` from each checkout in turn (its own
server, client and harness: ``PYTHONPATH=<tree>:<tree>/benchmarks``), ``--rounds``
times, alternating which goes first, and prints per scenario and system the
median msgs/s (p99 for latency-at-5k) of each tree, and the median of amqlite's
ratio to the raw-trio relay measured in the same invocation. The checkouts need
not be installed; a checkout from before the harness moved out of the package
(``amqlite/bench``) works too.

    git worktree add --detach /tmp/before <commit>
    python benchmarks/before_after.py --before /tmp/before --after . --rounds 5

Print with ``--markdown`` for benchmarks/README.md; ``--save FILE`` keeps every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCENARIOS = "1to1-transient,1to1-persistent-confirm,fanout-1to10,latency-at-5k"


def run_bench(tree: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{tree}{os.pathsep}{tree / 'benchmarks'}"
    cmd = [sys.executable, "-m", "amqlite", "bench", "--json", "--scenarios", args.scenarios]
    cmd += ["--messages", str(args.messages), "--latency-seconds", str(args.latency_seconds)]
    if args.systems:
        cmd += ["--systems", args.systems]
    out = subprocess.run(
        cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=args.timeout
    )
    if out.returncode != 0:
        sys.exit(f"bench failed in {tree} (exit {out.returncode}):\n{out.stderr[-2000:]}")
    rows: list[dict[str, Any]] = json.loads(out.stdout)["results"]
    return rows


def metric(row: dict[str, Any]) -> float:
    if row["scenario"] == "latency-at-5k":
        return float(row["p99_ms"])
    return float(row["msgs_per_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, required=True, help="checkout before the change")
    p.add_argument("--after", type=Path, required=True, help="checkout after the change")
    p.add_argument("--rounds", type=int, default=5, help="runs per tree, interleaved")
    p.add_argument("--scenarios", default=SCENARIOS)
    p.add_argument("--systems", help="amqlite bench --systems (default: its own, raw-trio,amqlite)")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--latency-seconds", type=float, default=5)
    p.add_argument("--timeout", type=float, default=900, help="seconds per bench run")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--save", type=Path)
    args = p.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[list[dict[str, Any]]]] = {"before": [], "after": []}
    for i in range(args.rounds):
        order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
        for name in order:
            t0 = time.monotonic()
            runs[name].append(run_bench(trees[name], args))
            print(
                f"round {i + 1}/{args.rounds} {name}: {time.monotonic() - t0:.0f} s",
                file=sys.stderr,
            )
    if args.save:
        args.save.write_text(
            json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "runs": runs}, indent=2)
        )
    table: list[tuple[str, str, float, float, str]] = []
    keys = sorted({(r["scenario"], r["system"]) for rs in runs["before"] for r in rs})
    for scenario, system in keys:
        med = {}
        for name in ("before", "after"):
            vals = [
                metric(r)
                for rs in runs[name]
                for r in rs
                if (r["scenario"], r["system"]) == (scenario, system)
            ]
            med[name] = statistics.median(vals)
        unit = "p99 ms" if scenario == "latency-at-5k" else "msgs/s"
        table.append((scenario, f"{system} ({unit})", med["before"], med["after"], ""))
        if system.startswith("amqlite") and scenario != "latency-at-5k":
            ratios = {}
            for name in ("before", "after"):
                per_run = []
                for rs in runs[name]:
                    mine = [r for r in rs if (r["scenario"], r["system"]) == (scenario, system)]
                    raw = [r for r in rs if (r["scenario"], r["system"]) == (scenario, "raw-trio")]
                    if mine and raw:
                        per_run.append(metric(mine[0]) / metric(raw[0]))
                ratios[name] = statistics.median(per_run) if per_run else float("nan")
            if ratios["before"] == ratios["before"]:  # raw-trio ran (--systems may leave it out)
                table.append(
                    (scenario, "amqlite / raw-trio", ratios["before"], ratios["after"], "ratio")
                )
    if args.markdown:
        print("| scenario | measure | before | after | change |")
        print("|---|---|---:|---:|---:|")
    for scenario, what, before, after, kind in table:
        change = (after - before) / before * 100 if before else float("nan")
        fmt = "{:.3f}" if kind == "ratio" else "{:,.1f}"
        b, a = fmt.format(before), fmt.format(after)
        if args.markdown:
            print(f"| {scenario} | {what} | {b} | {a} | {change:+.1f}% |")
        else:
            print(f"{scenario:26} {what:28} {b:>12} {a:>12} {change:+6.1f}%")


if __name__ == "__main__":
    main()
