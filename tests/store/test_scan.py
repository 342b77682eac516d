"""Recovery's scan of ``message.enqueue`` frames (``EnqueueScan``) and the state's
fold of what it reads (``StoreState.enqueue_placed``) are a fast path beside the
full decoder and ``apply`` + ``place``: whatever the scan accepts, the decoder
decodes to the same fields, on good, damaged and cut records alike; and the two
folds give the same state."""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker
from amqlite.store import (
    MessageEnqueue,
    MessageRef,
    MessageRun,
    QueueDeclare,
    RecordError,
    decode_record,
    encode_record,
)
from amqlite.store import state as state_module
from amqlite.store.codec import EnqueueScan
from amqlite.store.records import Record, record_to_map
from amqlite.store.state import KEPT_PROPS, ScannedEnqueue, StoreState

from .support import ack, delivered, enq, queue

_text = st.text(max_size=6)
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), _text,
    st.binary(max_size=6),
)  # fmt: skip
_props = st.fixed_dictionaries(
    {"persistent": st.just(True)},
    optional={
        "priority": st.integers(0, 255),
        "expiration": st.integers(0, 10_000),
        "group_id": _text,
        "content_type": _text,
    },
)

enqueues = st.builds(
    MessageEnqueue,
    id=st.integers(0, 2**63 - 1) | st.integers(0, 300),
    vhost=st.sampled_from(["/", "v"]) | _text,
    queues=st.lists(
        st.sampled_from(["q", "r", "s"]) | _text, min_size=1, max_size=3, unique=True
    ).map(tuple),
    exchange=_text,
    routing_key=_text,
    body=st.binary(max_size=300),
    headers=st.dictionaries(_text, _scalar, max_size=3),
    props=st.just({}) | _props,
    enqueued_at=st.just(0.0) | st.floats(0, 4e9),
    deaths=st.just(()) | st.lists(st.tuples(_text, _text), max_size=2).map(tuple),
    publish_key=st.just("") | _text,
)


def _fields(record: MessageEnqueue) -> ScannedEnqueue:
    return (
        record.id,
        record.vhost,
        record.queues,
        len(record.body),
        record.enqueued_at,
        record.publish_key,
    )


def _plain(record: MessageEnqueue) -> bool:
    """What the scan must take: no deaths, no mesh, no property kept in memory."""
    return not record.deaths and not record.mesh and not any(k in record.props for k in KEPT_PROPS)


def _agrees(scan: EnqueueScan, payload: bytes) -> ScannedEnqueue | None:
    """Scan ``payload`` (inside other bytes, as in a segment); when it accepts, the
    decoder must give an enqueue with the same fields."""
    data = b"\xa7" + payload + b"\xa7atomessage.enqueue"  # bytes either side
    got = scan.scan(data, 1, 1 + len(payload))
    if got is not None:
        record = decode_record(payload)
        assert type(record) is MessageEnqueue
        assert _fields(record) == got
        assert _plain(record)
    return got


@settings(max_examples=400, deadline=None, database=None)
@given(records=st.lists(enqueues, min_size=1, max_size=4))
def test_the_scan_reads_what_the_decoder_reads(records: list[MessageEnqueue]) -> None:
    scan = EnqueueScan()  # one for all: its caches carry over, as in a recovery
    for record in records + records:
        for payload in (encode_record(record), cbor2.dumps(record_to_map(record))):
            got = _agrees(scan, payload)
            if payload == encode_record(record) and _plain(record):
                assert got == _fields(record)  # the encoder's layout is always taken


@settings(max_examples=600, deadline=None, database=None)
@given(
    record=enqueues,
    edits=st.lists(
        st.tuples(st.sampled_from(["flip", "cut", "insert", "delete"]), st.integers(0, 400),
                  st.integers(0, 255)),
        min_size=1,
        max_size=3,
    ),
    warm=st.booleans(),
)  # fmt: skip
def test_a_damaged_record_is_never_misread(
    record: MessageEnqueue, edits: list[tuple[str, int, int]], warm: bool
) -> None:
    scan = EnqueueScan()
    good = encode_record(record)
    if warm:  # the caches hold the good record's route and maps
        scan.scan(good, 0, len(good))
    payload = bytearray(good)
    for op, where, byte in edits:
        i = where % (len(payload) + 1)
        if op == "flip" and i < len(payload):
            payload[i] ^= byte or 1
        elif op == "cut":
            del payload[i:]
        elif op == "insert":
            payload[i:i] = bytes([byte])
        elif op == "delete" and i < len(payload):
            del payload[i]
    if not payload:
        return
    try:
        decoded: Record | None = decode_record(bytes(payload))
    except RecordError:
        decoded = None
    data = bytes(payload)
    got = scan.scan(data, 0, len(data))
    if got is not None:
        assert type(decoded) is MessageEnqueue and _fields(decoded) == got and _plain(decoded)


def test_what_the_scan_leaves_to_the_decoder() -> None:
    scan = EnqueueScan()
    base = enq(7, "q", body=b"x" * 10)
    payload = encode_record(base)
    assert scan.scan(payload, 0, len(payload)) == (7, "/", ("q",), 10, base.enqueued_at, "")
    unusual = [
        dataclasses.replace(base, props={"persistent": True, "expiration": 5}),
        dataclasses.replace(base, props={"group_id": "g"}),
        dataclasses.replace(base, deaths=(("q", "expired"),)),
        dataclasses.replace(base, mesh={"o": "n1"}),
    ]
    for record in unusual:
        payload = encode_record(record)
        assert scan.scan(payload, 0, len(payload)) is None
    int_time = cbor2.dumps({**record_to_map(base), "at": 12})
    assert scan.scan(int_time, 0, len(int_time)) is None  # the decoder takes it
    bad_props = cbor2.dumps({**record_to_map(base), "props": {"nonsense": 1}})
    assert scan.scan(bad_props, 0, len(bad_props)) is None  # the decoder says why
    other = encode_record(ack(7))
    assert scan.scan(other, 0, len(other)) is None


# --- the state: enqueue_placed against apply + place ------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("enq"), st.integers(1, 40), st.sampled_from([("q",), ("r",), ("q", "r"),
                  ("x",), ("q", "x")]), st.integers(0, 50), st.sampled_from(["", "k"])),
        st.tuples(st.just("ack"), st.integers(1, 40), st.sampled_from(["q", "r"])),
        st.tuples(st.just("dlv"), st.integers(1, 40), st.sampled_from(["q", "r"])),
        st.tuples(st.just("declare"), st.sampled_from(["q", "r", "x"])),
    ),
    max_size=40,
)  # fmt: skip


@settings(max_examples=300, deadline=None, database=None)
@given(ops=_ops)
def test_enqueue_placed_is_apply_then_place(ops: list[Any]) -> None:
    _check_enqueue_placed(ops)


@settings(max_examples=100, deadline=None, database=None)
@given(ops=_ops)
def test_enqueue_placed_agrees_when_the_index_widens(ops: list[Any]) -> None:
    """The index's enqueue order and queue columns start narrow and widen when a
    value needs it (``_Index.widen``); here that happens from the sixth message and
    the second queue on, in both paths."""
    with (
        mock.patch.object(state_module, "_SEQ_NARROW", 5),
        mock.patch.object(state_module, "_Q_NARROW", 0),
    ):
        _check_enqueue_placed(ops)


def test_the_index_widens_past_four_billion_enqueues() -> None:
    state = StoreState()
    state.apply(queue("q"))
    state._seq = (1 << 32) - 3
    for journal_id in range(1, 4):  # through place
        record = enq(journal_id, "q")
        state.apply(record)
        state.place(record, journal_id)
    scan = EnqueueScan()
    batch = []
    for journal_id in range(4, 7):  # through the scan's batch
        payload = encode_record(enq(journal_id, "q"))
        got = scan.scan(payload, 0, len(payload))
        assert got is not None
        batch.append((got, journal_id))
    state.enqueue_placed_many(batch)
    index = state._index
    assert index.seqs.typecode == "q" and index.qs.typecode == "H"
    assert list(index.seqs) == [(1 << 32) - 2 + k for k in range(6)]
    assert state.live_journal_ids() == [1, 2, 3, 4, 5, 6]


def _check_enqueue_placed(ops: list[Any]) -> None:
    slow, fast = StoreState(), StoreState()
    for state in (slow, fast):
        state.apply(queue("q"))
        state.apply(queue("r"))
    scan = EnqueueScan()
    at = 1
    batch: list[tuple[ScannedEnqueue, int]] = []  # folded together, as recovery does
    for op in ops:
        if op[0] == "enq":
            _, journal_id, queues, size, pk = op
            record = dataclasses.replace(
                enq(journal_id, *queues, body=bytes(size)), enqueued_at=float(at), publish_key=pk
            )
            slow.apply(record)
            slow.place(record, at)
            payload = encode_record(record)
            got = scan.scan(payload, 0, len(payload))
            assert got is not None
            batch.append((got, at))
            at += 1
            continue
        fast.enqueue_placed_many(batch)
        batch.clear()
        other: Record
        if op[0] == "ack":
            other = ack(op[1], op[2])
        elif op[0] == "dlv":
            other = delivered(op[1], op[2])
        else:
            other = queue(op[1])
        slow.apply(other)
        fast.apply(other)
        assert fast._canonical() == slow._canonical()
    fast.enqueue_placed_many(batch)
    assert fast._canonical() == slow._canonical()
    assert fast.live_journal_ids() == slow.live_journal_ids()
    assert [(i, e.loc) for i, e in fast._entries()] == [(i, e.loc) for i, e in slow._entries()]


# --- the rebuild: runs against refs -------------------------------------------------------

_state_ops = st.lists(
    st.one_of(
        st.tuples(st.just("enq"), st.sampled_from([("q",), ("r",), ("q", "r")]), st.booleans(),
                  st.sampled_from(["", "k"])),
        st.tuples(st.just("settle"), st.integers(0, 60), st.sampled_from(["q", "r"]),
                  st.booleans()),
    ),
    max_size=60,
)  # fmt: skip


def _state_from(ops: list[Any]) -> StoreState:
    """A journal's state after a restart: placed messages, some in the index and some
    objects (several queues, ids below the index's last), acks and delivered flags."""
    state = StoreState()
    state.apply(QueueDeclare(name="q", arguments={"x-message-ttl": 1500}))
    state.apply(queue("r"))
    scan = EnqueueScan()
    high, low, ids = 1000, 999, []
    for op in ops:
        if op[0] == "enq":
            _, queues, is_low, pk = op
            if is_low:
                journal_id, low = low, low - 1
            else:
                journal_id, high = high, high + 1
            record = dataclasses.replace(
                enq(journal_id, *queues), publish_key=pk and f"{pk}{journal_id}"
            )
            payload = encode_record(record)
            got = scan.scan(payload, 0, len(payload))
            assert got is not None
            state.enqueue_placed(got, 1 << 36 | journal_id)
            ids.append(journal_id)
        elif ids:
            _, which, name, is_ack = op
            journal_id = ids[which % len(ids)]
            state.apply(ack(journal_id, name) if is_ack else delivered(journal_id, name))
    return state


def _expanded(items: list[Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for r in items:
        if isinstance(r, MessageRun):
            for k in range(r.start, r.stop):
                out.append(
                    (r.ids[k], r.vhost, (r.queue,), (r.queue,) if r.flags[k] else (),
                     r.sizes[k], r.ats[k])
                )  # fmt: skip
        elif isinstance(r, MessageRef):
            out.append((r.id, r.vhost, r.queues, r.delivered, r.size, r.enqueued_at))
    return out


class _Source:
    def load(self, journal_ids: Any) -> list[Any]:
        return [None] * len(journal_ids)


def _rebuilt(state: StoreState, *, runs: bool) -> Broker:
    broker = Broker(record=lambda record: 0)
    assert broker.recorder is not None
    broker.recorder.source = _Source()
    broker.recorder.wall_offset = 1_699_999_000.25
    broker.apply(state.iter_refs(runs=runs), 0.0)
    return broker


@settings(max_examples=300, deadline=None, database=None)
@given(ops=_state_ops)
def test_runs_describe_what_refs_do(ops: list[Any]) -> None:
    state = _state_from(ops)
    refs = list(state.iter_refs())
    runs = list(state.iter_refs(runs=True))
    assert _expanded(runs) == _expanded(refs)
    assert [r for r in runs if not isinstance(r, MessageRef | MessageRun)] == [
        r for r in refs if not isinstance(r, MessageRef)
    ]
    # a broker rebuilt from either holds the same
    slow, fast = _rebuilt(state, runs=False), _rebuilt(state, runs=True)
    assert slow.recorder is not None and fast.recorder is not None
    assert fast.recorder.last_journal_id == slow.recorder.last_journal_id
    for name in ("q", "r"):
        a = slow.vhost("/").queues[name]  # type: ignore[union-attr]
        b = fast.vhost("/").queues[name]  # type: ignore[union-attr]
        assert a.count() == b.count()
        if a.backlog is None:
            assert b.backlog is None or not b.backlog
            continue
        assert b.backlog is not None
        for slot in ("_ids", "_expires", "_sizes", "_flags"):
            assert list(getattr(b.backlog._front, slot)) == list(getattr(a.backlog._front, slot)), (
                slot
            )
        assert b.backlog.bytes == a.backlog.bytes
    keys_slow = slow.vhost("/").publish_keys  # type: ignore[union-attr]
    keys_fast = fast.vhost("/").publish_keys  # type: ignore[union-attr]
    assert list(keys_fast._keys) == list(keys_slow._keys)
