"""The browser channels' throughput and latency: a page in headless Chromium
subscribed through ``amqlite.js`` over the WebSocket and over long polling.

    .venv/bin/python benchmarks/browser_channels.py [--rate 1000] [--seconds 10]
                                                     [--messages 50000] [--channels ws,poll]

Starts one broker (``amqlite server --host 127.0.0.1 --port 0 --http-port 0
--in-memory``) and Chromium (Debian's ``chromium`` driven by Playwright). For each
channel the page (on the broker's own origin) connects with ``channels: [channel]``
and subscribes to ``amq.topic`` / ``bench.#`` (``ack: "auto"``); a publisher in this
process (native protocol, transient 100-byte-ish bodies carrying the publish time)
then runs two loads:

- **latency at a fixed rate**: ``--rate`` messages a second for ``--seconds``, paced;
  the page notes ``Date.now()`` minus the publish time of each message (one clock,
  one machine): p50, p99 and max in ms;
- **throughput**: ``--messages`` published as fast as the publisher goes; the
  page's rate is messages over the time from its first to its last delivery. A page
  that falls behind loses its oldest messages (the outbox drops them, docs/browser.md):
  ``missed`` counts them.

Prints each run as JSON and a markdown table. Needs chromium and playwright
(``sudo apt-get install -y chromium && pip install playwright``); says so and
exits 2 without them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import time
from typing import Any

import trio

import amqlite
from page_under_load import INSTALL, start_broker

PAGE_SETUP = """async ([channel]) => {
  const { connect } = await import("/js/amqlite.js");
  window.lat = []; window.count = 0; window.first = 0; window.last = 0; window.missed = 0;
  window.conn = await connect({ servers: [""], channels: [channel], wsTimeout: 3000 });
  window.conn.addEventListener("missed", (e) => { window.missed += e.detail.count || 0; });
  await window.conn.subscribe({ exchange: "amq.topic", key: "bench.#" }, (msg) => {
    const now = Date.now();
    if (!window.first) window.first = now;
    window.last = now;
    window.count++;
    const sent = Number(msg.text.slice(0, msg.text.indexOf(" ")));
    if (window.record) window.lat.push(now - sent);
  });
  return window.conn.channel;
}"""
PAD = "x" * 80


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _paced(port: int, rate: float, seconds: float) -> int:
    sent = 0
    async with amqlite.connect(f"127.0.0.1:{port}") as conn:
        start = trio.current_time()
        total = int(rate * seconds)
        while sent < total:
            due = start + sent / rate
            delay = due - trio.current_time()
            if delay > 0:
                await trio.sleep(delay)
            await conn.publish("amq.topic", "bench.rate", f"{time.time() * 1000:.3f} {PAD}")
            sent += 1
        await conn.publish("amq.topic", "bench.rate", f"{time.time() * 1000:.3f} end", confirm=True)
    return sent + 1


async def _blast(port: int, messages: int) -> int:
    async with amqlite.connect(f"127.0.0.1:{port}") as conn:
        for _ in range(messages - 1):
            await conn.publish("amq.topic", "bench.blast", f"{time.time() * 1000:.3f} {PAD}")
        await conn.publish(
            "amq.topic", "bench.blast", f"{time.time() * 1000:.3f} end", confirm=True
        )
    return messages


def _settle(page: Any, expected: int, timeout_s: float) -> None:
    """Until the page has ``expected`` messages (missed ones count) or no new one
    came for 3 s, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    seen, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count, missed = page.evaluate("[window.count, window.missed]")
        if count + missed >= expected:
            return
        if count != seen:
            seen, quiet_since = count, time.monotonic()
        elif time.monotonic() - quiet_since > 3:
            return
        page.wait_for_timeout(100)


def run_channel(page: Any, port: int, channel: str, args: argparse.Namespace) -> dict[str, Any]:
    page.reload()
    assert page.evaluate(PAGE_SETUP, [channel]) == channel
    page.evaluate("window.record = true")
    sent = trio.run(_paced, port, args.rate, args.seconds)
    _settle(page, sent, args.seconds + 30)
    lat, count, missed = page.evaluate("[window.lat, window.count, window.missed]")
    latency = {
        "rate": args.rate,
        "sent": sent,
        "received": count,
        "missed": missed,
        "p50_ms": round(_percentile(lat, 0.50), 1) if lat else None,
        "p99_ms": round(_percentile(lat, 0.99), 1) if lat else None,
        "max_ms": round(max(lat), 1) if lat else None,
    }
    page.evaluate("window.record = false; window.count = 0; window.first = 0; window.missed = 0")
    started = time.monotonic()
    sent = trio.run(_blast, port, args.messages)
    publish_s = time.monotonic() - started
    _settle(page, sent, 120)
    count, first, last, missed = page.evaluate(
        "[window.count, window.first, window.last, window.missed]"
    )
    span = max((last - first) / 1000, 1e-3)
    throughput = {
        "sent": sent,
        "publish_rate": round(sent / publish_s),
        "received": count,
        "missed": missed,
        "page_rate": round(count / span),
    }
    return {"channel": channel, "latency": latency, "throughput": throughput}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="messages/s (default 1000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="of the paced load")
    parser.add_argument("--messages", type=int, default=50_000, help="of the throughput load")
    parser.add_argument("--channels", default="ws,poll", help="default ws,poll")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        chromium = None
    if chromium is None:
        print(f"needs chromium and playwright: {INSTALL}")
        raise SystemExit(2)
    proc, listening = start_broker()
    results = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"http://{listening['http']}/health/live")
            for channel in args.channels.split(","):
                result = run_channel(page, int(listening["port"]), channel, args)
                print(json.dumps(result), flush=True)
                results.append(result)
            browser.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    print("\n| channel | sent at rate | p50 ms | p99 ms | max ms | throughput msg/s | missed |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        lat, thr = r["latency"], r["throughput"]
        print(
            f"| {r['channel']} | {lat['sent']} at {lat['rate']:.0f}/s | {lat['p50_ms']} | "
            f"{lat['p99_ms']} | {lat['max_ms']} | {thr['page_rate']} "
            f"({thr['received']} of {thr['sent']}) | {thr['missed']} |"
        )
    if len(results) == 2:
        ratio = results[1]["throughput"]["page_rate"] / max(
            results[0]["throughput"]["page_rate"], 1
        )
        print(f"\n{results[1]['channel']} / {results[0]['channel']} throughput: {ratio:.2f}")


if __name__ == "__main__":
    main()
