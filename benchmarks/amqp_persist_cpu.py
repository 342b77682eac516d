"""The broker's CPU per persistent confirmed message over AMQP 0-9-1 (pika), source
trees A/B.

    cd /tmp && /work/main/.venv/bin/python /work/wt/mine/benchmarks/amqp_persist_cpu.py \
        --trees /tmp/base,/work/wt/mine [--repeat 4] [--messages 400000]

For each repeat and each tree in turn (ABBA: first in one order, then in the other,
so that the machine's load falls on both alike) it runs ``amqlite bench --systems
amqlite-amqp --scenarios 1to1-persistent-confirm --messages N --json`` with
``PYTHONPATH=TREE:TREE/benchmarks``: the bench starts that tree's brokers (``--fsync
batch`` and ``--fsync always``, an AMQP listener each) and drives them with the
pika clients RabbitMQ's runs use (N/4 persistent messages, confirmed, at most 1,000
outstanding). It prints the bench's figures per row: the broker's CPU
microseconds per message (from ``/proc/PID/stat`` over the run), the clients',
msg/s, and the 1-minute load average at the start; then medians per tree and
policy (with ``--vs rabbitmq``, RabbitMQ's rows too, driven by the same pika
clients in the same invocation: its ratio is each tree's msg/s over it). Run it
from a directory outside both trees (``python -m`` puts the cwd
first on the path).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _bench(tree: str, messages: int, vs: str) -> list[dict[str, float | str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{tree}:{tree}/benchmarks"}
    cmd = [sys.executable, "-m", "amqlite", "bench", "--systems", "amqlite-amqp"]
    cmd += ["--scenarios", "1to1-persistent-confirm", "--repeat", "1"]
    cmd += ["--messages", str(messages), "--json"]
    if vs:
        cmd += ["--vs", vs]
    out = subprocess.run(cmd, env=env, capture_output=True, check=True)
    rows: list[dict[str, float | str]] = json.loads(out.stdout)["results"]
    return rows


_COLUMNS = (
    ("load", "load", "{:.2f}"),
    ("server_cpu_us_per_msg", "broker us/msg", "{:.1f}"),
    ("client_cpu_us_per_msg", "client us/msg", "{:.1f}"),
    ("msgs_per_s", "msg/s", "{:,.0f}"),
    ("other_cpu", "other CPU", "{:.2f}"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", required=True)
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--vs", default="", help="also run this peer (rabbitmq) each time")
    args = parser.parse_args()
    trees = args.trees.split(",")
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    print("| tree | fsync | run | UTC | " + " | ".join(c[1] for c in _COLUMNS) + " |", flush=True)
    print("|---|---|---:|---|" + "---:|" * len(_COLUMNS), flush=True)
    for i in range(args.repeat):
        for tree in trees if i % 2 == 0 else trees[::-1]:
            load = os.getloadavg()[0]
            utc = time.strftime("%H:%M:%S", time.gmtime())
            for r in _bench(tree, args.messages, args.vs):
                system = str(r["system"])
                policy = system.rsplit("-", 1)[1] if "fsync" in system else system
                row = {k: float(r[k]) for k, _, _ in _COLUMNS if k != "load"}
                row["load"] = load
                rows.setdefault((tree, policy), []).append(row)
                cells = " | ".join(f.format(row[k]) for k, _, f in _COLUMNS)
                print(f"| {tree} | {policy} | {i + 1} | {utc} | {cells} |", flush=True)
    for (tree, policy), rs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        med = {k: statistics.median(r[k] for r in rs) for k, _, _ in _COLUMNS}
        cells = " | ".join(f.format(med[k]) for k, _, f in _COLUMNS)
        print(f"| {tree} | {policy} | median | | {cells} |", flush=True)


if __name__ == "__main__":
    main()
