"""``amqlite switchover``: hand an HA pair's mastership to the passive node."""

from __future__ import annotations

import argparse
import sys

import trio

from amqlite.client import connect
from amqlite.connection_args import tls_options
from amqlite.errors import AmqliteError

from .common import PROG
from .status import ask_each


def cmd_switchover(args: argparse.Namespace) -> int:
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]

    async def run() -> int:
        nodes = await ask_each(args, servers, alone=False)
        states = [n.get("state") for n in nodes]
        active = next(
            (a for a, state in zip(servers, states, strict=True) if state == "active"), None
        )
        if active is None:
            why = "; ".join(f"{n['address']}: {n['error']}" for n in nodes if "error" in n)
            print(
                f"{PROG}: error: no active node among {', '.join(servers)}"
                + (f" ({why})" if why else ""),
                file=sys.stderr,
            )
            return 1
        print(f"handing over from {active} ...", file=sys.stderr)
        try:
            async with connect(
                active,
                vhost=args.vhost,
                login=args.login,
                password=args.password,
                client_name=f"{PROG}-switchover",
                connect_timeout=args.connect_timeout,
                **tls_options(args),
                reconnect=False,
                role="monitor",
            ) as conn:
                done = await conn.switchover(args.timeout)
        except AmqliteError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 1
        print(f"switched over: {done.get('active')} is active, {done.get('passive')} is passive")
        return 0

    return trio.run(run)
