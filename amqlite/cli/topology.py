"""``amqlite declare`` and ``amqlite bind``: exchanges, queues and bindings."""

from __future__ import annotations

import argparse

from amqlite.client import Connection

from .common import parse_pairs, run_connected


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

    return run_connected(args, body)


def cmd_bind(args: argparse.Namespace) -> int:
    arguments = parse_pairs(args.arg, "argument")

    async def body(conn: Connection) -> int:
        await conn.bind(args.queue, args.exchange, args.key, arguments)
        print(f"bound queue {args.queue!r} to exchange {args.exchange!r} with key {args.key!r}")
        return 0

    return run_connected(args, body)
