"""Take docs/management-page.png: an HA pair (site A) peered with a second broker
(site B) over exchange ``events``, some traffic, the active node's management page
in headless Chromium (Debian's chromium + Playwright), one full-page screenshot.

Run: .venv/bin/python scripts/page_screenshot.py [OUT.png]  (needs chromium and
playwright: sudo apt-get install -y chromium && pip install playwright)
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    """A broker with an HTTP listener on a free port; (process, its HTTP URL)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "amqlite", "server", "--http-port", "0", "--log-format", "json",
         *args],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if '"server_listening"' in line:
            subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)
            return proc, f"http://{json.loads(line)['http']}"
    raise SystemExit("a broker did not start")


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "management-page.png"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium: sudo apt-get install -y chromium", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="amqlite-shot-"))
    primary, backup, site_b = free_port(), free_port(), free_port()
    link = 'name = "events"\nmode = "publish"\ntype = "topic"\nlogin = "guest"\npassword = "guest"'
    (tmp / "a.toml").write_text(
        f'[cluster]\nprimary_peer = "127.0.0.1:{primary}"\nbackup_peer = "127.0.0.1:{backup}"\n'
        f'[[cluster_mta]]\nhost = "127.0.0.1:{site_b}"\n{link}\n'
    )
    (tmp / "b.toml").write_text(
        f'[server]\nnode_id = "site-b"\n'
        f'[[cluster_mta]]\nhost = "127.0.0.1:{primary},127.0.0.1:{backup}"\n{link}\n'
    )
    procs = []
    try:
        for args in (
            ("--config", str(tmp / "a.toml"), "--port", str(primary), "--node-id", "site-a-1",
             "--data-dir", str(tmp / "p"), "--is_primary", "1"),
            ("--config", str(tmp / "a.toml"), "--port", str(backup), "--node-id", "site-a-2",
             "--data-dir", str(tmp / "k"), "--is_backup", "1"),
            ("--config", str(tmp / "b.toml"), "--port", str(site_b), "--data-dir", str(tmp / "b")),
        ):  # fmt: skip
            procs.append(start(*args))
        url = procs[0][1]
        api = httpx.Client(base_url=url, auth=("guest", "guest"), timeout=10)
        deadline = time.monotonic() + 20
        while api.put("/api/queues/%2F/orders.eu", json={}).status_code not in (201, 204):
            if time.monotonic() > deadline:
                raise SystemExit("site A's primary did not become active")
            time.sleep(0.2)
        for name, key in (("orders.eu", "eu.*"), ("orders.us", "us.*"), ("audit", "#")):
            api.put(f"/api/queues/%2F/{name}", json={"durable": True})
            api.post(f"/api/bindings/%2F/e/events/q/{name}", json={"routing_key": key})
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1440, "height": 1100})
            page.goto(url)
            page.fill("input[name=user]", "guest")
            page.fill("input[name=password]", "guest")
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("#main:not([hidden])")
            for step in range(40):  # about 20 s of traffic for the charts
                for n in range(step % 9 + 1):
                    api.post(
                        "/api/exchanges/%2F/events/publish",
                        json={
                            "routing_key": f"{'eu' if n % 2 else 'us'}.new",
                            "payload": f"order {step}.{n}",
                            "properties": {"delivery_mode": 2},
                        },
                    )
                if step % 4 == 3:
                    api.post(
                        "/api/queues/%2F/audit/get",
                        json={"count": 12, "ackmode": "ack_requeue_false"},
                    )
                time.sleep(0.5)
            page.screenshot(path=str(out), full_page=True)
            browser.close()
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
