"""A passive HA node's reading of its syncs (``amqlite.store.recover.ReplicaFrames``:
runs of enqueues of one shape checked and read in C, the shape kept from one sync to
the next) is a fast path beside ``segment.check_frames`` and ``segment.parse_scanned``
(``EnqueueScan.scan``, the decoder for the rest): on good and damaged syncs alike,
the errors, the records and the frames' starts are the same."""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.store import MessageEnqueue, MessageMarks, Record, RecordError, encode_record
from amqlite.store import recover as recover_module
from amqlite.store.codec import EnqueueScan
from amqlite.store.recover import ReplicaFrames
from amqlite.store.segment import FRAME_HEAD, check_frames, frame, parse_scanned
from amqlite.store.state import ScannedEnqueue

from .support import ack, enq, queue

# a block: a run of enqueues of one shape (queues, body size, properties) whose
# publish keys are an instance's text and a counter (their length changes when the
# counter's does), or none, or one that is not UTF-8 once framed (made so below);
# ids growing from a start of some width; or one other record
_blocks = st.lists(
    st.one_of(
        st.tuples(
            st.just("run"),
            st.sampled_from([("q",), ("r",), ("q", "r")]),
            st.integers(0, 40),  # body size
            st.sampled_from(["", "9130da9380c6bda9:", "é:", "bad"]),  # key's instance
            st.sampled_from([1, 300, 70_000, 5_000_000_000]),  # first id
            st.sampled_from([1, 3, 7, 95]),  # the key's first counter
            st.integers(1, 40),  # how many
            st.booleans(),  # times all alike
            st.booleans(),  # properties all alike (or every fifth with headers)
        ),
        st.tuples(st.just("ack"), st.integers(0, 80), st.sampled_from(["q", "r"])),
        st.tuples(
            st.just("marks"),
            st.lists(st.integers(0, 80), max_size=5),
            st.lists(st.integers(0, 80), max_size=5),
        ),
        st.tuples(st.just("declare"), st.sampled_from(["q", "r"])),
    ),
    max_size=10,
)
# damage to a sync: none, cut at a fraction of its length, or one byte changed
_damage = st.one_of(
    st.none(),
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
)
_BAD = b"\xff"  # a key's first byte made so: not UTF-8


def _frames(blocks: list[Any]) -> list[bytes]:
    out: list[bytes] = []
    ids: list[int] = []
    for block in blocks:
        if block[0] == "declare":
            out.append(frame(encode_record(queue(block[1]))))
        elif block[0] == "ack":
            out.append(frame(encode_record(ack(ids[block[1] % len(ids)] if ids else 1, block[2]))))
        elif block[0] == "marks":
            pick = [ids[i % len(ids)] if ids else i + 1 for i in block[1] + block[2]]
            marks = MessageMarks(
                queue="q",
                delivered=tuple(pick[: len(block[1])]),
                acked=tuple(pick[len(block[1]) :]),
            )
            out.append(frame(encode_record(marks)))
        else:
            _, queues, size, instance, first, counter, count, same_time, same_props = block
            for k in range(count):
                journal_id = first + len(ids)
                record: MessageEnqueue = dataclasses.replace(
                    enq(journal_id, *queues, body=bytes([k % 251]) * size),
                    enqueued_at=1.7e9 + (0 if same_time else k // 3),
                )
                if not same_props and k % 5 == 4:
                    record = dataclasses.replace(record, headers={"h": 1})
                if instance:
                    key = ("x:" if instance == "bad" else instance) + str(counter + k)
                    record = dataclasses.replace(record, publish_key=key)
                payload = encode_record(record)
                if instance == "bad" and k % 7 == 6:  # "x:..." -> "\xff:...", framed
                    at = payload.rindex(b"x:")
                    payload = payload[:at] + _BAD + payload[at + 1 :]
                out.append(frame(payload))
                ids.append(journal_id)
    return out


def _syncs(frames: list[bytes], cuts: list[float], damage: Any) -> list[bytes]:
    """``frames`` split into syncs at fractions ``cuts`` of their count; the last sync
    damaged as ``damage`` says."""
    at = sorted({int(c * len(frames)) for c in cuts} | {0, len(frames)})
    syncs = [b"".join(frames[a:b]) for a, b in itertools.pairwise(at)]
    if damage is not None and syncs and syncs[-1]:
        data = bytearray(syncs[-1])
        where = int(damage[1] * (len(data) - 1))
        if damage[0] == "cut":
            del data[where:]
        else:
            data[where] ^= damage[2]
        syncs[-1] = bytes(data)
    return syncs


def _scanned(data: bytes, scan: EnqueueScan) -> tuple[list[Record | ScannedEnqueue], list[int]]:
    """The general path: ``parse_scanned``'s records, and where its frames start."""
    pairs = parse_scanned(data, scan.scan, checked=True)
    starts = list(itertools.accumulate((len(f) for _, f in pairs), initial=0))
    return [r for r, _ in pairs], starts


def _outcome(call: Any) -> Any:
    try:
        return call()
    except RecordError as exc:
        return ("error", exc.text)


def _check(blocks: list[Any], cuts: list[float], damage: Any) -> None:
    syncs = _syncs(_frames(blocks), cuts, damage)
    fast, scan = ReplicaFrames(), EnqueueScan()
    for data in syncs:
        checked = _outcome(lambda d=data: check_frames(d))
        assert _outcome(lambda d=data: fast.check(d)) == checked
        if checked is None:
            assert _outcome(lambda d=data: fast.scan(d)) == _outcome(
                lambda d=data: _scanned(d, scan)
            )


@settings(max_examples=300, deadline=None, database=None)
@given(blocks=_blocks, cuts=st.lists(st.floats(0, 1), max_size=4), damage=_damage)
def test_the_runs_check_and_scan_what_the_frame_by_frame_functions_do(
    blocks: Any, cuts: list[float], damage: Any
) -> None:
    _check(blocks, cuts, damage)


@settings(max_examples=150, deadline=None, database=None)
@given(blocks=_blocks, cuts=st.lists(st.floats(0, 1), max_size=4), damage=_damage)
def test_short_runs_agree_too(blocks: Any, cuts: list[float], damage: Any) -> None:
    """Runs of at most 3 frames each, and a shape learned again after every scan."""
    with (
        mock.patch.object(recover_module, "RUN_MAX", 3),
        mock.patch.object(recover_module, "_RELEARN", 1),
    ):
        _check(blocks, cuts, damage)


def test_a_sync_of_keyed_enqueues_and_marks_is_read_as_runs() -> None:
    """The usual sync (runs of keyed enqueues between marks) goes through the runs:
    the scan is called for the first frame of the first run and after each
    frame of another length only."""
    records: list[Record] = []
    for k in range(600):
        records.append(dataclasses.replace(enq(10_000 + k, "q"), publish_key=f"i:{1000 + k}"))
        if k % 60 == 59:
            records.append(MessageMarks(queue="q", acked=tuple(range(10_000 + k - 59, 10_001 + k))))
    data = b"".join(frame(encode_record(r)) for r in records)
    calls: list[int] = []

    class Counted(EnqueueScan):
        def scan(self, data: bytes, pos: int, end: int) -> Any:
            calls.append(pos)
            return super().scan(data, pos, end)

    scan = Counted()
    fast = ReplicaFrames(scan)
    fast.check(data)
    assert fast.scan(data) == _scanned(data, EnqueueScan())
    assert len(calls) <= 1 + 10 * 2  # the first, and after each marks record (and itself)


def test_a_bad_checksum_inside_a_run_is_found() -> None:
    payloads = [encode_record(enq(k, "q")) for k in range(100, 140)]
    data = bytearray(b"".join(frame(p) for p in payloads))
    size = len(frame(payloads[0]))
    data[25 * size + FRAME_HEAD.size + 3] ^= 1  # frame 25's payload
    with pytest.raises(RecordError):
        check_frames(bytes(data))
    with pytest.raises(RecordError):
        ReplicaFrames().check(bytes(data))
    assert zlib.crc32(payloads[0]) == FRAME_HEAD.unpack_from(data, 0)[1]
