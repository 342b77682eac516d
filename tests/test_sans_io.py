"""The sans-IO core never does I/O, reads the clock or logs (DESIGN.md section 1).

Two checks per package: its source never imports a forbidden module (read with
``ast``, so an import inside a function or under ``if TYPE_CHECKING`` counts too),
and importing every one of its modules in a fresh interpreter pulls in no
forbidden module that the interpreter had not already loaded at start-up.

``amqlite/store`` is half pure, half I/O: its pure modules (the records, their
codec, segment framing, the state fold, the errors, and the package itself) are
checked like a core package; the journal and the file layer are the I/O half and
are forbidden to every checked module, so the broker core can import the records
without pulling in the journal.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The sans-IO core: amqlite/ha, amqlite/peering and amqlite/amqp join as soon as they exist
# (the HA and peering issues); protocol and broker must always be there.
CORE = ("protocol", "broker", "ha", "peering", "amqp", "browser")
SANS_IO = tuple(p for p in CORE if (ROOT / "amqlite" / p).is_dir())
assert {"protocol", "broker"} <= set(SANS_IO)
#: amqlite/store's pure modules (``__init__`` is the package) and its I/O ones; every
#: module there is one or the other (``durable_file``: the store's durable
#: small-file write, issue 13).
STORE_PURE = ("__init__", "codec", "errors", "records", "recover", "segment", "state")
STORE_IO = ("durable_file", "files", "journal")
#: What the checks cover: the core packages whole, and the pure part of the store.
CHECKED = (*SANS_IO, "store")
FORBIDDEN = frozenset(
    {
        "trio",
        "socket",
        "asyncio",
        "time",
        "logging",
        "structlog",
        "selectors",
        "threading",
        *(f"amqlite.store.{name}" for name in STORE_IO),
    }
)
#: Forbidden besides to the store's pure modules: the file system is the I/O half's.
FILE_IO = frozenset({"os", "fcntl", "io", "mmap", "pathlib", "shutil", "tempfile"})


def _forbidden_for(package: str) -> frozenset[str]:
    return FORBIDDEN | FILE_IO if package == "store" else FORBIDDEN


def is_forbidden(module: str, forbidden: frozenset[str] = FORBIDDEN) -> bool:
    """Whether ``module`` (a dotted name) is, or is inside, a ``forbidden`` module."""
    parts = module.split(".")
    return any(".".join(parts[:i]) in forbidden for i in range(1, len(parts) + 1))


def _sources(package: str) -> list[Path]:
    """The checked files of a package: all of a core one, the pure modules of the store."""
    files = sorted((ROOT / "amqlite" / package).rglob("*.py"))
    if package == "store":
        files = [f for f in files if f.stem in STORE_PURE]
    return files


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(path: Path, level: int, module: str | None) -> str:
    """The absolute module a (possibly relative) ``from`` import names."""
    if level == 0:
        return module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()  # a module's own package
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def forbidden_imports(source: str, path: Path, forbidden: frozenset[str] = FORBIDDEN) -> list[str]:
    """``file:line: name`` for every import of a ``forbidden`` module in ``source``,
    the text of ``path`` (which places relative imports)."""
    tree = ast.parse(source, filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(path, node.level, node.module)
            # ``from . import x`` / ``from pkg import x`` may import a module ``x``
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names = [arg.value]
        if any(is_forbidden(name, forbidden) for name in names):
            line = getattr(node, "lineno", 0)
            found.append(f"{path.relative_to(ROOT)}:{line}: {ast.unparse(node)}")
    return found


def _is_dynamic_import(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Name):
        name = func.id
    elif isinstance(func, ast.Attribute):
        name = func.attr
    else:
        return False
    return name in ("__import__", "import_module") and bool(node.args)


# --- the checker itself ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("import trio\n", True),
        ("import os, socket\n", True),
        ("import logging.handlers\n", True),
        ("from time import monotonic\n", True),
        ("from asyncio import sleep as s\n", True),
        ("def f():\n    import structlog\n", True),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import trio\n", True),
        ("import importlib\nimportlib.import_module('threading')\n", True),
        ("__import__('selectors')\n", True),
        ("import os\nfrom dataclasses import dataclass\nimport cbor2\n", False),
        ("from . import events\nfrom .codec import frame\nfrom .. import errors\n", False),
        ("import timeit\nfrom mytime import x\nimport trio_like\n", False),
        ("from amqlite.store.journal import Journal\n", True),
        ("from amqlite.store import journal\n", True),
        ("from ..store.files import OsFileLayer\n", True),
        ("from amqlite.store.records import Record\n", False),
        ("from amqlite.store import StoreState\n", False),
        ("x = 'import trio'\n", False),
    ],
)
def test_checker_spots_forbidden_imports(source: str, bad: bool) -> None:
    where = ROOT / "amqlite" / "protocol" / "probe.py"
    assert bool(forbidden_imports(source, where)) is bad


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("import os\n", True),
        ("from os import path\n", True),
        ("import fcntl\n", True),
        ("from pathlib import Path\n", True),
        ("from .journal import Journal\n", True),
        ("from . import files\n", True),
        ("import struct, zlib, re, errno\nimport cbor2\n", False),
        ("from .records import Record\nfrom .codec import encode_record\n", False),
    ],
)
def test_the_store_s_pure_modules_touch_no_files(source: str, bad: bool) -> None:
    where = ROOT / "amqlite" / "store" / "probe.py"
    assert bool(forbidden_imports(source, where, _forbidden_for("store"))) is bad


def test_relative_imports_resolve_inside_the_package() -> None:
    init = ROOT / "amqlite" / "protocol" / "__init__.py"
    module = ROOT / "amqlite" / "protocol" / "codec.py"
    assert _resolve(init, 1, "codec") == "amqlite.protocol.codec"
    assert _resolve(module, 1, "events") == "amqlite.protocol.events"
    assert _resolve(module, 2, "errors") == "amqlite.errors"
    assert _resolve(module, 1, None) == "amqlite.protocol"


# --- the packages ----------------------------------------------------------------------


def test_every_store_module_is_pure_or_io() -> None:
    names = {p.stem for p in (ROOT / "amqlite" / "store").glob("*.py")}
    assert not set(STORE_PURE) & set(STORE_IO)
    assert names <= set(STORE_PURE) | set(STORE_IO), "classify it in STORE_PURE or STORE_IO"
    assert set(STORE_PURE) <= names


@pytest.mark.parametrize("package", CHECKED)
def test_sources_import_nothing_forbidden(package: str) -> None:
    sources = _sources(package)
    assert sources, f"amqlite/{package} has no Python files"
    forbidden = _forbidden_for(package)
    found = [hit for p in sources for hit in forbidden_imports(p.read_text("utf-8"), p, forbidden)]
    assert found == []


_PROBE = r"""
import importlib, json, sys, types
root, modules = sys.argv[1], json.loads(sys.argv[2])
at_start = set(sys.modules)
# Load the amqlite package without running amqlite/__init__.py: the public API may
# re-export the trio shells, and that is not the sans-IO package's doing.
pkg = types.ModuleType("amqlite")
pkg.__path__ = [root + "/amqlite"]
sys.modules["amqlite"] = pkg
gained = {}
for name in modules:
    before = set(sys.modules)
    importlib.import_module(name)
    gained[name] = sorted(set(sys.modules) - before)
print(json.dumps({"at_start": sorted(at_start), "gained": gained}))
"""


@pytest.mark.parametrize("package", CHECKED)
def test_importing_pulls_in_nothing_forbidden(package: str) -> None:
    modules = [_module_name(p) for p in _sources(package)]
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(ROOT), json.dumps(modules)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    at_start = set(report["at_start"])
    forbidden = _forbidden_for(package)
    offenders = {
        module: bad
        for module, gained in report["gained"].items()
        if (bad := [m for m in gained if is_forbidden(m, forbidden) and m not in at_start])
    }
    assert offenders == {}
    # the probe really imported the package
    assert f"amqlite.{package}" in {m for g in report["gained"].values() for m in g}
