"""The LOCK file keeps a second broker off a data dir, with a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from amqlite.errors import ReplyCode
from amqlite.store import StoreLocked
from amqlite.store.journal import Journal

from .support import enq, queue

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_journal_in_the_same_process_is_refused(tmp_path: Path) -> None:
    first = Journal(tmp_path)
    with pytest.raises(StoreLocked) as info:
        Journal(tmp_path)
    assert info.value.pid == os.getpid()
    assert info.value.text == f"data dir {tmp_path} is in use by pid {os.getpid()}"
    assert info.value.code == ReplyCode.RESOURCE_LOCKED
    assert (tmp_path / "LOCK").read_text().strip() == str(os.getpid())
    first.close()
    Journal(tmp_path).close()  # released on close


def test_the_lock_is_released_even_when_never_recovered(tmp_path: Path) -> None:
    with Journal(tmp_path):
        pass
    with Journal(tmp_path) as journal:
        journal.recover()


def test_another_process_is_refused_while_we_hold_it(tmp_path: Path) -> None:
    with Journal(tmp_path) as journal:
        journal.recover()
        journal.append(queue())
        journal.commit()
        code = (
            "import sys\n"
            "from amqlite.store import StoreLocked\n"
            "from amqlite.store.journal import Journal\n"
            "try:\n"
            f"    Journal({str(tmp_path)!r})\n"
            "except StoreLocked as exc:\n"
            "    print(exc.text)\n"
            "    sys.exit(3)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        assert done.returncode == 3, done.stderr
        assert done.stdout.strip() == f"data dir {tmp_path} is in use by pid {os.getpid()}"


def test_we_are_refused_while_another_process_holds_it(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from amqlite.store.journal import Journal\n"
        f"j = Journal({str(tmp_path)!r})\n"
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == b"locked"
        with pytest.raises(StoreLocked, match=f"in use by pid {child.pid}$"):
            Journal(tmp_path)
        child.stdin.write(b"\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with Journal(tmp_path) as journal:  # the dead holder's lock is gone with it
        journal.recover()
        journal.append(queue())
        journal.append(enq(1))
        journal.commit()


def test_a_stale_lock_file_from_a_dead_process_does_not_block(tmp_path: Path) -> None:
    (tmp_path / "LOCK").write_text("999999\n")
    with Journal(tmp_path) as journal:
        journal.recover()
    assert (tmp_path / "LOCK").read_text().strip() == str(os.getpid())
