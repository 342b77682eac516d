"""HA pair against a standalone broker: confirm latency at a fixed offered rate.

    /work/main/.venv/bin/python benchmarks/ha_confirm_latency.py \
        --trees /work/wt/ref-r15,/work/wt/ha-stall-r15 [--rate 5000] [--seconds 4] [--repeat 6]

For each repeat and each source tree in turn (ABBA, as ``ha_cpu.py``), it starts an
HA pair and a standalone broker from that tree (``--fsync batch``, as ``ha_cpu.py``
does) and publishes persistent confirmed messages to each at ``--rate`` msg/s for
``--seconds`` (a consumer acks them; no window limit), printing the publish ->
confirm latency's p50 / p90 / p99 in ms for the pair and the standalone broker.

Why beside ``ha_cpu.py`` and the failover scenario: those run a window of 1,000
unconfirmed messages, so their msg/s is 1,000 / the confirm latency while the
cores have room, and the CPU a message once they have none, as on a machine shared
with other benchmarks; at a fixed rate well below either broker's capacity the
latency the pair adds to a confirm shows on its own (round 15: the passive node's
batch wait; benchmarks/README.md, round 15).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ha_cpu

_CLIENT = r"""
import sys, time, trio, amqlite
addr, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])

async def main():
    latencies = []
    async with amqlite.connect(addr, max_in_flight=1_000_000) as pub, amqlite.connect(addr) as sub:
        await pub.declare_queue("latency", durable=True)
        await sub.declare_queue("latency", durable=True)
        consumer = await sub.consume("latency", prefetch=1000)
        send, receive = trio.open_memory_channel(1_000_000)

        async def consume():
            async for d in consumer:
                await d.ack()

        async def watch():
            async for sent, pending in receive:
                await pending.wait()
                latencies.append(time.perf_counter() - sent)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            nursery.start_soon(watch)
            start, n = trio.current_time(), 0
            while trio.current_time() - start < seconds:
                while n / rate <= trio.current_time() - start:
                    pending = await pub.publish_nowait("", "latency", b"x" * 100, persistent=True)
                    send.send_nowait((time.perf_counter(), pending))
                    n += 1
                await trio.sleep(0.001)
            await send.aclose()
            while len(latencies) < n:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    latencies.sort()
    print(" ".join(f"{latencies[int(len(latencies) * q)] * 1e3:.2f}" for q in (0.5, 0.9, 0.99)))

trio.run(main)
"""


def _latency(tree: str, addr: str, rate: float, seconds: float) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _CLIENT, addr, str(rate), str(seconds)],
        env=ha_cpu._env(tree),
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    )
    return out.stdout.strip()


def _measure(tree: str, work: Path, rate: float, seconds: float) -> dict[str, str]:
    ports, servers, alone_port, alone = ha_cpu.start_brokers(tree, work)
    try:
        for s in servers:
            s.wait_for("server_listening")
        servers[0].wait_for("ha_replication_started")
        alone.wait_for("server_listening")
        pair = ",".join(f"127.0.0.1:{p}" for p in ports.values())
        return {
            "pair": _latency(tree, pair, rate, seconds),
            "standalone": _latency(tree, f"127.0.0.1:{alone_port}", rate, seconds),
        }
    finally:
        for s in [*servers, alone]:
            s.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--rate", type=float, default=5000.0)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=6)
    args = parser.parse_args()
    trees = args.trees.split(",")
    print("| tree | run | UTC | load | pair p50 / p90 / p99 ms | standalone p50 / p90 / p99 ms |")
    print("|---|---:|---|---:|---|---|", flush=True)
    for i in range(args.repeat):
        for tree in trees if i % 2 == 0 else trees[::-1]:
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory() as tmp:
                row = _measure(tree, Path(tmp), args.rate, args.seconds)
            utc = time.strftime("%H:%M:%S", time.gmtime())
            pair, alone = (row[k].replace(" ", " / ") for k in ("pair", "standalone"))
            cells = f"{i + 1} | {utc} | {load:.1f} | {pair} | {alone}"
            print(f"| {Path(tree).name} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
