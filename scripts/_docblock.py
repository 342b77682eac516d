"""Shared by the scripts that render a generated block into a doc page
(render_state_tables.py, ha_diagram.py): print it, ``--write FILE`` to update the
block between its markers, ``--check FILE`` to fail when the page is stale."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def replace_block(text: str, block: str, begin: str, end: str) -> str:
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise SystemExit("the generated-block markers are missing")
    return text[:start] + block + text[stop + len(end) :]


def main(
    argv: list[str] | None, *, description: str, render: Callable[[], str], begin: str,
    end: str, what: str,
) -> int:  # fmt: skip
    parser = argparse.ArgumentParser(description=description)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="FILE", help="update the block in FILE")
    group.add_argument("--check", type=Path, metavar="FILE", help="fail if FILE is stale")
    args = parser.parse_args(argv)
    block = render()
    if args.write is None and args.check is None:
        print(block)
        return 0
    path: Path = args.write or args.check
    text = path.read_text(encoding="utf-8")
    updated = replace_block(text, block, begin, end)
    if args.check is not None:
        if updated != text:
            print(f"{path}: {what} is stale; run {sys.argv[0]} --write {path}")
            return 1
        return 0
    path.write_text(updated, encoding="utf-8")
    return 0
