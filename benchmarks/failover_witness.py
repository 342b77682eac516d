"""What a witness costs a failover: ``kill -9`` of an HA pair's master under
persistent confirmed load, on a pair without a witness and on one with an
``amqlite witness``, in the same invocation.

    .venv/bin/python benchmarks/failover_witness.py [--kills 20] [--rate 2000] [--json FILE]

Each pair runs the ``failover`` scenario's kills (``amqlite_bench.failover``:
SIGKILL the active node, time the first confirm from the other node, restart the
killed node, wait until the pair is redundant again), alternating which pair goes
first over ``--rounds``. Prints per pair the failover p50/p99/max (kill -> first
confirm on the new master), the delivery gap p99 and the confirmed messages lost,
and the ratio witness / no witness of the failover p99. Issue 22's goal: the
failover p99 with a witness stays at most 1.5 s (defaults: heartbeat 200 ms,
failover timeout 1000 ms; the lease lasts a failover timeout and is renewed every
heartbeat, so a takeover waits for the silence and the lease alike).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from amqlite_bench.failover import FAILOVER_P99_TARGET_S, FailoverOptions, measure_failover
from amqlite_bench.hapair import PRIMARY, PairTiming, open_pair, other

AUTH = {"login": "guest", "password": "guest"}


async def _one(witness: bool, options: FailoverOptions) -> dict[str, Any]:
    def say(line: str) -> None:
        print(f"  [{'witness' if witness else 'no witness'}] {line}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="amqlite-bench-witness-") as tmp:
        async with open_pair(Path(tmp), options.timing) as pair:
            if witness:
                await pair.start_witness()
            await pair.start(PRIMARY)
            await pair.start(other(PRIMARY))
            await pair.wait_settled(PRIMARY, 30)
            row = await measure_failover(pair, options, auth=AUTH, stall_timeout=30, say=say)
    extra = row.extra
    return {
        "witness": witness,
        "kills": extra["kills"],
        "failover_p50_ms": extra["failover_p50_ms"],
        "failover_p99_ms": extra["failover_p99_ms"],
        "failover_max_ms": extra["failover_max_ms"],
        "gap_p99_ms": extra["gap_p99_ms"],
        "confirmed": extra["confirmed"],
        "lost": extra["lost"],
        "unflagged_duplicates": extra["unflagged_duplicates"],
        "failover_ms_runs": extra["failover_ms_runs"],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    options = FailoverOptions(
        kills=args.kills,
        rate=args.rate,
        timing=PairTiming(args.heartbeat_ms, args.failover_timeout_ms),
    )
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for round_ in range(args.rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        for witness in order:
            runs[witness].append(await _one(witness, options))
    summary: dict[str, Any] = {"runs": {"no_witness": runs[False], "witness": runs[True]}}
    for witness in (False, True):
        failovers = [ms for r in runs[witness] for ms in r["failover_ms_runs"]]
        failovers.sort()
        rank = max(1, -(-99 * len(failovers) // 100))
        key = "witness" if witness else "no_witness"
        summary[key] = {
            "failover_p50_ms": failovers[max(1, -(-50 * len(failovers) // 100)) - 1],
            "failover_p99_ms": failovers[rank - 1],
            "lost": sum(r["lost"] for r in runs[witness]),
            "kills": len(failovers),
        }
    summary["p99_ratio_witness_vs_none"] = round(
        summary["witness"]["failover_p99_ms"] / summary["no_witness"]["failover_p99_ms"], 3
    )
    summary["p99_target_ms"] = FAILOVER_P99_TARGET_S * 1000
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="kills per pair and round")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (alternating order)")
    parser.add_argument("--rate", type=float, default=2000.0, help="publishes per second")
    parser.add_argument("--heartbeat-ms", type=int, default=200)
    parser.add_argument("--failover-timeout-ms", type=int, default=1000)
    parser.add_argument("--json", metavar="FILE", help="also write the summary here")
    args = parser.parse_args(argv)
    summary = trio.run(run, args)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    none, wit = summary["no_witness"], summary["witness"]
    print(
        f"| failover p50 / p99 (ms) | {none['failover_p50_ms']} / {none['failover_p99_ms']} "
        f"| {wit['failover_p50_ms']} / {wit['failover_p99_ms']} | ratio p99 "
        f"{summary['p99_ratio_witness_vs_none']} | lost {none['lost']} / {wit['lost']} |"
    )
    return 0 if wit["lost"] == 0 and none["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
