"""``amqlite consume``: print messages from a queue, each flushed before it is acked.

Across a failover the consumer is resumed on the new server (see ``publish``):
messages printed but not yet acked when the link broke come again (at least once).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

import trio

from amqlite.client import Connection, Consumer, Delivery

from .common import UsageError, json_default
from .publish import run_reconnecting


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
    return json.dumps(record, default=json_default, ensure_ascii=False)


def cmd_consume(args: argparse.Namespace) -> int:
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

    # a broken stdout pipe ends it: what was not acked goes back
    return run_reconnecting(args, body)


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
