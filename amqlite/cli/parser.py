"""The argparse tree of the ``amqlite`` command and its subcommands."""

from __future__ import annotations

import argparse
from typing import Any

from amqlite import __version__
from amqlite.connection_args import connection_options

from .common import PROG
from .consume import cmd_consume
from .delegated import add_bench_arguments, cmd_bench, cmd_server
from .epilogs import (
    BIND_EPILOG,
    CONSUME_EPILOG,
    DECLARE_EPILOG,
    MAIN_EPILOG,
    PASSWD_EPILOG,
    PUBLISH_EPILOG,
    STATUS_EPILOG,
)
from .passwd import cmd_passwd
from .publish import cmd_publish
from .status import cmd_status
from .switchover import cmd_switchover
from .topology import cmd_bind, cmd_declare_exchange, cmd_declare_queue
from .trace import cmd_audit, cmd_trace
from .witness import WITNESS_DESCRIPTION, WITNESS_EPILOG, add_witness_arguments, cmd_witness

COMMANDS = (
    "server",
    "publish",
    "consume",
    "declare",
    "bind",
    "status",
    "switchover",
    "witness",
    "trace",
    "audit",
    "passwd",
    "bench",
)


def _sub(
    subs: Any, name: str, help: str, description: str, epilog: str, parents: list[Any]
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subs.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        parents=parents,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser. ``command`` (the subcommand about to run) lets the heavy
    ``server`` and ``bench`` options load only when they are needed; for ``bench``
    it raises :class:`UsageError` when the harness is not installed."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="amqlite: a message broker and its command-line client.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    conn = [connection_options()]

    p = _sub(subs, "server", "run a broker", "Run an amqlite broker.", "", [])
    if command == "server":
        from amqlite.server.main import add_server_arguments

        add_server_arguments(p)
    p.set_defaults(func=cmd_server)

    p = _sub(subs, "witness", "run an HA pair's witness", WITNESS_DESCRIPTION, WITNESS_EPILOG, [])
    add_witness_arguments(p)
    p.set_defaults(func=cmd_witness)

    p = _sub(
        subs,
        "publish",
        "publish messages",
        "Publish one message, COUNT numbered copies, or one message per line of stdin.",
        PUBLISH_EPILOG,
        conn,
    )
    p.add_argument("body", metavar="BODY", help="message body ({n} = sequence number; - = stdin)")
    p.add_argument("-e", "--exchange", default="", help='exchange (default: "", the default one)')
    p.add_argument("-k", "--key", default="", help="routing key")
    p.add_argument(
        "-H",
        "--header",
        action="append",
        metavar="NAME=VALUE",
        help="header (repeatable); {n} in a text value is numbered like the body",
    )
    p.add_argument(
        "-P",
        "--property",
        action="append",
        metavar="NAME=VALUE",
        help="message property, e.g. message_id=order-{n} or priority=5 (repeatable; "
        "{n} in a text value is numbered like the body)",
    )
    p.add_argument("--persistent", action="store_true", help="ask the broker to keep it on disk")
    p.add_argument("--confirm", action="store_true", help="wait for the broker's confirms")
    p.add_argument("--mandatory", action="store_true", help="return messages no queue takes")
    p.add_argument("--count", type=int, default=1, metavar="N", help="publish N copies")
    p.add_argument("--rate", type=float, metavar="R", help="at most R messages a second")
    p.add_argument(
        "--window",
        type=int,
        default=1000,
        metavar="N",
        help="with --confirm: unconfirmed messages in flight (default %(default)s)",
    )
    p.set_defaults(func=cmd_publish)

    p = _sub(
        subs,
        "consume",
        "print messages from a queue",
        "Print messages from a queue (or from an exchange through a private queue).",
        CONSUME_EPILOG,
        conn,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-q", "--queue", help="queue to consume from")
    src.add_argument("-e", "--exchange", help="exchange to tap through a private queue")
    p.add_argument("-k", "--key", default="", help="binding key (with -e)")
    p.add_argument("--prefetch", type=int, default=100, metavar="N", help="default %(default)s")
    p.add_argument("--count", type=int, metavar="N", help="stop after N messages")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="stop after idle SECONDS")
    p.add_argument("--json", action="store_true", help="one JSON object per message")
    p.add_argument(
        "--selector",
        metavar="EXPR",
        default="",
        help="only messages this JMS selector selects, e.g. \"priority > 4 AND region = 'eu'\" "
        "(see docs/selectors.md); the others stay in the queue",
    )
    stream = p.add_argument_group("stream queues")
    stream.add_argument(
        "--offset",
        metavar="WHERE",
        help="where to start: first, last, next (the server's default), an offset N or "
        "an ISO-8601 time such as 2026-11-22T10:00:00Z (no zone: UTC)",
    )
    stream.add_argument(
        "--name",
        metavar="NAME",
        help="resume after the offset stored under NAME (else start at --offset, "
        "default first) and store the offset of what is printed under NAME",
    )
    p.set_defaults(func=cmd_consume)

    p = _sub(
        subs,
        "declare",
        "declare an exchange or a queue",
        "Declare an exchange or a queue.",
        DECLARE_EPILOG,
        [],
    )
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    px = _sub(
        kinds, "exchange", "declare an exchange", "Declare an exchange.", DECLARE_EPILOG, conn
    )
    px.add_argument("name", metavar="NAME")
    px.add_argument(
        "type",
        metavar="TYPE",
        choices=("direct", "fanout", "topic", "headers"),
        help="direct, fanout, topic or headers",
    )
    px.add_argument("--durable", action="store_true", help="survive a broker restart")
    px.add_argument("--auto-delete", action="store_true", help="delete when unbound from all")
    px.add_argument("--internal", action="store_true", help="no direct publishing")
    px.add_argument("--arg", action="append", metavar="K=V", help="argument (repeatable)")
    px.set_defaults(func=cmd_declare_exchange)
    pq = _sub(kinds, "queue", "declare a queue", "Declare a queue.", DECLARE_EPILOG, conn)
    pq.add_argument("name", metavar="NAME", help='queue name ("" = let the server name it)')
    pq.add_argument("--durable", action="store_true", help="survive a broker restart")
    pq.add_argument("--exclusive", action="store_true", help="this connection only (short-lived)")
    pq.add_argument("--auto-delete", action="store_true", help="delete after its last consumer")
    pq.add_argument(
        "--type",
        choices=("classic", "stream"),
        help="sets x-queue-type (a stream is always durable)",
    )
    pq.add_argument(
        "--max-age",
        metavar="AGE",
        help="streams: keep messages this long, e.g. 7D, 12h, 30m (units Y M D h m s)",
    )
    pq.add_argument(
        "--max-length-bytes", type=int, metavar="N", help="keep at most N bytes of bodies"
    )
    pq.add_argument("--arg", action="append", metavar="K=V", help="argument (repeatable)")
    pq.set_defaults(func=cmd_declare_queue)

    p = _sub(
        subs,
        "bind",
        "bind a queue to an exchange",
        "Bind QUEUE to EXCHANGE with KEY.",
        BIND_EPILOG,
        conn,
    )
    p.add_argument("exchange", metavar="EXCHANGE")
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("key", metavar="KEY", nargs="?", default="", help='binding key (default "")')
    p.add_argument("--arg", action="append", metavar="K=V", help="argument (repeatable)")
    p.set_defaults(func=cmd_bind)

    p = _sub(
        subs,
        "status",
        "show a broker's state",
        "Show the node, its queues, exchanges with bindings, and connections.",
        STATUS_EPILOG,
        conn,
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print the status map as JSON (several servers: {"nodes": [...]}; see below)',
    )
    p.set_defaults(func=cmd_status)

    p = _sub(
        subs,
        "switchover",
        "hand an HA pair's mastership to the passive node",
        "Planned switchover for maintenance: the active node of the pair given with -s "
        "refuses and closes its clients, waits until the passive node holds every "
        "record of its journal, and lets it take over. Clients reconnect to the new "
        "active node by themselves; nothing confirmed is lost.",
        "example:\n  amqlite switchover -s 127.0.0.1:5555,127.0.0.1:6666\n",
        conn,
    )
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the hand-over (10)"
    )
    p.set_defaults(func=cmd_switchover)

    p = _sub(
        subs,
        "trace",
        "record publishes, deliveries and acks into amq.trace",
        "Switch the broker trace on or off: while on, the broker appends one record per "
        "publish, delivery and ack to the stream queue amq.trace of the vhost (read by "
        "amqlite audit). Off by default; server.trace = true in the config turns it on at "
        "start.",
        "examples:\n  amqlite trace on -s 127.0.0.1:5555\n  amqlite trace off\n",
        conn,
    )
    p.add_argument("state", choices=("on", "off"), metavar="on|off")
    p.set_defaults(func=cmd_trace)

    p = _sub(
        subs,
        "audit",
        "report lost, duplicated and late messages from amq.trace (Spark)",
        "Read the broker trace (amq.trace) with Spark and report, per exchange and "
        "queue: published, delivered, acked, lost, duplicated, latency p50/p99 and "
        "throughput over time. Needs the spark extra (pip install 'amqlite[spark]').",
        "examples:\n  amqlite audit -s 127.0.0.1:5555 --out audit-out\n"
        "  amqlite audit --master spark://head:7077 --since 1h\n",
        conn,
    )
    if command == "audit":
        from amqlite.spark.audit import add_audit_arguments

        add_audit_arguments(p)
    p.set_defaults(func=cmd_audit)

    p = _sub(
        subs,
        "passwd",
        "hash a password for the config file",
        "Read a password (twice, without echo) and print its hash for the config file.",
        PASSWD_EPILOG,
        [],
    )
    p.add_argument("--stdin", action="store_true", help="read one line from stdin instead")
    p.add_argument(
        "--user",
        metavar="NAME",
        help="print a whole [[users]] entry for NAME instead of the bare hash",
    )
    p.add_argument(
        "--tags",
        default="",
        metavar="TAG,...",
        help="with --user: its tags (administrator, monitoring, management, cluster, peering)",
    )
    p.set_defaults(func=cmd_passwd)

    p = _sub(
        subs,
        "bench",
        "benchmark amqlite against a raw-trio baseline",
        "Benchmark amqlite against a raw-trio baseline, in one invocation.",
        "",
        [],
    )
    if command == "bench":  # UsageError when the harness is not installed
        add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)
    return parser
