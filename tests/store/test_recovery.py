"""Recovery: replay in order, cut a torn tail of the last segment, refuse other damage."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from amqlite.store import (
    ExchangeDeclare,
    JournalCorrupt,
    QueueBind,
    Record,
    SegmentReader,
    StoreError,
)
from amqlite.store.journal import Journal
from amqlite.store.segment import HEADER, segment_name

from .support import (
    ack,
    bodies,
    delivered,
    enq,
    fold,
    open_journal,
    queue,
    recovered_state,
    segments,
)

HISTORY: list[Record] = [
    ExchangeDeclare(name="e", type="direct"),
    queue("q"),
    QueueBind(queue="q", exchange="e", key="k"),
    enq(1),
    enq(2, body=b"two" * 20),
    delivered(1),
    ack(2),
    enq(3),
]


def _write(directory: Path, records: list[Record], **options: object) -> None:
    with open_journal(directory, **options) as journal:  # type: ignore[arg-type]
        for r in records:
            journal.append(r)
        journal.commit()


def test_an_empty_data_dir_recovers_to_nothing(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "data")
    report = journal.recover()
    assert (report.records, report.segments, report.dropped_bytes) == (0, 0, 0)
    assert report.truncated_segment is None and report.reason is None
    assert report.state == fold([])
    journal.close()


def test_what_was_committed_comes_back(tmp_path: Path) -> None:
    _write(tmp_path, HISTORY)
    journal = Journal(tmp_path)
    report = journal.recover()
    assert report.records == len(HISTORY) and report.segments == 1
    assert report.state == fold(HISTORY)
    assert [(m.record.id, m.redelivered) for m in report.state.messages("/", "q")] == [
        (1, True),
        (3, False),
    ]
    assert journal.state is report.state
    journal.close()


def test_the_journal_must_be_recovered_once_before_use(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    with pytest.raises(StoreError, match=r"call recover\(\) before"):
        journal.append(queue())
    journal.recover()
    with pytest.raises(StoreError, match="only once"):
        journal.recover()
    journal.close()
    with pytest.raises(StoreError, match="closed"):
        journal.append(queue())


def test_a_cut_at_every_byte_of_the_last_record_keeps_everything_before_it(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "whole", HISTORY)
    whole = (tmp_path / "whole" / segment_name(1)).read_bytes()
    last_start = [offset for offset, _ in SegmentReader(whole)][-1]
    for cut in range(last_start, len(whole)):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        (directory / segment_name(1)).write_bytes(whole[:cut])
        journal = Journal(directory)
        report = journal.recover()
        assert report.records == len(HISTORY) - 1, cut
        assert report.state == fold(HISTORY[:-1]), cut
        assert report.dropped_bytes == cut - last_start, cut
        if cut > last_start:
            assert report.truncated_segment == segment_name(1)
            assert report.reason is not None and f"at offset {last_start}" in report.reason
        assert (directory / segment_name(1)).stat().st_size == last_start
        journal.append(enq(4))  # and the journal carries on after the cut
        journal.commit()
        journal.close()
        assert bodies(recovered_state(directory)) == [b"m1", b"m4"], cut


def test_garbage_over_the_tail_is_cut_off(tmp_path: Path) -> None:
    _write(tmp_path, HISTORY)
    path = tmp_path / segment_name(1)
    data = bytearray(path.read_bytes())
    offsets = [offset for offset, _ in SegmentReader(bytes(data))]
    rng = random.Random(7)
    start = offsets[5]
    data[start:] = rng.randbytes(len(data) - start + 100)  # overwritten and longer
    path.write_bytes(bytes(data))
    journal = Journal(tmp_path)
    report = journal.recover()
    assert report.state == fold(HISTORY[:5])
    assert report.dropped_bytes == len(data) - start
    assert report.reason is not None and f"offset {start}" in report.reason
    journal.close()


def test_a_zero_filled_tail_is_cut_off(tmp_path: Path) -> None:
    _write(tmp_path, HISTORY)
    path = tmp_path / segment_name(1)
    size = path.stat().st_size
    with path.open("ab") as f:
        f.write(b"\0" * 4096)
    journal = Journal(tmp_path)
    report = journal.recover()
    assert report.state == fold(HISTORY)
    assert report.dropped_bytes == 4096 and path.stat().st_size == size
    assert report.reason is not None and "zero-length frame" in report.reason
    journal.close()


def test_a_last_segment_with_a_torn_header_is_emptied_and_reused(tmp_path: Path) -> None:
    names = _multi_segment(tmp_path)
    last = tmp_path / names[-1]
    lost = len(list(SegmentReader(last.read_bytes())))
    last.write_bytes(HEADER[:3])
    journal = Journal(tmp_path, segment_bytes=64)
    report = journal.recover()
    assert report.truncated_segment == names[-1] and report.dropped_bytes == 3
    assert report.state == fold(HISTORY[:-lost])
    journal.append(enq(9))
    journal.commit()
    journal.close()
    assert bodies(recovered_state(tmp_path)) == [b"m1", b"m9"]


def _multi_segment(directory: Path) -> list[str]:
    """HISTORY spread over several segments (one record per commit, tiny segments)."""
    with open_journal(directory, segment_bytes=64) as journal:
        for r in HISTORY:
            journal.append(r)
            journal.commit()
    names = segments(directory)
    assert len(names) >= 3
    return names


def test_segments_roll_over_and_replay_in_order(tmp_path: Path) -> None:
    names = _multi_segment(tmp_path)
    assert names == [segment_name(n) for n in range(1, len(names) + 1)]
    for name in names[:-1]:  # soft limit: a segment ends with the commit that fills it
        data = (tmp_path / name).read_bytes()
        last_offset = list(SegmentReader(data))[-1][0]
        assert last_offset < 64 <= len(data)
    journal = Journal(tmp_path, segment_bytes=64)
    report = journal.recover()
    assert report.segments == len(names) and report.records == len(HISTORY)
    assert report.state == fold(HISTORY)
    journal.close()


def test_one_commit_never_spans_two_segments(tmp_path: Path) -> None:
    with open_journal(tmp_path, segment_bytes=64) as journal:
        for i in range(1, 30):
            journal.append(enq(i))
        journal.commit()
        assert len(segments(tmp_path)) == 1
        journal.append(enq(30))
        journal.commit()
        assert len(segments(tmp_path)) == 2


def test_damage_in_a_middle_segment_is_refused_with_what_to_do(tmp_path: Path) -> None:
    names = _multi_segment(tmp_path)
    middle = tmp_path / names[1]
    data = bytearray(middle.read_bytes())
    data[-3] ^= 0xFF
    middle.write_bytes(bytes(data))
    journal = Journal(tmp_path)
    with pytest.raises(JournalCorrupt) as info:
        journal.recover()
    text = str(info.value)
    assert names[1] in text and "checksum mismatch" in text
    assert "not the last segment" in text and "Restore the data dir" in text
    assert f"truncate {names[1]} to" in text
    journal.close()
    assert middle.read_bytes() == bytes(data)  # nothing was "repaired"


def test_a_missing_middle_segment_is_refused(tmp_path: Path) -> None:
    names = _multi_segment(tmp_path)
    (tmp_path / names[1]).unlink()
    journal = Journal(tmp_path)
    with pytest.raises(JournalCorrupt, match=f"{names[1]} is missing"):
        journal.recover()
    journal.close()


def test_damage_in_the_last_of_several_segments_is_a_torn_tail(tmp_path: Path) -> None:
    names = _multi_segment(tmp_path)
    last = tmp_path / names[-1]
    data = last.read_bytes()
    last.write_bytes(data[:-1])
    journal = Journal(tmp_path)
    report = journal.recover()
    assert report.truncated_segment == names[-1]
    assert report.state == fold(HISTORY[:-1])
    journal.close()


def test_unrelated_files_are_left_alone(tmp_path: Path) -> None:
    _write(tmp_path, HISTORY)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "journal-7.log").write_text("not ours")
    assert recovered_state(tmp_path) == fold(HISTORY)
    assert (tmp_path / "notes.txt").exists() and (tmp_path / "journal-7.log").exists()


def test_a_copy_of_a_data_dir_recovers_the_same(tmp_path: Path) -> None:
    _multi_segment(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert recovered_state(tmp_path / "a") == recovered_state(tmp_path / "b") == fold(HISTORY)
