"""Bodies stay in the journal: once written, a message's record leaves memory
(``StoreState.place``, one write late: at the next commit, or ``place_written``) and
is read back from its segment when needed; compaction moves messages to the
snapshot segment and their locations with them.

The placed state is a fast path beside the fold that keeps every record in
memory: the state machine below checks, at every step, that the journal's state
(placed, read back) and the plain fold of the same records agree, and that every
live message reads back as the record it was enqueued with.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from amqlite.store import MessageRef, Record
from amqlite.store import state as state_module
from amqlite.store.journal import Journal
from amqlite.store.records import QueuePurge

from .support import ack, delivered, enq, fold, open_journal, queue


def _held_records(journal: Journal) -> int:
    return sum(
        1 for item in journal.state.snapshot_refs() if type(item) is MessageRef and item.record
    )


def test_written_messages_leave_memory_and_read_back(tmp_path: Path) -> None:
    journal = open_journal(tmp_path, fsync="never")
    for r in [queue("q"), queue("r"), *(enq(i, "q", "r") for i in range(1, 6))]:
        journal.append(r)
    assert _held_records(journal) == 5  # buffered: in memory
    journal.commit()
    assert _held_records(journal) == 5  # written: placed at the next write
    journal.place_written()
    assert _held_records(journal) == 0
    journal.append(ack(2, "q"))
    journal.append(ack(2, "r"))
    journal.append(delivered(3, "q"))
    journal.append(enq(9, "q"))
    got = journal.read_messages([1, 2, 3, 9])
    assert got == [enq(1, "q", "r"), None, enq(3, "q", "r"), enq(9, "q")]
    journal.commit()
    report = journal.compact()
    assert report.forgotten == 0
    assert journal.read_messages([1, 3, 9]) == [enq(1, "q", "r"), enq(3, "q", "r"), enq(9, "q")]
    assert _held_records(journal) == 0
    journal.append(ack(1, "r"))
    journal.commit()
    journal.compact()  # a second time: the records read back from the first snapshot
    assert (
        journal.snapshot()
        == fold(
            [
                queue("q"),
                queue("r"),
                enq(1, "q"),
                enq(3, "q", "r"),
                delivered(3, "q"),
                enq(4, "q", "r"),
                enq(5, "q", "r"),
                enq(9, "q"),
            ]
        ).snapshot()
    )
    journal.close()
    again = open_journal(tmp_path)
    assert _held_records(again) == 0
    assert again.read_messages([5, 9]) == [enq(5, "q", "r"), enq(9, "q")]
    again.close()


def test_a_message_with_an_expiration_keeps_its_record(tmp_path: Path) -> None:
    journal = open_journal(tmp_path, fsync="never")
    journal.append(queue("q"))
    record = enq(1, "q")
    record.props["expiration"] = 100
    journal.append(record)
    journal.commit()
    journal.place_written()
    assert _held_records(journal) == 1
    journal.close()


def test_messages_are_placed_one_write_late_and_an_ack_before_spares_the_index(
    tmp_path: Path,
) -> None:
    """A write's messages are placed at the next write (or by ``place_written``, or
    a commit with nothing to write): one acked before then never enters the index."""
    journal = open_journal(tmp_path, fsync="never")
    journal.append(queue("q"))
    for i in range(1, 5):
        journal.append(enq(i, "q"))
    journal.commit()
    assert journal.unplaced and _held_records(journal) == 4
    journal.append(ack(1))
    journal.append(ack(2))
    journal.append(enq(5, "q"))
    journal.commit()  # places 3 and 4 (1 and 2 are gone); 5 waits
    state = journal.state
    assert list(state._index.ids) == [3, 4] and _held_records(journal) == 1
    journal.commit()  # nothing to write: places 5
    assert list(state._index.ids) == [3, 4, 5] and not journal.unplaced
    assert _held_records(journal) == 0
    assert journal.read_messages([1, 3, 5]) == [None, enq(3, "q"), enq(5, "q")]
    journal.append(enq(6, "q"))
    journal.commit()
    journal.compact()  # places 6 first: its location was in a segment it replaces
    assert not journal.unplaced and _held_records(journal) == 0
    assert journal.read_messages([3, 6]) == [enq(3, "q"), enq(6, "q")]
    journal.close()


class PlacedAgreesWithTheFold(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(self._tmp())
        self.journal = open_journal(self.dir, fsync="never", compact_after_bytes=1)
        self.records: list[Record] = []
        self.next_id = 1_000_000  # ids grow, as a broker's do ...
        self.low_id = 999_999  # ... but the fold takes any order: these go below
        self.live: dict[int, set[str]] = {}
        self.squeeze = state_module.SQUEEZE_AFTER
        state_module.SQUEEZE_AFTER = 2  # drop acked entries from the index arrays often
        for name in ("q", "r"):
            self._append(queue(name))

    @staticmethod
    def _tmp() -> str:
        import tempfile

        return tempfile.mkdtemp(prefix="placed-")

    def _append(self, record: Record) -> None:
        self.records.append(record)
        self.journal.append(record)

    @rule(
        queues=st.sampled_from([("q",), ("r",), ("q",), ("q", "r")]),
        size=st.integers(0, 300),
        low=st.booleans(),
    )
    def enqueue(self, queues: tuple[str, ...], size: int, low: bool) -> None:
        if low:
            i = self.low_id
            self.low_id -= 1
        else:
            i = self.next_id
            self.next_id += 1
        self._append(enq(i, *queues, body=bytes([i % 251]) * size))
        self.live[i] = set(queues)

    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        if not self.live:
            return
        i = data.draw(st.sampled_from(sorted(self.live)))
        q = data.draw(st.sampled_from(sorted(self.live[i])))
        if data.draw(st.booleans()):
            self._append(delivered(i, q))
            return
        self._append(ack(i, q))
        self.live[i].discard(q)
        if not self.live[i]:
            del self.live[i]

    @rule()
    def commit(self) -> None:
        self.journal.commit()

    @rule()
    def place_written(self) -> None:
        self.journal.place_written()

    @rule()
    def compact(self) -> None:
        self.journal.compact()

    @rule()
    def restart(self) -> None:
        self.journal.close()
        self.journal = open_journal(self.dir, fsync="never", compact_after_bytes=1)

    @invariant()
    def agrees(self) -> None:
        expected = fold(self.records)
        assert self.journal.state == expected
        assert self.journal.snapshot() == expected.snapshot()
        ids = sorted(self.live)
        got = self.journal.read_messages(ids)
        assert [r.body if r else None for r in got] == [
            bytes([i % 251]) * len(r.body) if r else None for i, r in zip(ids, got, strict=True)
        ]
        assert all(r is not None and r.id == i for i, r in zip(ids, got, strict=True))

    @rule()
    def purge(self) -> None:
        self._append(QueuePurge(name="q"))
        for i in [i for i, qs in self.live.items() if "q" in qs]:
            self.live[i].discard("q")
            if not self.live[i]:
                del self.live[i]

    def teardown(self) -> None:
        state_module.SQUEEZE_AFTER = self.squeeze
        self.journal.close()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


PlacedAgreesWithTheFold.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_placed_state_agrees_with_the_fold = PlacedAgreesWithTheFold.TestCase


def test_a_backlog_lives_in_the_index_arrays(tmp_path: Path) -> None:
    journal = open_journal(tmp_path, fsync="never")
    journal.append(queue("q"))
    for i in range(1, 101):
        journal.append(enq(i, "q"))
    journal.commit()
    journal.place_written()
    state = journal.state
    assert state._index.live() == 100 and not state._messages  # no object per message
    journal.append(delivered(7))
    journal.append(ack(8))
    assert state.live_messages == 99 and state.message_counts()[("/", "q")] == 99
    refs = [r for r in state.snapshot_refs() if type(r) is MessageRef]
    assert [r.id for r in refs] == [i for i in range(1, 101) if i != 8]
    assert refs[6].delivered == ("q",) and refs[6].location > 0 and refs[6].record is None
    journal.commit()
    journal.compact()
    assert journal.read_messages([7, 8, 100]) == [enq(7, "q"), None, enq(100, "q")]
    journal.close()


def test_acks_while_compaction_walks_the_index_are_kept(tmp_path: Path) -> None:
    """Compaction writes the index outside the lock: acks arriving meanwhile (here,
    each time it writes a chunk) leave the index's entries in place and lose
    nothing; the snapshot and the records after it give the state of all records."""
    from amqlite.store import state as state_module

    from .support import TestLayer

    records: list[Record] = [queue("q")]
    acked = iter(range(1, 400, 3))

    def hook(op: str, path: str) -> None:
        if op == "write" and path.endswith(".tmp"):
            for _ in range(20):
                i = next(acked, None)
                if i is not None:
                    records.append(ack(i))
                    journal.append(ack(i))

    squeeze, state_module.SQUEEZE_AFTER = state_module.SQUEEZE_AFTER, 1
    try:
        journal = open_journal(tmp_path, TestLayer(hook), fsync="never")
        journal.append(records[0])
        for i in range(1, 400):
            records.append(enq(i, "q", body=bytes(3000)))  # the snapshot takes > 1 MiB
            journal.append(records[-1])
        journal.commit()
        journal.compact()
        assert journal.state == fold(records)
        assert journal.snapshot() == fold(records).snapshot()
        journal.commit()
        journal.close()
        again = open_journal(tmp_path)
        acks = len(records) - 400
        assert acks >= 20  # some came while the index was being walked
        assert again.state == fold(records) and again.state.live_messages == 399 - acks
        again.close()
    finally:
        state_module.SQUEEZE_AFTER = squeeze
