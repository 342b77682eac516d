"""TLS contexts and the reasons TLS failures are given in (docs/tls.md).

Both sides build their :class:`ssl.SSLContext` here, from plain values, so that
the config (``[tls]``), the server's listeners, the node's own dials (the HA peer
link, peering links) and the clients (the ``amqlite`` CLI, :func:`amqlite.connect`)
agree on what ``verify`` and ``min_version`` mean:

* ``verify = "none"``: nothing is verified on either side (tests, a trusted
  network); the server asks no client for a certificate.
* ``verify = "peer"`` (the default): a dialer verifies the server's certificate
  against the CA and the host name it dialed; the server asks clients for nothing.
* ``verify = "mutual"``: as ``peer``, and the server requires every client of a
  TLS listener to present a certificate signed by the CA (the node presents its
  own certificate when it dials its HA peer or a peering remote).

An empty ``ca`` means the system's trust store. Nothing here opens a socket.
"""

from __future__ import annotations

import ssl
from typing import Protocol

__all__ = [
    "MIN_VERSIONS",
    "VERIFY_MODES",
    "TlsSettings",
    "client_context",
    "describe_tls_error",
    "node_client_context",
    "server_context",
]

VERIFY_MODES = ("none", "peer", "mutual")
MIN_VERSIONS: dict[str, ssl.TLSVersion] = {
    "1.2": ssl.TLSVersion.TLSv1_2,
    "1.3": ssl.TLSVersion.TLSv1_3,
}
#: The first byte of a TLS record carrying a handshake (a ClientHello).
TLS_HANDSHAKE_BYTE = 0x16


class TlsSettings(Protocol):
    """What a node's ``[tls]`` table holds (:class:`amqlite.config.TlsConfig`)."""

    @property
    def cert(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def ca(self) -> str: ...
    @property
    def verify(self) -> str: ...
    @property
    def min_version(self) -> str: ...


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The context of a TLS listener: our certificate chain (``key`` empty: the key
    is in the ``cert`` file) and, with ``verify = "mutual"``, required client
    certificates signed by ``ca``. Raises :class:`ssl.SSLError` or :class:`OSError`
    when a file cannot be used."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSIONS[settings.min_version]
    ctx.load_cert_chain(settings.cert, settings.key or None)
    if settings.verify == "mutual":
        ctx.verify_mode = ssl.CERT_REQUIRED
        _load_ca(ctx, settings.ca)
    return ctx


def node_client_context(settings: TlsSettings) -> ssl.SSLContext:
    """The context a node dials its HA peer and peering remotes with: the remote's
    certificate verified against ``ca`` and the dialed host name (unless ``verify =
    "none"``); the node's own certificate presented when it has one."""
    ctx = client_context(
        ca=settings.ca,
        verify=settings.verify != "none",
        min_version=settings.min_version,
    )
    if settings.cert:
        ctx.load_cert_chain(settings.cert, settings.key or None)
    return ctx


def client_context(
    *,
    ca: str = "",
    cert: str = "",
    key: str = "",
    verify: bool = True,
    min_version: str = "1.2",
) -> ssl.SSLContext:
    """A client's context: the server's certificate checked against ``ca`` (empty:
    the system's trust store) and the host name dialed, unless ``verify`` is False;
    ``cert``/``key`` are a client certificate for a ``mutual`` server."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = MIN_VERSIONS[min_version]
    if verify:
        _load_ca(ctx, ca)
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(cert, key or None)
    return ctx


def _load_ca(ctx: ssl.SSLContext, ca: str) -> None:
    if ca:
        ctx.load_verify_locations(cafile=ca)
    else:
        ctx.load_default_certs()


def describe_tls_error(exc: BaseException) -> str:
    """A short reason for a failed TLS handshake, naming what went wrong: ``TLS:
    certificate verify failed: unable to get local issuer certificate`` (wrong CA),
    ``... Hostname mismatch ...``, ``... certificate has expired``, or a hint that
    the other end does not speak TLS."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError):
        reason = cause.reason or str(cause)
        text = reason.replace("_", " ").lower()
        if cause.reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER_FAILURE"):
            text += " (the other end does not speak TLS on this port?)"
        elif cause.reason == "UNEXPECTED_EOF_WHILE_READING":
            text += (
                " (the other end closed: a server with verify = mutual does so on a"
                " missing or unknown client certificate)"
            )
        elif cause.reason in ("UNSUPPORTED_PROTOCOL", "TLSV1_ALERT_PROTOCOL_VERSION"):
            text += " (no TLS version both ends accept: see min_version)"
        return f"TLS: {text}"
    return "TLS: the other end closed the connection during the TLS handshake"
