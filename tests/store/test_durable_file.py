"""A small file replaced whole and durably (amqlite/store/durable_file.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amqlite.store.durable_file import read_if_present, write_durably


def test_a_write_replaces_the_file_and_reads_back(tmp_path: Path) -> None:
    path = str(tmp_path / "EPOCH")
    assert read_if_present(path) is None
    write_durably(path, b"1\n")
    assert read_if_present(path) == b"1\n"
    write_durably(path, b"2\n")
    assert read_if_present(path) == b"2\n"
    assert sorted(os.listdir(tmp_path)) == ["EPOCH"]  # no temporary file left


def test_the_data_and_the_directory_are_fsynced_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "EPOCH")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_durably(path, b"7\n")
    assert synced == ["file", "dir"]


@pytest.mark.parametrize("failing", ["write", "fsync", "replace"])
def test_a_failed_write_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = str(tmp_path / "EPOCH")
    write_durably(path, b"1\n")

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    if failing == "write":
        monkeypatch.setattr(os, "fdopen", _open_failing_writes())
    else:
        monkeypatch.setattr(os, failing, disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_durably(path, b"2\n")
    monkeypatch.undo()
    assert read_if_present(path) == b"1\n"
    assert sorted(os.listdir(tmp_path)) == ["EPOCH"]


def test_a_failed_first_write_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "EPOCH")

    def io_error(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", io_error)
    with pytest.raises(OSError):
        write_durably(path, b"1\n")
    monkeypatch.undo()
    assert read_if_present(path) is None
    assert os.listdir(tmp_path) == []


def _open_failing_writes() -> object:
    """``os.fdopen`` whose files fail on ``write`` (the disk filled up mid-write)."""
    real_open = os.fdopen

    class Failing:
        def __init__(self, f: object) -> None:
            self.f = f

        def __enter__(self) -> Failing:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()  # type: ignore[attr-defined]

        def write(self, data: bytes) -> int:
            self.f.write(data[: len(data) // 2])  # type: ignore[attr-defined]
            raise OSError(28, "No space left on device")

    def failing_open(path: int, mode: str = "r", *args: object, **kwargs: object) -> object:
        f = real_open(path, mode, *args, **kwargs)  # type: ignore[call-overload]
        return Failing(f) if "w" in mode else f

    return failing_open
