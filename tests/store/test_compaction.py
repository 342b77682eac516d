"""Compaction: one snapshot segment replaces the journal; a crash at any step of it
recovers to the state before or after it, never anything else."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from amqlite.store import (
    ExchangeDeclare,
    QueueBind,
    Record,
    SegmentReader,
    StoreWriteError,
)
from amqlite.store.journal import Journal
from amqlite.store.segment import segment_name

from .support import (
    Crash,
    TestLayer,
    ack,
    bodies,
    delivered,
    enospc,
    enq,
    fail_on,
    fold,
    open_journal,
    queue,
    recovered_state,
    segments,
)


def _history() -> list[Record]:
    """Topology, then 60 messages on two queues of which most are acked."""
    records: list[Record] = [
        ExchangeDeclare(name="e", type="fanout"),
        queue("a"),
        queue("b"),
        QueueBind(queue="a", exchange="e"),
        QueueBind(queue="b", exchange="e"),
    ]
    for i in range(1, 61):
        records.append(enq(i, "a", "b", body=b"%d" % i * 20))
    for i in range(1, 61):
        if i % 7:
            records.append(ack(i, "a"))
        if i % 11:
            records.append(ack(i, "b"))
    records += [delivered(7, "a"), delivered(11, "b")]
    return records


def _build(directory: Path, records: list[Record], **options: object) -> None:
    """A multi-segment journal holding ``records`` (a commit every 10)."""
    with open_journal(directory, segment_bytes=1024, **options) as journal:  # type: ignore[arg-type]
        for n, r in enumerate(records, 1):
            journal.append(r)
            if n % 10 == 0:
                journal.commit()


def test_compaction_keeps_exactly_the_live_state(tmp_path: Path) -> None:
    history = _history()
    _build(tmp_path, history)
    before = segments(tmp_path)
    assert len(before) > 3
    journal = open_journal(tmp_path, segment_bytes=1024)
    report = journal.compact()
    expected = fold(history)
    assert report.removed == tuple(before)
    assert report.segment == segment_name(len(before) + 1) and segments(tmp_path) == [
        report.segment
    ]
    assert report.bytes_after < report.bytes_before / 3
    assert report.records == len(expected.snapshot()) and report.forgotten == 0
    written = [r for _, r in SegmentReader((tmp_path / report.segment).read_bytes())]
    assert written == expected.snapshot()
    journal.close()
    state = recovered_state(tmp_path)
    assert state == expected
    assert [(m.record.id, m.redelivered) for m in state.messages("/", "a")] == [
        (i, i == 7) for i in range(7, 61, 7)
    ]
    assert [m.record.id for m in state.messages("/", "b")] == [11, 22, 33, 44, 55]
    assert len(state.bindings()) == 2 and state.last_journal_id == 60


def test_appends_after_compaction_follow_the_snapshot(tmp_path: Path) -> None:
    history = _history()
    _build(tmp_path, history)
    journal = open_journal(tmp_path)
    journal.append(enq(100, "a"))  # buffered: the snapshot covers it
    pos = journal.appended
    journal.compact()
    assert journal.committed == journal.synced == pos
    journal.append(enq(101, "a"))
    journal.append(ack(7, "a"))
    journal.commit()
    assert len(segments(tmp_path)) == 1  # appended to the snapshot segment
    journal.close()
    expected = fold([*history, enq(100, "a"), enq(101, "a"), ack(7, "a")])
    assert recovered_state(tmp_path) == expected


def test_live_journal_ids_drop_what_the_broker_no_longer_has(tmp_path: Path) -> None:
    _build(tmp_path, _history())
    journal = open_journal(tmp_path)
    report = journal.compact(live_journal_ids={14, 21, 22, 999})
    assert report.forgotten == len(fold(_history()).live_journal_ids()) - 3
    journal.close()
    state = recovered_state(tmp_path)
    assert sorted(state.live_journal_ids()) == [14, 21, 22]


def test_compacting_twice_and_an_empty_journal(tmp_path: Path) -> None:
    with open_journal(tmp_path) as journal:
        journal.compact()
        journal.append(queue("a"))
        journal.append(enq(1, "a"))
        journal.compact()
        journal.append(ack(1, "a"))
        journal.compact()
        assert segments(tmp_path) == [segment_name(3)]
    state = recovered_state(tmp_path)
    assert state.live_messages == 0 and state.last_journal_id == 1
    assert [q.name for q in state.queues()] == ["a"]


def test_compaction_due(tmp_path: Path) -> None:
    with open_journal(tmp_path, segment_bytes=4096) as journal:
        journal.append(queue())
        for i in range(1, 200):
            journal.append(enq(i, body=b"x" * 50))
            journal.commit()
        assert not journal.compaction_due()  # everything is live
        for i in range(1, 200):
            journal.append(ack(i))
        journal.commit()
        assert journal.compaction_due()
        journal.compact()
        assert not journal.compaction_due()


def test_a_disk_error_during_compaction_leaves_the_journal_as_it_was(tmp_path: Path) -> None:
    history = _history()
    _build(tmp_path, history)
    before = segments(tmp_path)
    layer = TestLayer()
    journal = open_journal(tmp_path, layer, segment_bytes=1024)
    layer.hook = fail_on("fsync", lambda: enospc())
    pending = journal.append(enq(200, "a"))
    with pytest.raises(StoreWriteError) as info:
        journal.compact()
    assert info.value.dropped == (pending,)
    assert segments(tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    journal.append(enq(201, "a"))
    journal.commit()
    report = journal.compact()  # and it works once the disk does
    journal.close()
    assert segments(tmp_path) == [report.segment]
    assert recovered_state(tmp_path) == fold([*history, enq(201, "a")])


@pytest.mark.parametrize("policy", ["always", "never"])
def test_a_crash_at_any_step_of_compaction_recovers_before_or_after(
    tmp_path: Path, policy: str
) -> None:
    """Step k of compaction raises (the process dies there); recovery must give the
    state before compaction or, once the snapshot was renamed into place, after it.
    With ``never`` the active segment holds unsynced records, so sealing it is a
    step too."""
    history = _history()
    template = tmp_path / "template"
    _build(template, history)
    old = segments(template)
    committed: list[Record] = [enq(299, "b")] if policy == "never" else []
    buffered: list[Record] = [enq(300, "a"), ack(14, "a")]
    before = fold([*history, *committed])
    after = fold([*history, *committed, *buffered])
    outcomes = set()
    step = 0
    while True:
        directory = tmp_path / f"crash{step}"
        shutil.copytree(template, directory)
        layer = TestLayer()
        journal = open_journal(directory, layer, fsync=policy, segment_bytes=1024)
        for r in committed:
            journal.append(r)
        journal.commit()
        for r in buffered:
            journal.append(r)
        countdown = [step]

        def crash_at_step(op: str, path: str, countdown: list[int] = countdown) -> None:
            if countdown[0] == 0:
                raise Crash(f"{op} {path}")
            countdown[0] -= 1

        layer.log.clear()
        layer.hook = crash_at_step
        try:
            journal.compact()
        except Crash:
            pass
        else:
            journal.close()
            break
        layer.kill()
        renamed = any(op == "rename" for op, _ in layer.log[:-1])
        leftovers = {n for n in segments(directory) if n in old}
        recovering = Journal(directory)
        report = recovering.recover()
        assert report.state == (after if renamed else before), (step, layer.log[-1])
        if renamed:  # recovery finishes the compaction: superseded segments go
            assert set(report.removed) >= leftovers, step
            assert not {n for n in segments(directory) if n in old}, step
        else:
            assert leftovers == set(old), step
        assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")], step
        recovering.append(enq(400, "a"))  # and the journal goes on
        recovering.commit()
        recovering.close()
        assert bodies(recovered_state(directory), "a")[-1] == b"m400"
        outcomes.add(renamed)
        step += 1
    assert outcomes == {False, True}
    assert step >= (8 if policy == "never" else 6)
    assert recovered_state(directory) == after


def test_compaction_does_not_wait_for_a_whole_segment(tmp_path: Path) -> None:
    """Restart time follows the journal's size: dead history is compacted once it
    passes compact_after_bytes, even inside the first (large) segment."""
    with Journal(tmp_path, compact_after_bytes=16 * 1024) as journal:
        journal.recover()
        journal.append(queue())
        for i in range(1, 200):
            journal.append(enq(i, body=b"x" * 100))
            journal.append(ack(i))
        journal.commit()
        assert journal.stats().segments == 1 and journal.compaction_due()
        journal.compact()
        assert not journal.compaction_due()
