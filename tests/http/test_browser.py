"""The management page in headless Chromium (Debian's ``chromium`` driven by
Playwright with that system browser): log in, see a queue's depth change after a
publish, purge it from the page, and see an HA pair's states flip after a kill -9
of the master. Skipped, with the install line, where either is missing.

Each test starts real broker processes on 127.0.0.1 port 0. The overview's
screenshot lands in the test's tmp dir (``scripts/page_screenshot.py`` makes the
one in docs/).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..e2e.procs import amqlite_argv, checkout_env
from ..ports import fixed_port

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

INSTALL = "sudo apt-get install -y chromium && pip install playwright"
WAIT_MS = 15_000


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip(f"no chromium on this machine: {INSTALL}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip(f"playwright is not installed: {INSTALL}")
    return path


@contextmanager
def broker(*args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """A broker process with an HTTP listener; (process, its server_listening line)."""
    proc = subprocess.Popen(
        amqlite_argv(
            "server", "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
            "--log-format", "json", *args,
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=checkout_env(),
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "server_listening":
                break
        else:
            raise AssertionError("the broker exited before listening")
        # keep its pipe drained
        drain = subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)
        try:
            yield proc, record
        finally:
            drain.kill()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _log_in(page: Any, url: str) -> None:
    page.goto(url)
    page.fill("input[name=user]", "guest")
    page.fill("input[name=password]", "guest")
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#main:not([hidden])", timeout=WAIT_MS)


def test_log_in_see_a_depth_change_and_purge_from_the_page(tmp_path: Path) -> None:
    executable = _chromium()
    from playwright.sync_api import expect, sync_playwright

    with broker("--in-memory") as (_, listening), sync_playwright() as p:
        url = f"http://{listening['http']}"
        api = httpx.Client(base_url=url, auth=("guest", "guest"))
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            expect(page.locator("#login")).to_be_visible()
            page.fill("input[name=user]", "guest")
            page.fill("input[name=password]", "wrong")
            page.click("#login-form button[type=submit]")
            expect(page.locator("#login")).to_be_visible()  # refused: still the form
            _log_in(page, url)
            expect(page.locator("#node-state")).to_have_text("standalone", timeout=WAIT_MS)

            assert api.put("/api/queues/%2F/web.q", json={}).status_code == 201
            row = page.locator("#queues tr[data-queue='web.q']")
            expect(row.locator("td.ready")).to_have_text("0", timeout=WAIT_MS)
            for n in range(3):
                published = api.post(
                    "/api/exchanges/%2F/amq.default/publish",
                    json={"routing_key": "web.q", "payload": f"m{n}"},
                )
                assert published.json() == {"routed": True}
            expect(row.locator("td.ready")).to_have_text("3", timeout=WAIT_MS)
            page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)

            row.get_by_role("button", name="Purge").click()
            expect(row.locator("td.ready")).to_have_text("0", timeout=WAIT_MS)
            assert api.get("/api/queues/%2F/web.q").json()["messages"] == 0
        finally:
            browser.close()
            api.close()
    assert (tmp_path / "overview.png").stat().st_size > 10_000


def test_the_ha_pair_drawing_flips_after_a_kill_9_of_the_master(tmp_path: Path) -> None:
    executable = _chromium()
    from playwright.sync_api import expect, sync_playwright

    ports = {"primary": fixed_port(), "backup": fixed_port()}
    config = tmp_path / "pair.toml"
    config.write_text(
        "[cluster]\n"
        f'primary_peer = "127.0.0.1:{ports["primary"]}"\n'
        f'backup_peer = "127.0.0.1:{ports["backup"]}"\n'
        "heartbeat_ms = 100\nfailover_timeout_ms = 600\n"
    )

    def side(name: str) -> tuple[str, ...]:
        flag = "--is_primary" if name == "primary" else "--is_backup"
        return (
            "--config", str(config), "--port", str(ports[name]),
            "--data-dir", str(tmp_path / name), flag, "1",
        )  # fmt: skip

    with (
        broker(*side("primary")) as (primary, _),
        broker(*side("backup")) as (_, backup_listening),
        sync_playwright() as p,
    ):
        url = f"http://{backup_listening['http']}"
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _log_in(page, url)
            drawing = page.locator("#ha-drawing")
            expect(page.locator("#node-state")).to_have_text("passive", timeout=WAIT_MS)
            expect(drawing).to_contain_text("state: passive", timeout=WAIT_MS)
            expect(drawing).to_contain_text("state: active")  # the peer
            primary.kill()  # kill -9
            primary.wait()
            # a change asks for service: the client vote that promotes the backup
            # (refused with a notice until the backup sees the primary silent: try again)
            page.fill("#queue-form input[name=name]", "after.failover")
            for _ in range(15):
                page.click("#queue-form button[type=submit]")
                try:
                    expect(page.locator("#node-state")).to_have_text("active", timeout=2000)
                    break
                except AssertionError:
                    continue
            expect(page.locator("#node-state")).to_have_text("active")
            expect(drawing).to_contain_text("state: active")
            expect(drawing).to_contain_text("peer silent")
            expect(page.locator("#queues")).to_contain_text("after.failover")
        finally:
            browser.close()
