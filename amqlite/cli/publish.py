"""``amqlite publish``: one message, numbered copies, or stdin lines; optionally
paced and confirmed.

``publish`` and ``consume`` ride out a failover: their connection reconnects
through the server list (primary first), and they say so on stderr. Confirmed
publishes not confirmed before the cut are sent again, so ``--confirm`` ends with
every message confirmed (some perhaps twice on the broker: at least once).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import Any

import structlog
import trio

from amqlite.client import (
    Connection,
    Disconnected,
    PendingConfirm,
    Reconnected,
    ReconnectPolicy,
    connect,
)
from amqlite.connection_args import tls_options
from amqlite.errors import AmqliteError, PublishNacked, PublishReturned
from amqlite.log import configure_logging

from .common import PROG, UsageError, describe_error, parse_pairs, parse_properties

#: How the long-running commands reconnect: as the client's default policy.
RECONNECT = ReconnectPolicy()


async def until_interrupted(work: Awaitable[int]) -> int:
    """Await ``work``; Ctrl-C (SIGINT) cancels it at its next checkpoint and gives
    130. Unlike a KeyboardInterrupt, which may hit any task (the connection's own
    included), the cancel leaves the connection working, so ``work`` can still
    store its offset and cancel its consumer on the way out. (Signals reach only
    the main thread; elsewhere ``work`` is simply awaited.)"""
    if threading.current_thread() is not threading.main_thread():
        return await work
    status = 130
    failure: BaseException | None = None
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(watch)
            try:
                status = await work
            except Exception as exc:  # raised as itself, not inside a nursery's group,
                failure = exc  # so the command prints its usual one-line error
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return status


def run_reconnecting(args: argparse.Namespace, body: Callable[[Connection], Awaitable[int]]) -> int:
    """Like ``common.run_connected``, with a connection that reconnects (whatever the
    length of the server list) and one stderr line when it loses and regains its
    server."""

    def lost(event: Disconnected) -> None:
        why = describe_error(event.error)
        print(f"{PROG}: lost {event.address} ({why}), reconnecting", file=sys.stderr)

    def back(event: Reconnected) -> None:
        print(
            f"{PROG}: reconnected to {event.address} after {event.downtime:.2f}s",
            file=sys.stderr,
        )

    async def session() -> int:
        async with connect(
            args.servers,
            vhost=args.vhost,
            login=args.login,
            password=args.password,
            client_name=f"{PROG}-{args.command}",
            connect_timeout=args.connect_timeout,
            **tls_options(args),
            max_in_flight=getattr(args, "window", 1000),
            reconnect=RECONNECT,
            on_disconnect=lost,
            on_reconnect=back,
        ) as conn:
            return await body(conn)

    with _client_logs_on_stderr():
        return trio.run(session)


@contextlib.contextmanager
def _client_logs_on_stderr() -> Iterator[None]:
    """The client's warnings go to stderr, never into the messages on stdout (an
    unconfigured structlog prints to stdout); a configuration in place is kept."""
    if structlog.is_configured():
        yield
        return
    configure_logging("console", "warning", sys.stderr)
    try:
        yield
    finally:
        structlog.reset_defaults()


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


def _numbering(values: dict[str, Any]) -> Callable[[int], dict[str, Any] | None]:
    """n -> ``values`` with ``{n}`` in its text values replaced by n (as in the body),
    e.g. ``-P message_id=order-{n}``; the same map every time when none has it."""
    if not any(isinstance(v, str) and "{n}" in v for v in values.values()):
        fixed = values or None
        return lambda n: fixed
    return lambda n: {
        k: v.replace("{n}", str(n)) if isinstance(v, str) else v for k, v in values.items()
    }


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


def cmd_publish(args: argparse.Namespace) -> int:
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
    headers_for, properties_for = _numbering(headers), _numbering(properties)
    tally = _PublishTally()
    sent = 0
    used: list[Connection] = []

    async def body(conn: Connection) -> int:
        nonlocal sent
        used.append(conn)

        async def one(i: int, payload: bytes) -> None:
            nonlocal sent
            headers_of_n, properties_of_n = headers_for(i + 1), properties_for(i + 1)
            if args.confirm:
                p = await conn.publish_nowait(
                    args.exchange,
                    args.key,
                    payload,
                    headers=headers_of_n,
                    properties=properties_of_n,
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
                    headers=headers_of_n,
                    properties=properties_of_n,
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
                await one(i, payload)
        if args.confirm:
            with contextlib.suppress(AmqliteError):  # counted below, message by message
                await conn.wait_for_confirms()
            tally.collect()
            if tally.error is not None:
                raise tally.error
        return 0

    async def interruptible(conn: Connection) -> int:
        return await until_interrupted(body(conn))

    # raises (one line, exit 1) on broker/connection errors; Ctrl-C: 130
    status = run_reconnecting(args, interruptible)
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
    if status == 130:  # interrupted: what was sent and confirmed is printed above
        return 130
    return 0 if ok else 1
