"""The ``amqlite`` command: run a broker, publish, consume, declare, inspect.

Every subcommand explains itself with ``--help``. Errors are one line on stderr
(``amqlite: error: ...``); the exit status is 0 on success, 1 for runtime errors
and 2 for usage errors.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from amqlite.connection_args import DEFAULT_SERVERS
from amqlite.errors import AmqliteError

from .common import (
    PROG,
    UsageError,
    describe_error,
    fail,
    parse_pairs,
    parse_properties,
    parse_scalar,
)
from .parser import COMMANDS, build_parser
from .status import print_status

__all__ = [
    "COMMANDS",
    "DEFAULT_SERVERS",
    "PROG",
    "UsageError",
    "build_parser",
    "main",
    "parse_pairs",
    "parse_properties",
    "parse_scalar",
    "print_status",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``amqlite`` command; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    at = next((i for i, a in enumerate(args_list) if a in COMMANDS), None)
    command = None
    if at is not None:
        command = args_list[at]
        # "amqlite -s HOST status" works too: options go after the command
        args_list = [command, *args_list[:at], *args_list[at + 1 :]]
    try:
        parser = build_parser(command)
    except UsageError as exc:  # e.g. amqlite bench without the bench harness
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
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
        return fail(describe_error(exc))
    except ValueError as exc:  # a bad server list
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. "amqlite status --json | head"
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
