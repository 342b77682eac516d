"""``amqlite consume``: print messages from a queue, each flushed before it is acked.

Across a failover the consumer is resumed on the new server (see ``publish``):
messages printed but not yet acked when the link broke come again (at least once).
A stream queue is read from ``--offset`` on and resumed after the last message
returned, so a failover repeats nothing there. With ``--name`` the offset of what
was printed is stored on the server (every ``STORE_EVERY`` messages and at exit,
Ctrl-C included), and the next run under that name goes on after it.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import sys
from contextlib import suppress
from typing import Any

import trio

from amqlite.client import Connection, Consumer, Delivery
from amqlite.errors import AmqliteError

from .common import UsageError, json_default
from .publish import run_reconnecting, until_interrupted

#: With ``--name``: messages printed between two stores of their offset.
STORE_EVERY = 100


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
    if d.offset is not None:
        record["offset"] = d.offset
    return json.dumps(record, default=json_default, ensure_ascii=False)


def parse_offset(text: str) -> str | int:
    """``--offset``: ``first``, ``last``, ``next``, an offset or ISO-8601 time text."""
    if text in ("first", "last", "next"):
        return text
    try:
        offset = int(text)
    except ValueError:
        pass
    else:
        if offset < 0:
            raise UsageError(f"--offset must not be negative, got {offset}")
        return offset
    try:
        datetime.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--offset must be first, last, next, an offset or an ISO-8601 time, not {text!r}"
        ) from None
    return text


def cmd_consume(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise UsageError("--count must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    if args.key and args.queue:
        raise UsageError("-k/--key goes with -e/--exchange (a queue is consumed as it is)")
    if (args.offset is not None or args.name is not None) and args.queue is None:
        raise UsageError("--offset and --name go with -q/--queue (a stream queue)")
    if args.name == "":
        raise UsageError("--name must not be empty")
    start = None if args.offset is None else parse_offset(args.offset)
    name: str | None = args.name
    out = sys.stdout

    async def body(conn: Connection) -> int:
        queue = args.queue
        if queue is None:
            queue = (await conn.declare_queue("", exclusive=True, auto_delete=True)).name
            await conn.bind(queue, args.exchange, args.key)
        offset = start
        if name is not None:
            stored = await conn.query_offset(queue, name)
            if stored is not None:
                offset = stored + 1
            elif offset is None:
                offset = "first"
        prefetch = args.prefetch
        if args.count is not None:
            prefetch = min(prefetch, args.count) if prefetch else args.count
        seen = 0
        printed: list[Delivery] = []
        unstored: int | None = None  # the offset of the last message printed, not stored
        since_store = 0

        async def settle() -> None:
            out.flush()
            for d in printed:
                await d.ack()
            printed.clear()

        async def store() -> None:
            nonlocal unstored, since_store
            if name is None or unstored is None:
                return
            out.flush()  # stored only once printed
            await conn.store_offset(queue, name, unstored)
            unstored, since_store = None, 0

        try:
            async with await conn.consume(
                queue, prefetch=prefetch, offset=offset, selector=args.selector
            ) as consumer:
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
                    if d.offset is not None:
                        unstored = d.offset
                        since_store += 1
                        if since_store >= STORE_EVERY:
                            await store()
                await settle()
            await store()
        except BaseException:  # Ctrl-C, a lost server...: keep what was printed
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(conn.close_timeout),
                suppress(AmqliteError, OSError),
            ):
                await store()
            raise
        return 0

    async def interruptible(conn: Connection) -> int:
        return await until_interrupted(body(conn))

    # a broken stdout pipe ends it: what was not acked goes back
    return run_reconnecting(args, interruptible)


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
