"""Recovery's pass over one journal segment: its frames checked, its enqueues scanned.

Why this exists beside ``SegmentReader.frames`` and ``EnqueueScan.scan``: a restart
with a backlog reads a million frames, nearly all ``message.enqueue`` records of one
shape (issue 16 item 4: serve within 5 s of the start). Walking them through the
frame generator and the scan took about 4 us a frame on the slower 2-core VM, most
of a restart. This is the same walk written as one loop, plus a shortcut: once the
scan has read an enqueue whose time is its last field, a later frame of the same
length whose bytes equal that record's everywhere except in the id (same width),
the body (same size) and the time is that record with the new id and time, so its
fields are taken from those bytes without the scan (see :class:`_Shape`). Everything
else goes through the scan, or to ``other`` to be decoded in full, exactly as
before. ``tests/store/test_recover_pass.py`` checks with hypothesis that the state a
journal recovers to, its defects and counts are those of the frame-by-frame walk.
"""

from __future__ import annotations

import re
import struct
import zlib
from array import array
from collections.abc import Callable
from itertools import repeat
from operator import itemgetter

from amqlite.protocol.cbor import head as _head

from .codec import (
    _ENQUEUE_HEAD,
    _K_AT,
    _K_BODY,
    _K_PK,
    _UNPACK_FLOAT,
    EnqueueScan,
    _item_end,
    decode_record,
)
from .errors import RecordError
from .records import Record
from .segment import FRAME_HEAD, FRAME_HEAD_SIZE, Defect, SegmentReader, next_frame
from .state import ScannedEnqueue

_ID_TYPES = {1: "B", 2: "H", 4: "I"}  # an id's width -> its struct format
_FIRST, _SECOND, _THIRD, _FOURTH = map(itemgetter, range(4))

#: scanned enqueues are handed on this many at a time
BATCH = 4096

_ID_AT = 1 + len(_ENQUEUE_HEAD)  # the id's head byte, after the map's head and "t"/"id"
_AT_TAIL = _K_AT + b"\xfb"
#: scanned frames of a shape's length that did not match it, before it is learned anew
_RELEARN = 16


#: frames of one shape in a row, one at a time, before the pass tries them as a run
RUN_AFTER = 8
#: the most frames a run reads at once (its temporary rows stay small: the memory a
#: restart takes is held after it, issue 16 item 4); the next run follows at once
RUN_MAX = 8192


def _pair_end(data: bytes, pos: int, end: int) -> int:
    """Where the map's key and value at ``pos`` end, or -1."""
    pos = _item_end(data, pos, end)
    return _item_end(data, pos, end) if pos >= 0 else -1


class _Shape:
    """Where an enqueue's id, body, time and publish key sit, as learned from one the
    scan read.

    ``head`` is the record up to and including the id's head byte; ``mid`` the bytes
    from the id's end to the body's first byte (the route, the body's key and length);
    ``tail`` those from the body's end to the time's 8 bytes; then the record ends, or
    ``pk_head`` (the publish key's map key and text head) and the key's ``pk_size``
    bytes end it. A frame of the same ``length`` with the same ``head``, ``mid``,
    ``tail`` and ``pk_head`` at the same places decodes to the same fields but its id,
    time and key (the scan reads nothing in the body; an id of at most 4 bytes is
    always in range; the key's bytes must be UTF-8, as the scan's)."""

    __slots__ = (
        "fields",
        "frames",
        "head",
        "id_end",
        "length",
        "mid",
        "pk_at",
        "pk_head",
        "pk_size",
        "row",
        "tail",
        "tail_at",
    )

    def __init__(self, data: bytes, start: int, end: int, fields: ScannedEnqueue) -> None:
        self.length = -1  # unusable unless everything below holds
        self.fields = fields
        id_pos = start + _ID_AT
        b = data[id_pos]
        if not 0x18 <= b <= 0x1A:  # 1 to 4 id bytes
            return
        id_end = id_pos + 1 + (1 << (b - 0x18))
        # the body: walk the map's pairs after the id up to its key
        pos = id_end
        while not data.startswith(_K_BODY, pos):
            pos = _pair_end(data, pos, end)
            if pos < 0:
                return
        body_end = _item_end(data, pos + len(_K_BODY), end)
        body_start = body_end - fields[3]
        if body_end < 0 or body_start <= pos:
            return
        # the publish key, if any, ends the record: its key, a head of its length
        key = fields[5].encode()
        pk_head = _K_PK + _head(0x60, len(key)) if key else b""
        pk_at = end - len(key)
        if not data.startswith(key, pk_at) or not data.startswith(pk_head, pk_at - len(pk_head)):
            return
        # the time before it: the pairs after the body end at its key, then 8 bytes
        at = pk_at - len(pk_head) - 8
        pos = body_end
        while pos < at - len(_AT_TAIL):
            pos = _pair_end(data, pos, end)
            if pos < 0:
                return
        if pos != at - len(_AT_TAIL) or not data.startswith(_AT_TAIL, pos):
            return
        if _UNPACK_FLOAT(data, at)[0] != fields[4]:
            return
        self.head = data[start : id_pos + 1]
        self.id_end = id_end - start
        self.mid = data[id_end:body_start]
        self.tail = data[body_end:at]
        self.tail_at = body_end - start
        self.pk_head = pk_head
        self.pk_size = len(key)
        self.pk_at = pk_at - start
        self.length = end - start
        # for runs (:func:`_run`): frames of this shape back to back, whole, as one
        # pattern (the length's bytes, any checksum, head, any id, mid, any body,
        # tail, any time, the key's head, any key), and the checksum, id, time and key
        # of each as one struct
        width = id_end - id_pos - 1
        frame_at = start - FRAME_HEAD_SIZE
        one = b"".join(
            (
                re.escape(data[frame_at : frame_at + 4]),
                b".{4}",
                re.escape(self.head),
                b".{%d}" % width,
                re.escape(self.mid),
                b".{%d}" % fields[3],
                re.escape(self.tail),
                b".{8}",
                re.escape(pk_head),
                b".{%d}" % len(key),
            )
        )
        self.frames = re.compile(b"(?:%s)*" % one, re.DOTALL)
        key_format = f"{len(pk_head)}x{len(key)}s" if key else ""
        self.row = struct.Struct(f">4xI{_ID_AT + 1}x{_ID_TYPES[width]}{at - id_end}xd{key_format}")

    def one(self, data: bytes, start: int, end: int) -> ScannedEnqueue | None:
        """The fields of the enqueue in ``data[start:end]`` if it has this shape (its
        length and constant bytes), else None."""
        if not (
            end - start == self.length
            and data.startswith(self.head, start)
            and data.startswith(self.mid, start + self.id_end)
            and data.startswith(self.tail, start + self.tail_at)
        ):
            return None
        f = self.fields
        key = ""
        at = end - 8
        if self.pk_size:
            pk_at = start + self.pk_at
            at = pk_at - len(self.pk_head) - 8
            if not data.startswith(self.pk_head, at + 8):
                return None
            try:
                key = data[pk_at:end].decode()
            except UnicodeDecodeError:
                return None
        return (
            int.from_bytes(data[start + _ID_AT + 1 : start + self.id_end], "big"),
            f[1],
            f[2],
            f[3],
            _UNPACK_FLOAT(data, at)[0],
            key,
        )


PlaceRun = Callable[
    [
        "array[int]",
        "array[float]",
        "array[int]",
        str,
        tuple[str, ...],
        int,
        "list[str] | None",
    ],
    None,
]

#: a run: its ids, times, publish keys (None: the shape has none) and count
Run = tuple["array[int]", "array[float]", "list[str] | None", int]


def _good_crcs(view: memoryview, pos: int, stride: int, stored: array[int]) -> int:
    """How many of the frames of ``stride`` bytes from ``pos`` (as many as ``stored``,
    their checksums as their heads give them) have the checksum they say, before
    the first that has not: the checksums are computed in C, over a map of slices."""
    count = len(stored)
    first = pos + FRAME_HEAD_SIZE
    stop = pos + count * stride
    payloads = map(
        view.__getitem__,
        map(slice, range(first, stop, stride), range(pos + stride, stop + stride, stride)),
    )
    computed = array("I", map(zlib.crc32, payloads))
    if computed == stored:
        return count
    return next(i for i in range(count) if computed[i] != stored[i])


def _run(data: bytes, pos: int, shape: _Shape, *, checked: bool = False) -> Run | None:
    """The frames from ``pos`` on that have ``shape`` (its length and constant bytes)
    and the checksum their heads give (``checked``: known already), up to the first
    that has not: their ids, times, keys and count; None for none. All in C but one
    checksum call a frame."""
    stride = FRAME_HEAD_SIZE + shape.length
    matched = shape.frames.match(data, pos, min(len(data), pos + RUN_MAX * stride))
    count = (matched.end() - pos) // stride if matched is not None else 0
    if not count:
        return None
    view = memoryview(data)
    rows = list(shape.row.iter_unpack(view[pos : pos + count * stride]))
    if not checked:
        good = _good_crcs(view, pos, stride, array("I", map(_FIRST, rows)))
        if good < count:  # damage: the run ends before the first bad frame
            if not good:
                return None
            count = good
            rows = rows[:count]
    keys: list[str] | None = None
    if shape.pk_size:
        raw = list(map(_FOURTH, rows))
        try:
            keys = list(map(bytes.decode, raw))
        except UnicodeDecodeError:  # not a key the scan reads: the run ends before it
            count = _decodable(raw)
            if not count:
                return None
            rows, keys = rows[:count], [k.decode() for k in raw[:count]]
    return array("q", map(_SECOND, rows)), array("d", map(_THIRD, rows)), keys, count


def _decodable(raw: list[bytes]) -> int:
    """How many of ``raw`` decode as UTF-8 before the first that does not."""
    for i, key in enumerate(raw):
        try:
            key.decode()
        except UnicodeDecodeError:
            return i
    return len(raw)


def fold_segment(
    reader: SegmentReader,
    base: int,
    scan: EnqueueScan,
    place_many: Callable[[list[tuple[ScannedEnqueue, int]]], None],
    other: Callable[[int, int, int], None],
    place_run: PlaceRun | None = None,
) -> None:
    """Walk ``reader``'s frames as ``reader.frames()`` does (setting ``end``,
    ``defect`` and ``records`` alike): each enqueue the scan (or the shortcut) reads
    goes to ``place_many`` as ``(fields, base | offset)``, in batches; any other
    frame goes to ``other(offset, start, end)``, after the batch before it. With
    ``place_run`` (``StoreState.enqueue_placed_run``), frames of one shape in a row
    go to it as columns, a run at a time, instead (:func:`_run_length`)."""
    data = reader.data
    pos = reader.start()
    if pos < 0:
        return
    size = len(data)
    view = memoryview(data)
    scan_one = scan.scan
    batch: list[tuple[ScannedEnqueue, int]] = []
    add = batch.append
    shape: _Shape | None = None
    length_of_shape = -1
    misses = 0  # scanned since the shape was learned: learn again now and then
    streak = 0  # frames in a row the shortcut read
    records = 0
    while pos < size:
        if streak >= RUN_AFTER and shape is not None and place_run is not None:
            streak = 0
            run = _run(data, pos, shape)
            if run is not None:
                if batch:
                    place_many(batch)
                    batch = []
                    add = batch.append
                ids, times, keys, count = run
                stride = FRAME_HEAD_SIZE + shape.length
                f = shape.fields
                where = base | pos
                place_run(
                    ids,
                    times,
                    array("q", range(where, where + count * stride, stride)),
                    f[1],
                    f[2],
                    f[3],
                    keys,
                )
                pos += count * stride
                records += count
                if count == RUN_MAX:
                    streak = RUN_AFTER
                continue
        got = next_frame(data, view, pos)
        if isinstance(got, Defect):
            reader.defect = got
            break
        start, end = got
        length = end - start
        fields = shape.one(data, start, end) if length == length_of_shape and shape else None
        if fields is not None:
            streak += 1
            add((fields, base | pos))
            if len(batch) >= BATCH:
                place_many(batch)
                batch = []
                add = batch.append
        else:
            streak = 0
            fields = scan_one(data, start, end)
            if fields is not None:
                add((fields, base | pos))
                if len(batch) >= BATCH:
                    place_many(batch)
                    batch = []
                    add = batch.append
                misses += 1
                if length != length_of_shape or misses >= _RELEARN:
                    misses = 0
                    learned = _Shape(data, start, end, fields)
                    if learned.length > 0:
                        shape, length_of_shape = learned, learned.length
            else:
                if batch:
                    place_many(batch)
                    batch = []
                    add = batch.append
                reader.end, reader.records = pos, records
                other(pos, start, end)
        pos = end
        records += 1
    reader.end, reader.records = pos, records  # where the good frames end
    if batch:
        place_many(batch)


class ReplicaFrames:
    """A passive HA node's reading of the frames its syncs bring: :meth:`check` is
    ``segment.check_frames`` and :meth:`scan` ``segment.parse_scanned`` (with
    ``EnqueueScan.scan``, ``checked``) without the frames, each with the same
    result and errors, reading runs of enqueues of one shape in C as recovery does
    (:func:`_run`).

    Why it exists: scanning each replicated enqueue (~3 us on the slower 2-core VM)
    and checking each frame in a Python loop were a third of the passive node's CPU
    per persistent message, and every microsecond it spends is one the active node
    loses on a 2-core machine (issue 16 item 3). A replicated enqueue carries a
    publish key, different in each message but usually of one length in a run (a
    shape has one); acks and marks come between runs of a few dozen enqueues, so a
    run is tried at the first frame of a shape's length, not after eight. The shape
    learned is kept from one sync to the next. ``tests/store/test_replica_frames.py``
    checks with hypothesis that both agree with the frame by frame functions."""

    __slots__ = ("_check_runs", "_misses", "_scan", "_shape")

    def __init__(self, scan: EnqueueScan | None = None) -> None:
        self._scan = scan if scan is not None else EnqueueScan()
        self._shape: _Shape | None = None
        self._misses = 0  # scanned since the shape was learned: learn again now and then
        # a frame length -> the pattern of frames of that length back to back, and the
        # struct of their checksums (few lengths: the cache is dropped past 64)
        self._check_runs: dict[int, tuple[re.Pattern[bytes], struct.Struct]] = {}

    def check(self, data: bytes) -> None:
        """Raise RecordError unless ``data`` is whole frames, each with the right
        checksum (``segment.check_frames``); a frame of the length of the one
        before it starts a run of that length, checked in C (:func:`_good_crcs`)."""
        view = memoryview(data)
        i, end = 0, len(data)
        crc32, head = zlib.crc32, FRAME_HEAD.unpack_from
        last = -1
        while i < end:
            if end - i < FRAME_HEAD_SIZE:
                raise RecordError("replication data ends inside a frame header")
            length, crc = head(data, i)
            if length == last:
                count = self._same_length(data, view, i, length)
                if count:
                    i += count * (FRAME_HEAD_SIZE + length)
                    continue
            last = length
            start = i + FRAME_HEAD_SIZE
            i = start + length
            if i > end or crc32(view[start:i]) != crc:
                raise RecordError("replication frame cut short or checksum mismatch")

    def _same_length(self, data: bytes, view: memoryview, pos: int, length: int) -> int:
        """How many frames of ``length`` from ``pos`` on are whole and checked good,
        up to the first that is not (or not of that length)."""
        got = self._check_runs.get(length)
        if got is None:
            if len(self._check_runs) >= 64:
                self._check_runs.clear()
            got = self._check_runs[length] = (
                re.compile(
                    b"(?:%s.{%d})*" % (re.escape(FRAME_HEAD.pack(length, 0)[:4]), length + 4),
                    re.DOTALL,
                ),
                struct.Struct(f">4xI{length}x"),
            )
        pattern, row = got
        stride = FRAME_HEAD_SIZE + length
        matched = pattern.match(data, pos, min(len(data), pos + RUN_MAX * stride))
        count = (matched.end() - pos) // stride if matched is not None else 0
        if not count:
            return 0
        stored = array("I", map(_FIRST, row.iter_unpack(view[pos : pos + count * stride])))
        return _good_crcs(view, pos, stride, stored)

    def scan(self, data: bytes) -> tuple[list[Record | ScannedEnqueue], list[int]]:
        """``segment.parse_scanned(data, scan, checked=True)`` of frames
        :meth:`check` passed, without the frames: the records (a tuple is a scanned
        enqueue's fields) and where each frame starts, then ``len(data)`` (frame ``j``
        is ``data[starts[j]:starts[j + 1]]``). A passive node's bulk fold
        (``Journal.fold``) needs the frame of few of them (most messages cancel out,
        ``StoreState.fold_records``): slicing each one, a tuple each and the offsets
        summed back from their lengths were a tenth of its parse (round 12)."""
        records: list[Record | ScannedEnqueue] = []
        starts: list[int] = []
        add, at = records.append, starts.append
        view = memoryview(data)
        head = FRAME_HEAD.unpack_from
        scan_one = self._scan.scan
        shape = self._shape
        length_of_shape = shape.length if shape is not None else -1
        i, end = 0, len(data)
        while i < end:
            if end - i < FRAME_HEAD_SIZE:
                raise RecordError("replication data ends inside a frame header")
            length = head(data, i)[0]
            if length == length_of_shape:
                assert shape is not None
                run = _run(data, i, shape, checked=True)
                if run is not None:
                    ids, times, keys, count = run
                    f = shape.fields
                    records += zip(
                        ids,
                        repeat(f[1], count),
                        repeat(f[2]),
                        repeat(f[3]),
                        times,
                        keys if keys is not None else repeat(""),
                    )
                    stride = FRAME_HEAD_SIZE + length
                    stop = i + count * stride
                    starts += range(i, stop, stride)
                    i = stop
                    continue
            start, stop = i + FRAME_HEAD_SIZE, i + FRAME_HEAD_SIZE + length
            if stop > end:
                raise RecordError("replication frame cut short or checksum mismatch")
            fields = scan_one(data, start, stop) if length else None
            if fields is None:
                add(decode_record(view[start:stop]))
            else:
                add(fields)
                self._misses += 1
                if length != length_of_shape or self._misses >= _RELEARN:
                    self._misses = 0
                    learned = _Shape(data, start, stop, fields)
                    if learned.length > 0:
                        shape, length_of_shape = learned, learned.length
                        self._shape = shape
            at(i)
            i = stop
        at(end)
        return records, starts
