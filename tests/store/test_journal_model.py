"""A hypothesis state machine drives a journal through appends, commits, flushes,
compactions, full disks, process crashes and power cuts, and checks after every
restart that exactly what was committed (plus, after a process crash, what was
written) comes back."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from amqlite.store import (
    MessageEnqueue,
    QueueBind,
    QueueDelete,
    QueuePurge,
    Record,
    StoreWriteError,
)
from amqlite.store.journal import Journal

from .support import Hook, TestLayer, ack, delivered, eio, enq, fold, queue

QUEUES = ["q1", "q2"]


class JournalMachine(RuleBasedStateMachine):
    base: Path  # set by the test: its tmp_path

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="run-", dir=self.base))
        self.stored: list[Record] = []  # committed: fsynced
        self.written: list[tuple[int, Record]] = []  # (position, record) flushed, not fsynced
        self.pending: list[tuple[int, Record]] = []  # appended only
        self.next_id = 1
        self.journal, self.layer = self._open()

    def _open(self) -> tuple[Journal, TestLayer]:
        layer = TestLayer()
        journal = Journal(self.directory, fsync="always", segment_bytes=512, file_layer=layer)
        journal.recover()
        return journal, layer

    def _append(self, record: Record) -> None:
        self.pending.append((self.journal.append(record), record))

    def _settle(self) -> None:
        """Records a rollover fsynced (sealing a segment) count as stored: the journal
        says so in ``synced``, and the next power cut checks that claim."""
        synced = self.journal.synced
        self.stored += [r for pos, r in self.written if pos <= synced]
        self.written = [(pos, r) for pos, r in self.written if pos > synced]

    def _commit_all(self) -> None:
        self.stored += [r for _, r in self.written + self.pending]
        self.written, self.pending = [], []

    def teardown(self) -> None:
        self.layer.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- what the broker does ------------------------------------------------------

    @rule(name=st.sampled_from(QUEUES))
    def declare(self, name: str) -> None:
        self._append(queue(name))

    @rule(name=st.sampled_from(QUEUES), purge=st.booleans())
    def drop(self, name: str, purge: bool) -> None:
        self._append(QueuePurge(name=name) if purge else QueueDelete(name=name))

    @rule(name=st.sampled_from(QUEUES))
    def bind(self, name: str) -> None:
        self._append(QueueBind(queue=name, exchange="amq.direct", key=name))

    @rule(names=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2, unique=True))
    def publish(self, names: list[str]) -> None:
        self._append(enq(self.next_id, *names, body=b"x" * (self.next_id % 40)))
        self.next_id += 1

    @rule(data=st.data(), acked=st.booleans())
    def settle(self, data: st.DataObject, acked: bool) -> None:
        state = self.journal.state
        live = [(m.record.id, q) for q in QUEUES for m in state.messages("/", q)]
        if live:
            journal_id, name = data.draw(st.sampled_from(live))
            self._append(ack(journal_id, name) if acked else delivered(journal_id, name))

    # --- what the shell does -------------------------------------------------------

    @rule()
    def commit(self) -> None:
        self.journal.commit()
        self._commit_all()

    @rule()
    def flush(self) -> None:
        self.journal.flush()
        self.written += self.pending
        self.pending = []
        self._settle()

    @rule()
    def compact(self) -> None:
        self.journal.compact()
        self._commit_all()

    @rule(space=st.integers(0, 200), fsync_fails=st.booleans())
    def disk_trouble(self, space: int, fsync_fails: bool) -> None:
        if fsync_fails:
            self.layer.hook = _fail_fsync_once()
        else:
            self.layer.space = space
        try:
            self.journal.commit()
        except StoreWriteError as exc:
            self._settle()  # a rollover before the failure may have synced some
            failed = self.written + self.pending
            assert exc.not_stored == tuple(pos for pos, _ in failed)
            assert exc.dropped == tuple(pos for pos, r in failed if type(r) is MessageEnqueue)
            self.pending = [(pos, r) for pos, r in failed if type(r) is not MessageEnqueue]
            self.written = []
        else:  # the write fitted
            self._commit_all()
        finally:
            self.layer.space = None
            self.layer.hook = None

    # --- restarts ------------------------------------------------------------------

    @rule()
    def restart(self) -> None:
        self.journal.close()
        self._commit_all()
        self._restart()

    @rule()
    def process_crash(self) -> None:
        self.layer.kill()
        self.stored += [r for _, r in self.written]  # the page cache survives a process
        self.written, self.pending = [], []
        self._restart()

    @precondition(lambda self: bool(self.written or self.pending))
    @rule()
    def power_cut(self) -> None:
        self.layer.cut_power()
        self.written, self.pending = [], []
        self._restart()

    def _restart(self) -> None:
        self.journal, self.layer = self._open()
        _assert_holds(self.journal, self.stored)

    @invariant()
    def state_is_the_fold_of_what_was_appended(self) -> None:
        appended = self.stored + [r for _, r in self.written + self.pending]
        _assert_holds(self.journal, appended)


def _assert_holds(journal: Journal, records: list[Record]) -> None:
    """The journal's state is the fold of ``records``, less the messages dropped by
    write errors, whose ids stay used (a compaction may have recorded them)."""
    expected = fold(records)
    assert journal.state.last_journal_id >= expected.last_journal_id
    expected.last_journal_id = journal.state.last_journal_id
    assert journal.state == expected


def _fail_fsync_once() -> Hook:
    fired = [False]

    def hook(op: str, path: str) -> None:
        if op == "fsync" and not fired[0]:
            fired[0] = True
            raise eio()

    return hook


def test_journal_model(tmp_path: Path) -> None:
    class Machine(JournalMachine):
        base = tmp_path

    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=40, stateful_step_count=40, deadline=None, database=None),
    )
