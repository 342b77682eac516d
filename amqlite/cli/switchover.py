"""``amqlite switchover``: hand an HA pair's mastership to the passive node."""

from __future__ import annotations

import argparse
import sys

import trio

from amqlite.errors import AmqliteError, ConnectionRefused
from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev

from .common import PROG


async def _request(address: str, args: argparse.Namespace, event: ev.Event) -> ev.Event:
    """One request on a monitor connection (which a passive node accepts too)."""
    host, _, port = address.rpartition(":")
    with trio.fail_after(args.connect_timeout + args.timeout + 5):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            proto = Connection(Role.CLIENT)
            hello = ev.Hello(
                0,
                vhost=args.vhost,
                login=args.login,
                password=args.password,
                client=f"{PROG}-switchover",
                role="monitor",
            )
            await stream.send_all(proto.send(hello))
            sent = False
            while True:
                item = proto.next_event()
                if item is NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        raise ConnectionRefused(f"{address} closed the connection")
                    proto.receive_data(data)
                    continue
                assert isinstance(item, ev.Event)
                if isinstance(item, ev.Refused):
                    raise ConnectionRefused(f"{address}: {item.code} {item.text}")
                if isinstance(item, ev.Welcome) and not sent:
                    sent = True
                    await stream.send_all(proto.send(event))
                    continue
                if getattr(item, "re", None) == getattr(event, "id", None):
                    return item


def cmd_switchover(args: argparse.Namespace) -> int:
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]

    async def run() -> int:
        active = None
        for address in servers:
            try:
                reply = await _request(address, args, ev.Status(1))
            except (AmqliteError, OSError, trio.TooSlowError) as exc:
                print(f"{PROG}: {address}: {exc}", file=sys.stderr)
                continue
            if isinstance(reply, ev.Ok) and reply.info.get("state") == "active":
                active = address
                break
        if active is None:
            print(f"{PROG}: error: no active node among {', '.join(servers)}", file=sys.stderr)
            return 1
        print(f"handing over from {active} ...", file=sys.stderr)
        reply = await _request(active, args, ev.HaSwitchover(2, timeout=args.timeout))
        if isinstance(reply, ev.Ok):
            print(f"switched over: {reply.info.get('active')} is active, "
                  f"{reply.info.get('passive')} is passive")  # fmt: skip
            return 0
        text = getattr(reply, "text", repr(reply))
        print(f"{PROG}: error: {text}", file=sys.stderr)
        return 1

    return trio.run(run)
