"""A standalone broker's CPU per persistent confirmed message, source trees A/B.

    /work/main/.venv/bin/python benchmarks/persist_cpu.py --trees /tmp/base,/work/wt/mine \
        [--repeat 4] [--messages 400000] [--fsync batch,always]

For each repeat, each fsync policy and each tree in turn (ABBA: first in one order,
then in the other, so that the machine's load falls on both alike) it starts a
standalone broker from that tree (``PYTHONPATH=TREE:TREE/benchmarks`` for the
server and the bench client alike, ``--fsync POLICY``, its own data dir) and runs
``amqlite bench -s ADDR --scenarios 1to1-persistent-confirm --systems amqlite
--messages N --clients process`` against it (N/4 persistent messages,
confirmed). It prints the broker's CPU time (user + system, from
``/proc/PID/stat``) per message, the bench process's, msg/s and the 1-minute load
average at the start of each run, then medians per tree and policy. The broker is
one Python process near a full core in this scenario, so its CPU per message is
what sets the ratio to RabbitMQ; msg/s moves with whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ha_cpu import _cpu, _env, _free_port, _Server


def _bench(tree: str, addr: str, messages: int) -> tuple[float, float]:
    """(msg/s, the bench processes' CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "amqlite", "bench", "-s", addr, "--scenarios"]
    cmd += ["1to1-persistent-confirm", "--systems", "amqlite", "--messages", str(messages)]
    cmd += ["--clients", "process", "--json"]
    out = subprocess.run(cmd, env=_env(tree), capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = json.loads(out.stdout)["results"]
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return float(rows[0]["msgs_per_s"]), cpu


def _measure(tree: str, work: Path, messages: int, fsync: str) -> dict[str, float]:
    persistent = messages // 4
    row: dict[str, float] = {"load": os.getloadavg()[0]}
    port = _free_port()
    # _Server passes --fsync batch first; the later --fsync wins
    server = _Server(
        tree, work / "broker.log", "--port", str(port), "--data-dir", str(work / "d"),
        "--fsync", fsync,
    )  # fmt: skip
    try:
        server.wait_for("server_listening")
        pid = server.proc.pid
        before = _cpu(pid)
        rate, client = _bench(tree, f"127.0.0.1:{port}", messages)
        after = _cpu(pid)
        row["broker"] = 1e6 * (after[0] - before[0]) / persistent
        row["broker_sys"] = 1e6 * (after[1] - before[1]) / persistent
        row["client"] = 1e6 * client / persistent
        row["rate"] = rate
    finally:
        server.stop()
    return row


_COLUMNS = (
    ("load", "load", "{:.2f}"),
    ("broker", "broker us/msg", "{:.1f}"),
    ("broker_sys", "broker sys us", "{:.1f}"),
    ("client", "client us/msg", "{:.1f}"),
    ("rate", "msg/s", "{:,.0f}"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", required=True)
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--fsync", default="batch,always")
    args = parser.parse_args()
    trees = args.trees.split(",")
    policies = args.fsync.split(",")
    rows: dict[tuple[str, str], list[dict[str, float]]] = {
        (t, p): [] for t in trees for p in policies
    }
    print("| tree | fsync | run | UTC | " + " | ".join(c[1] for c in _COLUMNS) + " |", flush=True)
    print("|---|---|---:|---|" + "---:|" * len(_COLUMNS), flush=True)
    for i in range(args.repeat):
        for policy in policies:
            for tree in trees if i % 2 == 0 else trees[::-1]:
                with tempfile.TemporaryDirectory() as tmp:
                    row = _measure(tree, Path(tmp), args.messages, policy)
                rows[(tree, policy)].append(row)
                cells = " | ".join(f.format(row[k]) for k, _, f in _COLUMNS)
                utc = time.strftime("%H:%M:%S", time.gmtime())
                print(f"| {tree} | {policy} | {i + 1} | {utc} | {cells} |", flush=True)
    for policy in policies:
        for tree in trees:
            rs = rows[(tree, policy)]
            med = {k: statistics.median(r[k] for r in rs) for k, _, _ in _COLUMNS}
            cells = " | ".join(f.format(med[k]) for k, _, f in _COLUMNS)
            print(f"| {tree} | {policy} | median | | {cells} |", flush=True)


if __name__ == "__main__":
    main()
