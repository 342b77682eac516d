"""docs/protocol.md stays in step with the code: methods, fields, types and
defaults, properties, reply codes, the state table and the example frame."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from amqlite.errors import ReplyCode, is_hard
from amqlite.protocol import PROPERTY_TYPES, WIRE_EVENTS
from amqlite.protocol import events as ev
from amqlite.protocol.codec import encode

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
SCRIPT = ROOT / "scripts" / "render_state_tables.py"

_TYPE_WORDS = {str: "text", int: "int", bool: "bool", float: "number", bytes: "bytes"}


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _type_word(name: str, tp: Any) -> str:
    if name == "headers":
        return "headers"
    if name == "props":
        return "properties"
    if name == "msgs":
        return "list of messages"
    if name == "extras":
        return "list of records"
    if tp in _TYPE_WORDS:
        return _TYPE_WORDS[tp]
    text = str(tp)
    if text.startswith("dict["):
        return "map"
    if text.startswith("list[str]"):
        return "list of text"
    if text == "int | None":
        return "int or null"
    raise AssertionError(f"no doc word for {name}: {tp!r}")


def _section(doc: str, method: str) -> str:
    """The text under ``#### `method` `` up to the next heading."""
    match = re.search(rf"^#### `{re.escape(method)}`\n(.*?)(?=^#)", doc, re.S | re.M)
    assert match, f"docs/protocol.md has no section for {method!r}"
    return match.group(1)


def _field_rows(section: str) -> list[list[str]]:
    """The rows of the first table in ``section`` (the field table)."""
    rows: list[list[str]] = []
    in_table = False
    for line in section.splitlines():
        if line.startswith("|"):
            in_table = True
            if line.startswith("| `"):
                rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif in_table:
            break
    return rows


@pytest.mark.parametrize("cls", WIRE_EVENTS, ids=[c.METHOD for c in WIRE_EVENTS])
def test_every_method_is_documented_field_by_field(cls: type[ev.Event]) -> None:
    rows = _field_rows(_section(_doc(), cls.METHOD))
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    assert [r[0] for r in rows] == [f"`{f.name}`" for f in fields]
    for row, f in zip(rows, fields, strict=True):
        assert row[1] == _type_word(f.name, f.type), f.name
        if f.default is not dataclasses.MISSING:
            assert row[2] == f"`{json.dumps(f.default)}`", f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert row[2] == f"`{json.dumps(f.default_factory())}`", f.name
        else:
            assert row[2] == "required", f.name


def test_summary_lists_every_method_with_its_direction() -> None:
    doc = _doc()
    summary = doc[doc.index("Summary:") : doc.index("### Handshake")]
    arrows = {"client": "client → server", "server": "server → client", "both": "both"}
    listed = {}
    for line in summary.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            listed[cells[0].strip("`")] = cells[1]
    assert listed == {cls.METHOD: arrows[cls.SENDER.value] for cls in WIRE_EVENTS}


def test_property_table_matches_the_codec() -> None:
    doc = _doc()
    section = doc[doc.index("## Message properties and headers") : doc.index("## Publish replies")]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `(\w+)` \| (\w+) \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    assert rows == {name: _TYPE_WORDS[t] for name, t in PROPERTY_TYPES.items()}


def test_reply_code_table_matches_errors() -> None:
    doc = _doc()
    table = doc[doc.index("## Reply codes") : doc.index("## Example frames")]
    found = {}
    for line in table.splitlines():
        m = re.match(r"^\| (\d{3}) \| (\w+) \| ([^|]+) \|", line)
        if m and m.group(1) != "200":
            found[int(m.group(1))] = (m.group(2), m.group(3).strip())
    assert {code: name for code, (name, _) in found.items()} == {int(c): c.name for c in ReplyCode}
    for code, (_, kind) in found.items():
        assert kind.startswith("hard") == is_hard(code), code
    hard_list = doc[doc.index("The hard codes are") : doc.index("In addition, every error")]
    for c in ReplyCode:
        assert (f"{int(c)} {c.name}" in hard_list) == is_hard(c), c


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_state_tables", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_state_table_block_is_the_scripts_output() -> None:
    printed = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert printed.strip() == _script().render().strip()
    assert printed.strip() in _doc()
    assert _script().main(["--check", str(DOC)]) == 0


def test_script_check_spots_a_stale_block(tmp_path: Path) -> None:
    script = _script()
    stale = tmp_path / "protocol.md"
    stale.write_text(_doc().replace("| **OPEN** | - | - | - | **OPEN**", "| **OPEN** | x |"))
    assert script.main(["--check", str(stale)]) == 1
    assert script.main(["--write", str(stale)]) == 0
    assert stale.read_text() == _doc()


def test_example_hello_frame_is_what_the_codec_writes() -> None:
    data = encode(ev.Hello(id=1, client="demo", heartbeat=5.0))
    doc = _doc()
    assert data.hex(" ") in doc
    assert f"`{data[:4].hex(' ')}` | length: {len(data) - 4} payload bytes" in doc
