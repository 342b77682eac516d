"""Backlogs on disk (issue 16 item 4): restart time and memory per waiting message,
amqlite and RabbitMQ in the same run, and a backlog larger than the memory limit.

    .venv/bin/python benchmarks/backlog.py [--messages 1000000] [--body 100]
        [--vs rabbitmq] [--big 5000000 --watermark 256MB] [--json FILE]

**Restart** (each broker in turn): start it on a fresh data dir, declare one durable
queue, measure its RSS (``/proc/PID/statm``) empty, publish ``--messages``
persistent messages of ``--body`` bytes (confirmed: amqlite's native client with
pipelined confirms; RabbitMQ through aio-pika with publisher confirms, 1,000
unconfirmed at a time), measure the RSS again ("after publish"), ``kill -9`` it,
start it again on the same data, and time from the start until a passive declare of
the queue answers with every message ("serves after"), and the CPU time the broker's
process used until then (a load-proof figure on a shared machine). Then, with the
broker idle for two seconds, the RSS per waiting message: (RSS after restart - RSS
empty) / messages. RabbitMQ is the one ``scripts/peers`` runs, on ports and a state
dir of its own (:data:`PEERS_ENV`; its state kept over the restart:
PEERS_KEEP_STATE=1).

**Bigger than memory** (``--big N``, amqlite only): a broker with
``limits.memory_high_watermark`` = ``--watermark``; N persistent messages
published, then a consumer drains every one (prefetch 1000, acks); RSS sampled
every 50 ms throughout. Prints the peak against the watermark.

The machine is shared: run the big figures on a quiet machine (the defaults take
minutes); ``--messages 20000`` is a smoke run. Prints a markdown table and, with
``--json``, writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import trio

import amqlite

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "scripts" / "peers"
PAGE = os.sysconf("SC_PAGE_SIZE")
QUEUE = "backlog"


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def parse_size(text: str) -> int:
    units = {"kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}
    low = text.strip().lower()
    for suffix, factor in units.items():
        if low.endswith(suffix):
            return int(float(low[: -len(suffix)]) * factor)
    return int(low)


class Sampler:
    """The peak RSS of a process, sampled every 50 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.05):
            try:
                now_rss = rss(self.pid)
            except OSError:
                return
            self.peak = max(self.peak, now_rss)
            if time.monotonic() - last >= 30:  # a long run says how it goes
                last = time.monotonic()
                print(
                    f"  {time.strftime('%H:%M:%S')} RSS {now_rss / 2**20:.0f} MiB, "
                    f"peak {self.peak / 2**20:.0f} MiB",
                    file=sys.stderr,
                    flush=True,
                )

    def phase(self) -> int:
        """The peak so far; the next phase's peak starts from now."""
        peak, self.peak = self.peak, 0
        return peak

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


# --- amqlite -----------------------------------------------------------------------------


def start_amqlite(data_dir: str, config: str | None = None) -> tuple[subprocess.Popen[str], int]:
    argv = [sys.executable, "-m", "amqlite", "server", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--data-dir", data_dir, "--log-format", "json"]
    if config is not None:
        argv += ["--config", config]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "server_listening":
            # keep draining its log so it never blocks on a full pipe
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(record["port"])
    raise SystemExit(f"amqlite did not start: exit {proc.wait()}")


async def _publish(port: int, count: int, body: bytes, stall_s: float = 1e9) -> int:
    """Publish ``count`` confirmed messages; how many were confirmed (fewer if the
    confirms stopped for ``stall_s``: the broker blocked the publisher)."""
    confirmed = 0
    with trio.CancelScope() as outer:  # a blocked connection may not close: cut it
        async with amqlite.connect(f"127.0.0.1:{port}") as conn:
            await conn.declare_queue(QUEUE, durable=True)
            window: list[Any] = []
            for n in range(count):
                window.append(await conn.publish_nowait("", QUEUE, body, persistent=True))
                if len(window) >= 2000 or n == count - 1:
                    with trio.move_on_after(stall_s):
                        for pending in window:
                            await pending.wait()
                            confirmed += 1
                    if confirmed < n + 1:  # every one published so far, or it stalled
                        print(f"  publishing stalled at {confirmed:,} confirmed", file=sys.stderr)
                        outer.deadline = trio.current_time() + 10
                        break
                    window.clear()
    return confirmed


async def _declare(port: int) -> int:
    async with amqlite.connect(f"127.0.0.1:{port}") as conn:
        info = await conn.declare_queue(QUEUE, durable=True)
        return int(info.messages)


async def _drain(port: int, count: int) -> int:
    """Consume and ack ``count`` messages; how many were left in the queue after."""
    async with amqlite.connect(f"127.0.0.1:{port}") as conn:
        consumer = await conn.consume(QUEUE, prefetch=1000)
        got = 0
        async for delivery in consumer:
            await delivery.ack()
            got += 1
            if got == count:
                break
        await consumer.cancel()
        info = await conn.declare_queue(QUEUE, durable=True, passive=True)
        return int(info.messages)


def amqlite_restart(count: int, body: bytes) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="backlog-bench-") as data:
        proc, port = start_amqlite(data)
        trio.run(_declare, port)
        empty = rss(proc.pid)
        started = time.perf_counter()
        trio.run(_publish, port, count, body)
        published = time.perf_counter() - started
        after_publish = rss(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        started = time.perf_counter()
        proc, port = start_amqlite(data)  # binds, then recovers: clients wait meanwhile
        found = trio.run(_declare, port)
        serves = time.perf_counter() - started
        serves_cpu = _cpu(proc.pid)  # its CPU since the start: what load does not inflate
        time.sleep(2.0)
        after_restart = rss(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    report = _restart_report(
        "amqlite", count, found, published, empty, after_publish, serves, after_restart
    )
    report["serves_cpu_s"] = round(serves_cpu, 2)
    return report


def _restart_report(
    broker: str,
    count: int,
    found: int,
    published: float,
    empty: int,
    after_publish: int,
    serves: float,
    after_restart: int,
) -> dict[str, Any]:
    """One broker's restart figures (RSS in bytes; per waiting message over the empty
    broker's)."""
    return {
        "broker": broker,
        "messages": count,
        "found": found,
        "publish_s": round(published, 1),
        "rss_empty": empty,
        "per_message_after_publish": round((after_publish - empty) / count),
        "serves_after_s": round(serves, 2),
        "per_message_after_restart": round((after_restart - empty) / count),
    }


def amqlite_bigger_than_memory(count: int, body: bytes, watermark: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="backlog-big-") as data:
        config = Path(data) / "server.toml"
        config.write_text(f"[limits]\nmemory_high_watermark = {watermark}\n")
        proc, port = start_amqlite(os.path.join(data, "node"), str(config))
        empty = rss(proc.pid)
        sampler = Sampler(proc.pid)
        started = time.perf_counter()
        cpu = _cpu(proc.pid)
        confirmed = trio.run(_publish, port, count, body, 120.0)
        published = time.perf_counter() - started
        publish_cpu = _cpu(proc.pid) - cpu
        after_publish = rss(proc.pid)
        publish_peak = sampler.phase()
        started = time.perf_counter()
        cpu = _cpu(proc.pid)
        left = trio.run(_drain, port, confirmed)
        drained = time.perf_counter() - started
        drain_cpu = _cpu(proc.pid) - cpu
        drain_peak = sampler.stop()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    peak = max(publish_peak, drain_peak)
    return {
        "broker": "amqlite",
        "messages": count,
        "watermark": watermark,
        "rss_empty": empty,
        "publish_s": round(published, 1),
        "publish_server_cpu_s": round(publish_cpu, 1),
        "rss_after_publish": after_publish,
        "per_message_after_publish": round((after_publish - empty) / count, 1),
        "publish_peak_rss": publish_peak,
        "drain_s": round(drained, 1),
        "drain_server_cpu_s": round(drain_cpu, 1),
        "confirmed": confirmed,
        "drained": confirmed,
        "left_after_drain": left,
        "drain_peak_rss": drain_peak,
        "peak_rss": peak,
        "peak_over_watermark": peak - watermark,
    }


def _cpu(pid: int) -> float:
    """A process's user + system CPU seconds so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- RabbitMQ ------------------------------------------------------------------------------


#: A RabbitMQ of its own (state dir and ports), so a peer another run uses is left alone.
PEERS_ENV = {
    "PEERS_DIR": os.path.join(tempfile.gettempdir(), f"amqlite-backlog-peers-{os.getuid()}"),
    "PEERS_RABBITMQ_PORT": "5692",
    "PEERS_RABBITMQ_DIST_PORT": "25692",
    "PEERS_EPMD_PORT": "4389",
}


def peers(*args: str, keep: bool = False) -> dict[str, str]:
    env = {**os.environ, **PEERS_ENV, "PEERS_KEEP_STATE": "1" if keep else "0"}
    out = subprocess.run(
        [str(PEERS), *args, "rabbitmq"], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"scripts/peers {' '.join(args)} rabbitmq failed: {out.stderr.strip()}")
    line = out.stdout.strip().splitlines()[-1]
    return dict(part.split("=", 1) for part in line.split()[2:] if "=" in part)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (the peers script's child)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rabbit_channel(address: str) -> Any:
    import pika

    host, port = address.rsplit(":", 1)
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
    return conn, conn.channel()


async def _rabbit_publish(address: str, count: int, body: bytes, window: int = 1000) -> int:
    """Publish ``count`` persistent messages to RabbitMQ with publisher confirms,
    ``window`` unconfirmed at a time (aio-pika); how many were confirmed. A confirm
    per publish (pika's blocking channel) took 692 s for a million; a window
    measures the same state, sooner."""
    import aio_pika
    from pamqp.commands import Basic

    host, port = address.rsplit(":", 1)
    connection = await aio_pika.connect(host=host, port=int(port))
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        exchange = channel.default_exchange
        confirmed = 0
        for start in range(0, count, window):
            n = min(window, count - start)
            results = await asyncio.gather(
                *(exchange.publish(message, routing_key=QUEUE) for _ in range(n))
            )
            confirmed += sum(1 for r in results if isinstance(r, Basic.Ack))
    return confirmed


def rabbitmq_restart(count: int, body: bytes) -> dict[str, Any]:
    peers("stop")
    status = peers("start")
    pid, address = int(status["pid"]), status["address"]
    # the first start's helpers (its epmd) outlive the kill -9 and are not recorded
    # by the restart: ended here at the end
    first = Path(PEERS_ENV["PEERS_DIR"], "rabbitmq", "pids").read_text().split()
    conn, ch = rabbit_channel(address)
    ch.queue_declare(QUEUE, durable=True)
    conn.close()
    time.sleep(2.0)
    empty = rss(pid)
    started = time.perf_counter()
    confirmed = asyncio.run(_rabbit_publish(address, count, body))
    published = time.perf_counter() - started
    if confirmed != count:
        raise SystemExit(f"rabbitmq confirmed {confirmed:,} of {count:,}")
    after_publish = rss(pid)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)  # until reaped: the peers script takes a zombie for a live server
    started = time.perf_counter()
    status = peers("start", keep=True)
    pid = int(status["pid"])
    found = -1
    while time.perf_counter() - started < 300:
        try:
            conn, ch = rabbit_channel(address)
            found = ch.queue_declare(QUEUE, durable=True, passive=True).method.message_count
            conn.close()
            if found >= count:
                break
        except Exception:  # not up yet, or the queue not yet recovered
            pass
        time.sleep(0.05)
    serves = time.perf_counter() - started
    serves_cpu = _cpu(pid)
    time.sleep(2.0)
    after_restart = rss(pid)
    peers("stop")
    for leftover in first:
        if alive(int(leftover)):
            os.kill(int(leftover), signal.SIGTERM)
    report = _restart_report(
        "rabbitmq", count, found, published, empty, after_publish, serves, after_restart
    )
    report["serves_cpu_s"] = round(serves_cpu, 2)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=100)
    parser.add_argument("--vs", default="", help="rabbitmq: measure it too")
    parser.add_argument("--big", type=int, default=0, help="messages for the watermark run")
    parser.add_argument("--watermark", default="256MB")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--no-restart", action="store_true", help="only the --big run (no restart figures)"
    )
    args = parser.parse_args()
    body = b"x" * args.body
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if not args.no_restart:
        rows = [amqlite_restart(args.messages, body)]
        if "rabbitmq" in args.vs:
            rows.append(rabbitmq_restart(args.messages, body))
        print(f"{args.messages:,} persistent {args.body}-byte messages waiting, kill -9, restart")
        print(
            "| broker | serves after | its CPU until then | RSS per waiting message after "
            "restart | after publish |"
        )
        print("|---|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['broker']} | {r['serves_after_s']} s | {r['serves_cpu_s']} s "
                f"| {r['per_message_after_restart']} B | {r['per_message_after_publish']} B |"
            )
        out["restart"] = rows
    if args.big:
        big = amqlite_bigger_than_memory(args.big, body, parse_size(args.watermark))
        out["bigger_than_memory"] = big
        mib = 2**20
        print(
            f"\n{big['messages']:,} messages, watermark {big['watermark'] / mib:.0f} MiB "
            f"(empty broker {big['rss_empty'] / mib:.0f} MiB): published in {big['publish_s']} s "
            f"({big['publish_server_cpu_s']} s server CPU), RSS after publish "
            f"{big['rss_after_publish'] / mib:.0f} MiB ({big['per_message_after_publish']} B a "
            f"message); drained {big['drained']:,} in {big['drain_s']} s "
            f"({big['drain_server_cpu_s']} s server CPU), {big['left_after_drain']} left; peak "
            f"RSS {big['publish_peak_rss'] / mib:.0f} MiB publishing, "
            f"{big['drain_peak_rss'] / mib:.0f} MiB draining "
            f"({big['peak_over_watermark'] / mib:+.0f} MiB against the watermark)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
