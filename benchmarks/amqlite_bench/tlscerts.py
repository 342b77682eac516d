"""A throwaway CA and server certificate for ``amqlite-tls``, made at run time.

``trustme`` makes a CA and a certificate for ``127.0.0.1`` and ``localhost``
signed by it; they are written to a temporary directory the bench removes when it
ends. Nothing is checked in, nothing outlives the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: How to get trustme when it is missing (it is in the harness's dependencies).
TRUSTME_HINT = "pip install trustme (or pip install -e benchmarks/)"


class TrustmeMissing(Exception):
    """trustme cannot be imported: ``amqlite-tls`` is left out."""


@dataclass(frozen=True, slots=True)
class BenchCertificates:
    ca: Path  # what the clients verify the broker against
    cert: Path  # the broker's certificate chain (127.0.0.1, localhost)
    key: Path

    def server_flags(self) -> tuple[str, ...]:
        """``amqlite server`` flags for a TLS-only native listener with these files."""
        return (
            "--tls",
            "--tls-cert", str(self.cert),
            "--tls-key", str(self.key),
            "--tls-ca", str(self.ca),
        )  # fmt: skip


def make_certificates(directory: Path) -> BenchCertificates:
    """Write a fresh CA and a server certificate into ``directory``."""
    try:
        import trustme
    except ImportError as exc:
        raise TrustmeMissing(f"trustme is not installed ({TRUSTME_HINT})") from exc
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    files = BenchCertificates(
        directory / "ca.pem", directory / "server.pem", directory / "server.key"
    )
    ca.cert_pem.write_to_path(str(files.ca))
    leaf.private_key_pem.write_to_path(str(files.key))
    files.cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return files
