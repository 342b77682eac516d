"""Segment framing and the reader that stops at the first damaged frame."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cbor2
import pytest

from amqlite.store import JournalCorrupt, QueueDeclare, Record, SegmentReader
from amqlite.store.errors import RecordError
from amqlite.store.segment import (
    FRAME_HEAD_SIZE,
    HEADER,
    frame,
    frame_record,
    parse_framed,
    segment_name,
    segment_seq,
)

from .support import ack, enq, fold, open_journal, queue, recovered_state

RECORDS: list[Record] = [queue("q"), enq(1), enq(2, body=b"x" * 300), ack(1)]


def _segment() -> tuple[bytes, list[int]]:
    """A segment holding RECORDS and the offset where each frame starts."""
    data, offsets = bytearray(HEADER), []
    for r in RECORDS:
        offsets.append(len(data))
        data += frame_record(r)
    return bytes(data), offsets


def _read(data: bytes) -> tuple[list[object], SegmentReader]:
    reader = SegmentReader(data)
    return [r for _, r in reader], reader


def test_names_sort_in_sequence_order() -> None:
    assert segment_name(7) == "journal-0000000000000007.log"
    assert segment_seq("journal-0000000000000007.log") == 7
    for other in ("journal-7.log", "journal-0000000000000007.log.tmp", "LOCK", "x.log"):
        assert segment_seq(other) is None
    names = [segment_name(n) for n in (10, 9, 100, 1)]
    assert [segment_seq(n) for n in sorted(names)] == [1, 9, 10, 100]
    with pytest.raises(ValueError):
        segment_name(-1)


def test_frame_layout() -> None:
    payload = cbor2.dumps({"t": "snapshot.end"})
    framed = frame(payload)
    assert framed[:4] == struct.pack(">I", len(payload))
    assert framed[4:8] == struct.pack(">I", zlib.crc32(payload))
    assert framed[8:] == payload


def test_clean_segment_reads_every_record_with_offsets() -> None:
    data, offsets = _segment()
    reader = SegmentReader(data)
    assert list(reader) == list(zip(offsets, RECORDS, strict=True))
    assert reader.defect is None and reader.end == len(data) and reader.records == len(RECORDS)


def test_a_cut_anywhere_keeps_the_whole_records_before_it() -> None:
    data, offsets = _segment()
    for cut in range(len(HEADER), len(data)):
        records, reader = _read(data[:cut])
        whole = sum(1 for start in [*offsets[1:], len(data)] if start <= cut)
        assert records == RECORDS[:whole], cut
        assert reader.end == ([len(HEADER), *offsets[1:]][whole]), cut
        if cut in offsets:
            assert reader.defect is None
        else:
            assert reader.defect is not None
            assert reader.defect.offset == reader.end
            assert "torn" in reader.defect.reason


def test_torn_and_zeroed_headers_are_reported_not_raised() -> None:
    for cut in range(len(HEADER)):
        records, reader = _read(HEADER[:cut])
        assert records == [] and reader.end == 0
        assert (reader.defect is not None) == (cut > 0), cut
    records, reader = _read(b"\0" * 100)
    assert records == [] and reader.defect is not None
    assert reader.defect.reason == "zero-filled header"


def test_checksum_mismatch_stops_at_that_frame() -> None:
    data, offsets = _segment()
    damaged = bytearray(data)
    damaged[offsets[2] + FRAME_HEAD_SIZE + 5] ^= 0x01
    records, reader = _read(bytes(damaged))
    assert records == RECORDS[:2]
    assert reader.defect is not None
    assert (reader.defect.offset, reader.defect.reason) == (offsets[2], "checksum mismatch")


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (b"\0" * 64, "zero-length frame"),
        (struct.pack(">II", 2**31, 0) + b"x" * 16, "impossible frame length"),
        (struct.pack(">II", 5, 0) + b"abcde", "checksum mismatch"),
        (b"\x00\x00", "torn frame header"),
    ],
)
def test_garbage_after_the_records_is_a_defect(tail: bytes, reason: str) -> None:
    data, _ = _segment()
    records, reader = _read(data + tail)
    assert records == RECORDS
    assert reader.defect is not None and reason in reader.defect.reason
    assert reader.end == len(data)


def test_a_foreign_file_or_version_is_refused() -> None:
    with pytest.raises(JournalCorrupt, match="not an amqlite journal segment"):
        _read(b"PK\x03\x04zipfile")
    with pytest.raises(JournalCorrupt, match="format version 9 is not supported"):
        _read(HEADER[:-1] + b"\x09")


def test_a_valid_checksum_over_a_bad_record_is_corruption_not_a_torn_tail() -> None:
    data = HEADER + frame_record(QueueDeclare(name="q")) + frame(cbor2.dumps({"t": "nope"}))
    with pytest.raises(JournalCorrupt, match=r"offset \d+ has a valid checksum.*'nope'"):
        _read(data)


def test_a_passive_node_journals_the_frames_it_received_as_they_came(tmp_path: Path) -> None:
    """parse_framed hands each record with its checked frame; appending that frame
    stores the same bytes the active node wrote, and recovery reads them back."""
    records: list[Record] = [queue("q"), enq(1), enq(2), ack(1)]
    data = b"".join(frame_record(r) for r in records)
    framed = parse_framed(data)
    assert [r for r, _ in framed] == records
    assert b"".join(f for _, f in framed) == data
    journal = open_journal(tmp_path)
    for record, received in framed:
        journal.append_framed(record, received)
    journal.commit()
    journal.close()
    assert recovered_state(tmp_path) == fold(records)
    with pytest.raises(RecordError, match="checksum"):
        parse_framed(data[:-1] + bytes([data[-1] ^ 1]))
