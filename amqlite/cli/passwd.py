"""``amqlite passwd``: hash a password for the config file."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import warnings

from .common import fail


def cmd_passwd(args: argparse.Namespace) -> int:
    from amqlite.auth import TAGS, hash_password

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
            return fail("no terminal to read the password from (use --stdin)")
        if password != again:
            return fail("the passwords differ")
    if not password:
        return fail("empty password")
    if args.user is None:
        if args.tags:
            return fail("--tags needs --user")
        print(hash_password(password))
        return 0
    tags = [tag.strip() for tag in args.tags.split(",") if tag.strip()]
    unknown = [tag for tag in tags if tag not in TAGS]
    if unknown:
        return fail(f"unknown tag {unknown[0]!r} (known: {', '.join(TAGS)})")
    print(users_entry(args.user, hash_password(password), tags))
    return 0


def users_entry(name: str, password_hash: str, tags: list[str]) -> str:
    """A ``[[users]]`` entry to paste into the config file (permissions to fill in)."""
    listed = ", ".join(json.dumps(tag) for tag in tags)
    return "\n".join(
        [
            "[[users]]",
            f"name = {json.dumps(name)}",
            f'password_hash = "{password_hash}"',
            f"tags = [{listed}]",
            '[users.permissions."/"]          # one table per vhost; regexes over names',
            'configure = ""',
            'write = ""',
            'read = ""',
        ]
    )
