"""Does the management page slow a loaded broker? The same load with and without
the page open in a real browser, on one broker, alternating.

    .venv/bin/python benchmarks/page_under_load.py [--messages 1000000] [--rounds 5]

Starts one broker (``amqlite server --host 127.0.0.1 --port 0 --http-port 0
--in-memory``). Each round runs the load twice, alternating which goes first:
with no page, and with the management page open in headless Chromium (Debian's
``chromium`` driven by Playwright, logged in as guest, in a process of its own;
the page refreshes itself every POLL_MS of ``amqlite/web/app.js``, asking the API
for the overview, queues, exchanges, connections and links). The load: one
publisher and one consumer (prefetch 1000, one ack per message) in this process
over the native protocol, ``--messages`` transient 100-byte messages through one
queue; its rate is messages over the time from the first publish to the last
delivery (about 10 s at the default: five of the page's refreshes). Prints every
run, the medians and the ratio page / no page (issue 19's goal: at least 0.95), as
JSON and a markdown row.

Needs chromium and playwright (``sudo apt-get install -y chromium && pip install
playwright``); says so and exits 2 without them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

import amqlite

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "sudo apt-get install -y chromium && pip install playwright"


def start_broker() -> tuple[subprocess.Popen[str], dict[str, Any]]:
    argv = [sys.executable, "-m", "amqlite", "server", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--http-port", "0", "--in-memory", "--log-format", "json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "server_listening":
            # keep its pipe drained
            subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)
            return proc, record
    raise SystemExit(f"the broker exited before listening (exit {proc.wait()})")


def hold_page(url: str, chromium: str) -> None:
    """In a process of its own: open the page, log in, say 'ready', wait for stdin to close."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.fill("input[name=user]", "guest")
        page.fill("input[name=password]", "guest")
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#main:not([hidden])", timeout=15_000)
        page.wait_for_selector("#queues tr[data-queue='bench.page']", timeout=15_000)
        print("ready", flush=True)
        sys.stdin.read()
        browser.close()


async def one_load(address: str, messages: int) -> float:
    body = b"x" * 100
    async with amqlite.connect(address) as conn:
        await conn.declare_queue("bench.page")
        await conn.purge_queue("bench.page")
        consumer = await conn.consume("bench.page", prefetch=1000)
        done = trio.Event()
        received = 0

        async def consume() -> None:
            nonlocal received
            async for d in consumer:
                await d.ack()
                received += 1
                if received == messages:
                    done.set()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            started = time.perf_counter()
            for _ in range(messages):
                await conn.publish("", "bench.page", body)
            await done.wait()
            elapsed = time.perf_counter() - started
        await consumer.cancel()
    return messages / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hold-page", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if args.hold_page:
        assert chromium is not None
        hold_page(args.hold_page, chromium)
        return
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        chromium = None
    if chromium is None:
        print(f"needs chromium and playwright: {INSTALL}")
        raise SystemExit(2)
    broker, listening = start_broker()
    address, url = f"127.0.0.1:{listening['port']}", f"http://{listening['http']}"
    trio.run(one_load, address, 1000)  # declares the queue the page waits for; warms up
    runs: dict[str, list[float]] = {"no page": [], "page": []}
    try:
        for r in range(args.rounds):
            order = ["no page", "page"] if r % 2 == 0 else ["page", "no page"]
            for what in order:
                page = None
                if what == "page":
                    page = subprocess.Popen(
                        [sys.executable, __file__, "--hold-page", url],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                    )  # fmt: skip
                    assert page.stdout is not None
                    if page.stdout.readline().strip() != "ready":
                        raise SystemExit("the page did not open (see its error above)")
                try:
                    rate = trio.run(one_load, address, args.messages)
                finally:
                    if page is not None:
                        assert page.stdin is not None
                        page.stdin.close()
                        page.wait(30)
                runs[what].append(rate)
                print(f"round {r + 1}/{args.rounds} {what}: {rate:,.0f} msgs/s", file=sys.stderr)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(10)
    no_page, with_page = statistics.median(runs["no page"]), statistics.median(runs["page"])
    ratio = with_page / no_page
    print(json.dumps({
        "messages": args.messages, "rounds": args.rounds,
        "runs_msg_s": {k: [round(v) for v in vs] for k, vs in runs.items()},
        "no_page_msg_s": round(no_page), "page_msg_s": round(with_page),
        "ratio_page_over_no_page": round(ratio, 3),
    }, indent=2))  # fmt: skip
    print("| load | no page (msgs/s) | page open (msgs/s) | page / no page |")
    print("|---|---:|---:|---:|")
    print(
        f"| 1 publisher, 1 consumer, transient | {no_page:,.0f} | {with_page:,.0f} | {ratio:.3f} |"
    )


if __name__ == "__main__":
    main()
