"""The disk spill store of a peering link: a FIFO of entries in one file."""

from __future__ import annotations

from pathlib import Path

from amqlite.peering import Entry, Envelope, MeshId
from amqlite.server.peering.spill import FileSpill


def _entry(seq: int, body: bytes = b"b") -> Entry:
    env = Envelope(MeshId("a", 1, seq), "k", body, {"h": seq}, {"persistent": True}, "x")
    return Entry(seq, env, env.size(), 10.0 + seq)


def test_entries_come_back_oldest_first_and_the_file_empties(tmp_path: Path) -> None:
    spill = FileSpill(str(tmp_path / "spill" / "link.spill"))
    for seq in range(1, 6):
        spill.append(_entry(seq, b"x" * seq))
    assert len(spill) == 5
    assert spill.bytes == sum(_entry(seq, b"x" * seq).size for seq in range(1, 6))
    assert spill.peek_size() == _entry(1, b"x").size
    assert spill.pop() == _entry(1, b"x")
    spill.append(_entry(6, b"y"))  # appends after reads keep the order
    assert [spill.pop() for _ in range(5)] == [
        *(_entry(seq, b"x" * seq) for seq in range(2, 6)),
        _entry(6, b"y"),
    ]
    assert len(spill) == 0 and spill.bytes == 0
    assert (tmp_path / "spill" / "link.spill").stat().st_size == 0
    spill.append(_entry(7))
    assert spill.pop() == _entry(7)
    spill.close()


def test_a_new_store_starts_empty(tmp_path: Path) -> None:
    path = str(tmp_path / "link.spill")
    first = FileSpill(path)
    first.append(_entry(1))
    first.close()
    assert len(FileSpill(path)) == 0
    assert Path(path).stat().st_size == 0
