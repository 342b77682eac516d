"""``amqlite server`` and ``amqlite bench``: each hands its arguments to its own
package, imported only when that command runs."""

from __future__ import annotations

import argparse


def cmd_server(args: argparse.Namespace) -> int:
    from amqlite.server.main import run_server

    return run_server(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from amqlite.bench import run_bench

    return run_bench(args)
