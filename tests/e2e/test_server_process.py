"""The broker as a real process: start, serve, stop on SIGTERM, refuse bad configs."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest
import trio

from amqlite.errors import ReplyCode
from amqlite.protocol import events as ev

from ..server.rawclient import RawClient
from .procs import run_cli, start_server

pytestmark = pytest.mark.e2e


async def test_sigterm_closes_clients_with_320_and_exits_0() -> None:
    server = await start_server()
    try:
        client = await RawClient.connect(server.port)
        assert isinstance(await client.handshake(), ev.Welcome)
        assert isinstance(await client.request(ev.QueueDeclare, queue="q"), ev.Ok)
        server.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            close = await client.receive_until(ev.Close)
        assert isinstance(close, ev.Close)
        assert close.code == ReplyCode.CONNECTION_FORCED
        await client.send(ev.CloseOk())
        with trio.fail_after(10):
            status = await server.proc.wait()
        assert status == 0
        await server.read_log_until("server_stopped")
    finally:
        if server.proc.returncode is None:
            server.proc.kill()
            await server.proc.wait()


async def test_wrong_password_is_logged(tmp_path: Path) -> None:
    server = await start_server()
    try:
        client = await RawClient.connect(server.port)
        reply = await client.handshake(login="guest", password="nope")
        assert isinstance(reply, ev.Refused)
        assert reply.code == ReplyCode.ACCESS_REFUSED
        record = await server.read_log_until("connection_refused")
        assert record["login"] == "guest"
    finally:
        server.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            await server.proc.wait()


BAD_CONFIGS = [
    pytest.param("[server]\nport = 'x'\n", "server.port", id="wrong-type"),
    pytest.param("[server]\nprot = 5555\n", "server.prot", id="unknown-key"),
    pytest.param("[server\n", "", id="toml-syntax"),
]


@pytest.mark.parametrize(("text", "key"), BAD_CONFIGS)
def test_bad_config_exits_2_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = run_cli("server", "--config", str(path))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"config error: {key}")


def test_port_in_use_is_one_clear_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("server", "--host", "127.0.0.1", "--port", str(port))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_amqp_port_in_use_is_one_clear_line_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "server", "--host", "127.0.0.1", "--port", "0", "--in-memory", "--amqp-port", str(port)
        )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert f"cannot listen on AMQP 127.0.0.1:{port}" in lines[0]
    assert "--amqp-port" in lines[0]
