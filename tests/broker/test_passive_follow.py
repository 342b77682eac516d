"""A passive HA node's broker follows the topology only (``Broker.follow``); when it
takes over it is rebuilt from the journal's state. The rebuilt broker must hold what
a broker fed every replicated record holds (the general path, which passive nodes
took before): the same queues, the same messages in the same order with the same
redelivered flags, and the same publish keys."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker
from amqlite.store import (
    MessageMarks,
    QueueDelete,
    QueuePurge,
    Record,
    SnapshotBegin,
    SnapshotEnd,
    StoreState,
)
from tests.store.support import ack, delivered, enq, queue

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("enq"), st.sampled_from([("q",), ("r",), ("q", "r"), ("x",)]),
                  st.sampled_from(["", "k"])),
        st.tuples(st.just("ack"), st.integers(0, 60), st.sampled_from(["q", "r"])),
        st.tuples(st.just("dlv"), st.integers(0, 60), st.sampled_from(["q", "r"])),
        st.tuples(st.just("marks"), st.integers(0, 60), st.integers(0, 60),
                  st.sampled_from(["q", "r"])),
        st.tuples(st.just("declare"), st.sampled_from(["q", "r"])),
        st.tuples(st.just("delete"), st.sampled_from(["q", "r"])),
        st.tuples(st.just("purge"), st.sampled_from(["q", "r"])),
        st.tuples(st.just("snapshot")),
    ),
    max_size=50,
)  # fmt: skip


def _records(ops: list[Any]) -> list[Record]:
    records: list[Record] = [queue("q"), queue("r")]
    ids: list[int] = []
    next_id = 1
    for op in ops:
        kind = op[0]
        if kind == "enq":
            _, queues, pk = op
            records.append(
                dataclasses.replace(enq(next_id, *queues), publish_key=pk and f"{pk}{next_id}")
            )
            ids.append(next_id)
            next_id += 1
        elif kind in ("ack", "dlv") and ids:
            journal_id = ids[op[1] % len(ids)]
            records.append((ack if kind == "ack" else delivered)(journal_id, op[2]))
        elif kind == "marks" and ids:
            a, b = ids[op[1] % len(ids)], ids[op[2] % len(ids)]
            records.append(MessageMarks(queue=op[3], delivered=(a,), acked=(b,) if b != a else ()))
        elif kind == "declare":
            records.append(queue(op[1]))
        elif kind == "delete":
            records.append(QueueDelete(name=op[1]))
        elif kind == "purge":
            records.append(QueuePurge(name=op[1]))
        elif kind == "snapshot":  # what a rejoin sends: the state so far, from nothing
            state = StoreState.fold(records)
            records += [SnapshotBegin(last_journal_id=state.last_journal_id), *state.snapshot()[1:]]
            assert isinstance(records[-1], SnapshotEnd)
    return records


def _broker() -> Broker:
    broker = Broker(record=lambda record: 0)
    broker.wall_offset = 1_699_999_000.25
    return broker


def _contents(broker: Broker) -> dict[str, list[tuple[int | None, bool]]]:
    host = broker.vhost("/")
    assert host is not None
    out = {}
    for name, q in host.queues.items():
        assert not q.backlog  # small queues: everything is in ready
        out[name] = [(message.journal_id, red) for message, _, red in q.ready]
    return out


@settings(max_examples=300, deadline=None, database=None)
@given(ops=_ops)
def test_a_passive_broker_rebuilt_at_takeover_holds_what_one_fed_every_record_holds(
    ops: list[Any],
) -> None:
    records = _records(ops)
    every = _broker()  # the general path: every record applied as it arrives
    every.apply(records, 0.0)
    follower = _broker()  # the passive node's broker: topology and publish keys
    follower.follow(records, 0.0)
    state = StoreState.fold(records)  # the passive node's journal state
    rebuilt = _broker()  # at takeover
    rebuilt.apply(state.iter_refs(runs=True), 0.0)
    rebuilt.adopt_publish_keys(follower)
    assert _contents(rebuilt) == _contents(every)
    assert set(follower.vhost("/").queues) == set(every.vhost("/").queues)  # type: ignore[union-attr]
    assert rebuilt.recorder is not None and every.recorder is not None
    assert rebuilt.recorder.last_journal_id == every.recorder.last_journal_id
    keys = rebuilt.vhost("/").publish_keys  # type: ignore[union-attr]
    assert list(keys.known) == list(every.vhost("/").publish_keys.known)  # type: ignore[union-attr]
