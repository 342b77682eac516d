"""TLS listeners in-process with real TLS streams: the amqlite client over
``amqlites://``, verification failures named, plain-text on a TLS port and TLS on a
plain port refused with a reason, a slow handshake costing only its own socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

import amqlite
from amqlite.config import load_config
from amqlite.errors import ConnectionClosed, ConnectionRefused, ReplyCode
from amqlite.server import BrokerNode
from amqlite.server.tls_accept import accept_tls
from amqlite.tls import server_context

from ..tls_certs import TlsFiles


async def _start(nursery: trio.Nursery, **overrides: Any) -> BrokerNode:
    base = {"server.host": "127.0.0.1", "server.port": 0, "storage.persist": False}
    node = BrokerNode(load_config(overrides=base | overrides))
    await nursery.start(node.run)
    return node


def _tls(files: TlsFiles, cert: Any = None, key: Any = None, **more: Any) -> dict[str, Any]:
    return {
        "server.tls": True,
        "tls.cert": str(cert or files.cert),
        "tls.key": str(key or files.key),
        "tls.ca": str(files.ca),
    } | more


@pytest.fixture
async def tls_node(nursery: trio.Nursery, tls_files: TlsFiles) -> AsyncIterator[BrokerNode]:
    node = await _start(nursery, **_tls(tls_files))
    yield node
    node.stop()


async def test_a_client_publishes_and_gets_over_tls(
    tls_node: BrokerNode, tls_files: TlsFiles
) -> None:
    with trio.fail_after(10):
        url = f"amqlites://127.0.0.1:{tls_node.port}"
        async with amqlite.connect(url, ca=str(tls_files.ca), reconnect=False) as conn:
            await conn.declare_queue("q")
            await conn.publish("", "q", b"over tls", confirm=True)
            got = await conn.get("q", no_ack=True)
            assert got is not None and got.body == b"over tls"
        # tls=True does the same for plain host:port entries
        async with amqlite.connect(
            f"localhost:{tls_node.port}", tls=True, ca=str(tls_files.ca), reconnect=False
        ) as conn:
            assert (await conn.get("q", no_ack=True)) is None


async def test_status_says_where_tls_is_in_force(
    nursery: trio.Nursery, tls_files: TlsFiles
) -> None:
    """``status`` ``tls``: each listener (``amqp`` null without one) and the rules;
    each client connection's line says whether it came over TLS."""
    plain = await _start(nursery)
    assert plain.status()["tls"] == {
        "native": False,
        "amqp": None,
        "verify": "peer",
        "min_version": "1.2",
    }
    async with amqlite.connect(f"127.0.0.1:{plain.port}", reconnect=False) as conn:
        (line,) = (await conn.status())["connections"]
        assert line["tls"] is False
    node = await _start(
        nursery,
        **_tls(tls_files, **{"amqp.port": 0, "tls.verify": "mutual", "tls.min_version": "1.3"}),
    )
    url = f"amqlites://localhost:{node.port}"
    ca, cert = str(tls_files.ca), str(tls_files.client_cert)
    async with amqlite.connect(url, ca=ca, cert=cert, reconnect=False) as conn:
        status = await conn.status()
    assert status["tls"] == {
        "native": True,
        "amqp": False,
        "verify": "mutual",
        "min_version": "1.3",
    }
    (line,) = status["connections"]
    assert line["tls"] is True
    plain.stop()
    node.stop()


async def _refusal(url: str, **kwargs: Any) -> ConnectionClosed | ConnectionRefused:
    with trio.fail_after(10):
        with pytest.raises((ConnectionClosed, ConnectionRefused)) as info:
            async with amqlite.connect(url, reconnect=False, connect_timeout=5, **kwargs):
                pass
    err = info.value
    assert isinstance(err, ConnectionClosed | ConnectionRefused)
    return err


async def test_a_wrong_ca_is_a_clear_error(tls_node: BrokerNode, tls_files: TlsFiles) -> None:
    err = await _refusal(f"amqlites://127.0.0.1:{tls_node.port}", ca=str(tls_files.other_ca))
    assert isinstance(err, ConnectionClosed)
    assert "TLS: certificate verify failed: unable to get local issuer certificate" in str(err)


async def test_a_wrong_hostname_is_a_clear_error(
    nursery: trio.Nursery, tls_files: TlsFiles
) -> None:
    node = await _start(
        nursery, **_tls(tls_files, tls_files.wrong_host_cert, tls_files.wrong_host_key)
    )
    err = await _refusal(f"amqlites://localhost:{node.port}", ca=str(tls_files.ca))
    assert "TLS: certificate verify failed: Hostname mismatch" in str(err)
    assert "not valid for 'localhost'" in str(err)
    node.stop()


async def test_an_expired_certificate_is_a_clear_error(
    nursery: trio.Nursery, tls_files: TlsFiles
) -> None:
    node = await _start(nursery, **_tls(tls_files, tls_files.expired_cert, tls_files.expired_key))
    err = await _refusal(f"amqlites://127.0.0.1:{node.port}", ca=str(tls_files.ca))
    assert "TLS: certificate verify failed: certificate has expired" in str(err)
    node.stop()


async def test_a_plain_client_on_a_tls_port_is_told_why(
    tls_node: BrokerNode, tls_files: TlsFiles
) -> None:
    with capture_logs() as logs:
        err = await _refusal(f"127.0.0.1:{tls_node.port}")
    assert isinstance(err, ConnectionRefused)
    assert err.code == ReplyCode.NOT_ALLOWED
    assert "this port speaks TLS only: dial amqlites://" in str(err)
    assert any(r["event"] == "tls_expected" and r["listener"] == "native" for r in logs)


async def test_a_tls_client_on_a_plain_port_is_told_why(
    nursery: trio.Nursery, tls_files: TlsFiles
) -> None:
    node = await _start(nursery)
    with capture_logs() as logs:
        err = await _refusal(f"amqlites://127.0.0.1:{node.port}", ca=str(tls_files.ca))
    assert "TLS: " in str(err)
    assert any(r["event"] == "protocol_error" and "this looks like TLS" in r["text"] for r in logs)
    node.stop()


async def test_mutual_needs_a_client_certificate(
    nursery: trio.Nursery, tls_files: TlsFiles
) -> None:
    node = await _start(nursery, **_tls(tls_files, **{"tls.verify": "mutual"}))
    url = f"amqlites://127.0.0.1:{node.port}"
    with capture_logs() as logs:
        err = await _refusal(url, ca=str(tls_files.ca))
        # the alert or, when the server's close wins the race, the end of the stream
        assert "TLS: tlsv13 alert certificate required" in str(err) or (
            "client certificate" in str(err)
        )
        with trio.fail_after(10):
            async with amqlite.connect(
                url, ca=str(tls_files.ca), cert=str(tls_files.client_cert), reconnect=False
            ) as conn:
                await conn.declare_queue("mutual")
    # the refused handshake was over long before the second one
    (failed,) = [r for r in logs if r["event"] == "tls_handshake_failed"]
    assert "certificate" in failed["reason"]
    node.stop()


async def test_a_silent_socket_on_a_tls_port_does_not_stop_others(
    tls_node: BrokerNode, tls_files: TlsFiles
) -> None:
    silent = await trio.open_tcp_stream("127.0.0.1", tls_node.port)
    half = await trio.open_tcp_stream("127.0.0.1", tls_node.port)
    await half.send_all(b"\x16\x03\x01")  # the start of a ClientHello, never finished
    with trio.fail_after(10):
        async with amqlite.connect(
            f"amqlites://127.0.0.1:{tls_node.port}", ca=str(tls_files.ca), reconnect=False
        ) as conn:
            await conn.declare_queue("still-served")
    await silent.aclose()
    await half.aclose()


async def test_a_handshake_that_never_ends_is_closed_and_logged(
    autojump_clock: trio.testing.MockClock, tls_files: TlsFiles
) -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    ctx = server_context(load_config(overrides=_tls(tls_files)).tls)
    with capture_logs() as logs:
        await theirs.send_all(b"\x16\x03\x01\x02\x00")  # a ClientHello that stops there
        result = await accept_tls(ours, ctx, remote="r:1", listener="native", timeout=10)
    assert result is None
    assert logs == [
        {
            "event": "tls_handshake_timeout",
            "log_level": "warning",
            "remote": "r:1",
            "listener": "native",
            "timeout_s": 10,
        }
    ]
    assert trio.current_time() == pytest.approx(10)
    assert await theirs.receive_some() == b""  # closed
