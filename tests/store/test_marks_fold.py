"""StoreState's fold of ``message.marks``: its inline path (the usual message: live,
held by the record's queue alone) agrees with the per-id records it stands for
(``message.delivered`` of each delivered id, then ``message.ack`` of each acked
one), folded one by one through the general rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.store import MessageAck, MessageDelivered, Record, StoreState
from amqlite.store.records import MessageMarks

from .support import enq, queue

QUEUES = ("a", "b", "c")  # "c" is never declared: a message routed there is not kept
VHOSTS = ("/", "v")

_ids = st.lists(st.integers(min_value=1, max_value=14), max_size=8)
_step = st.one_of(
    st.tuples(
        st.just("enq"),
        st.sampled_from(VHOSTS),
        st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True),
    ),
    st.tuples(st.just("marks"), st.sampled_from(QUEUES), _ids, _ids),
    st.tuples(st.just("delivered"), st.sampled_from(QUEUES), _ids, st.just([])),
)


def _expanded(record: Record) -> list[Record]:
    """What a ``message.marks`` record stands for, one record an id."""
    if type(record) is not MessageMarks:
        return [record]
    return [MessageDelivered(id=i, queue=record.queue) for i in record.delivered] + [
        MessageAck(id=i, queue=record.queue) for i in record.acked
    ]


def _observed(state: StoreState) -> tuple[object, ...]:
    per_queue = {
        (vhost, name): [(m.record.id, m.redelivered) for m in state.messages(vhost, name)]
        for vhost in VHOSTS
        for name in QUEUES
        if (vhost, name) in state.message_counts()
    }
    live = {i: (m.vhost, m.items(), m.size) for i, m in state._messages.items()}
    return (
        state.snapshot(),
        state.message_bytes,
        state.live_messages,
        state.message_counts(),
        per_queue,
        live,
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(_step, max_size=40))
def test_the_inline_marks_fold_agrees_with_the_records_one_by_one(steps: list[tuple]) -> None:
    records: list[Record] = [queue(q, vhost) for vhost in VHOSTS for q in QUEUES[:2]]
    next_id = 1
    for step in steps:
        if step[0] == "enq":
            _, vhost, queues = step
            records.append(enq(next_id, *queues, vhost=vhost))
            next_id += 1
        else:
            _, name, delivered, acked = step
            if step[0] == "marks":
                records.append(
                    MessageMarks(queue=name, delivered=tuple(delivered), acked=tuple(acked))
                )
            else:
                records.append(MessageMarks(queue=name, delivered=tuple(delivered)))
    fast, general = StoreState(), StoreState()
    for record in records:
        fast.apply(record)
        for one in _expanded(record):
            general.apply(one)
        assert _observed(fast) == _observed(general)
