"""Hardening of what the broker writes: names from outside never leave the data dir,
and every directory it creates is 0700, every file 0600, whatever the umask."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import amqlite
from amqlite.config import load_config
from amqlite.peering import Entry, Envelope, MeshId
from amqlite.server import BrokerNode
from amqlite.server.peering.durability import SPILL_DIR, spill_path
from amqlite.server.peering.spill import FileSpill
from amqlite.store.durable_file import write_durably
from amqlite.store.files import file_name_for

HOSTILE = ["../x", "/abs", "a/b", "..", ".", "", "\0", "a\0b", "x" * 10_000, "../../" * 50]


def _inside(path: str, directory: str) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([real, base]) == base and real != base


def _check_name(name: str) -> None:
    component = file_name_for(name)
    assert component not in ("", ".", "..")
    assert "/" not in component and "\0" not in component
    assert len(component.encode()) <= 81  # far below NAME_MAX (255)
    with tempfile.TemporaryDirectory() as data_dir:
        path = spill_path(data_dir, name)
        assert _inside(path, os.path.join(data_dir, SPILL_DIR))
        spill = FileSpill(path)  # the file really is created there
        spill.close()
        assert os.listdir(os.path.join(data_dir, SPILL_DIR)) == [os.path.basename(path)]
        assert os.listdir(data_dir) == [SPILL_DIR]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_link_names_stay_in_the_data_dir(name: str) -> None:
    _check_name(name)
    _check_name(f"remote-node/{name}")  # a link id is "<node id>/<link name>"


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_name_stays_in_the_data_dir(name: str) -> None:
    _check_name(name)


@given(st.text(), st.text())
def test_different_names_never_share_a_file(a: str, b: str) -> None:
    assert (file_name_for(a) == file_name_for(b)) == (a == b)


def test_names_that_used_to_collide_get_their_own_files() -> None:
    names = ["a/b", "a_b", "a.b", "a:b", "é", "_", "x" * 100, "x" * 101]
    assert len({file_name_for(n) for n in names}) == len(names)
    assert file_name_for("eu-west/orders").startswith("eu-west_orders-")  # still readable


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The loosest umask: the modes must come from the broker, not from the umask."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _assert_private(root: Path) -> list[str]:
    """Every directory under ``root`` (and ``root``) 0700, every file 0600."""
    seen = []
    assert _mode(root) == 0o700, root
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            assert _mode(os.path.join(dirpath, d)) == 0o700, d
        for f in filenames:
            assert _mode(os.path.join(dirpath, f)) == 0o600, f
            seen.append(f)
    return seen


@pytest.mark.usefixtures("open_umask")
def test_spill_and_epoch_files_are_private(tmp_path: Path) -> None:
    spill = FileSpill(spill_path(str(tmp_path / "data"), "remote/link"))
    env = Envelope(MeshId("a", 1, 1), "k", b"b", {}, {"persistent": True}, "x")
    spill.append(Entry(1, env, env.size(), 1.0))
    spill.close()
    write_durably(str(tmp_path / "data" / "PEERING_EPOCH"), b"1")
    assert len(_assert_private(tmp_path / "data")) == 2


@pytest.mark.usefixtures("open_umask")
async def test_a_nodes_data_dir_is_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "deep" / "data"
    overrides = {"server.host": "127.0.0.1", "server.port": 0, "server.data_dir": str(data_dir)}
    node = BrokerNode(load_config(overrides=overrides))
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        async with amqlite.connect(f"127.0.0.1:{node.port}") as conn:
            await conn.declare_queue("q", durable=True)
            await conn.publish("", "q", "m", persistent=True, confirm=True)
        files = _assert_private(data_dir)
        node.stop()
    assert "LOCK" in files and any(f.endswith(".log") for f in files)
    assert _mode(tmp_path / "deep") == 0o700  # a parent it had to create, too
