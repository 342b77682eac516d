"""Recovery's pass over a segment (``amqlite.store.recover.fold_segment``: one loop,
a shortcut for a frame shaped like the last enqueue, runs of such frames read in C
and placed by ``StoreState.enqueue_placed_run``) is a fast path beside the frame
by frame walk (``SegmentReader.frames`` + ``EnqueueScan.scan``, the decoder for the
rest): on good, cut and damaged segments alike, the state, the end of the good
frames, the defect, the count of records and any error are the same."""

from __future__ import annotations

import dataclasses
import struct
import zlib
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.store import JournalCorrupt, MessageEnqueue, Record, encode_record
from amqlite.store import recover as recover_module
from amqlite.store import state as state_module
from amqlite.store.codec import EnqueueScan
from amqlite.store.recover import fold_segment
from amqlite.store.segment import HEADER, SegmentReader, frame
from amqlite.store.state import ScannedEnqueue, StoreState

from .support import ack, delivered, enq, queue

BASE = 3 << 36  # a segment's location base, as the journal gives it

# a block: a run of enqueues of one shape (queues, body size, properties, publish key)
# with ids that grow by a step from a start (or fall) (its width varies: 1, 2, 4, 8 bytes), and
# times that change now and then; or one other record
_blocks = st.lists(
    st.one_of(
        st.tuples(
            st.just("run"),
            st.sampled_from([("q",), ("r",), ("q", "r"), ("x",)]),
            st.integers(0, 40),  # body size
            st.sampled_from(["plain", "headers", "expiring", "pk"]),
            st.sampled_from([0, 30, 300, 70_000, 5_000_000_000]),  # first id
            st.sampled_from([1, 2, 3, -1]),  # id step (down, too)
            st.integers(1, 30),  # how many
            st.booleans(),  # times all alike
            st.booleans(),  # ids above all before (or from the first id: lower, repeated)
        ),
        # of an id enqueued before (at a fraction of those so far), or of any
        st.tuples(
            st.just("ack"), st.floats(0, 1) | st.integers(0, 40), st.sampled_from(["q", "r"])
        ),
        st.tuples(
            st.just("dlv"), st.floats(0, 1) | st.integers(0, 40), st.sampled_from(["q", "r"])
        ),
        st.tuples(st.just("declare"), st.sampled_from(["q", "r", "x"])),
    ),
    max_size=12,
)
# damage: none, the segment cut at a fraction of its length, or one byte changed
_damage = st.one_of(
    st.none(),
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
)


def _records(blocks: list[Any]) -> list[Record]:
    out: list[Record] = []
    ids: list[int] = []
    n = 0
    for block in blocks:
        if block[0] == "declare":
            out.append(queue(block[1]))
            continue
        if block[0] != "run":
            kind, which, name = block
            if isinstance(which, float):
                which = ids[int(which * (len(ids) - 1))] if ids else 0
            out.append((ack if kind == "ack" else delivered)(which, name))
            continue
        _, queues, size, kind, first, step, count, same_time, above = block
        for k in range(count):
            journal_id = first + (n if above else 0) + (k * step if step > 0 else count - k)
            record: MessageEnqueue = dataclasses.replace(
                enq(journal_id, *queues, body=bytes([k % 251]) * size),
                enqueued_at=1.7e9 + (0 if same_time else k // 3),
            )
            if kind == "pk":
                record = dataclasses.replace(record, publish_key=f"é{k % 2}")
            elif kind == "headers":
                record = dataclasses.replace(record, headers={"h": k % 2})
            elif kind == "expiring":
                record = dataclasses.replace(record, props={"persistent": True, "expiration": 9})
            out.append(record)
            ids.append(journal_id)
        n += count * abs(step) + 1
    return out


def _segment(records: list[Record], damage: Any) -> bytes:
    data = bytearray(HEADER + b"".join(frame(encode_record(r)) for r in records))
    if damage is not None and len(data) > len(HEADER):
        at = len(HEADER) + int(damage[1] * (len(data) - len(HEADER) - 1))
        if damage[0] == "cut":
            del data[at:]
        else:
            data[at] ^= damage[2]
    return bytes(data)


def _fresh() -> StoreState:
    state = StoreState()
    state.apply(queue("q"))
    state.apply(queue("r"))
    return state


def _reference(data: bytes) -> tuple[StoreState, SegmentReader, str | None]:
    """The frame by frame walk recovery made before the pass."""
    state, reader, scan = _fresh(), SegmentReader(data), EnqueueScan()
    batch: list[tuple[ScannedEnqueue, int]] = []
    try:
        for offset, start, end in reader.frames():
            fields = scan.scan(data, start, end)
            if fields is not None:
                batch.append((fields, BASE | offset))
                continue
            state.enqueue_placed_many(batch)
            batch.clear()
            record = reader.decode(offset, start, end)
            state.apply(record)
            if type(record) is MessageEnqueue:
                state.place(record, BASE | offset)
        state.enqueue_placed_many(batch)
    except JournalCorrupt as exc:
        return state, reader, str(exc)
    return state, reader, None


def _pass(data: bytes, *, runs: bool) -> tuple[StoreState, SegmentReader, str | None]:
    state, reader = _fresh(), SegmentReader(data)

    def other(offset: int, start: int, end: int) -> None:
        record = reader.decode(offset, start, end)
        state.apply(record)
        if type(record) is MessageEnqueue:
            state.place(record, BASE | offset)

    try:
        fold_segment(
            reader,
            BASE,
            EnqueueScan(),
            state.enqueue_placed_many,
            other,
            state.enqueue_placed_run if runs else None,
        )
    except JournalCorrupt as exc:
        return state, reader, str(exc)
    return state, reader, None


def _same(a: tuple[StoreState, SegmentReader, str | None], b: Any) -> None:
    (sa, ra, ea), (sb, rb, eb) = a, b
    assert (ra.end, ra.defect, ea) == (rb.end, rb.defect, eb)
    if ea is None:
        assert ra.records == rb.records
    assert sa._canonical() == sb._canonical()
    assert sa.live_journal_ids() == sb.live_journal_ids()
    assert [(i, e.loc, e.size, e.at, e.pk) for i, e in sa._entries()] == [
        (i, e.loc, e.size, e.at, e.pk) for i, e in sb._entries()
    ]
    assert (sa.last_journal_id, sa.message_bytes) == (sb.last_journal_id, sb.message_bytes)


def _check(blocks: list[Any], damage: Any) -> None:
    data = _segment(_records(blocks), damage)
    reference = _reference(data)
    _same(_pass(data, runs=True), reference)
    _same(_pass(data, runs=False), reference)


@settings(max_examples=300, deadline=None, database=None)
@given(blocks=_blocks, damage=_damage)
def test_the_pass_recovers_what_the_frame_by_frame_walk_does(blocks: Any, damage: Any) -> None:
    _check(blocks, damage)


@settings(max_examples=200, deadline=None, database=None)
@given(blocks=_blocks, damage=_damage)
def test_short_runs_and_narrow_columns_agree_too(blocks: Any, damage: Any) -> None:
    """Runs tried after every second frame of a shape, of at most 3 frames each, and
    the index's enqueue order and queue columns widening from the fourth message and
    the second queue on."""
    with (
        mock.patch.object(recover_module, "RUN_AFTER", 1),
        mock.patch.object(recover_module, "RUN_MAX", 3),
        mock.patch.object(state_module, "_SEQ_NARROW", 3),
        mock.patch.object(state_module, "_Q_NARROW", 0),
    ):
        _check(blocks, damage)


def test_a_backlog_is_read_as_runs() -> None:
    """The usual backlog (one queue, one shape) goes through the runs, and a damaged
    frame in the middle of one ends the run and the segment where the walk does."""
    records: list[Record] = [enq(1000 + k, "q", body=bytes(20)) for k in range(500)]
    data = _segment(records, None)
    calls: list[int] = []
    state, reader = _fresh(), SegmentReader(data)

    def run(*args: Any) -> None:
        calls.append(len(args[0]))
        state.enqueue_placed_run(*args)

    fold_segment(reader, BASE, EnqueueScan(), state.enqueue_placed_many, _never, run)
    assert sum(calls) > 480 and len(calls) <= 2  # all but the first few, in one or two
    _same((state, reader, None), _reference(data))
    frame_size = len(frame(encode_record(records[0])))
    damaged = bytearray(data)
    damaged[len(HEADER) + 300 * frame_size + 20] ^= 0x55  # frame 300's payload
    got = _pass(bytes(damaged), runs=True)
    assert got[1].end == len(HEADER) + 300 * frame_size
    assert got[1].defect is not None and got[1].defect.reason == "checksum mismatch"
    _same(got, _reference(bytes(damaged)))


def test_a_frame_that_differs_only_where_the_shape_does_not_look_is_not_misread() -> None:
    """A frame of the same length whose time is not a float but whose bytes are the
    same elsewhere is not taken by the shortcut: the fields come from the decoder."""
    records: list[Record] = [enq(1000 + k, "q", body=bytes(8)) for k in range(20)]
    data = bytearray(_segment(records, None))
    payload = encode_record(records[-1])
    at = data.rindex(payload)
    odd = bytearray(payload)
    odd[-9] = 0x1B  # the time's head: now an 8-byte integer
    data[at - 8 : at] = struct.pack(">II", len(odd), zlib.crc32(odd))
    data[at : at + len(odd)] = odd
    _same(_pass(bytes(data), runs=True), _reference(bytes(data)))


def _never(offset: int, start: int, end: int) -> None:
    raise AssertionError(f"frame at {offset} was not read as an enqueue")
