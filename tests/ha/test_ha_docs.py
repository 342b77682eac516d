"""docs/ha.md stays in step with the transition table: its generated block is
exactly what scripts/ha_diagram.py renders from amqlite.ha.states."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from amqlite.ha import TRANSITIONS, HaEvent, HaState

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ha.md"
SCRIPT = ROOT / "scripts" / "ha_diagram.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ha_diagram", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doc_block_is_the_scripts_output() -> None:
    printed = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert printed.strip() == _script().render().strip()
    assert printed.strip() in DOC.read_text(encoding="utf-8")
    assert _script().main(["--check", str(DOC)]) == 0


def test_regenerating_the_doc_changes_nothing(tmp_path: Path) -> None:
    copy = tmp_path / "ha.md"
    copy.write_text(DOC.read_text(encoding="utf-8"), encoding="utf-8")
    assert _script().main(["--write", str(copy)]) == 0
    assert copy.read_text(encoding="utf-8") == DOC.read_text(encoding="utf-8")


def test_check_spots_a_stale_block(tmp_path: Path) -> None:
    script = _script()
    text = DOC.read_text(encoding="utf-8")
    stale = tmp_path / "ha.md"
    edge = "    PASSIVE --> ACTIVE: "
    assert edge in text
    stale.write_text(text.replace(edge, "    PASSIVE --> BACKUP: "), encoding="utf-8")
    assert script.main(["--check", str(stale)]) == 1
    assert script.main(["--write", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == text


def test_every_pair_and_every_edge_is_in_the_diagram() -> None:
    table = _script().markdown_table()
    rows = [line for line in table.splitlines() if line.startswith("| **")]
    assert len(rows) == len(HaState)
    assert all(line.count(" | ") == len(HaEvent) for line in rows)
    diagram = _script().mermaid_diagram()
    for (state, event), _ in TRANSITIONS.items():
        edges = [line for line in diagram.splitlines() if line.startswith(f"    {state.name} -->")]
        assert any(event.value in line for line in edges), (state, event)
