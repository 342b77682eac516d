"""Certificates for the TLS tests, made by trustme in a temporary directory (never
checked in): a CA, a server certificate for ``localhost`` and ``127.0.0.1``, one
signed by another CA, one for another host name, an expired one, and a client
certificate for ``mutual``."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA everything below (but other_*) is signed by
    cert: Path  # localhost / 127.0.0.1, its chain
    key: Path
    other_ca: Path  # a CA that signed nothing the server presents
    other_cert: Path  # localhost / 127.0.0.1 signed by other_ca
    other_key: Path
    wrong_host_cert: Path  # signed by ca, for "elsewhere.example" only
    wrong_host_key: Path
    expired_cert: Path  # signed by ca, expired yesterday
    expired_key: Path
    client_cert: Path  # a client certificate signed by ca (key in the same file)


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other_ca = trustme.CA(), trustme.CA()
    now = datetime.datetime.now(datetime.UTC)

    def write(name: str, leaf: trustme.LeafCert) -> tuple[Path, Path]:
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        leaf.private_key_pem.write_to_path(str(key))
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        return cert, key

    cert, key = write("server", ca.issue_cert("localhost", "127.0.0.1"))
    other_cert, other_key = write("other", other_ca.issue_cert("localhost", "127.0.0.1"))
    wrong_cert, wrong_key = write("wrong-host", ca.issue_cert("elsewhere.example"))
    expired_cert, expired_key = write(
        "expired",
        ca.issue_cert(
            "localhost",
            "127.0.0.1",
            not_before=now - datetime.timedelta(days=2),
            not_after=now - datetime.timedelta(days=1),
        ),
    )
    client = directory / "client.pem"
    ca.issue_cert("client@example").private_key_and_cert_chain_pem.write_to_path(str(client))
    ca_path, other_ca_path = directory / "ca.pem", directory / "other-ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    other_ca.cert_pem.write_to_path(str(other_ca_path))
    return TlsFiles(
        ca_path,
        cert,
        key,
        other_ca_path,
        other_cert,
        other_key,
        wrong_cert,
        wrong_key,
        expired_cert,
        expired_key,
        client,
    )
