"""Disk trouble: a failed write or fsync names exactly what was not stored, never
counts it as committed, and the journal works again once the disk does."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from amqlite.errors import ReplyCode
from amqlite.store import QueueBind, StoreWriteError
from amqlite.store.journal import Journal

from .support import (
    TestLayer,
    ack,
    bodies,
    eio,
    enq,
    fail_on,
    open_journal,
    queue,
    recovered_state,
    segments,
)


def _journal(tmp_path: Path, **options: object) -> tuple[Journal, TestLayer, int]:
    """A journal with a queue and two committed messages; returns its file size."""
    layer = TestLayer()
    journal = open_journal(tmp_path, layer, fsync="always", **options)
    journal.append(queue())
    journal.append(enq(1))
    journal.append(enq(2))
    journal.commit()
    return journal, layer, (tmp_path / segments(tmp_path)[-1]).stat().st_size


def test_disk_full_mid_write(tmp_path: Path) -> None:
    journal, layer, size = _journal(tmp_path)
    layer.space = 30  # part of the next write lands, then ENOSPC
    positions = [journal.append(enq(i)) for i in (3, 4, 5)]
    bind = journal.append(QueueBind(queue="q", exchange="amq.direct", key="k"))
    with pytest.raises(StoreWriteError) as info:
        journal.commit()
    error = info.value
    assert error.dropped == tuple(positions)  # the publishes to refuse
    assert error.retrying == (bind,)
    assert error.not_stored == (*positions, bind)
    assert error.disk_full and error.errno == errno.ENOSPC
    assert error.code == ReplyCode.RESOURCE_ERROR
    assert "3 message(s) not stored" in error.text and "No space left" in error.text
    assert journal.committed == journal.synced == 3  # nothing new claimed
    assert (tmp_path / segments(tmp_path)[-1]).stat().st_size == size  # cut back
    assert journal.state.live_journal_ids() == [1, 2]  # the dropped ones are forgotten
    assert journal.stats().pending == 1  # the binding waits for the next commit

    layer.space = None  # space comes back
    journal.append(enq(6))
    assert journal.commit() == journal.appended
    journal.close()
    state = recovered_state(tmp_path)
    assert bodies(state) == [b"m1", b"m2", b"m6"]
    assert [b.key for b in state.bindings()] == ["k"]


def test_fsync_failure_fails_everything_written_since_the_last_fsync(tmp_path: Path) -> None:
    journal, layer, size = _journal(tmp_path)
    flushed = journal.append(enq(3))
    journal.flush()  # written, not yet fsynced
    buffered = journal.append(enq(4))
    layer.hook = fail_on("fsync", eio)
    with pytest.raises(StoreWriteError) as info:
        journal.commit()
    assert info.value.dropped == (flushed, buffered)
    assert info.value.errno == errno.EIO and not info.value.disk_full
    assert journal.synced == journal.committed == 3
    assert (tmp_path / segments(tmp_path)[-1]).stat().st_size == size
    journal.append(enq(5))
    journal.commit()  # the disk answers again
    journal.close()
    assert bodies(recovered_state(tmp_path)) == [b"m1", b"m2", b"m5"]


def test_a_kept_declaration_stays_ahead_of_what_was_appended_after_it(tmp_path: Path) -> None:
    """The failed batch declared a queue; a message for it appended after the failure
    must not be written before that declaration (or replay would drop it)."""
    journal, layer, _ = _journal(tmp_path)
    layer.hook = fail_on("write", eio)
    journal.append(queue("late"))
    lost = journal.append(enq(3, "late"))
    with pytest.raises(StoreWriteError) as info:
        journal.commit()
    assert info.value.dropped == (lost,)
    journal.append(enq(4, "late"))
    journal.commit()
    journal.close()
    assert bodies(recovered_state(tmp_path), "late") == [b"m4"]


def test_acks_in_a_failed_batch_are_retried(tmp_path: Path) -> None:
    journal, layer, _ = _journal(tmp_path)
    layer.hook = fail_on("write", eio)
    journal.append(ack(1))
    with pytest.raises(StoreWriteError) as info:
        journal.commit()
    assert info.value.dropped == () and len(info.value.retrying) == 1
    journal.commit()
    journal.close()
    assert bodies(recovered_state(tmp_path)) == [b"m2"]


def test_a_failed_cut_back_is_repaired_before_the_next_write(tmp_path: Path) -> None:
    journal, layer, size = _journal(tmp_path)
    layer.space = 10
    calls = {"truncate": 0}

    def hook(op: str, path: str) -> None:
        if op == "truncate" and calls["truncate"] == 0:
            calls["truncate"] += 1
            raise eio()

    layer.hook = hook
    journal.append(enq(3))
    with pytest.raises(StoreWriteError):
        journal.commit()
    path = tmp_path / segments(tmp_path)[-1]
    assert path.stat().st_size == size + 10  # a torn record is still there
    layer.space = None
    journal.append(enq(4))
    journal.commit()
    assert path.stat().st_size > size + 10
    journal.close()
    assert bodies(recovered_state(tmp_path)) == [b"m1", b"m2", b"m4"]


def test_a_crash_while_the_cut_back_failed_recovers_the_committed_records(
    tmp_path: Path,
) -> None:
    journal, layer, _ = _journal(tmp_path)
    layer.space = 10
    layer.hook = fail_on("truncate", eio, times=10)
    journal.append(enq(3))
    with pytest.raises(StoreWriteError):
        journal.commit()
    layer.kill()
    journal = Journal(tmp_path)
    report = journal.recover()
    assert report.dropped_bytes == 10
    assert bodies(report.state) == [b"m1", b"m2"]
    journal.close()


def test_a_new_segment_that_cannot_be_created(tmp_path: Path) -> None:
    journal, layer, _ = _journal(tmp_path, segment_bytes=64)
    layer.hook = fail_on("open", eio)
    journal.append(enq(3))
    with pytest.raises(StoreWriteError) as info:
        journal.commit()
    assert len(info.value.dropped) == 1
    journal.append(enq(4))
    journal.commit()
    journal.close()
    assert len(segments(tmp_path)) == 2
    assert bodies(recovered_state(tmp_path)) == [b"m1", b"m2", b"m4"]


def test_a_new_segment_whose_first_write_fails_gets_its_header_next_time(
    tmp_path: Path,
) -> None:
    journal, layer, _ = _journal(tmp_path, segment_bytes=64)
    layer.space = 3
    journal.append(enq(3))
    with pytest.raises(StoreWriteError):
        journal.commit()
    assert (tmp_path / segments(tmp_path)[-1]).stat().st_size == 0
    layer.space = None
    journal.append(enq(4))
    journal.commit()
    journal.close()
    assert bodies(recovered_state(tmp_path)) == [b"m1", b"m2", b"m4"]


def test_close_reports_a_failed_last_commit_and_still_releases_the_lock(
    tmp_path: Path,
) -> None:
    journal, layer, _ = _journal(tmp_path)
    layer.hook = fail_on("write", eio)
    journal.append(enq(3))
    with pytest.raises(StoreWriteError):
        journal.close()
    assert bodies(recovered_state(tmp_path)) == [b"m1", b"m2"]
