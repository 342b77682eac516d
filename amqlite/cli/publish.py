"""``amqlite publish``: one message, numbered copies, or stdin lines; optionally
paced and confirmed."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections import deque
from collections.abc import AsyncGenerator, Callable

import trio

from amqlite.client import Connection, PendingConfirm
from amqlite.errors import AmqliteError, PublishNacked, PublishReturned

from .common import UsageError, parse_pairs, parse_properties, run_connected


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

    status = run_connected(args, body)  # raises (one line, exit 1) on broker or connection errors
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
