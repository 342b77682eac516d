"""``amqlite witness``: run the third voter of an HA pair (docs/ha.md, "The
witness")."""

from __future__ import annotations

import argparse
import sys

from amqlite.config import load_config
from amqlite.errors import ConfigError

WITNESS_DESCRIPTION = """\
Run the witness of an HA pair: a tiny process (no queues, no journal) that
holds one lease, the right of one node to confirm persistent messages that its
peer does not hold, in one epoch. The pair names it in [cluster] witness =
"host:port". Two nodes cannot tell a dead peer from a cut peer link; the
witness can: with it, a passive node takes over only when its peer is silent
AND the witness grants it a new epoch, and a master that loses both its peer
and the witness stops confirming persistent publishes (they wait, then fail
with 506) instead of risking a second master. A confirmed message is then never
lost to a partition."""

WITNESS_EPILOG = """\
examples:
  amqlite witness --port 7777                            # state in amqlite-data/witness-7777.json
  amqlite witness --port 7777 --host 0.0.0.0 --state /var/lib/amqlite/witness.json
  amqlite witness --port 7777 --config pair.toml         # its [[users]] log in

and in the pair's config:
  [cluster]
  witness = "witness-host:7777"

The nodes log in with [cluster] login/password: with --config, that user must
be in the file's [[users]] with the 'cluster' tag; without it, only guest from
loopback (as on a broker with no users). The state file (holder, epoch, and
whether the holder confirms alone) is replaced atomically and fsynced before
an answer that changed it goes out. Run it on a third machine: on either
node's machine it falls with that node.
"""


def add_witness_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, required=True, metavar="N", help="TCP port to listen on")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="H",
        help="address to listen on (default %(default)s)",
    )
    p.add_argument(
        "--state",
        metavar="FILE",
        help="the lease's state file (default amqlite-data/witness-PORT.json)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a config whose [[users]] may log in (they need the 'cluster' tag)",
    )
    p.add_argument("--log-format", choices=("console", "json"), default="console")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def cmd_witness(args: argparse.Namespace) -> int:
    import os

    import trio

    from amqlite.auth import Authenticator
    from amqlite.log import configure_logging
    from amqlite.server.witness import WitnessService, default_state_path

    if not 0 <= args.port < 65536:
        print(f"amqlite: error: --port must be 0-65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config) if args.config else load_config()
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    configure_logging(args.log_format, args.log_level)
    state = args.state or default_state_path(args.port)
    os.makedirs(os.path.dirname(os.path.abspath(state)), exist_ok=True)
    service = WitnessService(state, Authenticator(config.users, config.server.vhosts))
    try:
        trio.run(service.serve, args.host, args.port)
    except ValueError as exc:  # a damaged state file
        print(f"amqlite: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"amqlite: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0
