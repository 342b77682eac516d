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
from operator import itemgetter

from .codec import _ENQUEUE_HEAD, _K_AT, _K_BODY, _UNPACK_FLOAT, EnqueueScan, _item_end
from .segment import FRAME_HEAD_SIZE, Defect, SegmentReader, next_frame
from .state import ScannedEnqueue

_ID_TYPES = {1: "B", 2: "H", 4: "I"}  # an id's width -> its struct format
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)

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
    """Where an enqueue's id, body and time sit, as learned from one the scan read.

    ``head`` is the record up to and including the id's head byte; ``mid`` the bytes
    from the id's end to the body's first byte (the route, the body's key and length);
    ``tail`` those from the body's end to the time's 8 bytes, which end the record.
    A frame of the same ``length`` with the same ``head``, ``mid`` and ``tail`` at
    the same places decodes to the same fields but its id and time (the scan reads
    nothing in the body; an id of at most 4 bytes is always in range)."""

    __slots__ = (
        "fields",
        "frames",
        "head",
        "id_end",
        "length",
        "mid",
        "row",
        "tail",
        "tail_at",
    )

    def __init__(self, data: bytes, start: int, end: int, fields: ScannedEnqueue) -> None:
        self.length = -1  # unusable unless everything below holds
        self.fields = fields
        id_pos = start + _ID_AT
        b = data[id_pos]
        if not 0x18 <= b <= 0x1A or fields[5]:  # 1 to 4 id bytes; no publish key
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
        # the time last: the pairs after the body end at its key, then 8 bytes
        at = end - 8
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
        self.length = end - start
        # for runs (:func:`_run`): frames of this shape back to back, whole, as one
        # pattern (the length's bytes, any checksum, head, any id, mid, any body,
        # tail, any time), and the checksum, id and time of each as one struct
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
            )
        )
        self.frames = re.compile(b"(?:%s)*" % one, re.DOTALL)
        self.row = struct.Struct(f">4xI{_ID_AT + 1}x{_ID_TYPES[width]}{at - id_end}xd")


PlaceRun = Callable[["array[int]", "array[float]", "array[int]", str, tuple[str, ...], int], None]


def _run(data: bytes, pos: int, shape: _Shape) -> tuple[array[int], array[float], int] | None:
    """The frames from ``pos`` on that have ``shape`` (its length and constant bytes)
    and the checksum their heads give, up to the first that has not: their ids,
    times and count; None for none. All in C but one checksum call a frame."""
    stride = FRAME_HEAD_SIZE + shape.length
    matched = shape.frames.match(data, pos, min(len(data), pos + RUN_MAX * stride))
    count = (matched.end() - pos) // stride if matched is not None else 0
    if not count:
        return None
    view = memoryview(data)
    rows = list(shape.row.iter_unpack(view[pos : pos + count * stride]))
    stored = array("I", map(_FIRST, rows))
    first = pos + FRAME_HEAD_SIZE
    stop = first + count * stride
    payloads = map(
        view.__getitem__,
        map(slice, range(first, stop, stride), range(first + shape.length, stop, stride)),
    )
    computed = array("I", map(zlib.crc32, payloads))
    if computed != stored:  # damage: the run ends before the first bad frame
        count = next(i for i in range(count) if computed[i] != stored[i])
        if not count:
            return None
        rows = rows[:count]
    return array("q", map(_SECOND, rows)), array("d", map(_THIRD, rows)), count


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
    unpack_float = _UNPACK_FLOAT
    from_bytes = int.from_bytes
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
                ids, times, count = run
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
        if (
            length == length_of_shape
            and shape is not None
            and data.startswith(shape.head, start)
            and data.startswith(shape.mid, start + shape.id_end)
            and data.startswith(shape.tail, start + shape.tail_at)
        ):
            streak += 1
            f = shape.fields
            add(
                (
                    (
                        from_bytes(data[start + _ID_AT + 1 : start + shape.id_end], "big"),
                        f[1],
                        f[2],
                        f[3],
                        unpack_float(data, end - 8)[0],
                        "",
                    ),
                    base | pos,
                )
            )
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
