"""``amqlite declare`` and ``amqlite bind``: exchanges, queues and bindings."""

from __future__ import annotations

import argparse

from amqlite.client import Connection

from .common import UsageError, parse_pairs, run_connected


def cmd_declare_exchange(args: argparse.Namespace) -> int:
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

    return run_connected(args, body)


def cmd_declare_queue(args: argparse.Namespace) -> int:
    arguments = parse_pairs(args.arg, "argument")
    if args.type:
        arguments["x-queue-type"] = args.type
    if args.max_age is not None:
        arguments["x-max-age"] = args.max_age
    if args.max_length_bytes is not None:
        if args.max_length_bytes < 0:
            raise UsageError("--max-length-bytes must not be negative")
        arguments["x-max-length-bytes"] = args.max_length_bytes
    stream = arguments.get("x-queue-type") == "stream"
    if stream and (args.exclusive or args.auto_delete):
        raise UsageError("a stream queue cannot be --exclusive or --auto-delete")

    async def body(conn: Connection) -> int:
        info = await conn.declare_queue(
            args.name,
            durable=args.durable or stream,  # the broker takes only durable streams
            exclusive=args.exclusive,
            auto_delete=args.auto_delete,
            arguments=arguments,
        )
        print(
            f"declared queue {info.name!r} ({info.messages} messages, {info.consumers} consumers)"
        )
        return 0

    return run_connected(args, body)


def cmd_bind(args: argparse.Namespace) -> int:
    arguments = parse_pairs(args.arg, "argument")

    async def body(conn: Connection) -> int:
        await conn.bind(args.queue, args.exchange, args.key, arguments)
        print(f"bound queue {args.queue!r} to exchange {args.exchange!r} with key {args.key!r}")
        return 0

    return run_connected(args, body)
