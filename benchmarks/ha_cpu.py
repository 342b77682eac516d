"""HA pair against a standalone broker: CPU per persistent confirmed message, per node.

    /work/main/.venv/bin/python benchmarks/ha_cpu.py --trees /work/wt/ref,/work/wt/ha-r8 \
        [--repeat 5] [--messages 400000] [--profile DIR] [--keyed-standalone]

For each repeat and each source tree in turn (alternating, first in one order
then in the other, so that the machine's load falls on both alike) it starts,
from that tree (``PYTHONPATH=TREE:TREE/benchmarks`` for the servers and the bench
client alike), an HA pair on free loopback ports
(one ``[cluster]`` file, ``heartbeat_ms = 200``, ``failover_timeout_ms = 1000``,
``--fsync batch`` on both nodes, each with its own data dir; it waits for the
primary's ``ha_replication_started``) and a standalone broker (``--fsync batch``),
and runs ``amqlite bench -s SERVERS --scenarios 1to1-persistent-confirm --systems
amqlite --messages N`` against each (N/4 persistent messages, confirmed; with two
addresses the client gives publish keys, as the ``failover`` scenario's does). The
CPU time (user + system, ``/proc/PID/stat``) each broker and the bench process used
during the run, divided by the messages, is what it prints, per run and as medians
per tree, with the load average at the start of each run. Issue 16's ratio (pair /
standalone msg/s on 2 cores) follows the active node's CPU per message, since each
broker is single-threaded; msg/s is printed too but moves with the neighbours.

``pair / standalone`` is the pair run's msg/s over the standalone run's, the figure
issue 16 item 3 asks to be at least 0.9. ``--keyed-standalone`` adds a third run in
each repeat, on the same standalone broker, its address given twice (``keyed``):
that client reconnects, so it gives publish keys as the pair's client does, and
``pair / keyed`` is what the backup costs apart from the keys (the goal compares the
pair with a client that gives none). The runs of a repeat go in one order (pair,
standalone, keyed) and those of the next in the other, so that neither side always
meets the machine first (rounds 16-19 ran the pair first in every repeat).

``waits/1k`` and ``preempted/1k`` are the voluntary and involuntary context switches
of a broker's main thread per 1,000 persistent messages (``/proc/PID/task/PID/status``):
the thread blocking (for work, or for the interpreter lock), its core taken away.

``--pin`` pins the measured broker (the active node, then the standalone one; all
its threads) to CPU 1 and the passive node and the bench client to CPU 0, so that
the active node, like the standalone broker, has a core to itself: what is left of
the difference between them is the active node's own work, not the third busy
process sharing its core (its cache, its context switches). Other processes on the
machine are not pinned.

``recs`` is the records the broker journaled per message (``storage.appended``
from its status after the run; the enqueues and the ``message.marks`` records
between them); ``commits/1k`` the journal commits (each a write and an fsync) it
made per 1,000 messages (``storage.commits``).

``--profile DIR`` also runs py-spy (``PY_SPY``, default ``py-spy``; ``-r 200 -f
raw``) on every broker during each tree's last repeat, writing
``DIR/<tree>-<run>-<node>.txt`` for ``benchmarks/profile_summary.py``.

``--cpuprof DIR`` samples CPU time instead (``benchmarks/cpu_sampler``: only while
the broker runs, so a process waiting for a core is not counted busy, as py-spy
counts it with three busy processes on two cores), in every repeat, writing
``DIR/<tree>-<run>-<pair|standalone>-<node>.txt`` in the same format.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from amqlite_bench.hapair import SIDES, PairTiming, cluster_config
from amqlite_bench.ports import fixed_port

_TICK = os.sysconf("SC_CLK_TCK")
#: the servers' and the bench's working directory: ``python -m`` puts the working
#: directory first on sys.path, so run from inside a source tree every "tree" would
#: import that tree's amqlite, whatever PYTHONPATH says
_NEUTRAL = tempfile.gettempdir()
_READY = 60.0


def _cpu(pid: int) -> tuple[float, float]:
    """(user + system, system) CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK, int(fields[12]) / _TICK


def _main_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid``'s main thread (the event loop) so far:
    the rest of ``_cpu`` is its other threads (the journal's commits, in trio's
    worker threads), which a sampler in the main thread cannot see."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _io(pid: int) -> tuple[int, int]:
    """(read, write) system calls of ``pid`` so far (``/proc/PID/io``)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def _switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of ``pid``'s main thread (the event
    loop) so far: a voluntary one is the thread blocking (``epoll_wait`` with
    nothing ready, or the interpreter lock held by the journal's commit thread),
    an involuntary one its core taken away."""
    fields = dict(
        line.split(":\t")
        for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines()
        if ":\t" in line
    )
    return int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])


#: ``--cpuprof DIR``: the brokers load ``benchmarks/cpu_sampler`` (CPU-time samples,
#: not py-spy's wall-clock ones) and write their samples of each run into DIR
_CPUPROF: Path | None = None
_SAMPLER = Path(__file__).resolve().parent / "cpu_sampler"


def _env(tree: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{tree}:{tree}/benchmarks"}
    if _CPUPROF is not None:
        env["PYTHONPATH"] = f"{_SAMPLER}:{env['PYTHONPATH']}"
        env["CPUPROF_DIR"] = str(_CPUPROF)
    return env


def _sampled(pids: dict[str, int], tag: str) -> None:
    """Stop the CPU samplers of ``pids`` and name their files ``<tag>-<node>.txt``."""
    assert _CPUPROF is not None
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR2)
    for node, pid in pids.items():
        written = _CPUPROF / f"{pid}.txt"
        deadline = time.monotonic() + 10.0
        while not written.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if written.exists():
            written.rename(_CPUPROF / f"{tag}-{node}.txt")


class Server:
    """A broker from ``tree`` (``--fsync batch``, JSON log to ``log``); ``wrap`` goes
    before its command (``benchmarks/ha_instructions.py``: valgrind), ``ready`` is
    how long :meth:`wait_for` waits."""

    def __init__(
        self, tree: str, log: Path, *argv: str, wrap: tuple[str, ...] = (), ready: float = _READY
    ) -> None:
        self.log = log
        self.ready = ready
        self._file = log.open("wb")
        cmd = [*wrap, sys.executable, "-m", "amqlite", "server", "--host", "127.0.0.1"]
        cmd += ["--log-format", "json", "--fsync", "batch", *argv]
        self.proc = subprocess.Popen(
            cmd, env=_env(tree), stdout=self._file, stderr=subprocess.STDOUT, cwd=_NEUTRAL
        )

    def wait_for(self, event: str) -> None:
        deadline = time.monotonic() + self.ready
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.log} exited: {self.log.read_text()[-2000:]}")
            if f'"{event}"' in self.log.read_text():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.log}: no {event} in {self.ready} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._file.close()


def _bench(tree: str, servers: str, messages: int) -> tuple[float, float]:
    """(msg/s, the bench process's CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "amqlite", "bench", "-s", servers, "--scenarios"]
    cmd += ["1to1-persistent-confirm", "--systems", "amqlite", "--messages", str(messages)]
    out = subprocess.run(
        [*cmd, "--json"], env=_env(tree), capture_output=True, check=True, cwd=_NEUTRAL
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = json.loads(out.stdout)["results"]
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return float(rows[0]["msgs_per_s"]), cpu


def _spy(pids: dict[str, int], out: Path, tag: str) -> list[subprocess.Popen[bytes]]:
    spy = os.environ.get("PY_SPY", "py-spy")
    return [
        subprocess.Popen(
            [
                spy,
                "record",
                "-p",
                str(pid),
                "-f",
                "raw",
                "-r",
                "200",
                "--nonblocking",
                "-o",
                str(out / f"{tag}-{node}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for node, pid in pids.items()
    ]


def _pin(pid: int, cpu: int) -> None:
    """Pin every thread of ``pid`` to ``cpu`` (threads it starts later inherit it)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), {cpu})


def _appended(tree: str, port: int) -> tuple[float, float]:
    """The records the broker at ``port`` has journaled and the commits it has made
    (its status), nan if unknown."""
    cmd = [sys.executable, "-m", "amqlite", "status", "-s", f"127.0.0.1:{port}", "--json"]
    out = subprocess.run(cmd, env=_env(tree), capture_output=True, cwd=_NEUTRAL)
    try:
        storage = json.loads(out.stdout)["storage"]
        return float(storage["appended"]), float(storage.get("commits", "nan"))
    except (ValueError, KeyError, TypeError):
        return float("nan"), float("nan")


def start_brokers(tree: str, work: Path) -> tuple[dict[str, int], list[Server], int, Server]:
    """From ``tree``: an HA pair on free loopback ports (one ``[cluster]`` file, the
    bench's own: ``heartbeat_ms = 200``, ``failover_timeout_ms = 1000``) and a
    standalone broker, each with its own data dir under ``work``: the pair's ports,
    its servers (primary first), the standalone broker's port and server. Started,
    not waited for."""
    ports = {side: fixed_port() for side in SIDES}
    config = work / "pair.toml"
    config.write_text(cluster_config(ports, PairTiming()))
    servers = [
        Server(tree, work / f"{side}.log", "--config", str(config), "--port", str(port),
                "--data-dir", str(work / side), f"--is_{side}", "1")
        for side, port in ports.items()
    ]  # fmt: skip
    standalone_port = fixed_port()
    alone = Server(
        tree, work / "standalone.log", "--port", str(standalone_port),
        "--data-dir", str(work / "standalone"),
    )  # fmt: skip
    return ports, servers, standalone_port, alone


def _measure(
    tree: str,
    work: Path,
    messages: int,
    profile: Path | None,
    tag: str,
    pin: bool = False,
    keyed: bool = False,
    run: int = 0,
) -> dict[str, float]:
    persistent = messages // 4  # what 1to1-persistent-confirm publishes of --messages
    row: dict[str, float] = {"load": os.getloadavg()[0]}
    ports, servers, standalone_port, alone = start_brokers(tree, work)
    try:
        for s in servers:
            s.wait_for("server_listening")
        servers[0].wait_for("ha_replication_started")
        alone.wait_for("server_listening")
        node_ports = {"active": ports["primary"], "passive": ports["backup"],
                      "standalone": standalone_port}  # fmt: skip
        everywhere = os.sched_getaffinity(0)
        alone_addr = f"127.0.0.1:{standalone_port}"
        phases = [
            ("pair", {"active": servers[0], "passive": servers[1]},
             ",".join(f"127.0.0.1:{p}" for p in ports.values())),
            ("standalone", {"standalone": alone}, alone_addr),
        ]  # fmt: skip
        if keyed:
            # the same standalone broker, its address given twice: the client
            # reconnects, so it gives publish keys as it does to the pair
            phases.append(("keyed", {"keyed": alone}, f"{alone_addr},{alone_addr}"))
            node_ports["keyed"] = standalone_port
        if run % 2:  # ABBA: the pair runs first in one repeat, last in the next
            phases.reverse()
        for name, procs, addr in phases:
            pids = {node: s.proc.pid for node, s in procs.items()}
            if pin:
                for node, pid in pids.items():
                    _pin(pid, 0 if node == "passive" else 1)
                os.sched_setaffinity(0, {0})  # the bench client (our child) inherits it
            appended = {node: _appended(tree, node_ports[node]) for node in pids}
            spies = _spy(pids, profile, tag) if profile else []
            if spies:
                time.sleep(1.0)
            if _CPUPROF is not None:
                for pid in pids.values():
                    os.kill(pid, signal.SIGUSR1)
            before = {node: _cpu(pid) for node, pid in pids.items()}
            main_before = {node: _main_cpu(pid) for node, pid in pids.items()}
            io_before = {node: _io(pid) for node, pid in pids.items()}
            sw_before = {node: _switches(pid) for node, pid in pids.items()}
            rate, client = _bench(tree, addr, messages)
            if _CPUPROF is not None:
                _sampled(pids, f"{tag}-{name}")
            after = {node: _cpu(pid) for node, pid in pids.items()}
            main_after = {node: _main_cpu(pid) for node, pid in pids.items()}
            io_after = {node: _io(pid) for node, pid in pids.items()}
            sw_after = {node: _switches(pid) for node, pid in pids.items()}
            if pin:
                os.sched_setaffinity(0, everywhere)
            for node in pids:
                recs, commits = _appended(tree, node_ports[node])
                row[f"{node}_recs"] = (recs - appended[node][0]) / persistent
                row[f"{node}_commits"] = 1000 * (commits - appended[node][1]) / persistent
            for spy in spies:
                spy.send_signal(signal.SIGINT)
            for spy in spies:
                spy.wait()
            row[f"{name}_rate"] = rate
            row[f"{name}_client"] = 1e6 * client / persistent
            for node in pids:
                row[node] = 1e6 * (after[node][0] - before[node][0]) / persistent
                row[f"{node}_sys"] = 1e6 * (after[node][1] - before[node][1]) / persistent
                main = main_after[node] - main_before[node]
                row[f"{node}_threads"] = row[node] - 1e6 * main / persistent
                row[f"{node}_reads"] = (io_after[node][0] - io_before[node][0]) / persistent
                row[f"{node}_writes"] = (io_after[node][1] - io_before[node][1]) / persistent
                row[f"{node}_vcsw"] = 1000 * (sw_after[node][0] - sw_before[node][0]) / persistent
                row[f"{node}_icsw"] = 1000 * (sw_after[node][1] - sw_before[node][1]) / persistent
        row["ratio"] = row["pair_rate"] / row["standalone_rate"]
        if keyed:
            row["keyed_ratio"] = row["pair_rate"] / row["keyed_rate"]
    finally:
        for s in [*servers, alone]:
            s.stop()
        for side in ("primary", "backup", "standalone"):
            shutil.rmtree(work / side, ignore_errors=True)
    return row


_COLUMNS = (
    ("load", "load", "{:.1f}"),
    ("active", "active us", "{:.1f}"),
    ("passive", "passive us", "{:.1f}"),
    ("pair_client", "client us", "{:.1f}"),
    ("pair_rate", "pair msg/s", "{:,.0f}"),
    ("active_sys", "active sys", "{:.1f}"),
    ("active_threads", "active threads", "{:.1f}"),
    ("passive_sys", "passive sys", "{:.1f}"),
    ("active_reads", "active reads", "{:.2f}"),
    ("active_writes", "active writes", "{:.2f}"),
    ("active_vcsw", "active waits/1k", "{:.1f}"),
    ("active_icsw", "active preempted/1k", "{:.1f}"),
    ("active_recs", "active recs", "{:.3f}"),
    ("active_commits", "active commits/1k", "{:.2f}"),
    ("passive_commits", "passive commits/1k", "{:.2f}"),
    ("passive_writes", "passive writes", "{:.2f}"),
    ("standalone", "standalone us", "{:.1f}"),
    ("standalone_sys", "standalone sys", "{:.1f}"),
    ("standalone_threads", "standalone threads", "{:.1f}"),
    ("standalone_reads", "standalone reads", "{:.2f}"),
    ("standalone_writes", "standalone writes", "{:.2f}"),
    ("standalone_vcsw", "standalone waits/1k", "{:.1f}"),
    ("standalone_icsw", "standalone preempted/1k", "{:.1f}"),
    ("standalone_recs", "standalone recs", "{:.3f}"),
    ("standalone_commits", "standalone commits/1k", "{:.2f}"),
    ("standalone_client", "client us", "{:.1f}"),
    ("standalone_rate", "standalone msg/s", "{:,.0f}"),
    ("ratio", "pair / standalone", "{:.2f}"),
)

#: ``--keyed-standalone``: the standalone broker again, its client giving publish keys
_KEYED_COLUMNS = (
    ("keyed", "keyed standalone us", "{:.1f}"),
    ("keyed_sys", "keyed sys", "{:.1f}"),
    ("keyed_threads", "keyed threads", "{:.1f}"),
    ("keyed_recs", "keyed recs", "{:.3f}"),
    ("keyed_client", "keyed client us", "{:.1f}"),
    ("keyed_rate", "keyed msg/s", "{:,.0f}"),
    ("keyed_ratio", "pair / keyed", "{:.2f}"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", default="")
    parser.add_argument("--pin", action="store_true", help="see the module's doc")
    parser.add_argument(
        "--cpuprof",
        default="",
        help="DIR: CPU-time samples of every broker during every run "
        "(benchmarks/cpu_sampler), DIR/<tree>-<run>-<phase>-<node>.txt",
    )
    parser.add_argument(
        "--keyed-standalone",
        action="store_true",
        help="also run the standalone broker with a client that gives publish keys "
        "(its address twice, so it reconnects, as the pair's client does): the "
        "backup's own cost, apart from the keys' (see the module's doc)",
    )
    args = parser.parse_args()
    columns = _COLUMNS + (_KEYED_COLUMNS if args.keyed_standalone else ())
    trees = args.trees.split(",")
    profile = Path(args.profile) if args.profile else None
    if profile:
        profile.mkdir(parents=True, exist_ok=True)
    if args.cpuprof:
        global _CPUPROF
        _CPUPROF = Path(args.cpuprof).resolve()
        _CPUPROF.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    print("| tree | run | UTC | " + " | ".join(c[1] for c in columns) + " |", flush=True)
    print("|---|---:|---|" + "---:|" * len(columns), flush=True)
    for i in range(args.repeat):
        # ABBA: each tree runs first as often as last (the second run of a pair
        # often met a busier machine than the first)
        for tree in trees if i % 2 == 0 else trees[::-1]:
            tag = Path(tree).name
            with tempfile.TemporaryDirectory() as tmp:
                last = profile if i == args.repeat - 1 else None
                row = _measure(tree, Path(tmp), args.messages, last, f"{tag}-{i + 1}", args.pin,
                               args.keyed_standalone, i)  # fmt: skip
            rows[tree].append(row)
            cells = " | ".join(f.format(row[k]) for k, _, f in columns)
            print(f"| {tag} | {i + 1} | {time.strftime('%H:%M:%S', time.gmtime())} | {cells} |",
                  flush=True)  # fmt: skip
    for tree in trees:
        med = {k: statistics.median(r[k] for r in rows[tree]) for k, _, _ in columns}
        cells = " | ".join(f.format(med[k]) for k, _, f in columns)
        print(f"| {Path(tree).name} | median | | {cells} |", flush=True)


if __name__ == "__main__":
    main()
