"""A passive HA node journals each sync's frames as they came
(``Journal.append_unfolded``) and folds them into its state later, in bulk
(``StoreState.fold_replicated``: an enqueue and its ack in the same run cancel out).
A journal fed that way must agree with one that folds every record as it comes
(``append_framed``): the same state whenever it is read, the same messages read
back, the same snapshot, the same records handed to the broker to follow, the same
state after a failed write and after a restart."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from amqlite.store import MessageMarks, QueueDelete, QueuePurge, Record, SnapshotBegin
from amqlite.store.codec import EnqueueScan
from amqlite.store.errors import StoreWriteError
from amqlite.store.journal import Journal
from amqlite.store.segment import check_frames, frame_record, parse_scanned
from amqlite.store.state import StoreState

from .support import (
    TestLayer,
    ack,
    as_received,
    delivered,
    eio,
    enq,
    enq_of_kind,
    fail_on,
    queue,
)

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("enq"), st.sampled_from([("q",), ("r",), ("q", "r"), ("x",)]),
                  st.sampled_from(["plain", "plain", "pk", "expiring", "headers"])),
        st.tuples(st.just("reenq"), st.integers(0, 8), st.sampled_from([("q",), ("r",)])),
        st.tuples(st.just("ack"), st.integers(0, 8), st.sampled_from(["q", "r"])),
        st.tuples(st.just("ack_last"), st.sampled_from(["q", "r"])),
        st.tuples(st.just("dlv"), st.integers(0, 8), st.sampled_from(["q", "r"])),
        st.tuples(st.just("marks"), st.integers(0, 8), st.integers(0, 8),
                  st.sampled_from(["q", "r"])),
        st.tuples(st.just("cut")),  # the sync ends here: the next records are another
        st.tuples(st.just("fold")),
        st.tuples(st.just("commit")),
        st.tuples(st.just("fail")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("read"), st.integers(0, 60)),
        st.tuples(st.just("check")),
        st.tuples(st.just("snapshot")),
        st.tuples(st.just("delete"), st.sampled_from(["q", "r"])),
        st.tuples(st.just("purge"), st.sampled_from(["q", "r"])),
        st.tuples(st.just("declare"), st.sampled_from(["q", "r"])),
    ),
    max_size=60,
)  # fmt: skip


def _pick(ids: list[int], n: int) -> int:
    """Mostly one of the newest ids (a consumer keeps up), else any."""
    return ids[-1 - n] if n < min(4, len(ids)) else ids[n % len(ids)]


class _Pair:
    """The journal folding each record and the one folding syncs lazily, fed the same
    syncs (the records between two cuts)."""

    def __init__(self, root: Path) -> None:
        self.layers = (TestLayer(), TestLayer())
        self.dirs = (root / "each", root / "lazy")
        self.journals = tuple(
            Journal(d, file_layer=layer) for d, layer in zip(self.dirs, self.layers, strict=True)
        )
        for journal in self.journals:
            journal.recover()
        self.sync: list[Record] = []
        self.appended: list[Any] = []  # every record, as the broker must follow them
        self.followed: list[Any] = []
        self.cancelled = 0
        self._scan = EnqueueScan().scan

    def append(self, record: Record) -> None:
        self.sync.append(record)

    def cut(self) -> None:
        """The sync so far goes to both journals."""
        if not self.sync:
            return
        each, lazy = self.journals
        frames = [frame_record(r) for r in self.sync]
        for record, frame in zip(self.sync, frames, strict=True):
            each.append_framed(record, frame)
        data = b"".join(frames)
        check_frames(data)
        self.appended.extend(r for r, _ in parse_scanned(data, self._scan))
        lazy.append_unfolded(data)
        self.sync = []

    def take_followed(self) -> None:
        for records in self.journals[1].take_followed():
            self.followed.extend(records)

    def each(self, call: Any) -> list[Any]:
        self.cut()
        out = []
        for journal in self.journals:
            try:
                out.append(("ok", call(journal)))
            except StoreWriteError as exc:
                out.append(("failed", len(exc.dropped)))
        return out

    def check(self) -> None:
        self.cut()
        a, b = (j.state for j in self.journals)
        assert a._canonical() == b._canonical()
        assert [(i, e.loc >= 0) for i, e in a._entries()] == [
            (i, e.loc >= 0) for i, e in b._entries()
        ]
        self.take_followed()
        assert self.followed == self.appended


@settings(max_examples=300, deadline=None, database=None)
@given(ops=_ops)
# a message held before the run, enqueued again and acked in it: no cancelling (the
# ack removes the one held); and an id enqueued again after its ack in one run
@example(ops=[("enq", ("q",), "plain"), ("fold",), ("reenq", 0, ("q",)), ("ack", 0, "q")])
@example(ops=[("enq", ("q",), "plain"), ("ack", 0, "q"), ("reenq", 0, ("q",))])
# a snapshot right after a write: its enqueue is resent before it is placed (CI runs)
@example(ops=[("enq", ("q",), "plain"), ("commit",), ("snapshot",)])
def test_a_journal_folding_syncs_lazily_agrees_with_one_folding_each_record(
    ops: list[Any],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pair = _Pair(Path(tmp))
        for name in ("q", "r"):
            pair.append(queue(name))
        ids: list[int] = []
        for op in ops:
            kind = op[0]
            if kind == "enq":
                journal_id = len(ids) + 1
                pair.append(enq_of_kind(journal_id, op[1], op[2]))
                ids.append(journal_id)
            elif kind == "reenq" and ids:  # an id again (as a snapshot resends it)
                pair.append(enq(_pick(ids, op[1]), *op[2]))
            elif kind in ("ack", "dlv") and ids:
                journal_id = _pick(ids, op[1])
                pair.append((ack if kind == "ack" else delivered)(journal_id, op[2]))
            elif kind == "ack_last" and ids:  # the usual: the newest message consumed
                pair.append(MessageMarks(queue=op[1], delivered=(), acked=(ids[-1],)))
            elif kind == "marks" and ids:
                x, y = _pick(ids, op[1]), _pick(ids, op[2])
                pair.append(MessageMarks(queue=op[3], delivered=(x,), acked=(y,) if y != x else ()))
            elif kind == "cut":
                pair.cut()
            elif kind == "fold":
                pair.cut()
                pair.journals[1].fold()
            elif kind == "commit":
                results = pair.each(lambda j: j.commit() >= 0)
                assert results[0] == results[1]
            elif kind == "fail":  # the next write fails: the enqueues in it are dropped
                for layer in pair.layers:
                    layer.hook = fail_on("write", eio)
                results = pair.each(lambda j: j.commit())
                for layer in pair.layers:
                    layer.hook = None
                assert [r[0] for r in results] == [results[0][0]] * 2
            elif kind == "compact":
                results = pair.each(lambda j: j.compact().records)
                assert results[0] == results[1]
            elif kind == "read" and ids:
                journal_id = ids[op[1] % len(ids)]
                results = pair.each(lambda j, i=journal_id: j.read_messages([i]))
                assert results[0] == results[1]
            elif kind == "check":
                pair.check()
            elif kind == "snapshot":  # a rejoin: the state so far, from nothing
                pair.cut()
                snapshot = pair.journals[0].snapshot()
                assert pair.journals[1].snapshot() == snapshot
                assert isinstance(snapshot[0], SnapshotBegin)
                for record in snapshot:
                    pair.append(as_received(record))
            elif kind == "delete":
                pair.append(QueueDelete(name=op[1]))
            elif kind == "purge":
                pair.append(QueuePurge(name=op[1]))
            elif kind == "declare":
                pair.append(queue(op[1]))
        pair.check()
        assert pair.journals[1].snapshot() == pair.journals[0].snapshot()
        results = pair.each(lambda j: j.commit() >= 0)
        assert results[0] == results[1]
        pair.check()
        live = pair.journals[0].state.live_journal_ids()
        assert pair.journals[0].read_messages(live) == pair.journals[1].read_messages(live)
        for journal in pair.journals:
            journal.close()
        recovered = []
        for directory in pair.dirs:
            journal = Journal(directory)
            recovered.append(journal.recover().state)
            journal.close()
        assert recovered[0] == recovered[1]


def test_an_enqueue_and_its_ack_in_one_tail_cancel_out() -> None:
    """The property test above would pass vacuously if nothing cancelled: here a
    consumer keeps up, and the bulk fold builds no entry for the messages it acked."""
    state = StoreState()
    state.apply(queue("q"))
    scan = EnqueueScan().scan
    records: list[Record] = [enq(i, "q") for i in range(1, 6)]
    records.append(MessageMarks(queue="q", delivered=(5,), acked=(1, 2, 3, 4)))
    items = parse_scanned(b"".join(frame_record(r) for r in records), scan)
    built: list[int] = []
    original = state.enqueue_scanned

    def counting(fields: Any, frame: bytes) -> Any:
        built.append(fields[0])
        return original(fields, frame)

    state.enqueue_scanned = counting  # type: ignore[method-assign]
    placing = state.fold_replicated(items)
    assert built == [5]  # 1-4 cancelled out
    assert [i for i, _ in placing] == [4]
    assert state.live_journal_ids() == [5]
    assert state.last_journal_id == 5
    expected = StoreState.fold([queue("q"), *records])
    assert state._canonical() == expected._canonical()
