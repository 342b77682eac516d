"""``amqlite passwd``: hash a password for the config file."""

from __future__ import annotations

import argparse
import getpass
import sys
import warnings

from .common import fail


def cmd_passwd(args: argparse.Namespace) -> int:
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
            return fail("no terminal to read the password from (use --stdin)")
        if password != again:
            return fail("the passwords differ")
    if not password:
        return fail("empty password")
    print(hash_password(password))
    return 0
