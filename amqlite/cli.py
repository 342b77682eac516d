"""The ``amqlite`` command: run a broker, publish, consume, declare, inspect.

Every subcommand explains itself with ``--help``. Errors are one line on stderr
(``amqlite: error: ...``); the exit status is 0 on success, 1 for runtime errors
and 2 for usage errors.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import getpass
import io
import json
import logging
import os
import sys
import warnings
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

import trio

from amqlite import __version__
from amqlite.client import Connection, Consumer, Delivery, PendingConfirm, connect
from amqlite.errors import (
    AmqliteError,
    ConnectionClosed,
    ConnectionRefused,
    PublishNacked,
    PublishReturned,
)
from amqlite.protocol import PROPERTY_TYPES

PROG = "amqlite"
DEFAULT_SERVERS = "127.0.0.1:5555"
COMMANDS = ("server", "publish", "consume", "declare", "bind", "status", "passwd", "bench")


class UsageError(Exception):
    """Bad command-line input found after parsing (exit status 2)."""


# --- small parsers ------------------------------------------------------------------


def parse_scalar(text: str) -> int | float | bool | str:
    """``"42"`` -> 42, ``"1.5"`` -> 1.5, ``"true"``/``"false"`` -> bool, else the text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _pair(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UsageError(f"{what} {text!r} must look like name=value")
    return name, value


def parse_pairs(items: Sequence[str] | None, what: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values as :func:`parse_scalar`)."""
    out: dict[str, Any] = {}
    for item in items or ():
        name, value = _pair(item, what)
        out[name] = parse_scalar(value)
    return out


def parse_properties(items: Sequence[str] | None) -> dict[str, Any]:
    """``-P name=value`` message properties, converted to their wire types."""
    out: dict[str, Any] = {}
    for item in items or ():
        name, value = _pair(item, "property")
        kind = PROPERTY_TYPES.get(name)
        if kind is None:
            known = ", ".join(sorted(PROPERTY_TYPES))
            raise UsageError(f"unknown property {name!r} (known: {known})")
        if kind is bool:
            out[name] = value.lower() in ("1", "true", "yes")
        elif kind is int:
            try:
                out[name] = int(value)
            except ValueError:
                raise UsageError(f"property {name!r} must be an integer, not {value!r}") from None
        else:
            out[name] = value
    return out


# --- the parser -----------------------------------------------------------------------


def _connection_options() -> argparse.ArgumentParser:
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
    return common


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


PUBLISH_EPILOG = """\
examples:
  amqlite publish -k jobs 'hello'                       # default exchange -> queue "jobs"
  amqlite publish -e events -k orders.eu -H region=eu '{"id": 7}'
  amqlite publish -k jobs --confirm --count 1000 'job {n}'
  amqlite publish -e logs --rate 200 --count 2000 'tick {n}'
  tail -f app.log | amqlite publish -e logs -k app -   # one message per line

Prints "published N" (with --confirm: "published N confirmed M") on stderr and
exits 1 unless every message was sent and, with --confirm, confirmed. With
--mandatory, messages no queue takes come back and are counted as returned.
"""

CONSUME_EPILOG = """\
examples:
  amqlite consume -q jobs                      # until Ctrl-C
  amqlite consume -q jobs --count 10 --timeout 5
  amqlite consume -e events -k 'orders.#' --json

With -e, a private queue (exclusive, auto-delete, named by the server) is bound
to the exchange with the binding key for as long as the command runs. Each
message is printed (and stdout flushed) before it is acked.
"""

DECLARE_EPILOG = """\
examples:
  amqlite declare exchange events topic --durable
  amqlite declare queue jobs --durable
  amqlite declare queue audit --type stream --arg x-max-length=100000
"""

BIND_EPILOG = """\
examples:
  amqlite bind events eu-orders 'orders.eu.*'
  amqlite bind logs everything                  # fanout: no key
  amqlite bind tagged q '' --arg x-match=all --arg region=eu
"""

STATUS_EPILOG = """\
examples:
  amqlite status
  amqlite status -s 127.0.0.1:5555,127.0.0.1:5556 --json | jq '.vhosts[].queues'
"""

PASSWD_EPILOG = """\
examples:
  amqlite passwd                       # asks twice, prints the hash
  echo -n 's3cret' | amqlite passwd --stdin

Put the printed hash in the config file as the user's password_hash.
"""

MAIN_EPILOG = """\
examples:
  amqlite server
  amqlite declare queue jobs --durable
  amqlite publish -k jobs --confirm --count 5 'job {n}'
  amqlite consume -q jobs --count 5
  amqlite status

Run "amqlite COMMAND --help" for each command's options.
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser. ``command`` (the subcommand about to run) lets the heavy
    ``server`` and ``bench`` options load only when they are needed."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="amqlite: a message broker and its command-line client.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    conn = [_connection_options()]

    p = _sub(subs, "server", "run a broker", "Run an amqlite broker.", "", [])
    if command == "server":
        from amqlite.server.main import add_server_arguments

        add_server_arguments(p)
    p.set_defaults(func=_cmd_server)

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
        "-H", "--header", action="append", metavar="NAME=VALUE", help="header (repeatable)"
    )
    p.add_argument(
        "-P",
        "--property",
        action="append",
        metavar="NAME=VALUE",
        help="message property, e.g. message_id=7 or priority=5 (repeatable)",
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
    p.set_defaults(func=_cmd_publish)

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
    p.set_defaults(func=_cmd_consume)

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
    px.set_defaults(func=_cmd_declare_exchange)
    pq = _sub(kinds, "queue", "declare a queue", "Declare a queue.", DECLARE_EPILOG, conn)
    pq.add_argument("name", metavar="NAME", help='queue name ("" = let the server name it)')
    pq.add_argument("--durable", action="store_true", help="survive a broker restart")
    pq.add_argument("--exclusive", action="store_true", help="this connection only (short-lived)")
    pq.add_argument("--auto-delete", action="store_true", help="delete after its last consumer")
    pq.add_argument("--type", choices=("classic", "stream"), help="sets x-queue-type")
    pq.add_argument("--arg", action="append", metavar="K=V", help="argument (repeatable)")
    pq.set_defaults(func=_cmd_declare_queue)

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
    p.set_defaults(func=_cmd_bind)

    p = _sub(
        subs,
        "status",
        "show a broker's state",
        "Show the node, its queues, exchanges with bindings, and connections.",
        STATUS_EPILOG,
        conn,
    )
    p.add_argument("--json", action="store_true", help="print the raw status map as JSON")
    p.set_defaults(func=_cmd_status)

    p = _sub(
        subs,
        "passwd",
        "hash a password for the config file",
        "Read a password (twice, without echo) and print its hash for the config file.",
        PASSWD_EPILOG,
        [],
    )
    p.add_argument("--stdin", action="store_true", help="read one line from stdin instead")
    p.set_defaults(func=_cmd_passwd)

    p = _sub(
        subs,
        "bench",
        "benchmark amqlite against a raw-trio baseline",
        "Benchmark amqlite against a raw-trio baseline, in one invocation.",
        "",
        [],
    )
    if command == "bench":
        from amqlite.bench import add_bench_arguments

        add_bench_arguments(p)
    p.set_defaults(func=_cmd_bench)
    return parser


# --- running ---------------------------------------------------------------------------


def _fail(text: str) -> int:
    print(f"{PROG}: error: {text}", file=sys.stderr)
    return 1


def _describe(exc: AmqliteError) -> str:
    if isinstance(exc, ConnectionRefused | ConnectionClosed):
        return exc.text
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``amqlite`` command; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    at = next((i for i, a in enumerate(args_list) if a in COMMANDS), None)
    command = None
    if at is not None:
        command = args_list[at]
        # "amqlite -s HOST status" works too: options go after the command
        args_list = [command, *args_list[:at], *args_list[at + 1 :]]
    parser = build_parser(command)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 2
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    # the client logs what it also raises; a command reports errors in one line
    logging.getLogger("amqlite.client").addHandler(logging.NullHandler())
    logging.getLogger("amqlite.client").propagate = False
    try:
        return func(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except AmqliteError as exc:
        return _fail(_describe(exc))
    except ValueError as exc:  # a bad server list
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. "amqlite status --json | head"
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _run(args: argparse.Namespace, body: Callable[[Connection], Awaitable[int]]) -> int:
    """Connect with the common options, run ``body``, close; returns its status."""

    async def session() -> int:
        async with connect(
            args.servers,
            vhost=args.vhost,
            login=args.login,
            password=args.password,
            client_name=f"{PROG}-{args.command}",
            connect_timeout=args.connect_timeout,
            max_in_flight=getattr(args, "window", 1000),
        ) as conn:
            return await body(conn)

    return trio.run(session)


def _cmd_server(args: argparse.Namespace) -> int:
    from amqlite.server.main import run_server

    return run_server(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from amqlite.bench import run_bench

    return run_bench(args)


# --- publish -----------------------------------------------------------------------------


class _PublishTally:
    """Counts what became of confirmed publishes as they settle, in order."""

    def __init__(self) -> None:
        self.pending: deque[PendingConfirm] = deque()
        self.confirmed = 0
        self.returned = 0
        self.nacked = 0
        self.error: AmqliteError | None = None

    def collect(self) -> None:
        pending = self.pending
        while pending and pending[0].done:
            err = pending.popleft().error
            if err is None:
                self.confirmed += 1
            elif isinstance(err, PublishReturned):
                self.returned += 1
            elif isinstance(err, PublishNacked):
                self.nacked += 1
            elif self.error is None:
                self.error = err


def _stdin_chunks() -> Callable[[], bytes]:
    """A blocking 'read what is there' on stdin (run it in a thread)."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is not None:
            return lambda: bytes(buffer.read1(65536))
        return lambda: sys.stdin.readline().encode()
    return lambda: os.read(fd, 65536)


async def _payloads(template: str, count: int) -> AsyncGenerator[tuple[int, bytes], None]:
    """(index, body) for each message: stdin lines for ``-``, else ``count`` copies
    of ``template`` with ``{n}`` numbered from 1."""
    if template == "-":
        i = 0
        async for line in _stdin_lines():
            yield i, line
            i += 1
        return
    numbered = "{n}" in template
    fixed = template.encode()
    for i in range(count):
        yield i, template.replace("{n}", str(i + 1)).encode() if numbered else fixed


async def _stdin_lines() -> AsyncGenerator[bytes, None]:
    read = _stdin_chunks()
    rest = b""
    while True:
        chunk = await trio.to_thread.run_sync(read)
        if not chunk:
            break
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            yield line[:-1] if line.endswith(b"\r") else line
    if rest:
        yield rest


def _cmd_publish(args: argparse.Namespace) -> int:
    headers = parse_pairs(args.header, "header")
    properties = parse_properties(args.property)
    from_stdin = args.body == "-"
    if args.count < 1:
        raise UsageError("--count must be at least 1")
    if from_stdin and args.count != 1:
        raise UsageError("--count does not apply to stdin (one message per line)")
    if args.rate is not None and args.rate <= 0:
        raise UsageError("--rate must be positive")
    if args.window < 1:
        raise UsageError("--window must be at least 1")
    tally = _PublishTally()
    sent = 0
    used: list[Connection] = []

    async def body(conn: Connection) -> int:
        nonlocal sent
        used.append(conn)

        async def one(payload: bytes) -> None:
            nonlocal sent
            if args.confirm:
                p = await conn.publish_nowait(
                    args.exchange,
                    args.key,
                    payload,
                    headers=headers or None,
                    properties=properties or None,
                    persistent=args.persistent,
                    mandatory=args.mandatory,
                )
                tally.pending.append(p)
                tally.collect()
                if tally.error is not None:
                    raise tally.error
            else:
                await conn.publish(
                    args.exchange,
                    args.key,
                    payload,
                    headers=headers or None,
                    properties=properties or None,
                    persistent=args.persistent,
                    mandatory=args.mandatory,
                )
            sent += 1

        start = trio.current_time()
        async with contextlib.aclosing(_payloads(args.body, args.count)) as payloads:
            async for i, payload in payloads:
                if args.rate is not None:  # paced, and batched: all that is due goes at once
                    due = start + i / args.rate
                    if trio.current_time() < due:
                        await trio.sleep_until(due)
                await one(payload)
        if args.confirm:
            with contextlib.suppress(AmqliteError):  # counted below, message by message
                await conn.wait_for_confirms()
            tally.collect()
            if tally.error is not None:
                raise tally.error
        return 0

    status = _run(args, body)  # raises (one line, exit 1) on broker or connection errors
    ok = status == 0
    if args.confirm:
        print(f"published {sent} confirmed {tally.confirmed}", file=sys.stderr)
        ok = ok and tally.confirmed == sent
        if tally.returned:
            print(f"{tally.returned} returned (no queue took them)", file=sys.stderr)
        if tally.nacked:
            print(f"{tally.nacked} nacked by the broker", file=sys.stderr)
    else:
        print(f"published {sent}", file=sys.stderr)
        returned = used[0].returned_count if used else 0
        if returned:  # counted once the close handshake had drained every reply
            print(f"{returned} returned (no queue took them)", file=sys.stderr)
            ok = False
    return 0 if ok else 1


# --- consume ----------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    return str(value)


def _render(d: Delivery, as_json: bool) -> str:
    if not as_json:
        return d.body.decode("utf-8", errors="backslashreplace")
    record: dict[str, Any] = {
        "exchange": d.exchange,
        "routing_key": d.routing_key,
        "headers": d.headers,
        "properties": d.properties,
    }
    try:
        record["body"] = d.body.decode()
    except UnicodeDecodeError:
        record["body_b64"] = base64.b64encode(d.body).decode()
    record["redelivered"] = d.redelivered
    return json.dumps(record, default=_json_default, ensure_ascii=False)


def _cmd_consume(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise UsageError("--count must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    if args.key and args.queue:
        raise UsageError("-k/--key goes with -e/--exchange (a queue is consumed as it is)")
    out = sys.stdout

    async def body(conn: Connection) -> int:
        queue = args.queue
        if queue is None:
            queue = (await conn.declare_queue("", exclusive=True, auto_delete=True)).name
            await conn.bind(queue, args.exchange, args.key)
        prefetch = args.prefetch
        if args.count is not None:
            prefetch = min(prefetch, args.count) if prefetch else args.count
        seen = 0
        printed: list[Delivery] = []

        async def settle() -> None:
            out.flush()
            for d in printed:
                await d.ack()
            printed.clear()

        async with await conn.consume(queue, prefetch=prefetch) as consumer:
            while args.count is None or seen < args.count:
                if consumer.buffered:
                    d = await consumer.__anext__()
                else:
                    await settle()  # printed and flushed before acked, and before we wait
                    got = await _next_delivery(consumer, args.timeout)
                    if got is None:
                        break
                    d = got
                print(_render(d, args.json), file=out)
                printed.append(d)
                seen += 1
            await settle()
        return 0

    return _run(args, body)  # a broken stdout pipe ends it: what was not acked goes back


async def _next_delivery(consumer: Consumer, idle: float | None) -> Delivery | None:
    """The next delivery; None when the consumer ended or ``idle`` seconds passed."""
    try:
        if idle is None:
            return await consumer.__anext__()
        with trio.move_on_after(idle):
            return await consumer.__anext__()
        return None
    except StopAsyncIteration:
        return None


# --- declare, bind ------------------------------------------------------------------------


def _cmd_declare_exchange(args: argparse.Namespace) -> int:
    arguments = parse_pairs(args.arg, "argument")

    async def body(conn: Connection) -> int:
        await conn.declare_exchange(
            args.name,
            args.type,
            durable=args.durable,
            auto_delete=args.auto_delete,
            internal=args.internal,
            arguments=arguments,
        )
        print(f"declared exchange {args.name!r} ({args.type})")
        return 0

    return _run(args, body)


def _cmd_declare_queue(args: argparse.Namespace) -> int:
    arguments = parse_pairs(args.arg, "argument")
    if args.type:
        arguments["x-queue-type"] = args.type

    async def body(conn: Connection) -> int:
        info = await conn.declare_queue(
            args.name,
            durable=args.durable,
            exclusive=args.exclusive,
            auto_delete=args.auto_delete,
            arguments=arguments,
        )
        print(
            f"declared queue {info.name!r} ({info.messages} messages, {info.consumers} consumers)"
        )
        return 0

    return _run(args, body)


def _cmd_bind(args: argparse.Namespace) -> int:
    arguments = parse_pairs(args.arg, "argument")

    async def body(conn: Connection) -> int:
        await conn.bind(args.queue, args.exchange, args.key, arguments)
        print(f"bound queue {args.queue!r} to exchange {args.exchange!r} with key {args.key!r}")
        return 0

    return _run(args, body)


# --- status -------------------------------------------------------------------------------


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
    console.print(
        f"[bold]node[/bold] {status.get('node_id', '?')}  "
        f"[bold]state[/bold] {status.get('state', '?')}  "
        f"[bold]version[/bold] {status.get('version', '?')}  "
        f"[bold]up[/bold] {_duration(status.get('uptime_s'))}  "
        f"[bold]vhosts[/bold] {len(vhosts)}  [bold]queues[/bold] {n_queues}  "
        f"[bold]connections[/bold] {len(conns)}"
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
        for col in ("peer", "user", "vhost", "client", "since"):
            table.add_column(col)
        for c in conns:
            table.add_row(
                str(c.get("peer", "")),
                str(c.get("user", "")),
                str(c.get("vhost", "")),
                str(c.get("client", "")),
                _duration(c.get("since_s")),
            )
        console.print(table)


def _cmd_status(args: argparse.Namespace) -> int:
    async def body(conn: Connection) -> int:
        status = await conn.status()
        if args.json:
            print(json.dumps(status, indent=2, sort_keys=True, default=_json_default))
        else:
            print_status(status)
        return 0

    return _run(args, body)


# --- passwd -------------------------------------------------------------------------------


def _cmd_passwd(args: argparse.Namespace) -> int:
    from amqlite.auth import hash_password

    if args.stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        if password.endswith("\r"):
            password = password[:-1]
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", getpass.GetPassWarning)
                password = getpass.getpass("password: ")
                again = getpass.getpass("again: ")
        except (EOFError, getpass.GetPassWarning):
            return _fail("no terminal to read the password from (use --stdin)")
        if password != again:
            return _fail("the passwords differ")
    if not password:
        return _fail("empty password")
    print(hash_password(password))
    return 0
