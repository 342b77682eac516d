"""docs/amqp.md lists the state tables row for row as the code has them."""

from __future__ import annotations

import re
from pathlib import Path

from amqlite.amqp.states import CHANNEL_TRANSITIONS, CONNECTION_TRANSITIONS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "amqp.md").read_text("utf-8")
_ROW = re.compile(r"^\| `([a-z-]+)` \| `([a-z-]+)` \| `([a-z-]+)` \|$", re.MULTILINE)


def _section(title: str) -> set[tuple[str, str, str]]:
    start = DOC.index(title)
    end = DOC.find("\n### ", start + 1)
    end = DOC.find("\n## ", start + 1) if end == -1 else min(end, DOC.find("\n## ", start + 1))
    return {m.groups() for m in _ROW.finditer(DOC[start:end])}


def test_the_connection_table_in_the_docs_is_the_code_s() -> None:
    code = {(s.value, t.value, n.value) for (s, t), n in CONNECTION_TRANSITIONS.items()}
    assert _section("### Connection") == code


def test_the_channel_table_in_the_docs_is_the_code_s() -> None:
    code = {(s.value, t.value, n.value) for (s, t), n in CHANNEL_TRANSITIONS.items()}
    assert _section("### Channel") == code
