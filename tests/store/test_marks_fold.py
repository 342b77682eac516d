"""``StoreState`` folds a ``message.marks`` record with a fast path for a message held
by one queue (``StoreState._message_marks``); the general way is one
``message.delivered`` per delivered id, then one ``message.ack`` per acked id. A
journal fed the marks and one fed the same marks as single records must agree at
every step: the same state, the same placements once written, the same state after
a restart."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.store import MessageMarks, QueueDelete, Record, StoreState
from amqlite.store.journal import Journal

from .support import ack, delivered, enq, queue

_ids = st.lists(st.integers(0, 40), max_size=6)

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("enq"), st.sampled_from([("q",), ("r",), ("q", "r"), ("x",)])),
        st.tuples(st.just("marks"), st.sampled_from(["q", "r"]), _ids, _ids),
        st.tuples(st.just("commit")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("delete"), st.sampled_from(["q", "r"])),
        st.tuples(st.just("declare"), st.sampled_from(["q", "r"])),
    ),
    max_size=40,
)  # fmt: skip


class _Pair:
    """A journal fed ``message.marks`` (the fast fold) and one fed single records."""

    def __init__(self, root: Path) -> None:
        self.dirs = (root / "marks", root / "single")
        self.journals = tuple(Journal(d) for d in self.dirs)
        for journal in self.journals:
            journal.recover()

    def append(self, record: Record) -> None:
        for journal in self.journals:
            journal.append(record)

    def marks(self, queue_name: str, dlv: tuple[int, ...], acked: tuple[int, ...]) -> None:
        marks, single = self.journals
        marks.append(MessageMarks(queue=queue_name, delivered=dlv, acked=acked))
        for journal_id in dlv:
            single.append(delivered(journal_id, queue_name))
        for journal_id in acked:
            single.append(ack(journal_id, queue_name))

    def check(self) -> None:
        a, b = (j.state for j in self.journals)
        assert a == b
        assert [(i, e.loc >= 0) for i, e in a._entries()] == [
            (i, e.loc >= 0) for i, e in b._entries()
        ]


@settings(max_examples=200, deadline=None, database=None)
@given(ops=_ops)
def test_marks_fold_as_the_single_records_they_stand_for(ops: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pair = _Pair(Path(tmp))
        for name in ("q", "r"):
            pair.append(queue(name))
        count = 0
        for op in ops:
            kind = op[0]
            if kind == "enq":
                count += 1
                pair.append(enq(count, *op[1]))
            elif kind == "marks" and count:
                # an id is never in both lists (MessageMarks); unknown ids may come
                acked = tuple(dict.fromkeys(i % (count + 2) + 1 for i in op[3]))
                dlv = tuple(
                    i for i in dict.fromkeys(i % (count + 2) + 1 for i in op[2]) if i not in acked
                )
                pair.marks(op[1], dlv, acked)
            elif kind == "commit":
                for journal in pair.journals:
                    journal.commit()
            elif kind == "compact":
                for journal in pair.journals:
                    journal.compact()
            elif kind == "delete":
                pair.append(QueueDelete(name=op[1]))
            elif kind == "declare":
                pair.append(queue(op[1]))
            pair.check()
        for journal in pair.journals:
            journal.close()
        recovered = []
        for directory in pair.dirs:
            journal = Journal(directory)
            recovered.append(journal.recover().state)
            journal.close()
        assert recovered[0] == recovered[1]


def test_the_fast_fold_flags_and_takes_off_a_message_held_by_one_queue() -> None:
    """The fast path's own case (the property test above would also pass if it were
    never taken): delivered, then acked, each in its own record, as an HA pair
    journals them."""
    state = StoreState()
    state.apply(queue("q"))
    state.apply(enq(1, "q"))
    state.apply(enq(2, "q"))
    state.apply(MessageMarks(queue="q", delivered=(1, 2)))
    assert [live.items() for _, live in state._entries()] == [
        (("q", True),),
        (("q", True),),
    ]
    state.apply(MessageMarks(queue="q", acked=(1,)))
    assert [i for i, _ in state._entries()] == [2]
    assert state.message_bytes == len(enq(2, "q").body)
    state.apply(MessageMarks(queue="q", acked=(2,)))
    assert list(state._entries()) == [] and state.message_bytes == 0
