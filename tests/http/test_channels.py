"""The browser channels of a real broker process: ``/ws`` and ``/poll`` (docs/browser.md).

Bad JSON, unknown methods, no session, a session token used from another origin, a
huge message, a wrong password and a refused origin, for both channels; a slow page's
oldest transient messages dropped with a notice; an idle poll session ending.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ..e2e.procs import ServerProcess, start_server
from .test_browser import broker
from .wsclient import Rejected, WsClient

pytestmark = pytest.mark.e2e

APP = "http://app.example"
OTHER = "http://evil.example"
CONFIG = f"""
[http]
allowed_origins = ["{APP}"]
poll_idle = 1.0

[server]
max_frame_bytes = 65536
"""


class Node:
    def __init__(self, http: str, server: ServerProcess | None = None) -> None:
        self.url = f"http://{http}"
        self.port = int(http.rpartition(":")[2])
        self.server = server  # the broker process, when the test has its own

    def client(self, origin: str | None = APP) -> httpx.AsyncClient:
        headers = {"origin": origin} if origin else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=10)


@pytest.fixture(scope="module")
def shared_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One broker process for the tests that need nothing of their own."""
    config = tmp_path_factory.mktemp("channels") / "amqlite.toml"
    config.write_text(CONFIG)
    with broker("--config", str(config), "--in-memory") as (_, listening):
        yield str(listening["http"])


@pytest.fixture
def node(shared_http: str) -> Node:
    return Node(shared_http)


@asynccontextmanager
async def own_node(tmp_path: Path, *args: str, http: str = "") -> AsyncIterator[Node]:
    """A broker process of the test's own; ``http``: more ``[http]`` settings."""
    config = tmp_path / "amqlite.toml"
    config.write_text(CONFIG.replace("[http]\n", f"[http]\n{http}\n"))
    server = await start_server("--config", str(config), "--http-port", "0", *args)
    try:
        yield Node(str(server.log_lines[-1]["http"]), server)
    finally:
        if server.proc.returncode is None:
            server.proc.send_signal(signal.SIGTERM)
            with trio.fail_after(10):
                await server.proc.wait()


# --- the WebSocket ------------------------------------------------------------------


async def test_ws_publish_with_confirm_and_consume(node: Node) -> None:
    ws = await WsClient.connect(node.port, origin=APP)
    welcome = await ws.hello()
    assert welcome["m"] == "welcome" and welcome["re"] == 1 and welcome["state"] == "standalone"
    await ws.send({"m": "queue.declare", "id": 2, "queue": "web.q"})
    assert (await ws.recv())["re"] == 2
    await ws.send({"m": "consume", "id": 3, "queue": "web.q"})
    ok = await ws.recv()
    assert ok["m"] == "ok" and ok["re"] == 3
    tag = ok["info"]["tag"]
    await ws.send(
        [
            {"m": "publish", "id": 4, "exchange": "", "key": "web.q", "body": "héllo",
             "confirm": True, "headers": {"n": 1}},
            {"m": "publish", "id": 5, "exchange": "", "key": "web.q", "body64": "AP8=",
             "confirm": True},
        ]
    )  # fmt: skip
    got = [await ws.recv() for _ in range(4)]
    oks = sorted(f["re"] for f in got if f["m"] == "ok")
    delivers = [f for f in got if f["m"] == "deliver"]
    assert oks == [4, 5]
    assert [d.get("body") or d.get("body64") for d in delivers] == ["héllo", "AP8="]
    assert delivers[0]["headers"] == {"n": 1} and delivers[0]["ctag"] == tag
    # the consumer has acks and a credit: ack both, then nothing is left
    for d in delivers:
        await ws.send({"m": "ack", "id": 9, "dtag": d["dtag"]})
    await ws.send({"m": "queue.declare", "id": 10, "queue": "web.q", "passive": True})
    declared = await ws.recv_until("ok")
    assert declared["info"]["messages"] == 0
    await ws.aclose()


async def test_ws_bad_json_and_unknown_method_fail_that_frame_only(node: Node) -> None:
    ws = await WsClient.connect(node.port)
    assert (await ws.hello())["m"] == "welcome"
    await ws.send_text("{not json")
    error = await ws.recv()
    assert error["m"] == "error" and error["code"] == 502 and error.get("re") is None
    await ws.send({"m": "frobnicate", "id": 7})
    error = await ws.recv()
    assert (error["m"], error["re"], error["code"]) == ("error", 7, 540)
    await ws.send({"m": "publish", "id": 8, "exchange": "", "key": "k"})
    error = await ws.recv()
    assert (error["re"], error["code"]) == (8, 502) and "body" in error["text"]
    await ws.send({"m": "hello", "id": 9})  # the handshake is over
    assert (await ws.recv())["code"] == 540
    await ws.send({"m": "queue.declare", "id": 11, "queue": ""})  # still usable
    assert (await ws.recv())["m"] == "ok"
    await ws.aclose()


async def test_ws_cbor_binary_frames(node: Node) -> None:
    import cbor2

    ws = await WsClient.connect(node.port)
    assert (await ws.hello())["m"] == "welcome"
    await ws.send_bytes(cbor2.dumps({"m": "queue.declare", "id": 2, "queue": "bin.q"}))
    assert (await ws.recv())["re"] == 2
    frame = {"m": "publish", "id": 3, "exchange": "", "key": "bin.q", "body": b"\xff\x01",
             "confirm": True}  # fmt: skip
    await ws.send_bytes(cbor2.dumps(frame))
    assert (await ws.recv())["re"] == 3
    await ws.send({"m": "get", "id": 4, "queue": "bin.q", "no_ack": True})
    got = await ws.recv()
    assert got["m"] == "get-ok" and got["body64"] == "/wE="
    await ws.aclose()


async def test_ws_wrong_password_is_refused(node: Node) -> None:
    ws = await WsClient.connect(node.port)
    refused = await ws.hello(password="wrong")
    assert refused["m"] == "refused" and refused["code"] == 403
    assert await ws.recv() is None and ws.closed == 1008


async def test_ws_request_before_hello_is_refused(node: Node) -> None:
    ws = await WsClient.connect(node.port)
    await ws.send({"m": "queue.declare", "id": 1, "queue": "x"})
    refused = await ws.recv()
    assert refused["m"] == "refused" and "hello" in refused["text"]


async def test_ws_from_a_disallowed_origin_is_refused(node: Node) -> None:
    with pytest.raises(Rejected) as info:
        await WsClient.connect(node.port, origin=OTHER)
    assert info.value.status == 403
    # its own origin always may
    ws = await WsClient.connect(node.port, origin=node.url)
    assert (await ws.hello())["m"] == "welcome"
    await ws.aclose()


async def test_ws_heartbeats_both_ways_and_a_silent_page_is_dropped(tmp_path: Path) -> None:
    async with own_node(tmp_path, http="ws_heartbeat = 0.2") as node:
        ws = await WsClient.connect(node.port, origin=APP)
        welcome = await ws.hello()
        assert welcome["m"] == "welcome" and welcome["heartbeat"] == 0.2
        with trio.fail_after(10):
            # the broker says it lives when it has nothing else to say; a page that
            # answers in kind stays, for five periods (past the 0.6 s of silence
            # that would end it)
            for _ in range(5):
                assert (await ws.recv())["m"] == "heartbeat"
                await ws.send({"m": "heartbeat"})
            await ws.send({"m": "queue.declare", "id": 2, "queue": ""})
            assert (await ws.recv_until("ok"))["re"] == 2
            # then the page goes silent: the broker ends the session and says why
            closing = await ws.recv_until("close")
        assert closing is not None and closing["code"] == 320
        assert "heartbeat" in closing["text"]
        await ws.aclose()


async def test_ws_huge_message_closes_that_channel_only(node: Node) -> None:
    ws = await WsClient.connect(node.port)
    assert (await ws.hello())["m"] == "welcome"
    body = "x" * (3 * 65536)  # past 2 x max_frame_bytes
    await ws.send({"m": "publish", "id": 2, "exchange": "", "key": "k", "body": body})
    assert await ws.recv() is None
    assert ws.closed == 1009  # message too big
    other = await WsClient.connect(node.port)
    assert (await other.hello())["m"] == "welcome"
    await other.aclose()


# --- long polling ------------------------------------------------------------------


async def _open(http: httpx.AsyncClient, password: str = "guest") -> httpx.Response:
    return await http.post("/poll/open", json={"login": "guest", "password": password})


async def _recv(http: httpx.AsyncClient, token: str, ack: int, wait: float = 5) -> Any:
    response = await http.get(
        "/poll/recv", params={"ack": ack, "wait": wait}, headers={"x-amqlite-session": token}
    )
    assert response.status_code == 200, response.text
    return response.json()


async def _frames_until(http: httpx.AsyncClient, token: str, count: int) -> tuple[list[Any], int]:
    frames: list[Any] = []
    last = 0
    with trio.fail_after(20):
        while len(frames) < count:
            answer = await _recv(http, token, last)
            frames += answer["frames"]
            last = answer["last"]
    return frames, last


async def test_poll_publish_confirm_and_consume_with_cors(node: Node) -> None:
    async with node.client() as http:
        opened = await _open(http)
        assert opened.status_code == 200
        assert opened.headers["access-control-allow-origin"] == APP
        welcome = opened.json()
        token = welcome["session"]
        assert "password" not in json.dumps(welcome)
        send = {"x-amqlite-session": token}
        frames = [
            {"m": "queue.declare", "id": 1, "queue": "poll.q"},
            {"m": "consume", "id": 2, "queue": "poll.q", "no_ack": True},
            *({"m": "publish", "id": 3 + n, "exchange": "", "key": "poll.q",
               "body": f"m{n}", "confirm": True} for n in range(5)),
        ]  # fmt: skip
        sent = await http.post("/poll/send", json=frames, headers=send)
        assert sent.status_code == 204
        assert sent.headers["access-control-allow-origin"] == APP
        got, last = await _frames_until(http, token, 12)
        assert [f["body"] for f in got if f["m"] == "deliver"] == [f"m{n}" for n in range(5)]
        assert sorted(f["re"] for f in got if f["m"] == "ok") == list(range(1, 8))
        # an answer not acknowledged comes again; an acknowledged one does not
        again = await _recv(http, token, last - 2, wait=0)
        assert len(again["frames"]) == 2
        assert (await _recv(http, token, last, wait=0))["frames"] == []
        closed = await http.post("/poll/close", headers=send)
        assert closed.status_code == 204
        after = await http.get("/poll/recv", headers=send)
        assert after.status_code == 401


async def test_poll_preflight_and_refused_origins(node: Node) -> None:
    async with node.client() as http:
        pre = await http.options(
            "/poll/send",
            headers={"access-control-request-method": "POST",
                     "access-control-request-headers": "x-amqlite-session"},
        )  # fmt: skip
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == APP
        assert "x-amqlite-session" in pre.headers["access-control-allow-headers"]
    async with node.client(OTHER) as evil:
        for response in (await evil.options("/poll/open"), await _open(evil)):
            assert response.status_code == 403
            assert "access-control-allow-origin" not in response.headers


async def test_poll_wrong_password_no_session_bad_json_and_unknown_method(node: Node) -> None:
    async with node.client() as http:
        refused = await _open(http, password="wrong")
        assert refused.status_code == 403 and refused.json()["code"] == 403
        no_session = await http.post("/poll/send", json={"m": "status", "id": 1})
        assert no_session.status_code == 401 and "open" in no_session.json()["reason"]
        unknown = await http.get("/poll/recv", headers={"x-amqlite-session": "made-up"})
        assert unknown.status_code == 401
        token = (await _open(http)).json()["session"]
        send = {"x-amqlite-session": token}
        bad = await http.post("/poll/send", content=b"{nope", headers=send)
        assert bad.status_code == 400 and bad.json()["error"] == "bad_request"
        unknown_method = await http.post("/poll/send", json={"m": "nope", "id": 5}, headers=send)
        assert unknown_method.status_code == 204
        (error,), _ = await _frames_until(http, token, 1)
        assert (error["m"], error["re"], error["code"]) == ("error", 5, 540)


async def test_poll_token_stolen_by_a_page_from_another_origin(node: Node) -> None:
    async with node.client() as http, node.client(node.url) as own:
        token = (await _open(http)).json()["session"]
        # the broker's own origin is allowed, but the session was opened from APP
        stolen = await own.get("/poll/recv", params={"wait": 0},
                               headers={"x-amqlite-session": token})  # fmt: skip
        assert stolen.status_code == 403
        assert "another origin" in stolen.json()["reason"]
        assert (await _recv(http, token, 0, wait=0))["frames"] == []


async def test_poll_huge_body_is_413(node: Node) -> None:
    async with node.client() as http:
        token = (await _open(http)).json()["session"]
        frame = {"m": "publish", "id": 1, "exchange": "", "key": "k", "body": "x" * 200_000}
        huge = await http.post("/poll/send", json=frame, headers={"x-amqlite-session": token})
        assert huge.status_code == 413
        # the unread rest of the body ends that connection, and the reply says so (else
        # the client's next request may go into the close: "Server disconnected")
        assert huge.headers["connection"] == "close"
        assert (await _recv(http, token, 0, wait=0))["frames"] == []  # the session lives


async def test_poll_session_expires_when_idle(tmp_path: Path) -> None:
    async with own_node(tmp_path, "--in-memory") as node, node.client() as http:
        assert node.server is not None
        token = (await _open(http)).json()["session"]
        # left alone (a poll would keep it), the broker ends it past poll_idle (1 s)
        ended = await node.server.read_log_until("poll_session_ended", deadline_s=10)
        assert ended["why"] == "expired"
        response = await http.get(
            "/poll/recv", params={"wait": 0}, headers={"x-amqlite-session": token}
        )
        assert response.status_code == 401
        assert "expired" in response.json()["reason"]


async def test_a_slow_page_loses_its_oldest_transient_messages_with_a_notice(
    node: Node,
) -> None:
    async with node.client() as http:
        token = (await _open(http)).json()["session"]
        send = {"x-amqlite-session": token}
        setup = [
            {"m": "queue.declare", "id": 1, "queue": "", "exclusive": True},
        ]
        await http.post("/poll/send", json=setup, headers=send)
        (declared,), last = await _frames_until(http, token, 1)
        queue = declared["info"]["queue"]
        await http.post(
            "/poll/send",
            json={"m": "consume", "id": 2, "queue": queue, "no_ack": True},
            headers=send,
        )
        # 6 MiB for a page that does not poll: past the outbox's 4 MiB
        body = "y" * 30_000
        for batch in range(70):
            frames = [
                {"m": "publish", "id": 100 + batch * 3 + n, "exchange": "", "key": queue,
                 "body": body} for n in range(3)
            ]  # fmt: skip
            assert (await http.post("/poll/send", json=frames, headers=send)).status_code == 204
        got: list[Any] = []
        with trio.fail_after(20):
            while not any(f["m"] == "dropped" for f in got):
                answer = await _recv(http, token, last, wait=1)
                got += answer["frames"]
                last = answer["last"]
        notice = next(f for f in got if f["m"] == "dropped")
        assert notice["count"] > 0 and notice["total"] >= notice["count"]


async def test_the_management_api_lists_and_closes_browser_sessions(tmp_path: Path) -> None:
    async with own_node(tmp_path, "--in-memory") as node:
        await _list_and_close(node)


async def _list_and_close(node: Node) -> None:
    from urllib.parse import quote

    ws = await WsClient.connect(node.port)
    assert (await ws.hello())["m"] == "welcome"
    async with node.client() as http:
        token = (await _open(http)).json()["session"]
    async with httpx.AsyncClient(base_url=node.url, auth=("guest", "guest")) as api:
        listed = (await api.get("/api/connections")).json()
        by_protocol = {c["protocol"]: c for c in listed}
        assert set(by_protocol) == {"amqlite WebSocket", "amqlite long polling"}
        assert all(c["user"] == "guest" for c in listed)
        for conn in listed:
            closed = await api.delete(
                f"/api/connections/{quote(conn['name'], safe='')}", headers={"x-reason": "bye"}
            )
            assert closed.status_code == 204
        assert (await api.get("/api/connections")).json() == []
    close = await ws.recv_until("close")
    assert (close["code"], close["text"]) == (320, "bye")
    assert await ws.recv() is None and ws.closed == 1001
    async with node.client() as http:
        (close,), _ = await _frames_until(http, token, 1)
        assert close["m"] == "close" and close["code"] == 320
        gone = await http.get("/poll/recv", headers={"x-amqlite-session": token})
        assert gone.status_code == 401


async def test_a_slow_page_with_nothing_to_drop_pauses_its_session_and_loses_nothing(
    tmp_path: Path,
) -> None:
    async with own_node(tmp_path, "--data-dir", str(tmp_path / "data")) as node:
        await _slow_page_nothing_to_drop(node)


async def _slow_page_nothing_to_drop(node: Node) -> None:
    async with node.client() as http:
        token = (await _open(http)).json()["session"]
        send = {"x-amqlite-session": token}
        setup = [
            {"m": "queue.declare", "id": 1, "queue": "slow.q", "durable": True},
            {"m": "consume", "id": 2, "queue": "slow.q", "no_ack": True},
        ]
        await http.post("/poll/send", json=setup, headers=send)
        _, last = await _frames_until(http, token, 2)
        # 6 MiB of persistent messages on a durable queue (journaled: never dropped)
        body = "z" * 30_000
        for batch in range(70):
            frames = [
                {"m": "publish", "id": 100 + batch * 3 + n, "exchange": "", "key": "slow.q",
                 "body": f"{batch * 3 + n} {body}", "props": {"persistent": True}}
                for n in range(3)
            ]  # fmt: skip
            sent = await http.post("/poll/send", json=frames, headers=send)
            assert sent.status_code == 204
        # the session stopped taking deliveries: the rest wait in the queue
        async with httpx.AsyncClient(base_url=node.url, auth=("guest", "guest")) as api:
            with trio.fail_after(10):
                while True:
                    queue = (await api.get("/api/queues/%2F/slow.q")).json()
                    if queue["messages_ready"] > 0:
                        break
        got: list[Any] = []
        with trio.fail_after(30):
            while len([f for f in got if f["m"] == "deliver"]) < 210:
                answer = await _recv(http, token, last, wait=1)
                got += answer["frames"]
                last = answer["last"]
        numbers = [int(f["body"].split()[0]) for f in got if f["m"] == "deliver"]
        assert numbers == list(range(210))
        assert not [f for f in got if f["m"] == "dropped"]
