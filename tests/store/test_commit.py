"""Group commit and fsync policies: one fsync per commit, nothing called durable early."""

from __future__ import annotations

import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from amqlite.store.journal import Journal

from .support import TestLayer, bodies, enq, open_journal, queue, recovered_state


def _warm(tmp_path: Path, fsync: str = "always") -> tuple[Journal, TestLayer]:
    """A recovered journal whose segment already exists, with counters reset."""
    layer = TestLayer()
    journal = open_journal(tmp_path, layer, fsync=fsync)
    journal.append(queue())
    journal.commit()
    layer.ops.clear()
    return journal, layer


@pytest.mark.parametrize("policy", ["always", "batch"])
def test_n_appends_and_one_commit_cost_one_fsync(tmp_path: Path, policy: str) -> None:
    journal, layer = _warm(tmp_path, policy)
    positions = [journal.append(enq(i)) for i in range(1, 101)]
    assert layer.ops["write"] == 0 and journal.committed == 1  # append only buffers
    assert journal.commit() == positions[-1] == journal.committed == journal.synced
    assert layer.ops["fsync"] == 1 and layer.ops["write"] == 1
    assert layer.ops["fsync_dir"] == 0
    assert journal.commit() == positions[-1]  # nothing new: no fsync
    assert layer.ops["fsync"] == 1
    journal.close()
    assert len(bodies(recovered_state(tmp_path))) == 100


def test_a_new_segment_costs_one_directory_fsync(tmp_path: Path) -> None:
    layer = TestLayer()
    journal = open_journal(tmp_path, layer, fsync="always")
    journal.append(queue())
    journal.commit()
    assert (layer.ops["fsync"], layer.ops["fsync_dir"]) == (1, 1)
    journal.close()


def test_positions_count_appends_from_one(tmp_path: Path) -> None:
    journal, _ = _warm(tmp_path)
    assert journal.appended == 1
    assert [journal.append(enq(i)) for i in (1, 2, 3)] == [2, 3, 4]
    journal.close()


def test_flush_writes_without_fsync_and_commit_syncs_it(tmp_path: Path) -> None:
    journal, layer = _warm(tmp_path)
    journal.append(enq(1))
    assert journal.flush() == 2
    assert layer.ops["fsync"] == 0 and journal.synced == journal.committed == 1
    journal.append(enq(2))
    assert journal.commit() == 3
    assert layer.ops["fsync"] == 1 and layer.ops["write"] == 2
    journal.close()


def test_never_writes_but_does_not_fsync_until_close(tmp_path: Path) -> None:
    journal, layer = _warm(tmp_path, "never")
    for i in range(1, 11):
        journal.append(enq(i))
    assert journal.commit() == 11 == journal.committed
    assert layer.ops["fsync"] == 0
    assert journal.synced == 0  # never claims an fsync it did not do
    assert journal.commit_interval == 0.0
    journal.close()
    assert layer.ops["fsync"] == 1  # a clean shutdown makes it durable


def test_commit_interval_follows_the_policy(tmp_path: Path) -> None:
    for policy, interval in (("always", 0.0), ("batch", 0.025), ("never", 0.0)):
        with Journal(tmp_path / policy, fsync=policy, batch_ms=25) as journal:  # type: ignore[arg-type]
            assert journal.commit_interval == interval


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync policy must be one of always, batch, never"):
        Journal(tmp_path, fsync="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_ms"):
        Journal(tmp_path, batch_ms=0)
    with pytest.raises(ValueError, match="segment_bytes"):
        Journal(tmp_path, segment_bytes=4)


def test_appends_during_a_commit_ride_the_next_fsync(tmp_path: Path) -> None:
    """Group commit with a worker thread: while one fsync runs, the loop keeps
    appending; the next commit covers all of those with one fsync."""
    journal, layer = _warm(tmp_path)
    in_fsync, release = threading.Event(), threading.Event()

    def hook(op: str, path: str) -> None:
        if op == "fsync" and not release.is_set():
            in_fsync.set()
            assert release.wait(30)

    layer.hook = hook
    first = journal.append(enq(1))
    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(journal.commit()))
    worker.start()
    assert in_fsync.wait(30)
    later = [journal.append(enq(i)) for i in range(2, 52)]  # while the fsync runs
    assert journal.committed == 1
    release.set()
    worker.join(30)
    assert results == [first] and journal.committed == first
    assert journal.commit() == later[-1]
    assert layer.ops["fsync"] == 2
    journal.close()
    assert len(bodies(recovered_state(tmp_path))) == 51


@pytest.mark.parametrize("policy", ["always", "batch"])
def test_a_power_cut_keeps_exactly_what_commit_reported(tmp_path: Path, policy: str) -> None:
    layer = TestLayer()
    journal = open_journal(tmp_path, layer, fsync=policy)
    journal.append(queue())
    for i in range(1, 6):
        journal.append(enq(i))
    committed = journal.commit()
    for i in range(6, 9):
        journal.append(enq(i))
    journal.flush()  # written, not fsynced
    journal.append(enq(9))  # only buffered
    assert journal.committed == committed == 6
    layer.cut_power()
    assert bodies(recovered_state(tmp_path)) == [b"m%d" % i for i in range(1, 6)]


def test_with_never_a_power_cut_may_lose_committed_records(tmp_path: Path) -> None:
    """What ``never`` risks, shown: committed (written) but not fsynced."""
    layer = TestLayer()
    journal = open_journal(tmp_path, layer, fsync="never")
    journal.append(queue())
    journal.append(enq(1))
    assert journal.commit() == 2 and journal.synced == 0
    layer.kill()  # a process crash loses nothing that was written ...
    assert bodies(recovered_state(tmp_path)) == [b"m1"]
    layer = TestLayer()
    journal = open_journal(tmp_path, layer, fsync="never")
    journal.append(enq(2))
    journal.commit()
    layer.cut_power()  # ... a power cut loses what no fsync covered
    assert bodies(recovered_state(tmp_path)) == [b"m1"]


def test_stats(tmp_path: Path) -> None:
    journal, _ = _warm(tmp_path, "batch")
    journal.append(enq(1, body=b"12345"))
    stats = journal.stats()
    assert stats.directory == str(tmp_path) and stats.fsync == "batch"
    assert (stats.pending, stats.appended, stats.committed) == (1, 2, 1)
    assert (stats.live_messages, stats.live_message_bytes) == (1, 5)
    assert stats.queue_messages == {("/", "q"): 1}
    journal.commit()
    stats = journal.stats()
    assert (
        stats.segments == 1
        and stats.bytes == (tmp_path / "journal-0000000000000001.log").stat().st_size
    )
    journal.close()


def _files_now(directory: Path) -> Any:
    """The state recovered from a copy of the files as they are (the journal that
    wrote them is still open and locked), as after a kill -9 at this instant."""
    copy = directory.parent / f"{directory.name}-{uuid.uuid4().hex}"
    shutil.copytree(directory, copy)
    return recovered_state(copy)


@pytest.mark.parametrize("policy", ["always", "batch", "never"])
def test_a_commit_during_a_held_turn_stores_none_of_it(tmp_path: Path, policy: str) -> None:
    """A commit (in the committer's thread) while the event loop is inside a turn
    (hold ... release) writes what came before the turn and none of the turn, so the
    files never hold half of it; the next commit writes the whole turn."""
    journal, _ = _warm(tmp_path, policy)
    before = journal.append(enq(1))
    journal.hold()
    journal.append(enq(2))
    journal.hold()  # nested: one turn
    journal.append(enq(3))
    journal.release()
    committed = journal.commit() if policy != "never" else journal.flush()
    assert committed == before
    assert sorted(bodies(_files_now(tmp_path))) == [b"m1"]  # what a kill -9 would leave
    journal.append(enq(4))
    journal.release()
    last = journal.commit() if policy != "never" else journal.flush()
    assert last == journal.appended
    assert sorted(bodies(_files_now(tmp_path))) == [b"m1", b"m2", b"m3", b"m4"]
    with pytest.raises(RuntimeError):
        journal.release()
    journal.close()


def test_close_writes_a_turn_still_held(tmp_path: Path) -> None:
    journal, _ = _warm(tmp_path)
    journal.hold()
    journal.append(enq(1))
    journal.close()
    assert sorted(bodies(recovered_state(tmp_path))) == [b"m1"]


def test_compaction_waits_for_a_held_turn_to_end(tmp_path: Path) -> None:
    """Compaction (in a worker thread) snapshots whole turns only: started inside
    one, it waits for the release and then takes the whole turn."""
    journal, _ = _warm(tmp_path)
    journal.append(enq(1))
    journal.hold()
    journal.append(enq(2))
    done = threading.Event()
    worker = threading.Thread(target=lambda: (journal.compact(), done.set()))
    worker.start()
    assert not done.wait(0.2)  # held: no snapshot of half a turn
    journal.append(enq(3))
    journal.release()
    worker.join(10)
    assert done.is_set()
    assert sorted(bodies(_files_now(tmp_path))) == [b"m1", b"m2", b"m3"]
    journal.close()
