"""``amqlite trace on|off``: switch the broker trace; ``amqlite audit``: read it.

The trace (stream ``amq.trace``, one record per publish, delivery and ack) is what
``amqlite audit`` reads through Spark; see docs/spark.md.
"""

from __future__ import annotations

import argparse

import trio

from amqlite.client import connect
from amqlite.connection_args import tls_options

from .common import PROG


def cmd_trace(args: argparse.Namespace) -> int:
    enabled = args.state == "on"

    async def run() -> bool:
        async with connect(
            args.servers,
            vhost=args.vhost,
            login=args.login,
            password=args.password,
            client_name=f"{PROG}-trace",
            connect_timeout=args.connect_timeout,
            **tls_options(args),
            reconnect=False,
        ) as conn:
            now: bool = await conn.trace(enabled)
            return now

    now = trio.run(run)
    print(f"trace {'on' if now else 'off'} (stream amq.trace)")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from amqlite.spark.audit import run_from_args

    return run_from_args(args)
