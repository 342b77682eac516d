"""Segment files: naming, record framing, and a reader that stops at damage.

A segment is ``journal-<16-digit sequence>.log``. It starts with an 8-byte header
(``AMQLJNL`` and a format version byte, 1) followed by frames::

    [4-byte big-endian payload length][4-byte big-endian zlib.crc32(payload)][payload]

where the payload is one CBOR record (:mod:`amqlite.store.records`). Sequence
numbers only grow; replay goes in sequence order.

The reader is pure: it takes the bytes of a segment and yields ``(offset,
record)`` pairs until the data ends or a frame is damaged (short header, length
past the end, zero or absurd length, checksum mismatch). It then stops and says
where and why in :attr:`SegmentReader.defect`; it never guesses past damage. A
frame whose checksum matches but whose payload is not a valid record is not a
torn write: :class:`~amqlite.store.errors.JournalCorrupt` is raised.
"""

from __future__ import annotations

import dataclasses
import re
import struct
import zlib
from collections.abc import Callable, Iterator

from .codec import decode_record, encode_plain_enqueue, encode_record
from .errors import JournalCorrupt, RecordError
from .records import MessageEnqueue, Record
from .state import ScannedEnqueue

MAGIC = b"AMQLJNL"
VERSION = 1
HEADER = MAGIC + bytes((VERSION,))
HEADER_SIZE = len(HEADER)
FRAME_HEAD = struct.Struct(">II")
FRAME_HEAD_SIZE = FRAME_HEAD.size
#: Frames longer than this are damage, not data (bodies are far below it).
MAX_PAYLOAD = 1 << 30

_NAME = re.compile(r"journal-(\d{16})\.log")


def segment_name(seq: int) -> str:
    """``7`` -> ``journal-0000000000000007.log``."""
    if not 0 <= seq < 10**16:
        raise ValueError(f"segment sequence out of range: {seq}")
    return f"journal-{seq:016d}.log"


def segment_seq(name: str) -> int | None:
    """The sequence number of a segment file name, or None for any other name."""
    m = _NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def frame(payload: bytes) -> bytes:
    """One frame: length, checksum, payload."""
    return FRAME_HEAD.pack(len(payload), zlib.crc32(payload)) + payload


_PACK_HEAD = FRAME_HEAD.pack
_CRC32 = zlib.crc32


def frame_record(record: Record) -> bytes:
    """The frame for ``record`` (validated; raises RecordError). The usual persistent
    message's goes straight to its encoder (:func:`encode_plain_enqueue`, which
    :func:`encode_record` would call first too): one per message."""
    if type(record) is MessageEnqueue:
        payload = encode_plain_enqueue(record)
        if payload is not None:
            return _PACK_HEAD(len(payload), _CRC32(payload)) + payload
    return frame(encode_record(record))


def parse_frames(data: bytes) -> list[Record]:
    """The records in ``data``, a run of whole frames (the HA peer link sends
    journal frames); raises RecordError for a bad frame or checksum."""
    return [record for record, _ in parse_framed(data)]


def parse_framed(data: bytes) -> list[tuple[Record, bytes]]:
    """:func:`parse_frames`, each record with its frame (checked: a passive HA node
    journals it as it came, without encoding the record again)."""
    out = []
    view = memoryview(data)
    i, end = 0, len(data)
    while i < end:
        if end - i < 8:
            raise RecordError("replication data ends inside a frame header")
        length = int.from_bytes(view[i : i + 4], "big")
        crc = int.from_bytes(view[i + 4 : i + 8], "big")
        payload = view[i + 8 : i + 8 + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            raise RecordError("replication frame cut short or checksum mismatch")
        out.append((decode_record(payload), bytes(view[i : i + 8 + length])))
        i += 8 + length
    return out


def check_frames(data: bytes) -> None:
    """Raise RecordError unless ``data`` is whole frames, each with the right checksum
    (what :func:`parse_scanned` checks, without reading the records)."""
    view = memoryview(data)
    i, end = 0, len(data)
    crc32, head = zlib.crc32, FRAME_HEAD.unpack_from
    while i < end:
        if end - i < 8:
            raise RecordError("replication data ends inside a frame header")
        length, crc = head(data, i)
        start = i + 8
        i = start + length
        if i > end or crc32(view[start:i]) != crc:
            raise RecordError("replication frame cut short or checksum mismatch")


def parse_scanned(
    data: bytes,
    scan: Callable[[bytes, int, int], ScannedEnqueue | None],
    *,
    checked: bool = False,
) -> list[tuple[Record | ScannedEnqueue, bytes]]:
    """:func:`parse_framed`, except that a ``message.enqueue`` frame that ``scan``
    (``EnqueueScan.scan``) reads comes as its fields, not decoded (a passive HA
    node folds it from those: ``StoreState.enqueue_scanned`` says why); a tuple is
    fields, anything else a record. ``checked``: :func:`check_frames` passed on
    ``data`` already (the checksums are not computed again)."""
    out: list[tuple[Record | ScannedEnqueue, bytes]] = []
    view = memoryview(data)
    i, end = 0, len(data)
    crc32 = zlib.crc32
    while i < end:
        if end - i < 8:
            raise RecordError("replication data ends inside a frame header")
        length, crc = FRAME_HEAD.unpack_from(data, i)
        start, stop = i + 8, i + 8 + length
        if stop > end or (not checked and crc32(view[start:stop]) != crc):
            raise RecordError("replication frame cut short or checksum mismatch")
        fields = scan(data, start, stop) if length else None
        out.append(
            (fields if fields is not None else decode_record(view[start:stop]), data[i:stop])
        )
        i = stop
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Defect:
    """Where a segment stops being readable, and why."""

    offset: int
    reason: str


def next_frame(data: bytes, view: memoryview, pos: int) -> tuple[int, int] | Defect:
    """The payload's ``(start, end)`` of the whole frame at ``pos`` whose checksum
    matches, or the :class:`Defect` that is there instead (``view`` is
    ``memoryview(data)``, made once by the caller)."""
    size = len(data)
    if size - pos < FRAME_HEAD_SIZE:
        return Defect(pos, f"torn frame header ({size - pos} bytes)")
    length, crc = FRAME_HEAD.unpack_from(data, pos)
    start = pos + FRAME_HEAD_SIZE
    if length == 0:
        return Defect(pos, "zero-length frame (zero-filled tail?)")
    if length > MAX_PAYLOAD:
        return Defect(pos, f"impossible frame length {length}")
    end = start + length
    if end > size:
        return Defect(pos, f"torn frame: {length} bytes announced, {size - start} present")
    if zlib.crc32(view[start:end]) != crc:
        return Defect(pos, "checksum mismatch")
    return start, end


class SegmentReader:
    """Iterate ``(offset, record)`` over the bytes of one segment.

    After iteration, :attr:`end` is the offset just past the last good record (the
    length to keep) and :attr:`defect` is None when the data ended cleanly.
    """

    def __init__(self, data: bytes, *, name: str = "segment") -> None:
        self.data = data
        self.name = name
        self.end = 0
        self.defect: Defect | None = None
        self.records = 0

    def __iter__(self) -> Iterator[tuple[int, Record]]:
        for pos, start, end in self.frames():
            yield pos, self.decode(pos, start, end)

    def decode(self, pos: int, start: int, end: int) -> Record:
        """The record of the frame at ``pos`` (payload ``data[start:end]``, checksum
        checked); raises JournalCorrupt when it cannot be read."""
        try:
            return decode_record(memoryview(self.data)[start:end])
        except RecordError as exc:
            raise JournalCorrupt(
                f"{self.name}: record at offset {pos} has a valid checksum but cannot "
                f"be read ({exc.text}); it was written by another program or version"
            ) from None

    def start(self) -> int:
        """Check the segment's header: the offset of its first frame, or -1 when
        there is none to read (empty, or :attr:`defect` says why); raises
        JournalCorrupt for a file that is not a segment this version reads. Resets
        :attr:`end`, :attr:`defect` and :attr:`records`."""
        data = self.data
        size = len(data)
        self.end, self.defect, self.records = 0, None, 0
        header = data[:HEADER_SIZE]
        if size == 0:  # created, nothing written yet
            return -1
        if header != HEADER:
            if size < HEADER_SIZE and HEADER.startswith(header):
                self.defect = Defect(0, f"torn header ({size} of {HEADER_SIZE} bytes)")
            elif not header.strip(b"\0"):
                self.defect = Defect(0, "zero-filled header")
            elif header.startswith(MAGIC):
                raise JournalCorrupt(
                    f"{self.name}: journal format version {header[-1]} is not supported "
                    f"(this amqlite reads version {VERSION}); use the amqlite that wrote it"
                )
            else:
                raise JournalCorrupt(
                    f"{self.name}: not an amqlite journal segment (bad header {header!r}); "
                    "move it out of the data dir"
                )
            return -1
        self.end = HEADER_SIZE
        return HEADER_SIZE

    def frames(self) -> Iterator[tuple[int, int, int]]:
        """``(offset, payload start, payload end)`` of each whole frame whose checksum
        matches, without decoding it (recovery scans most payloads instead:
        ``amqlite.store.recover``); :attr:`end`, :attr:`defect` and :attr:`records`
        as for iterating (a frame counts once the caller asks for the next)."""
        pos = self.start()
        if pos < 0:
            return
        data = self.data
        size = len(data)
        view = memoryview(data)
        while pos < size:
            got = next_frame(data, view, pos)
            if isinstance(got, Defect):
                self.defect = got
                return
            start, end = got
            yield pos, start, end
            pos = end
            self.end = pos
            self.records += 1
