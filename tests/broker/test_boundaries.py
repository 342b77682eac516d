"""The broker core stays sans-IO, and its messages are what the codec expects."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import amqlite.broker
from amqlite.broker import Message
from amqlite.protocol.codec import WireMessage, encode_deliver

FORBIDDEN = {"trio", "socket", "asyncio", "time", "logging", "structlog", "selectors", "threading"}
BROKER_DIR = Path(amqlite.broker.__file__).parent


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted(BROKER_DIR.glob("*.py")), ids=lambda p: p.name)
def test_broker_modules_do_no_io(path: Path) -> None:
    assert _imported_roots(path) & FORBIDDEN == set()


def test_public_names_are_exported() -> None:
    for name in amqlite.broker.__all__:
        assert getattr(amqlite.broker, name) is not None


def _as_wire_message(m: Message) -> WireMessage:
    return m  # mypy checks that Message satisfies the codec's protocol


def test_message_encodes_as_a_delivery_and_caches_it() -> None:
    m = Message("ex", "key", b"body", {"h": 1}, {"message_id": "m1"})
    frame = encode_deliver("ctag-1", 7, False, _as_wire_message(m))
    assert m.wire is not None
    assert b"body" in frame
    assert encode_deliver("ctag-1", 7, False, m) == frame


def test_message_defaults() -> None:
    m = Message("ex", "key", b"")
    assert (m.headers, m.properties, m.wire) == ({}, {}, None)
