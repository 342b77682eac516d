"""The connection flags every command line that talks to a broker shares:
``-s/--servers``, ``--vhost``, ``--login``, ``--password``, ``--connect-timeout``,
``--tls``, ``--ca``, ``--cert``, ``--cert-key``, with their ``AMQLITE_*`` environment
defaults; :func:`tls_options` turns the TLS ones into :func:`amqlite.connect`'s
keywords.

Used by the ``amqlite`` command (:mod:`amqlite.cli`) and by entry points outside
it, such as ``python -m amqlite.spark.audit``; it imports neither, so nothing
outside the CLI has to import the CLI for them.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

#: Where a command connects when neither ``-s`` nor ``$AMQLITE_SERVERS`` says.
DEFAULT_SERVERS = "127.0.0.1:5555"


def connection_options() -> argparse.ArgumentParser:
    """A parent parser (``parents=[...]``) holding the connection flags."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection")
    g.add_argument(
        "-s",
        "--servers",
        default=os.environ.get("AMQLITE_SERVERS", DEFAULT_SERVERS),
        metavar="HOST:PORT,...",
        help="servers tried in order (default: $AMQLITE_SERVERS or %(default)s)",
    )
    g.add_argument("--vhost", default=os.environ.get("AMQLITE_VHOST", "/"), help="virtual host")
    g.add_argument(
        "--login",
        default=os.environ.get("AMQLITE_LOGIN", "guest"),
        help="user name (default: $AMQLITE_LOGIN or guest)",
    )
    g.add_argument(
        "--password",
        default=os.environ.get("AMQLITE_PASSWORD", "guest"),
        help="password (default: $AMQLITE_PASSWORD or guest)",
    )
    g.add_argument(
        "--connect-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="per-address connect and handshake limit (default %(default)s)",
    )
    g.add_argument(
        "--tls",
        action="store_true",
        default=os.environ.get("AMQLITE_TLS", "") not in ("", "0"),
        help="dial every server over TLS (or write amqlites://host:port; $AMQLITE_TLS=1)",
    )
    g.add_argument(
        "--ca",
        metavar="FILE",
        default=os.environ.get("AMQLITE_CA"),
        help="CA certificates (PEM) the server is verified against (default: $AMQLITE_CA "
        "or the system's trust store)",
    )
    g.add_argument(
        "--cert",
        metavar="FILE",
        default=os.environ.get("AMQLITE_CERT"),
        help="a client certificate (PEM), for a server with verify = mutual",
    )
    g.add_argument(
        "--cert-key", metavar="FILE", help="the client certificate's key (default: in --cert)"
    )
    return common


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """``tls``, ``ca``, ``cert``, ``key`` for :func:`amqlite.connect` from the flags."""
    return {
        "tls": bool(getattr(args, "tls", False)),
        "ca": getattr(args, "ca", None),
        "cert": getattr(args, "cert", None),
        "key": getattr(args, "cert_key", None),
    }
