"""docs/storage.md stays in step with the code: record types, fields, types,
defaults, the segment header and the example frame."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from amqlite.store import MessageEnqueue, QueueDeclare
from amqlite.store.records import RECORD_TYPES, Record
from amqlite.store.segment import HEADER, MAGIC, VERSION, frame_record

DOC = Path(__file__).resolve().parents[2] / "docs" / "storage.md"

_TYPE_WORDS = {
    "str": "text",
    "bool": "bool",
    "bytes": "bytes",
    "int": "int",
    "float": "number",
    "dict[str, Any]": "map",
    "tuple[str, ...]": "list of text",
    "tuple[tuple[str, str], ...]": "list of [text, text]",
    "tuple[int, ...]": "list of int",
}


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _sections() -> dict[str, list[tuple[str, str, str]]]:
    """Record type -> (key, type, default) rows of its table."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for block in re.split(r"^### ", _doc(), flags=re.M)[1:]:
        block = block.split("\n## ")[0]  # up to the next section
        title = block.splitlines()[0]
        m = re.fullmatch(r"`([a-z.]+)`", title.strip())
        if m is None:
            continue
        rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \| ([^|]+) \|", block, flags=re.M)
        out[m.group(1)] = [(k, t.strip(), d.strip()) for k, t, d in rows]
    return out


def _default_word(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, dict):
        return "`{}`"
    if isinstance(value, tuple):
        return "`[]`"
    return f"`{value!r}`"


def _expected(cls: type[Record]) -> list[tuple[str, str, str]]:
    rows = []
    for f in dataclasses.fields(cls):
        key = f.metadata.get("key", f.name)
        word = {"headers": "headers", "props": "properties"}.get(f.name) or _TYPE_WORDS[str(f.type)]
        rows.append((key, word, _default_word(f)))
    return rows


def test_every_record_type_is_documented() -> None:
    assert sorted(_sections()) == sorted(cls.TYPE for cls in RECORD_TYPES)


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.TYPE)
def test_fields_types_and_defaults_match(cls: type[Record]) -> None:
    assert _sections()[cls.TYPE] == _expected(cls)


def test_segment_header_and_example_frame() -> None:
    doc = _doc()
    assert HEADER == MAGIC + bytes((VERSION,)) == b"AMQLJNL\x01"
    assert f"`{MAGIC.decode()}` followed by the format version\nbyte `0x0{VERSION}`" in doc
    example = frame_record(QueueDeclare(name="jobs"))
    assert example.hex(" ") in doc
    assert f"({len(example)} bytes)" in doc
    message = MessageEnqueue(
        id=1,
        queues=("jobs",),
        exchange="",
        routing_key="jobs",
        body=b"hello",
        props={"persistent": True},
        enqueued_at=1_700_000_000.0,
    )
    assert f"takes about {len(frame_record(message))} bytes" in doc
