"""TLS against a real broker process: pika over amqps (``pika.SSLOptions``), the
amqlite command line over ``--tls --ca``, wrong CA / host name failures with their
reason, a plain client on a TLS port and a TLS client on a plain port."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from ..tls_certs import TlsFiles
from .conftest import CHECKOUT, WAIT, AmqpServer, start_amqp_server


@pytest.fixture(scope="module")
def tls_server(tls_files: TlsFiles) -> Iterator[AmqpServer]:
    """Both listeners TLS-only: ``--tls --amqp-tls`` with trustme's certificate."""
    server = start_amqp_server(
        None,
        "--tls",
        "--amqp-tls",
        "--tls-cert",
        str(tls_files.cert),
        "--tls-key",
        str(tls_files.key),
        "--tls-ca",
        str(tls_files.ca),
    )
    try:
        yield server
    finally:
        server.stop()


def _ssl_options(ca: Path, hostname: str = "localhost") -> pika.SSLOptions:
    return pika.SSLOptions(ssl.create_default_context(cafile=str(ca)), hostname)


def test_pika_publishes_and_gets_over_amqps(tls_server: AmqpServer, tls_files: TlsFiles) -> None:
    conn = tls_server.connect(ssl_options=_ssl_options(tls_files.ca))
    try:
        channel = conn.channel()
        channel.queue_declare("amqps-q")
        channel.confirm_delivery()
        channel.basic_publish("", "amqps-q", b"over amqps")
        method, _, body = channel.basic_get("amqps-q", auto_ack=True)
        assert method is not None and body == b"over amqps"
    finally:
        conn.close()
    assert tls_server.wait_for_log("amqp_connection_opened", user="guest")


def test_status_shows_tls_on_both_listeners_and_on_an_amqps_connection(
    tls_server: AmqpServer, tls_files: TlsFiles
) -> None:
    conn = tls_server.connect(ssl_options=_ssl_options(tls_files.ca))
    try:
        done = _cli(
            "status", "--json", "-s", f"amqlites://localhost:{tls_server.port}",
            "--ca", str(tls_files.ca),
        )  # fmt: skip
    finally:
        conn.close()
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["tls"] == {"native": True, "amqp": True, "verify": "peer", "min_version": "1.2"}
    amqp = [c for c in status["connections"] if c.get("protocol") == "amqp-0-9-1"]
    assert amqp and all(c["tls"] is True for c in amqp), status["connections"]


def _pika_error(server: AmqpServer, **kwargs: object) -> str:
    """What pika raises (its own error, or the ssl module's during the handshake)."""
    with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)) as info:
        server.connect(connection_attempts=1, **kwargs)
    return repr(info.value)


def test_pika_with_a_wrong_ca_names_the_reason(tls_server: AmqpServer, tls_files: TlsFiles) -> None:
    text = _pika_error(tls_server, ssl_options=_ssl_options(tls_files.other_ca))
    assert "CERTIFICATE_VERIFY_FAILED" in text
    assert "unable to get local issuer certificate" in text


def test_pika_with_a_wrong_hostname_names_the_reason(
    tls_server: AmqpServer, tls_files: TlsFiles
) -> None:
    text = _pika_error(tls_server, ssl_options=_ssl_options(tls_files.ca, "elsewhere.example"))
    assert "Hostname mismatch" in text


def test_plain_pika_on_an_amqps_port_is_closed_and_logged(tls_server: AmqpServer) -> None:
    since = len(tls_server.records)
    _pika_error(tls_server)
    record = tls_server.wait_for_log("tls_expected", since=since, listener="amqp")
    assert "does not speak TLS" in record["reason"]


def test_tls_pika_on_a_plain_amqp_port_is_refused_and_logged(tls_files: TlsFiles) -> None:
    plain = start_amqp_server(None)
    try:
        _pika_error(plain, ssl_options=_ssl_options(tls_files.ca))
        record = plain.wait_for_log("amqp_wrong_protocol_header")
        assert record["looks_like"] == "TLS"
    finally:
        plain.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amqlite", *args],
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        check=False,
        env={"PYTHONPATH": str(CHECKOUT), "PATH": "/usr/bin:/bin"},
    )


def test_the_cli_publishes_and_consumes_over_tls(
    tls_server: AmqpServer, tls_files: TlsFiles
) -> None:
    servers = f"amqlites://localhost:{tls_server.port}"
    ca = ("--ca", str(tls_files.ca))
    declared = _cli("declare", "queue", "cli-tls", "-s", servers, *ca)
    assert declared.returncode == 0, declared.stderr
    published = _cli(
        "publish", "-s", f"localhost:{tls_server.port}", "--tls", *ca, "-k", "cli-tls",
        "--confirm", "hello tls",
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    consumed = _cli("consume", "-s", servers, *ca, "-q", "cli-tls", "--count", "1")
    assert consumed.returncode == 0, consumed.stderr
    assert "hello tls" in consumed.stdout


def test_the_cli_with_a_wrong_ca_names_the_reason(
    tls_server: AmqpServer, tls_files: TlsFiles
) -> None:
    result = _cli(
        "status", "-s", f"amqlites://127.0.0.1:{tls_server.port}", "--ca", str(tls_files.other_ca)
    )
    assert result.returncode != 0
    assert "TLS: certificate verify failed: unable to get local issuer certificate" in (
        result.stderr
    )


def test_the_cli_without_tls_on_a_tls_port_is_told_why(tls_server: AmqpServer) -> None:
    result = _cli("status", "-s", f"127.0.0.1:{tls_server.port}")
    assert result.returncode != 0
    assert "this port speaks TLS only: dial amqlites://" in result.stderr
