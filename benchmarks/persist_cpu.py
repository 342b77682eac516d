"""A standalone broker's CPU per persistent confirmed message, source trees A/B.

    /work/main/.venv/bin/python benchmarks/persist_cpu.py --trees /tmp/base,/work/wt/mine \
        [--repeat 4] [--messages 400000] [--fsync batch,always] \
        [--scenario 1to1-persistent-confirm|1to1-transient|fanout-1to10] [--client-tree T]

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

``--scenario 1to1-transient`` or ``fanout-1to10`` measures the same for that
scenario (the fsync policy then hardly matters: give one, ``--fsync batch``).
The divisor is the messages each scenario moves: N/4 for the persistent one, N
for 1to1-transient, N deliveries (N/10 publishes to ten consumers) for
fanout-1to10. ``--client-tree T`` runs the bench client from tree T for every
tree (the broker still from each tree), so that two brokers see the same client.
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

from amqlite_bench.ports import fixed_port
from ha_cpu import _NEUTRAL, _cpu, _env, _Server

#: the messages a scenario moves (what the broker's CPU is divided by), as a share of N
_SHARE = {"1to1-persistent-confirm": 4, "1to1-transient": 1, "fanout-1to10": 1}


def _bench(tree: str, addr: str, messages: int, scenario: str) -> tuple[float, float]:
    """(msg/s, the bench processes' CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "amqlite", "bench", "-s", addr, "--scenarios"]
    cmd += [scenario, "--systems", "amqlite", "--messages", str(messages)]
    cmd += ["--clients", "process", "--json"]
    out = subprocess.run(cmd, env=_env(tree), capture_output=True, check=True, cwd=_NEUTRAL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = json.loads(out.stdout)["results"]
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return float(rows[0]["msgs_per_s"]), cpu


def _measure(
    tree: str, client_tree: str, work: Path, messages: int, fsync: str, scenario: str
) -> dict[str, float]:
    moved = messages // _SHARE[scenario]
    row: dict[str, float] = {"load": os.getloadavg()[0]}
    port = fixed_port()
    # _Server passes --fsync batch first; the later --fsync wins
    server = _Server(
        tree, work / "broker.log", "--port", str(port), "--data-dir", str(work / "d"),
        "--fsync", fsync,
    )  # fmt: skip
    try:
        server.wait_for("server_listening")
        pid = server.proc.pid
        before = _cpu(pid)
        rate, client = _bench(client_tree, f"127.0.0.1:{port}", messages, scenario)
        after = _cpu(pid)
        row["broker"] = 1e6 * (after[0] - before[0]) / moved
        row["broker_sys"] = 1e6 * (after[1] - before[1]) / moved
        row["client"] = 1e6 * client / moved
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
    parser.add_argument("--scenario", default="1to1-persistent-confirm", choices=sorted(_SHARE))
    parser.add_argument("--client-tree", default=None)
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
                    client_tree = args.client_tree or tree
                    row = _measure(
                        tree, client_tree, Path(tmp), args.messages, policy, args.scenario
                    )
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
