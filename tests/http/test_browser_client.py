"""amqlite.js in headless Chromium (Debian's ``chromium`` driven by Playwright):
a page served from its own origin (a static server on 127.0.0.1 port 0, listed in
``[http] allowed_origins``) imports the client from the broker and subscribes.

- ``amq.topic`` / ``orders.#`` over the WebSocket: 1000 messages from a Python
  publisher arrive in order, and a confirmed publish from the page comes back;
- the same with ``window.WebSocket`` replaced by one that never opens: the client
  falls back to polling (``conn.channel == "poll"``);
- a wrong password and a page from an origin not allowed are refused;
- ``kill -9`` of an HA pair's master while the page consumes a durable queue with
  manual acks: every confirmed message arrives once the page is on the backup.

Skipped, with the install line, without chromium or playwright.
"""

from __future__ import annotations

import http.server
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import amqlite
from amqlite.errors import ConnectionClosed, ConnectionRefused

from ..ports import fixed_port
from .test_browser import WAIT_MS, _chromium, broker

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

PAGE = "<!doctype html><title>amqlite.js test page</title><p>test page</p>\n"
#: what every test page starts with: import the client from the broker
IMPORT = """async ([broker, options]) => {
  const { connect } = await import(broker + "/js/amqlite.js");
  window.got = [];
  try {
    window.conn = await connect(options);
  } catch (error) {
    return "refused: " + error.message;
  }
  return window.conn.channel;
}"""
NEVER_OPENS = """window.WebSocket = class {
  constructor(url) { this.url = url; this.readyState = 0; }
  send() { throw new Error("not open"); }
  close() {}
};"""


@contextmanager
def static_site(directory: Path) -> Iterator[str]:
    """A page's own origin: a static file server on 127.0.0.1 port 0."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "index.html").write_text(PAGE)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(Quiet, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _publish(port: int | str, messages: list[str], *, key: str, exchange: str = "amq.topic",
             persistent: bool = False) -> None:  # fmt: skip
    servers = port if isinstance(port, str) else f"127.0.0.1:{port}"

    async def run() -> None:
        # right after a kill -9 of the master the backup says it is passive (360)
        # until it has heard nothing for failover_timeout_ms: try again, bounded
        with trio.fail_after(WAIT_MS / 1000):
            while True:
                connected = False
                try:
                    async with amqlite.connect(servers) as conn:
                        connected = True
                        for text in messages:
                            await conn.publish(exchange, key.format(text), text, confirm=True,
                                               persistent=persistent)  # fmt: skip
                    return
                except (ConnectionRefused, ConnectionClosed):
                    if connected:
                        raise
                await trio.sleep(0.05)

    trio.run(run)


def _subscribe_topic(page: Any) -> None:
    page.evaluate(
        """async () => {
          await window.conn.subscribe({ exchange: "amq.topic", key: "orders.#" },
                                      (msg) => window.got.push(msg.text));
        }"""
    )


def _thousand_in_order_and_a_confirm_back(page: Any, port: int) -> None:
    sent = [f"order-{n}" for n in range(1000)]
    _publish(port, sent, key="orders.{}")
    page.wait_for_function("window.got.length >= 1000", timeout=WAIT_MS * 2)
    assert page.evaluate("window.got") == sent
    page.evaluate(
        """async () => {
          await window.conn.publish("amq.topic", "orders.page", "from the page",
                                    { confirm: true, headers: { source: "page" } });
        }"""
    )
    page.wait_for_function("window.got.includes('from the page')", timeout=WAIT_MS)


def test_ws_topic_subscription_gets_1000_in_order_and_a_confirm(tmp_path: Path) -> None:
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with (
        static_site(tmp_path / "site") as origin,
        broker("--in-memory", "--http-allow-origin", origin) as (_, listening),
        sync_playwright() as p,
    ):
        url = f"http://{listening['http']}"
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(origin)
            channel = page.evaluate(IMPORT, [url, {"servers": [url]}])
            assert channel == "ws"
            _subscribe_topic(page)
            _thousand_in_order_and_a_confirm_back(page, listening["port"])
            # a wrong password is refused, naming the reason
            refused = page.evaluate(IMPORT, [url, {"servers": [url], "password": "nope"}])
            assert refused.startswith("refused: amqlite: "), refused
            assert "refused" in refused[len("refused: ") :] and "login" in refused.lower()
        finally:
            browser.close()


def test_poll_fallback_when_websockets_never_open(tmp_path: Path) -> None:
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with (
        static_site(tmp_path / "site") as origin,
        broker("--in-memory", "--http-allow-origin", origin) as (_, listening),
        sync_playwright() as p,
    ):
        url = f"http://{listening['http']}"
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.add_init_script(NEVER_OPENS)
            page.goto(origin)
            options = {"servers": [url], "wsTimeout": 500}
            assert page.evaluate(IMPORT, [url, options]) == "poll"
            _subscribe_topic(page)
            _thousand_in_order_and_a_confirm_back(page, listening["port"])
            assert page.evaluate("window.conn.channel") == "poll"
        finally:
            browser.close()


def test_a_page_from_an_origin_not_allowed_is_refused(tmp_path: Path) -> None:
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with (
        static_site(tmp_path / "allowed") as allowed,
        static_site(tmp_path / "other") as other,
        broker("--in-memory", "--http-allow-origin", allowed) as (_, listening),
        sync_playwright() as p,
    ):
        url = f"http://{listening['http']}"
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(other)
            refused = page.evaluate(IMPORT, [url, {"servers": [url]}])
            assert refused.startswith("refused: amqlite: no server let us in"), refused
            assert "(ws)" in refused and "(poll)" in refused
            page.goto(allowed)
            assert page.evaluate(IMPORT, [url, {"servers": [url]}]) == "ws"
        finally:
            browser.close()


def test_kill_9_of_the_master_loses_no_confirmed_message(tmp_path: Path) -> None:
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    ports = {"primary": fixed_port(), "backup": fixed_port()}
    config = tmp_path / "pair.toml"
    config.write_text(
        "[cluster]\n"
        f'primary_peer = "127.0.0.1:{ports["primary"]}"\n'
        f'backup_peer = "127.0.0.1:{ports["backup"]}"\n'
        "heartbeat_ms = 100\nfailover_timeout_ms = 600\n"
    )
    servers = f"127.0.0.1:{ports['primary']},127.0.0.1:{ports['backup']}"

    with static_site(tmp_path / "site") as origin:

        def side(name: str) -> tuple[str, ...]:
            flag = "--is_primary" if name == "primary" else "--is_backup"
            return (
                "--config", str(config), "--port", str(ports[name]),
                "--data-dir", str(tmp_path / name), flag, "1", "--http-allow-origin", origin,
            )  # fmt: skip

        with (
            broker(*side("primary")) as (primary, primary_listening),
            broker(*side("backup")) as (_, backup_listening),
            sync_playwright() as p,
        ):
            urls = [f"http://{primary_listening['http']}", f"http://{backup_listening['http']}"]

            async def declare() -> None:
                async with amqlite.connect(servers) as conn:
                    await conn.declare_queue("web.jobs", durable=True)

            trio.run(declare)
            # the passive node sends browser clients on (360), as it does native ones
            passive = httpx.post(f"{urls[1]}/poll/open", json={}, headers={"origin": origin})
            assert passive.status_code == 503 and passive.json()["code"] == 360
            browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.goto(origin)
                assert page.evaluate(IMPORT, [urls[0], {"servers": urls}]) == "ws"
                page.evaluate(
                    """async () => {
                      window.seen = new Set();
                      window.failovers = [];
                      window.events = [];
                      const conn = window.conn;
                      for (const name of ["failover", "disconnect", "closed", "missed"]) {
                        conn.addEventListener(name, (e) => window.events.push(
                          [name, e.detail.reason || e.detail.server]));
                      }
                      conn.addEventListener("failover", (e) => window.failovers.push(e.detail));
                      await window.conn.subscribe({ queue: "web.jobs" }, (msg) => {
                        window.seen.add(msg.text);
                        msg.ack();
                      }, { ack: "manual", prefetch: 20 });
                      window.topic = await window.conn.subscribe(
                        { exchange: "amq.topic", key: "news.#" }, () => {});
                      window.topicMissed = [];
                      window.topic.addEventListener("missed",
                        (e) => window.topicMissed.push(e.detail.reason));
                    }"""
                )
                before = [f"job-{n}" for n in range(100)]
                after = [f"job-{n}" for n in range(100, 200)]
                _publish(servers, before, key="web.jobs", exchange="", persistent=True)
                page.wait_for_function("window.seen.size >= 50", timeout=WAIT_MS)
                primary.kill()  # kill -9 of the master
                primary.wait()
                _publish(servers, after, key="web.jobs", exchange="", persistent=True)
                try:
                    page.wait_for_function("window.seen.size >= 200", timeout=WAIT_MS * 2)
                except Exception:
                    state = page.evaluate(
                        "JSON.stringify([window.seen.size, window.events, window.conn.server])"
                    )
                    raise AssertionError(f"the page after the failover: {state}") from None
                seen = set(page.evaluate("[...window.seen]"))
                assert seen == set(before + after)
                assert page.evaluate("window.conn.server") == urls[1]
                assert page.evaluate("window.failovers.length") >= 1
                # the { exchange, key } subscription says it may have missed messages
                assert page.evaluate("window.topicMissed")[:1] == ["failover"]
                assert ["missed", "failover"] in page.evaluate("window.events")
            finally:
                browser.close()


def _readme_page() -> str:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## From a web page", 1)[1]
    return section.split("```html\n", 1)[1].split("```", 1)[0]


def test_the_readme_page_works(tmp_path: Path) -> None:
    executable = _chromium()
    from playwright.sync_api import expect, sync_playwright

    site = tmp_path / "site"
    with (
        static_site(site) as origin,
        broker("--in-memory", "--http-allow-origin", origin) as (_, listening),
        sync_playwright() as p,
    ):
        url = f"http://{listening['http']}"
        (site / "orders.html").write_text(_readme_page().replace("http://127.0.0.1:15672", url))
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"{origin}/orders.html")
            expect(page.locator("#status")).to_have_text(
                f"connected to {url} over ws", timeout=WAIT_MS
            )
            _publish(listening["port"], ["order 1", "order 2"], key="orders.eu")
            page.click("#send button")
            log = page.locator("#log li")
            expect(log).to_have_text(
                ["orders.eu: order 1", "orders.eu: order 2", "orders.web: hello from the page"],
                timeout=WAIT_MS,
            )
        finally:
            browser.close()


def test_a_stopped_broker_is_noticed_by_the_pages_heartbeat(tmp_path: Path) -> None:
    """A SIGSTOPped broker never closes the WebSocket: the page's heartbeat notices
    the silence and drops the channel (then reconnects or fails over)."""
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    config = tmp_path / "heartbeat.toml"
    config.write_text("[http]\nws_heartbeat = 0.3\n")
    with (
        static_site(tmp_path / "site") as origin,
        broker("--in-memory", "--config", str(config), "--http-allow-origin", origin) as (
            proc,
            listening,
        ),
        sync_playwright() as p,
    ):
        url = f"http://{listening['http']}"
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(origin)
            assert page.evaluate(IMPORT, [url, {"servers": [url]}]) == "ws"
            page.evaluate(
                """() => {
                  window.reasons = [];
                  window.conn.addEventListener(
                    "disconnect", (e) => window.reasons.push(e.detail.reason));
                }"""
            )
            proc.send_signal(signal.SIGSTOP)
            try:
                page.wait_for_function("window.reasons.length > 0", timeout=WAIT_MS)
            finally:
                proc.send_signal(signal.SIGCONT)
            assert "sent nothing for 0.9" in page.evaluate("window.reasons[0]")
        finally:
            browser.close()
