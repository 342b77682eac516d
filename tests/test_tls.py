"""TLS: the ``[tls]`` config, the contexts built from it, and the reasons failed
handshakes are given in (real handshakes over in-memory streams)."""

from __future__ import annotations

import ssl
import textwrap
from pathlib import Path

import pytest
import trio
import trio.testing

from amqlite.config import Config, TlsConfig, load_config
from amqlite.errors import ConfigError
from amqlite.tls import client_context, describe_tls_error, node_client_context, server_context

from .tls_certs import TlsFiles


def _config(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "amq.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return load_config(path)


def _refusal(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, text)
    return info.value


# --- config ---------------------------------------------------------------------------


def test_tls_is_off_by_default() -> None:
    config = load_config()
    assert config.tls == TlsConfig(cert="", key="", ca="", verify="peer", min_version="1.2")
    assert not config.server.tls and not config.amqp.tls and not config.uses_tls


def test_a_tls_table_loads(tmp_path: Path, tls_files: TlsFiles) -> None:
    config = _config(
        tmp_path,
        f"""
        [server]
        tls = true
        [amqp]
        port = 0
        tls = true
        [tls]
        cert = "{tls_files.cert}"
        key = "{tls_files.key}"
        ca = "{tls_files.ca}"
        verify = "mutual"
        min_version = "1.3"
        """,
    )
    assert config.server.tls and config.amqp.tls and config.uses_tls
    assert config.tls == TlsConfig(
        str(tls_files.cert), str(tls_files.key), str(tls_files.ca), "mutual", "1.3"
    )


def test_a_missing_file_names_its_key(tmp_path: Path) -> None:
    err = _refusal(tmp_path, '[tls]\ncert = "nowhere.pem"\n')
    assert err.key == "tls.cert"
    assert "no such file: 'nowhere.pem'" in str(err)
    assert _refusal(tmp_path, '[tls]\nca = "nowhere.pem"\n').key == "tls.ca"
    assert _refusal(tmp_path, '[tls]\nkey = "nowhere.pem"\n').key == "tls.key"


def test_verify_and_min_version_are_choices(tmp_path: Path) -> None:
    err = _refusal(tmp_path, '[tls]\nverify = "always"\n')
    assert err.key == "tls.verify"
    assert "'none', 'peer', 'mutual'" in str(err)
    err = _refusal(tmp_path, '[tls]\nmin_version = "1.1"\n')
    assert err.key == "tls.min_version"
    assert _refusal(tmp_path, "[tls]\nport = 1\n").key == "tls.port"


def test_a_tls_listener_needs_a_certificate(tmp_path: Path) -> None:
    err = _refusal(tmp_path, "[server]\ntls = true\n")
    assert err.key == "tls.cert"
    assert "server.tls = true" in str(err)
    err = _refusal(tmp_path, "[amqp]\nport = 0\ntls = true\n")
    assert "amqp.tls = true" in str(err)


def test_mutual_needs_a_ca(tmp_path: Path, tls_files: TlsFiles) -> None:
    text = f'[server]\ntls = true\n[tls]\ncert = "{tls_files.cert}"\nkey = "{tls_files.key}"\n'
    err = _refusal(tmp_path, text + 'verify = "mutual"\n')
    assert err.key == "tls.ca"


def test_a_key_that_does_not_match_is_refused(tmp_path: Path, tls_files: TlsFiles) -> None:
    text = (
        f'[server]\ntls = true\n[tls]\ncert = "{tls_files.cert}"\nkey = "{tls_files.other_key}"\n'
    )
    err = _refusal(tmp_path, text)
    assert err.key == "tls.key"
    assert "cannot load the certificate and its key" in str(err)


def test_a_ca_that_is_not_a_certificate_is_refused(tmp_path: Path, tls_files: TlsFiles) -> None:
    text = f'[server]\ntls = true\n[tls]\ncert = "{tls_files.cert}"\nkey = "{tls_files.key}"\n'
    err = _refusal(tmp_path, text + f'ca = "{tls_files.key}"\n')
    assert err.key == "tls.ca"


def test_tls_flags_override_the_file(tls_files: TlsFiles) -> None:
    config = load_config(
        overrides={
            "server.tls": True,
            "tls.cert": str(tls_files.cert),
            "tls.key": str(tls_files.key),
            "tls.verify": "none",
        }
    )
    assert config.server.tls and config.tls.verify == "none"


def test_a_peering_link_may_dial_over_tls(tmp_path: Path, tls_files: TlsFiles) -> None:
    config = _config(
        tmp_path,
        f"""
        [tls]
        ca = "{tls_files.ca}"
        [[cluster_mta]]
        name = "orders"
        host = "localhost:5556"
        mode = "publish"
        tls = true
        """,
    )
    assert config.cluster_mta[0].tls and config.uses_tls


# --- contexts -------------------------------------------------------------------------


def _settings(tls_files: TlsFiles, verify: str = "peer", min_version: str = "1.2") -> TlsConfig:
    return TlsConfig(
        str(tls_files.cert), str(tls_files.key), str(tls_files.ca), verify, min_version
    )


def test_server_contexts_ask_for_client_certificates_only_when_mutual(tls_files: TlsFiles) -> None:
    assert server_context(_settings(tls_files)).verify_mode is ssl.CERT_NONE
    assert server_context(_settings(tls_files, "mutual")).verify_mode is ssl.CERT_REQUIRED
    ctx = server_context(_settings(tls_files, min_version="1.3"))
    assert ctx.minimum_version is ssl.TLSVersion.TLSv1_3


def test_client_contexts_verify_unless_told_not_to(tls_files: TlsFiles) -> None:
    ctx = client_context(ca=str(tls_files.ca))
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    ctx = client_context(verify=False)
    assert ctx.verify_mode is ssl.CERT_NONE and not ctx.check_hostname
    ctx = node_client_context(_settings(tls_files, "none"))
    assert ctx.verify_mode is ssl.CERT_NONE
    assert node_client_context(_settings(tls_files)).check_hostname


async def _handshake(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, hostname: str = "localhost"
) -> tuple[BaseException | None, BaseException | None]:
    """A real handshake over an in-memory stream pair: (server's, client's) error."""
    left, right = trio.testing.memory_stream_pair()
    server = trio.SSLStream(left, server_ctx, server_side=True)
    client = trio.SSLStream(right, client_ctx, server_hostname=hostname)
    errors: list[BaseException | None] = [None, None]

    async def shake(index: int, stream: trio.SSLStream[trio.abc.Stream]) -> None:
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            errors[index] = exc
            await trio.aclose_forcefully(stream)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(shake, 0, server)
            nursery.start_soon(shake, 1, client)
    return errors[0], errors[1]


async def test_a_good_certificate_passes(tls_files: TlsFiles) -> None:
    server_err, client_err = await _handshake(
        server_context(_settings(tls_files)), client_context(ca=str(tls_files.ca))
    )
    assert server_err is None and client_err is None


async def test_a_wrong_ca_is_named(tls_files: TlsFiles) -> None:
    _, err = await _handshake(
        server_context(_settings(tls_files)), client_context(ca=str(tls_files.other_ca))
    )
    assert err is not None
    assert describe_tls_error(err) == (
        "TLS: certificate verify failed: unable to get local issuer certificate"
    )


async def test_a_wrong_hostname_is_named(tls_files: TlsFiles) -> None:
    _, err = await _handshake(
        server_context(_settings(tls_files)), client_context(ca=str(tls_files.ca)), "other.host"
    )
    assert err is not None
    assert "Hostname mismatch" in describe_tls_error(err)


async def test_an_expired_certificate_is_named(tls_files: TlsFiles) -> None:
    expired = TlsConfig(str(tls_files.expired_cert), str(tls_files.expired_key), "", "peer", "1.2")
    _, err = await _handshake(server_context(expired), client_context(ca=str(tls_files.ca)))
    assert err is not None
    assert describe_tls_error(err) == "TLS: certificate verify failed: certificate has expired"


async def test_mutual_refuses_a_client_without_a_certificate(tls_files: TlsFiles) -> None:
    server_err, _ = await _handshake(
        server_context(_settings(tls_files, "mutual")), client_context(ca=str(tls_files.ca))
    )
    assert server_err is not None
    assert "certificate" in describe_tls_error(server_err)
    server_err, client_err = await _handshake(
        server_context(_settings(tls_files, "mutual")),
        client_context(ca=str(tls_files.ca), cert=str(tls_files.client_cert)),
    )
    assert server_err is None and client_err is None


async def test_min_version_13_refuses_a_12_client(tls_files: TlsFiles) -> None:
    client = client_context(ca=str(tls_files.ca))
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    server_err, client_err = await _handshake(
        server_context(_settings(tls_files, min_version="1.3")), client
    )
    assert server_err is not None and client_err is not None
    assert "version" in describe_tls_error(server_err)
