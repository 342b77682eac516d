"""Recorder.acked_ids (a run of acks in one call) against ack of each id: the same
records, marks, wake-ups and spans, with delivery marks between."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker.recording import Recorder
from amqlite.store.records import Record

_ids = st.lists(st.integers(1, 12), max_size=8)
_step = st.one_of(
    st.tuples(st.sampled_from(["delivered", "acked"]), _ids, st.sampled_from("ab")),
    st.tuples(st.sampled_from(["flush", "pause", "resume", "span"]), st.just([]), st.just("")),
)


class _Side:
    def __init__(self, gather: bool) -> None:
        self.records: list[Record] = []
        self.wakes = 0
        self.recorder = Recorder(self._sink)
        if gather:
            self.recorder.gather_marks(self._wake)

    def _sink(self, record: Record) -> int:
        self.records.append(record)
        return len(self.records)

    def _wake(self) -> None:
        self.wakes += 1


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.lists(_step, max_size=30))
def test_a_run_in_one_call_records_what_one_call_an_id_does(
    gather: bool, steps: list[tuple[str, list[int], str]]
) -> None:
    runs, each = _Side(gather), _Side(gather)
    for kind, ids, queue in steps:
        for side in (runs, each):
            r = side.recorder
            if kind == "flush":
                r.flush_marks()
            elif kind == "pause":
                r.paused = True
            elif kind == "resume":
                r.paused = False
            elif kind == "span":
                r.start_span()
        if kind == "delivered":
            for side in (runs, each):
                for i in ids:
                    side.recorder.delivered(i, queue)
        elif kind == "acked":
            runs.recorder.acked_ids(ids, queue)
            for i in ids:
                each.recorder.ack(i, queue)
        assert runs.records == each.records
        assert runs.wakes == each.wakes
        assert runs.recorder.marks_waiting == each.recorder.marks_waiting
        assert (runs.recorder.span_first, runs.recorder.span_last) == (
            each.recorder.span_first,
            each.recorder.span_last,
        )
    for side in (runs, each):
        side.recorder.paused = False
        side.recorder.flush_marks()
    assert runs.records == each.records
