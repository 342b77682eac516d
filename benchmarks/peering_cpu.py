"""Exchange peering: broker CPU per message, local, peered and in mode subscribe.

    .venv/bin/python benchmarks/peering_cpu.py [--messages 50000] [--repeat 3] [--profile DIR]

The same two sites as ``benchmarks/peering.py`` (B, and A with a link to B's ``x``
in mode publish and one to B's ``y`` in mode subscribe); for each phase the CPU
time (user + system, from ``/proc``) each broker spent while N messages crossed,
in microseconds per message, and the benchmark client's (this process: the
publisher and the consumer); ``A sys`` / ``B sys`` are the system-time part (the
kernel: socket reads and writes, epoll). On a shared machine throughput moves with the
neighbours; CPU per message moves much less, and the peered / local throughput
ratio on a quiet 2-core machine follows the total (both brokers and the client
share the cores). ``--profile DIR`` also runs py-spy (``PY_SPY`` or ``py-spy``)
on both brokers during each phase's last repeat, writing ``DIR/<phase>-<site>.txt``
(raw format, for ``benchmarks/profile_summary.py``). py-spy counts a thread that
is runnable but waiting for a core as busy where it stopped, so on a loaded
machine a syscall that wakes another process (``os.write``) looks far costlier
in a profile than its share of the system time says.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import trio

import amqlite
from peering import Sites, _throughput, _wait, start_sites

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> tuple[float, float]:
    """(user + system, system) CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK, int(fields[12]) / _TICK


def _profile(pids: dict[str, int], out: Path, phase: str) -> list[subprocess.Popen[bytes]]:
    spy = os.environ.get("PY_SPY", "py-spy")
    spies = []
    for site, pid in pids.items():
        argv = [spy, "record", "-p", str(pid), "-f", "raw", "-r", "250", "--nonblocking"]
        argv += ["-o", str(out / f"{phase}-{site}.txt")]
        spies.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


def _stop(spies: list[subprocess.Popen[bytes]]) -> None:
    for spy in spies:
        spy.send_signal(signal.SIGINT)  # py-spy writes its profile
    for spy in spies:
        spy.wait()


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with trio.open_nursery() as nursery:
            sites = Sites(Path(tmp), nursery)
            try:
                await start_sites(sites)

                async def up() -> bool:
                    async with amqlite.connect(sites.address("b"), role="monitor") as c:
                        links = (await c.status())["links"]
                    return sum(x["state"] == "up" and x["interest_size"] == 1 for x in links) == 2

                await _wait(up)
                phases = {
                    "local": {"source": "b"},
                    "peered": {"source": "a"},
                    "subscribe": {"source": "b", "sink": "a", "exchange": "y", "queue": "qy"},
                }
                pids = {name: sites.procs[name].pid for name in ("a", "b")}
                results: dict[str, list[tuple[float, ...]]] = {p: [] for p in phases}
                for i in range(args.repeat):
                    for phase, kw in phases.items():
                        spies: list[subprocess.Popen[bytes]] = []
                        if args.profile and i == args.repeat - 1:
                            spies = _profile(pids, Path(args.profile), phase)
                            await trio.sleep(1.0)  # py-spy attached
                        before = {s: _cpu(p) for s, p in pids.items()}
                        client = time.process_time()
                        rate = await _throughput(sites, n=args.messages, **kw)
                        client = time.process_time() - client
                        after = {s: _cpu(p) for s, p in pids.items()}
                        _stop(spies)
                        n = args.messages
                        results[phase].append(
                            (rate, 1e6 * (after["a"][0] - before["a"][0]) / n,
                             1e6 * (after["b"][0] - before["b"][0]) / n, 1e6 * client / n,
                             1e6 * (after["a"][1] - before["a"][1]) / n,
                             1e6 * (after["b"][1] - before["b"][1]) / n)
                        )  # fmt: skip
                print(
                    "| phase | msg/s | A us/msg | B us/msg | A+B us/msg | client us/msg"
                    " | A sys | B sys |"
                )
                print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
                for phase, rows in results.items():
                    rate = statistics.median(r[0] for r in rows)
                    a = statistics.median(r[1] for r in rows)
                    b = statistics.median(r[2] for r in rows)
                    c = statistics.median(r[3] for r in rows)
                    sa = statistics.median(r[4] for r in rows)
                    sb = statistics.median(r[5] for r in rows)
                    print(
                        f"| {phase} | {rate:,.0f} | {a:.1f} | {b:.1f} | {a + b:.1f} | {c:.1f}"
                        f" | {sa:.1f} | {sb:.1f} |"
                    )
            finally:
                await sites.stop_all()
                nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", default="")
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
