"""What every command shares: value parsing, error reporting, and running a
command's body on one connection (its flags: :mod:`amqlite.connection_args`)."""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from amqlite.client import Connection, connect
from amqlite.connection_args import tls_options
from amqlite.errors import AmqliteError, ConnectionClosed, ConnectionRefused
from amqlite.protocol import PROPERTY_TYPES

PROG = "amqlite"


class UsageError(Exception):
    """Bad command-line input found after parsing (exit status 2)."""


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


def fail(text: str) -> int:
    print(f"{PROG}: error: {text}", file=sys.stderr)
    return 1


def describe_error(exc: AmqliteError) -> str:
    if isinstance(exc, ConnectionRefused | ConnectionClosed):
        return exc.text
    return str(exc)


def run_connected(args: argparse.Namespace, body: Callable[[Connection], Awaitable[int]]) -> int:
    """Connect with the common options, run ``body``, close; returns its status."""

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
        ) as conn:
            return await body(conn)

    return trio.run(session)


def json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    return str(value)
