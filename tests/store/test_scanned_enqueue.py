"""A passive HA node journals replicated enqueues from their scanned fields
(``Journal.append_scanned``, ``StoreState.enqueue_scanned``) instead of decoding each
one (``append_framed``). The two journals must agree at every step: the same state,
the same placements once written, the same snapshot, the same state after a
restart, and the same when a write fails."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from amqlite.store import MessageMarks, QueueDelete, Record, SnapshotBegin, SnapshotEnd
from amqlite.store.codec import EnqueueScan
from amqlite.store.errors import StoreWriteError
from amqlite.store.journal import Journal
from amqlite.store.segment import frame_record

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
                  st.sampled_from(["plain", "pk", "expiring", "headers"])),
        st.tuples(st.just("ack"), st.integers(0, 60), st.sampled_from(["q", "r"])),
        st.tuples(st.just("dlv"), st.integers(0, 60), st.sampled_from(["q", "r"])),
        st.tuples(st.just("marks"), st.integers(0, 60), st.integers(0, 60),
                  st.sampled_from(["q", "r"])),
        st.tuples(st.just("commit")),
        st.tuples(st.just("place")),
        st.tuples(st.just("fail")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("read"), st.integers(0, 60)),
        st.tuples(st.just("snapshot")),
        st.tuples(st.just("delete"), st.sampled_from(["q", "r"])),
        st.tuples(st.just("declare"), st.sampled_from(["q", "r"])),
    ),
    max_size=40,
)  # fmt: skip


class _Pair:
    """The general journal and the scanning one, fed the same frames."""

    def __init__(self, root: Path) -> None:
        self.layers = (TestLayer(), TestLayer())
        self.dirs = (root / "general", root / "scanned")
        self.journals = tuple(
            Journal(d, file_layer=layer) for d, layer in zip(self.dirs, self.layers, strict=True)
        )
        for journal in self.journals:
            journal.recover()
        self.scan = EnqueueScan()
        self.scanned = 0

    def append(self, record: Record) -> None:
        general, scanning = self.journals
        frame = frame_record(record)
        general.append_framed(record, frame)
        fields = self.scan.scan(frame, 8, len(frame))
        if fields is None:
            scanning.append_framed(record, frame)
        else:
            self.scanned += 1
            scanning.append_scanned(fields, frame)

    def each(self, call: Any) -> list[Any]:
        out = []
        for journal in self.journals:
            try:
                out.append(("ok", call(journal)))
            except StoreWriteError as exc:
                out.append(("failed", exc.dropped, exc.retrying))
        return out

    def check(self) -> None:
        a, b = (j.state for j in self.journals)
        assert a._canonical() == b._canonical()
        # placed or not alike (where: a record appended twice, as a snapshot resends
        # it, may be placed at either copy; the records read back are compared)
        assert [(i, e.loc >= 0) for i, e in a._entries()] == [
            (i, e.loc >= 0) for i, e in b._entries()
        ]

    def read_back(self) -> None:
        a, b = self.journals
        ids = a.state.live_journal_ids()
        assert a.read_messages(ids) == b.read_messages(ids)


@settings(max_examples=150, deadline=None, database=None)
@given(ops=_ops)
# a snapshot right after a write: its enqueue is resent before it is placed (a CI run)
@example(ops=[("enq", ("q",), "plain"), ("commit",), ("snapshot",)])
def test_a_journal_fed_scanned_enqueues_agrees_with_one_fed_records(ops: list[Any]) -> None:
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
            elif kind in ("ack", "dlv") and ids:
                journal_id = ids[op[1] % len(ids)]
                pair.append((ack if kind == "ack" else delivered)(journal_id, op[2]))
            elif kind == "marks" and ids:
                x, y = ids[op[1] % len(ids)], ids[op[2] % len(ids)]
                pair.append(MessageMarks(queue=op[3], delivered=(x,), acked=(y,) if y != x else ()))
            elif kind == "commit":
                results = pair.each(lambda j: j.commit())
                assert results[0] == results[1]
            elif kind == "place":  # the last write's messages, placed now
                pair.each(lambda j: j.place_written())
            elif kind == "fail":  # the next write fails: the enqueues in it are dropped
                for layer in pair.layers:
                    layer.hook = fail_on("write", eio)
                results = pair.each(lambda j: j.commit())
                for layer in pair.layers:
                    layer.hook = None
                assert results[0] == results[1]
            elif kind == "compact":
                results = pair.each(lambda j: j.compact().records)
                assert results[0] == results[1]
            elif kind == "read" and ids:
                journal_id = ids[op[1] % len(ids)]
                results = pair.each(lambda j, i=journal_id: j.read_messages([i]))
                assert results[0] == results[1]
            elif kind == "snapshot":  # a rejoin: the state so far, from nothing
                snapshot = pair.journals[0].snapshot()
                assert pair.journals[1].snapshot() == snapshot
                assert isinstance(snapshot[0], SnapshotBegin)
                assert isinstance(snapshot[-1], SnapshotEnd)
                for record in snapshot:
                    pair.append(as_received(record))
            elif kind == "delete":
                pair.append(QueueDelete(name=op[1]))
            elif kind == "declare":
                pair.append(queue(op[1]))
            pair.check()
        assert pair.journals[1].snapshot() == pair.journals[0].snapshot()
        pair.check()
        results = pair.each(lambda j: j.commit())
        assert results[0] == results[1]
        pair.check()
        pair.read_back()
        for journal in pair.journals:
            journal.close()
        recovered = []
        for directory in pair.dirs:
            journal = Journal(directory)
            recovered.append(journal.recover().state)
            journal.close()
        assert recovered[0] == recovered[1]


def test_the_scanning_journal_does_scan() -> None:
    """The property test above would pass vacuously if nothing were scanned."""
    with tempfile.TemporaryDirectory() as tmp:
        pair = _Pair(Path(tmp))
        pair.append(queue("q"))
        for journal_id in range(1, 4):
            pair.append(enq(journal_id, "q"))
        assert pair.scanned == 3
        entries = list(pair.journals[1].state._entries())
        assert all(e.record is None and e.frame is not None for _, e in entries)
        pair.each(lambda j: j.commit())
        pair.each(lambda j: j.place_written())
        entries = list(pair.journals[1].state._entries())
        assert all(e.frame is None and e.loc >= 0 for _, e in entries)
        pair.check()
        for journal in pair.journals:
            journal.close()


@pytest.mark.parametrize("materialise", [False, True])
def test_a_scanned_enqueue_read_before_its_write_is_placed_after_it(materialise: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pair = _Pair(Path(tmp))
        pair.append(queue("q"))
        pair.append(enq(1, "q"))
        if materialise:
            a, b = (j.read_messages([1]) for j in pair.journals)
            assert a == b and a[0] is not None
        pair.check()
        pair.each(lambda j: j.commit())
        pair.check()
        pair.each(lambda j: j.place_written())
        pair.check()
        assert pair.journals[1].state.located(1) == pair.journals[0].state.located(1)
        assert isinstance(pair.journals[1].state.located(1), int)
        for journal in pair.journals:
            journal.close()
