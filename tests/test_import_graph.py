"""The shells' import graph has no circle and no module uses another's private
members (issue 13: the server was a five-file import circle whose modules reached
into each other's privates).

Imports are read with ``ast``, so one under ``if TYPE_CHECKING`` counts too: a
circle of type-only imports is still two rooms leaning on each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "amqlite"
SHELLS = ("amqlite.server", "amqlite.client", "amqlite.link")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """The amqlite modules ``name`` imports (a package import counts as its
    ``__init__``; ``from pkg import mod`` as ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                for candidate in (f"{base}.{alias.name}", base):
                    if candidate in MODULES:
                        found.add(candidate)
                        break
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
    found.discard(name)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_the_shells() -> None:
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    circles = [c for c in _circles(graph) if any(m.startswith(SHELLS) for m in c)]
    assert circles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def _private_uses(path: Path) -> list[str]:
    """``file:line: expr`` for each ``x._name`` whose ``x`` is not ``self``/``cls``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("shell", ["server", "client"])
def test_no_private_member_used_from_outside(shell: str) -> None:
    paths = sorted((PACKAGE / shell).rglob("*.py"))
    if (PACKAGE / "link.py").exists() and shell == "client":
        paths.append(PACKAGE / "link.py")
    uses = [use for p in paths for use in _private_uses(p)]
    assert uses == []
