"""The committer's ``batch`` wait: appends wait up to ``batch_ms`` for others to share
their fsync, but a callback waiting on the commit (``NodeStorage.after_commit``: an
HA passive node's ``ha.synced``, which the active node's confirms wait for) or
``NodeStorage.commit_now`` (an HA active node's, as it sends a sync) starts it at
once, also when the wait has begun already. The clock is trio's MockClock: it
moves only when the test moves it (or when every task has been blocked for a whole
second of real time: then a test that waited for nothing would see it move)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from amqlite.broker import Broker
from amqlite.config import StorageConfig
from amqlite.server.storage import NodeStorage
from amqlite.store.records import ExchangeDeclare


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=1.0)


@asynccontextmanager
async def committing(tmp_path: Path) -> AsyncIterator[NodeStorage]:
    storage = NodeStorage(StorageConfig(fsync="batch", batch_ms=10.0))
    await storage.open(str(tmp_path), Broker())
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(storage.run)
            yield storage
            nursery.cancel_scope.cancel()
    finally:
        await storage.close()


def _declare(storage: NodeStorage, name: str) -> int:
    return storage.record(ExchangeDeclare(name=name, type="direct"))


async def _durable(storage: NodeStorage, position: int) -> None:
    done = trio.Event()
    storage.when_durable(position, position, lambda lost: done.set())
    await done.wait()


async def _an_append_waits_for_the_batch(
    storage: NodeStorage, clock: trio.testing.MockClock, start: float
) -> None:
    position = _declare(storage, "w")
    await trio.testing.wait_all_tasks_blocked()
    assert storage.journal is not None and storage.journal.committed < position
    clock.jump(0.010)
    await _durable(storage, position)
    assert trio.current_time() - start == pytest.approx(0.010)


async def test_an_append_waits_for_the_batch(clock: trio.testing.MockClock, tmp_path: Path) -> None:
    async with committing(tmp_path) as storage:
        await _an_append_waits_for_the_batch(storage, clock, trio.current_time())


async def test_a_callback_waiting_on_the_commit_starts_it_at_once(
    clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with committing(tmp_path) as storage:
        start = trio.current_time()
        _declare(storage, "x")  # ...
        await trio.testing.wait_all_tasks_blocked()  # the committer waits for the batch
        _declare(storage, "y")
        committed = trio.Event()
        storage.after_commit(committed.set)  # ...until this cuts the wait short
        await committed.wait()
        assert trio.current_time() == start
        assert storage.journal is not None and storage.journal.committed == 2
        # and when nothing was waiting yet: at once too
        _declare(storage, "z")
        again = trio.Event()
        storage.after_commit(again.set)
        await again.wait()
        assert trio.current_time() == start
        # an append after that waits for the batch again
        await _an_append_waits_for_the_batch(storage, clock, start)


async def test_commit_now_cuts_the_wait_and_holds_for_the_commit_after_a_running_one(
    clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """``commit_now`` (an HA active node's, as a sync goes out) ends the batch wait;
    made while a commit runs, it spares the next commit the wait too; then the
    wait comes back."""
    async with committing(tmp_path) as storage:
        start = trio.current_time()
        position = _declare(storage, "x")
        await trio.testing.wait_all_tasks_blocked()  # the committer waits for the batch
        assert storage.journal is not None and storage.journal.committed < position
        storage.commit_now()
        await _durable(storage, position)
        assert trio.current_time() == start
        # made while a commit runs (``before_commit`` runs just before it starts):
        # the commit after it, which takes what this appends, goes at once too
        later: list[int] = []

        def during() -> None:
            if not later:
                later.append(_declare(storage, "z"))
                storage.commit_now()

        storage.before_commit = during
        _declare(storage, "y")
        storage.commit_now()
        await trio.testing.wait_all_tasks_blocked()
        assert later
        await _durable(storage, later[0])
        assert trio.current_time() == start
        storage.before_commit = None
        # an append after that waits for the batch again
        await _an_append_waits_for_the_batch(storage, clock, start)


async def test_commit_now_for_records_the_running_commit_took_is_spent_by_it(
    clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """``commit_now`` made as a commit starts, after what it appended went into that
    commit, does not send the next commit off at once: with nothing new appended
    there is no second commit, and an append after it waits for the batch. (It
    did: the wish outlived the commit that granted it, and the next append, or an
    empty write, went at once; the test above then failed when its append came
    first, one CI run in many.)"""
    async with committing(tmp_path) as storage:
        start = trio.current_time()
        calls: list[int] = []

        def during() -> None:
            if not calls:
                calls.append(_declare(storage, "z"))  # taken by the commit starting
                storage.commit_now()

        storage.before_commit = during
        _declare(storage, "y")
        storage.commit_now()
        await trio.testing.wait_all_tasks_blocked()
        await _durable(storage, calls[0])
        storage.before_commit = None
        commits = storage.commit_times.count
        await trio.testing.wait_all_tasks_blocked()
        assert storage.commit_times.count == commits  # no commit for nothing
        assert trio.current_time() == start
        await _an_append_waits_for_the_batch(storage, clock, start)


async def test_an_idle_journal_places_its_last_write_after_place_idle(
    clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A write's messages are placed at the next one (``Journal.commit``); when none
    follows within ``PLACE_IDLE``, the committer places them itself."""
    from amqlite.server.storage import PLACE_IDLE

    async with committing(tmp_path) as storage:
        journal = storage.journal
        assert journal is not None
        await _durable(storage, _declare(storage, "p"))
        assert journal.unplaced
        await trio.testing.wait_all_tasks_blocked()
        clock.jump(PLACE_IDLE * 0.9)
        await trio.testing.wait_all_tasks_blocked()
        assert journal.unplaced  # not yet
        clock.jump(PLACE_IDLE * 0.2)
        # placed in a worker thread, which the mock clock does not see: a bounded poll
        # in real time, each turn a checkpoint (no virtual time passes)
        deadline = time.monotonic() + 10
        while journal.unplaced and time.monotonic() < deadline:
            await trio.lowlevel.checkpoint()
        assert not journal.unplaced
