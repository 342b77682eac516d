"""``amqlite status``: a broker's status map as tables or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import trio

from amqlite.client import connect
from amqlite.connection_args import tls_options
from amqlite.errors import AmqliteError, ConnectionRefused, ReplyCode

from .common import PROG, json_default


def _flags(item: dict[str, Any]) -> str:
    marks = [("durable", "D"), ("exclusive", "E"), ("auto_delete", "A"), ("internal", "I")]
    return "".join(letter for key, letter in marks if item.get(key)) or "-"


def _duration(seconds: Any) -> str:
    try:
        s = int(float(seconds))
    except (TypeError, ValueError):
        return "?"
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{s}s"
    return f"{s}s"


def print_status(status: dict[str, Any], file: Any = None) -> None:
    """The status map as readable tables (node, queues, exchanges, connections)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=False)
    vhosts = status.get("vhosts") or []
    conns = status.get("connections") or []
    n_queues = sum(len(v.get("queues") or []) for v in vhosts)
    if status.get("filtered"):
        console.print(
            "(filtered: only what this user's permissions cover; "
            "the full status needs the 'monitoring' tag)"
        )
    console.print(
        f"[bold]node[/bold] {status.get('node_id', '?')}  "
        f"[bold]state[/bold] {status.get('state', '?')}  "
        f"[bold]version[/bold] {status.get('version', '?')}  "
        f"[bold]up[/bold] {_duration(status.get('uptime_s'))}  "
        f"[bold]vhosts[/bold] {len(vhosts)}  [bold]queues[/bold] {n_queues}  "
        f"[bold]connections[/bold] {len(conns)}"
    )
    tls = _tls_line(status.get("tls"))
    if tls:
        console.print(tls, markup=False)
    if status.get("http_listen"):
        console.print(f"[bold]management API[/bold] {status['http_listen']} (docs/http.md)")
    alarms = status.get("alarms") or []
    if alarms:
        console.print(
            f"[bold red]alarms[/bold red] {', '.join(alarms)}: publishing connections are blocked"
        )
    queues = Table(title="queues", title_justify="left", show_edge=False)
    for col in ("vhost", "name", "type", "ready", "unacked", "consumers", "flags"):
        queues.add_column(
            col, justify="right" if col in ("ready", "unacked", "consumers") else "left"
        )
    for v in vhosts:
        for q in v.get("queues") or []:
            queues.add_row(
                str(q.get("vhost", v.get("name", ""))),
                str(q.get("name", "")),
                str(q.get("type", "classic")),
                str(q.get("messages", 0)),
                str(q.get("unacked", 0)),
                str(q.get("consumers", 0)),
                _flags(q),
            )
    console.print(queues if queues.row_count else "[dim]no queues[/dim]")
    exchanges = Table(title="exchanges", title_justify="left", show_edge=False)
    for col in ("vhost", "name", "type", "flags", "bindings"):
        exchanges.add_column(col)
    for v in vhosts:
        for x in v.get("exchanges") or []:
            bindings = x.get("bindings") or []
            lines = [
                f"{b.get('queue', '')} <- {b.get('key', '')!r}"
                + (f" {b['arguments']}" if b.get("arguments") else "")
                for b in bindings
            ]
            name = x.get("name", "")
            exchanges.add_row(
                str(v.get("name", "")),
                repr(name) if name == "" else str(name),
                str(x.get("type", "")),
                _flags(x),
                "\n".join(lines) or "-",
            )
    console.print(exchanges)
    if conns:
        table = Table(title="connections", title_justify="left", show_edge=False)
        for col in ("remote", "user", "vhost", "client", "since", "blocked"):
            table.add_column(col)
        for c in conns:
            table.add_row(
                str(c.get("remote", "")),
                str(c.get("user", "")),
                str(c.get("vhost", "")),
                str(c.get("client", "")),
                _duration(c.get("since_s")),
                str(c.get("blocked") or "-"),
            )
        console.print(table)
    print_links(status, console)


def _tls_line(tls: Any) -> str:
    """``tls native, amqp (verify peer, min TLS 1.2)``; "" when no listener speaks TLS."""
    if not isinstance(tls, dict):
        return ""
    listeners = [name for name in ("native", "amqp") if tls.get(name)]
    if not listeners:
        return ""
    return (
        f"tls {', '.join(listeners)} (verify {tls.get('verify')}, min TLS {tls.get('min_version')})"
    )


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def print_links(status: dict[str, Any], console: Any) -> None:
    """The peering links (``links``), two lines each (they hold too many figures
    for one table row)."""
    links = status.get("links") or []
    if not links:
        return
    console.print("[bold]peering links[/bold]")
    for link in links:
        get = link.get
        console.print(
            f"  {get('vhost', '/')}:{get('exchange', '')}  {get('mode')} {get('role')}  "
            f"[bold]{get('state')}[/bold]  remote {_cell(get('remote_address'))} "
            f"node {_cell(get('remote_node'))}  link {get('link')}"
            f"{'  tls' if get('tls') else ''}",
            markup=True,
        )
        console.print(
            f"    lag {_cell(get('lag_messages'))} msgs {_cell(get('lag_seconds'))} s  "
            f"in flight {_cell(get('in_flight'))}  buffered {_cell(get('buffered_bytes'))} B  "
            f"forwarded {_cell(get('forwarded'))}  received {_cell(get('received'))}  "
            f"duplicates dropped {_cell(get('duplicates_dropped'))}  "
            f"loops dropped {_cell(get('loops_dropped'))}  "
            f"interest {_cell(get('interest_size'))}",
            markup=False,
        )
        if get("queue"):  # a subscriber's peering queue here
            console.print(
                f"    peering queue {get('queue')}: {_cell(get('queued'))} waiting", markup=False
            )
        if get("restored"):
            console.print(f"    restored from the journal: {get('restored')}", markup=False)
        if get("last_error"):
            console.print(f"    last error: {get('last_error')}", markup=False)


def print_ha(status: dict[str, Any], file: Any = None) -> None:
    ha = status.get("ha")
    if not ha:
        return
    lag = ha.get("replication_lag_records")
    age = ha.get("last_heartbeat_age")
    print(
        f"ha: role {ha.get('role')}  state {ha.get('state')}  epoch {ha.get('epoch')}  "
        f"peer {ha.get('peer_address')} ({ha.get('peer_state') or 'unheard'}"
        f"{f', heard {age:.2f}s ago' if isinstance(age, int | float) else ''})  "
        f"link {'up' if ha.get('link_up') else 'down'}{' (tls)' if ha.get('tls') else ''}  "
        f"replicating {'yes' if ha.get('replicating') else 'no'}"
        f"{f' (lag {lag} records)' if lag is not None else ''}",
        file=file or sys.stdout,
    )
    promise = ha.get("promise")
    if promise:
        print(f"    promise: {_promise_line(ha)}", file=file or sys.stdout)


#: what a confirmed persistent message is promised, by mode (docs/ha.md)
_PROMISES = {
    "serve": "serve (a silent peer: confirms on the local disk; a cut peer link may lose them)",
    "hold": "hold (a silent peer: confirms wait for it; nothing confirmed is lost)",
    "witness": "witness (a silent peer: confirms only under the witness's lease; "
    "nothing confirmed is lost)",
}


def _promise_line(ha: dict[str, Any]) -> str:
    promise = str(ha.get("promise"))
    line = _PROMISES.get(promise, promise)
    witness = ha.get("witness")
    if isinstance(witness, dict):
        lease = "held" if witness.get("lease_held") else "not held"
        line += (
            f"  witness {ha.get('witness_address')} "
            f"({'up' if ha.get('witness_link_up') else 'down'}, lease {lease}"
            f"{', alone' if witness.get('lease_alone') else ''})"
        )
    if ha.get("confirms_held"):
        line += "  CONFIRMS HELD"
    return line


async def _ask(args: argparse.Namespace, server: str, role: str) -> dict[str, Any]:
    async with connect(
        server,
        vhost=args.vhost,
        login=args.login,
        password=args.password,
        client_name=f"{PROG}-status",
        connect_timeout=args.connect_timeout,
        **tls_options(args),
        reconnect=False,
        role=role,
    ) as conn:
        return await conn.status()


def with_flat_queues(status: dict[str, Any]) -> dict[str, Any]:
    """A node's status map with ``queues`` beside ``vhosts``: every vhost's queues in
    one list, each naming its ``vhost`` (what scripts look for first; the nested
    ``vhosts[].queues[]`` stays). A ``{address, error}`` entry is left as it is."""
    if "error" in status:
        return status
    queues = [
        {"vhost": v.get("name", ""), **q}
        for v in status.get("vhosts") or []
        for q in v.get("queues") or []
    ]
    return {**status, "queues": queues}


async def _one(args: argparse.Namespace, server: str, *, alone: bool) -> dict[str, Any]:
    """The full status on a monitor connection (the ``monitoring`` tag); a user
    without it is refused (403) and gets what a client connection shows it: the
    vhosts and names its permissions cover, its own connections."""
    try:
        try:
            return await _ask(args, server, "monitor")
        except ConnectionRefused as exc:
            if exc.code != ReplyCode.ACCESS_REFUSED or "'monitoring' tag" not in exc.text:
                raise
        return await _ask(args, server, "client")
    except AmqliteError as exc:
        if alone:
            raise  # one server: the command's usual one-line error
        return {"address": server, "error": exc.text if hasattr(exc, "text") else str(exc)}


async def ask_each(
    args: argparse.Namespace, servers: list[str], alone: bool
) -> list[dict[str, Any]]:
    """Each server's status map (on a monitor connection, or a client one for a
    user without the ``monitoring`` tag), or {address, error}."""
    return [await _one(args, server, alone=alone) for server in servers]


def cmd_status(args: argparse.Namespace) -> int:
    """One server: its status map. Several (an HA pair): every node's, each asked
    on its own (a passive node answers a status connection too)."""
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]

    results = trio.run(ask_each, args, servers, len(servers) == 1)
    failed = [r for r in results if "error" in r]
    if args.json:  # the shapes are documented in STATUS_EPILOG (amqlite status --help)
        nodes = [with_flat_queues(r) for r in results]
        shown: Any = nodes[0] if len(nodes) == 1 else {"nodes": nodes}
        print(json.dumps(shown, indent=2, sort_keys=True, default=json_default))
    else:
        for i, status in enumerate(results):
            if i:
                print()
            if "error" in status:
                print(f"{status['address']}: {status['error']}", file=sys.stderr)
                continue
            print_status(status)
            print_ha(status)
    if len(failed) == len(results):
        return 1
    return 0
