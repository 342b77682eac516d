"""Opening connections: handshake, refusals, failover order, timeouts."""

from __future__ import annotations

import pytest
import trio

import amqlite
from amqlite.errors import ConnectionClosed, ConnectionRefused, ReplyCode

from .fakeserver import FakeBroker


async def _start(nursery: trio.Nursery, **knobs: object) -> FakeBroker:
    broker = FakeBroker(**knobs)  # type: ignore[arg-type]
    await nursery.start(broker.serve)
    return broker


async def _dead_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


async def test_handshake_welcome(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(
        addr, vhost="/", login="bob", password="pw", client_name="tests", heartbeat=7
    ) as conn:
        assert conn.is_open
        assert conn.server_name == "fake"
        assert conn.server_state == "standalone"
        assert str(conn.address) == addr
    hello = fake.sessions[0].client_hello
    assert hello is not None
    assert (hello.vhost, hello.login, hello.password, hello.client) == ("/", "bob", "pw", "tests")
    assert hello.heartbeat == 7.0
    assert type(fake.frames[-1]).__name__ == "Close"
    assert not conn.is_open


async def test_refusal_is_final_and_names_the_reason(nursery: trio.Nursery) -> None:
    bad = await _start(nursery, refuse=ReplyCode.ACCESS_REFUSED)
    good = await _start(nursery)
    servers = f"127.0.0.1:{bad.port},127.0.0.1:{good.port}"
    with pytest.raises(ConnectionRefused) as info:
        async with amqlite.connect(servers):
            pass  # pragma: no cover
    assert info.value.code == ReplyCode.ACCESS_REFUSED
    assert f"127.0.0.1:{bad.port}" in str(info.value)
    assert good.connects == 0  # a bad login is the same everywhere: no failover


async def test_failover_skips_a_dead_address(nursery: trio.Nursery) -> None:
    good = await _start(nursery, name="second")
    dead = await _dead_port()
    async with amqlite.connect(f"127.0.0.1:{dead},127.0.0.1:{good.port}") as conn:
        assert conn.server_name == "second"
        assert conn.address.port == good.port


async def test_failover_skips_a_passive_node(nursery: trio.Nursery) -> None:
    passive = await _start(nursery, refuse=ReplyCode.NOT_ACTIVE, name="passive")
    active = await _start(nursery, name="active")
    third = await _start(nursery, name="third")
    servers = f"127.0.0.1:{passive.port},127.0.0.1:{active.port},127.0.0.1:{third.port}"
    async with amqlite.connect(servers) as conn:
        assert conn.server_name == "active"
    assert passive.connects == 1
    assert third.connects == 0  # tried in order, stopped at the first welcome


async def test_all_failing_lists_every_address(nursery: trio.Nursery) -> None:
    passive = await _start(nursery, refuse=ReplyCode.NOT_ACTIVE)
    dead = await _dead_port()
    with pytest.raises(ConnectionRefused) as info:
        async with amqlite.connect(f"127.0.0.1:{dead},127.0.0.1:{passive.port}"):
            pass  # pragma: no cover
    text = str(info.value)
    assert f"127.0.0.1:{dead} (connection refused)" in text
    assert f"127.0.0.1:{passive.port} (passive HA node" in text
    assert info.value.code == ReplyCode.NOT_ACTIVE


async def test_nothing_reachable_is_connection_closed() -> None:
    dead = await _dead_port()
    with pytest.raises(ConnectionClosed, match=f"cannot connect to 127.0.0.1:{dead} "):
        async with amqlite.connect(f"127.0.0.1:{dead}"):
            pass  # pragma: no cover


async def test_silent_listener_times_out_then_next(nursery: trio.Nursery) -> None:
    """A server that accepts and never answers costs connect_timeout, then failover."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    mute_port = listeners[0].socket.getsockname()[1]

    async def accept_and_sit(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    nursery.start_soon(trio.serve_listeners, accept_and_sit, listeners)
    good = await _start(nursery)
    with trio.fail_after(5):
        async with amqlite.connect(
            f"127.0.0.1:{mute_port},127.0.0.1:{good.port}", connect_timeout=0.2
        ) as conn:
            assert conn.address.port == good.port
    with trio.fail_after(5), pytest.raises(ConnectionClosed, match=r"no answer within 0\.2s"):
        async with amqlite.connect(f"127.0.0.1:{mute_port}", connect_timeout=0.2):
            pass  # pragma: no cover


async def test_bad_server_list_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="port must be a number"):
        async with amqlite.connect("127.0.0.1:abc"):
            pass  # pragma: no cover


async def test_body_exception_is_not_wrapped(fake: FakeBroker, addr: str) -> None:
    with pytest.raises(KeyError):
        async with amqlite.connect(addr):
            raise KeyError("mine")
    assert type(fake.frames[-1]).__name__ == "Close"
