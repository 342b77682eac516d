"""HA pair against a standalone broker: instructions per persistent confirmed message.

    /work/main/.venv/bin/python benchmarks/ha_instructions.py --trees /work/main,/work/wt/b \
        [--messages 40000] [--repeat 1] [--keyed-standalone]

``benchmarks/ha_cpu.py`` measures CPU time, which on a shared VM moves by half
between runs minutes apart, so a change worth a few percent of the active node's
work hides in the noise. This counts instructions instead (valgrind's callgrind,
``valgrind`` on the PATH): for each source tree in turn it starts, from that tree
(``PYTHONPATH=TREE:TREE/benchmarks``), a standalone broker under callgrind, runs
``amqlite bench --scenarios 1to1-persistent-confirm --systems amqlite`` against it
once to warm it up, zeroes the counters (``callgrind_control -z``), runs it again
(N/4 persistent confirmed messages, N = ``--messages``) and dumps them; then the
same for an HA pair whose primary (the active node) runs under callgrind and whose
backup runs as usual (``heartbeat_ms = 1000``, ``failover_timeout_ms = 30000``: the
active node is ~40x slower under callgrind and must not be taken for dead), with
both addresses given to the bench, so that the client gives publish keys as in
``ha_cpu.py``. It prints the instructions per message of each (every thread of the
process, the run's connection setup included) and their ratio.

Two measured runs of one tree agree to within a fraction of a percent. What it
cannot show: the node under callgrind is the bottleneck by far, so every batch is
as large as the client's window allows; per-batch costs (syscalls, wakeups, one
``ha.sync`` per round trip) weigh less than at full speed, and ``ha_cpu.py``'s
ratio is lower than this one. It measures the per-message work of each side.

``--keyed-standalone`` also counts the standalone broker (the same process, after
its own measured run) with its address given twice to the bench, so that its
client gives publish keys as the pair's does: ``keyed ratio`` is keyed standalone /
active, the backup's own cost apart from the keys'.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amqlite_bench.hapair import PairTiming, cluster_config
from amqlite_bench.ports import fixed_port
from ha_cpu import Server, _env

_NEUTRAL = tempfile.gettempdir()
_READY = 300.0  # a broker under callgrind starts in ~15 s
_TIMING = PairTiming(heartbeat_ms=1000, failover_timeout_ms=30000)


def _bench(tree: str, servers: str, messages: int) -> float:
    cmd = [sys.executable, "-m", "amqlite", "bench", "-s", servers, "--scenarios"]
    cmd += ["1to1-persistent-confirm", "--systems", "amqlite", "--messages", str(messages)]
    out = subprocess.run(
        [*cmd, "--json"], env=_env(tree), capture_output=True, check=True, cwd=_NEUTRAL
    )
    return float(json.loads(out.stdout)["results"][0]["msgs_per_s"])


_KEEP: Path | None = None  # --keep DIR


def _instructions(pid: int, out: Path, tree: str, servers: str, messages: int, name: str) -> float:
    """Instructions ``pid`` ran during one bench run, per persistent message."""
    _bench(tree, servers, max(messages // 5, 4000))  # warm up
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    _bench(tree, servers, messages)
    before = set(out.glob(f"cg.{pid}.*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + 60
    while not (dumps := set(out.glob(f"cg.{pid}.*")) - before):
        if time.monotonic() > deadline:
            raise SystemExit(f"callgrind wrote no dump for {pid}")
        time.sleep(0.2)
    dump = max(dumps, key=lambda p: int(p.name.rsplit(".", 1)[1]))
    for _ in range(300):
        match = re.search(r"^summary: (\d+)$", dump.read_text(), re.M)
        if match:
            if _KEEP is not None:
                shutil.copy(dump, _KEEP / f"{Path(tree).name}-{name}.callgrind")
            return int(match[1]) / (messages // 4)
        time.sleep(0.2)
    raise SystemExit(f"no summary in {dump}")


def measure(tree: str, work: Path, messages: int, keyed: bool = False) -> dict[str, float]:
    row: dict[str, float] = {}
    grind = work / "callgrind"
    grind.mkdir(parents=True, exist_ok=True)
    port = fixed_port()
    grinding = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={grind}/cg.%p")
    alone = Server(
        tree, work / "standalone.log", "--port", str(port),
        "--data-dir", str(work / "standalone"), wrap=grinding, ready=_READY,
    )  # fmt: skip
    try:
        alone.wait_for("server_listening")
        row["standalone"] = _instructions(
            alone.proc.pid, grind, tree, f"127.0.0.1:{port}", messages, "standalone"
        )
        if keyed:  # the address twice: the client reconnects, so it gives publish keys
            row["keyed"] = _instructions(
                alone.proc.pid, grind, tree, f"127.0.0.1:{port},127.0.0.1:{port}", messages,
                "keyed",
            )  # fmt: skip
    finally:
        alone.stop()
    ports = {"primary": fixed_port(), "backup": fixed_port()}
    config = work / "pair.toml"
    config.write_text(cluster_config(ports, _TIMING))
    servers = [
        Server(
            tree, work / f"{side}.log", "--config", str(config), "--port", str(p),
            "--data-dir", str(work / side), f"--is_{side}", "1",
            wrap=grinding if side == "primary" else (), ready=_READY,
        )
        for side, p in ports.items()
    ]  # fmt: skip
    try:
        for s in servers:
            s.wait_for("server_listening")
        servers[0].wait_for("ha_replication_started")
        addresses = ",".join(f"127.0.0.1:{p}" for p in ports.values())
        row["active"] = _instructions(
            servers[0].proc.pid, grind, tree, addresses, messages, "active"
        )
    finally:
        for s in servers:
            s.stop()
    row["ratio"] = row["standalone"] / row["active"]
    if keyed:
        row["keyed_ratio"] = row["keyed"] / row["active"]
    for name in ("standalone", "primary", "backup"):
        shutil.rmtree(work / name, ignore_errors=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--keep", default="", help="copy each callgrind dump to DIR/<tree>-<node>.callgrind"
    )
    parser.add_argument(
        "--keyed-standalone",
        action="store_true",
        help="also count the standalone broker with a client that gives publish keys "
        "(its address twice, as in ha_cpu.py --keyed-standalone): keyed, keyed ratio",
    )
    args = parser.parse_args()
    keyed = args.keyed_standalone
    if args.keep:
        global _KEEP
        _KEEP = Path(args.keep).resolve()
        _KEEP.mkdir(parents=True, exist_ok=True)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed: apt-get install -y valgrind")
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    extra = " keyed instr/msg | keyed ratio |" if keyed else ""
    print(
        "| tree | run | UTC | standalone instr/msg | active instr/msg "
        "| active - standalone | ratio |" + extra
    )
    print("|---|---:|---|---:|---:|---:|---:|" + ("---:|---:|" if keyed else ""))
    for run in range(1, args.repeat + 1):
        for tree in trees:
            with tempfile.TemporaryDirectory(prefix="ha-instr-") as work:
                stamp = time.strftime("%H:%M:%S", time.gmtime())
                row = measure(tree, Path(work), args.messages, keyed)
            cells = f" {row['keyed']:,.0f} | {row['keyed_ratio']:.3f} |" if keyed else ""
            print(
                f"| {Path(tree).name} | {run} | {stamp} | {row['standalone']:,.0f} | "
                f"{row['active']:,.0f} | {row['active'] - row['standalone']:,.0f} | "
                f"{row['ratio']:.3f} |" + cells,
                flush=True,
            )


if __name__ == "__main__":
    main()
