"""Records <-> CBOR bytes.

The generic path (:func:`amqlite.store.records.record_to_map` and
``record_from_map``) serves every record type. The three records written once
per message (``message.enqueue``, ``message.delivered``, ``message.ack``) are the
journal's hot path, on append and on recovery, so they also have hand-written
encoders and decoders, as the wire codec does for publish and deliver. Each
handles the ordinary case only and returns None for anything unusual; the generic
path then takes over and raises the precise error. The bytes are plain CBOR
either way (floats as float64), so the two paths read each other's output.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import cbor2

from amqlite.protocol.cbor import MAP_HEADS as _MAP_HEADS
from amqlite.protocol.cbor import head as _head
from amqlite.protocol.cbor import text as _text
from amqlite.protocol.cbor import uint as _uint
from amqlite.protocol.codec import check_headers, check_props

from .errors import RecordError
from .records import (
    MAX_JOURNAL_ID,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    MessageMarks,
    Record,
    record_from_map,
    record_to_map,
)
from .state import KEPT_PROPS, ScannedEnqueue

_FLOAT = struct.Struct(">d")


def _scalar(v: Any) -> bytes | None:
    t = type(v)
    if t is str:
        return _text(v)
    if t is bytes:
        raw: bytes = v
        return _head(0x40, len(raw)) + raw
    if t is bool:
        return b"\xf5" if v else b"\xf4"
    if v is None:
        return b"\xf6"
    if t is int:
        if 0 <= v < 1 << 64:
            return _head(0x00, v)
        if -(1 << 64) <= v < 0:
            return _head(0x20, -1 - v)
        return None
    if t is float:
        return b"\xfb" + _FLOAT.pack(v)
    return None


def _scalar_map(d: dict[str, Any]) -> bytes | None:
    parts = [_head(0xA0, len(d))]
    for k, v in d.items():
        value = _scalar(v)
        if type(k) is not str or value is None:
            return None
        parts.append(_text(k))
        parts.append(value)
    return b"".join(parts)


_T = _text("t")
_ENQUEUE = _T + _text(MessageEnqueue.TYPE)
_ACK = _T + _text(MessageAck.TYPE)
_DELIVERED = _T + _text(MessageDelivered.TYPE)
_K_ID = _text("id")
_K_VHOST = _text("vhost")
_K_QUEUES = _text("queues")
_K_QUEUE = _text("queue")
_K_EXCHANGE = _text("exchange")
_K_KEY = _text("key")
_K_BODY = _text("body")
_K_HEADERS = _text("headers")
_K_PROPS = _text("props")
_K_AT = _text("at")
_K_PK = _text("pk")


_CACHE_MAX = 4096
_ROUTES: dict[tuple[Any, ...], tuple[bytes, int]] = {}
_MAPS: dict[tuple[Any, ...], bytes] = {}


def _route(vhost: Any, queues: Any, exchange: Any, key: Any) -> tuple[bytes, int] | None:
    """The encoded vhost, queues, exchange and key pairs (those not at their default)
    and how many there are: the same for every message on one route, so cached."""
    route = (vhost, queues, exchange, key)
    try:
        hit = _ROUTES.get(route)
    except TypeError:  # something unhashable: not a valid record
        return None
    if hit is not None:
        return hit
    if (
        type(vhost) is not str
        or type(queues) is not tuple
        or not queues
        or any(type(q) is not str for q in queues)
        or len(set(queues)) != len(queues)
        or type(exchange) is not str
        or type(key) is not str
    ):
        return None
    parts = [_K_QUEUES, _head(0x80, len(queues)), *map(_text, queues), _K_EXCHANGE, _text(exchange)]
    pairs = 2
    if vhost != "/":
        parts += (_K_VHOST, _text(vhost))
        pairs += 1
    if key:
        parts += (_K_KEY, _text(key))
        pairs += 1
    hit = (b"".join(parts), pairs)
    if len(_ROUTES) >= _CACHE_MAX:
        _ROUTES.clear()
    _ROUTES[route] = hit
    return hit


def _checked_map(d: Any, check: Callable[[Any], str | None]) -> bytes | None:
    """The encoding of a headers or props map that passes ``check`` (cached by content
    and value types, so ``True`` and ``1`` stay apart)."""
    if type(d) is not dict:
        return None
    try:
        if len(d) == 1:  # the usual map ({"persistent": True}): the same key, no generator
            for k, v in d.items():
                ident: tuple[Any, ...] = ((k, type(v), v),)
        else:
            ident = tuple((k, type(v), v) for k, v in d.items())
        hit = _MAPS.get(ident)
    except TypeError:
        return None
    if hit is None:
        if check(d) is not None:
            return None
        hit = _scalar_map(d)
        if hit is None:
            return None
        if len(_MAPS) >= _CACHE_MAX:
            _MAPS.clear()
        _MAPS[ident] = hit
    return hit


def _encode_enqueue(r: MessageEnqueue) -> bytes | None:
    journal_id, body, headers, props, at = r.id, r.body, r.headers, r.props, r.enqueued_at
    pk = r.publish_key
    if (
        type(pk) is not str
        or type(journal_id) is not int
        or not 0 <= journal_id <= MAX_JOURNAL_ID
        or type(body) is not bytes
        or r.deaths
        or r.mesh
        or (type(at) is not float and type(at) is not int)
    ):
        return None
    route = _route(r.vhost, r.queues, r.exchange, r.routing_key)
    if route is None:
        return None
    prefix, pairs = route
    parts = [
        b"",
        _ENQUEUE,
        _K_ID,
        _head(0x00, journal_id),
        prefix,
        _K_BODY,
        _head(0x40, len(body)),
        body,
    ]
    if headers or type(headers) is not dict:
        encoded = _checked_map(headers, check_headers)
        if encoded is None:
            return None
        parts += (_K_HEADERS, encoded)
        pairs += 1
    if props or type(props) is not dict:
        encoded = _checked_map(props, check_props)
        if encoded is None:
            return None
        parts += (_K_PROPS, encoded)
        pairs += 1
    if at != 0.0:
        parts += (_K_AT, b"\xfb" + _FLOAT.pack(at))
        pairs += 1
    if pk:
        parts += (_K_PK, _text(pk))
        pairs += 1
    parts[0] = _MAP_HEADS[pairs + 3]  # plus t, id, body
    return b"".join(parts)


_PLAIN_HEADS: dict[tuple[Any, ...], tuple[bytes, bytes, bytes]] = {}
#: what follows the body in a plain enqueue: its props ({"persistent": true}) and
#: the head of its ``at`` (a float64)
_PLAIN_TAIL = _K_PROPS + _head(0xA0, 1) + _text("persistent") + b"\xf5" + _K_AT + b"\xfb"
_PACK_AT = _FLOAT.pack
_BODY_HEADS = tuple(_head(0x40, n) for n in range(0x100))


def encode_plain_enqueue(r: MessageEnqueue) -> bytes | None:
    """:func:`_encode_enqueue`'s bytes for the usual persistent message (no headers,
    props exactly ``{"persistent": True}``, no deaths, no mesh, a float ``at`` other
    than 0), else None.

    Why it exists beside ``_encode_enqueue``: every persistent message a client
    publishes is one of these, and everything but its id, body, time and publish
    key is the same for every message on its route, so it is joined from a
    template cached per route (the map's head, and what lies between the id and
    the body) instead of being checked and assembled field by field.
    ``tests/store/test_records.py::test_the_plain_enqueue_encoder_gives_the_general_bytes``
    checks with hypothesis that the two give the same bytes."""
    headers, props, journal_id, body, at, pk = (
        r.headers, r.props, r.id, r.body, r.enqueued_at, r.publish_key
    )  # fmt: skip
    if (
        headers
        or type(headers) is not dict
        or type(props) is not dict
        or len(props) != 1
        or props.get("persistent") is not True
        or type(journal_id) is not int
        or not 0 <= journal_id <= MAX_JOURNAL_ID
        or type(body) is not bytes
        or type(at) is not float
        or at == 0.0
        or type(pk) is not str
        or r.deaths
        or r.mesh
    ):
        return None
    route = (r.vhost, r.queues, r.exchange, r.routing_key)
    try:
        template = _PLAIN_HEADS.get(route)
    except TypeError:  # something unhashable: not a valid record
        return None
    if template is None:
        encoded = _route(*route)
        if encoded is None:
            return None
        prefix, pairs = encoded
        pairs += 5  # t, id, body, props, at
        template = (
            _MAP_HEADS[pairs] + _ENQUEUE + _K_ID,
            _MAP_HEADS[pairs + 1] + _ENQUEUE + _K_ID,  # with a publish key
            prefix + _K_BODY,
        )
        if len(_PLAIN_HEADS) >= _CACHE_MAX:
            _PLAIN_HEADS.clear()
        _PLAIN_HEADS[route] = template
    n = len(body)
    parts = [
        template[1] if pk else template[0],
        _uint(journal_id),
        template[2],
        _BODY_HEADS[n] if n < 0x100 else _head(0x40, n),
        body,
        _PLAIN_TAIL,
        _PACK_AT(at),
    ]
    if pk:  # the publish key, the map's last pair (an "instance:id" of ~24 bytes)
        raw = pk.encode()
        n = len(raw)
        parts += (_K_PK, _TEXT_HEADS[n] if n < 0x100 else _head(0x60, n), raw)
    return b"".join(parts)


#: ``_head(0x60, n)``: a text string's header, for the publish key above (cbor's
#: ``text`` called per message cost a third of a microsecond more than this)
_TEXT_HEADS = tuple(_head(0x60, n) for n in range(0x100))


def _encode_settle(prefix: bytes, journal_id: Any, queue: Any) -> bytes | None:
    if (
        type(journal_id) is not int
        or not 0 <= journal_id <= MAX_JOURNAL_ID
        or type(queue) is not str
    ):
        return None
    return b"\xa3" + prefix + _K_ID + _head(0x00, journal_id) + _K_QUEUE + _text(queue)


_MARKS = _T + _text(MessageMarks.TYPE)
_K_DELIVERED_IDS = _text("delivered")
_K_ACKED_IDS = _text("acked")


def _encode_marks(r: MessageMarks) -> bytes | None:
    """``cbor2.dumps(record_to_map(r))`` of a ``message.marks`` whose id lists are
    tuples of journal ids of one width in CBOR (all in [256, 65536) or all in
    [65536, 2**32): what a running node's ``Recorder.flush_marks`` makes), else
    None. The ids are checked and written by C code a record (``array``'s
    conversion refuses what is not an int or is out of the width's range, a zero
    high byte finds one below it, a bool among them is 0 or 1, below both), not
    one by one in Python.

    Why it exists: an HA pair's active node journals the marks of its deliveries
    before each push (~60 ids a record, one id a persistent message) besides the
    acks; the general path's per-id check (``records._ids``) and ``cbor2``'s
    encoding of each id were ~1,100 instructions an id.
    ``tests/store/test_records.py::test_the_marks_encoder_gives_the_general_bytes``
    checks with hypothesis that it gives the general path's bytes whenever it gives
    any, and gives them for every such record."""
    queue, delivered, acked = r.queue, r.delivered, r.acked
    if type(queue) is not str or type(delivered) is not tuple or type(acked) is not tuple:
        return None
    parts = [_MAP_HEADS[2 + bool(delivered) + bool(acked)], _MARKS, _K_QUEUE, _text(queue)]
    for key, ids in ((_K_DELIVERED_IDS, delivered), (_K_ACKED_IDS, acked)):
        if ids:
            encoded = _uniform_ids(ids)
            if encoded is None:
                return None
            parts += (key, encoded)
    return b"".join(parts)


def _uniform_ids(ids: tuple[Any, ...]) -> bytes | None:
    """The CBOR array of ``ids`` when they are ints all in [256, 65536) or all in
    [65536, 2**32) (one head byte and 2 or 4 bytes each), else None."""
    n = len(ids)
    first = ids[0]
    try:
        if type(first) is int and 256 <= first < 65536:
            words = array("H", ids)  # TypeError / OverflowError: not this width
            size, lead = 2, b"\x19"
        else:
            words = array("I", ids)
            size, lead = 4, b"\x1a"
    except (TypeError, OverflowError):
        return None
    if words.itemsize != size:
        return None  # (a platform whose C types differ: the general path)
    if _LITTLE:
        words.byteswap()
    raw = words.tobytes()
    if size == 2:
        if b"\0" in raw[0::2]:  # a high byte 0: below 256 (a bool among them too)
            return None
    elif b"\0" in (int.from_bytes(raw[0::4], "big") | int.from_bytes(raw[1::4], "big")).to_bytes(
        n, "big"
    ):  # both high bytes 0: below 65536
        return None
    step = size + 1
    out = bytearray(n * step)
    out[0::step] = lead * n
    for i in range(size):
        out[i + 1 :: step] = raw[i::size]
    return _head(0x80, n) + bytes(out)


_LITTLE = array("H", [1]).tobytes() == b"\x01\x00"


def encode_record(record: Record) -> bytes:
    """The CBOR encoding of ``record``; raises RecordError for an ill-typed record, so
    nothing is written that :func:`decode_record` would refuse."""
    t = type(record)
    fast: bytes | None = None
    if t is MessageEnqueue:
        fast = encode_plain_enqueue(record)  # type: ignore[arg-type]
        if fast is None:
            fast = _encode_enqueue(record)  # type: ignore[arg-type]
    elif t is MessageAck or t is MessageDelivered:
        prefix = _ACK if t is MessageAck else _DELIVERED
        fast = _encode_settle(prefix, record.id, record.queue)  # type: ignore[union-attr]
    elif t is MessageMarks:
        fast = _encode_marks(record)  # type: ignore[arg-type]
    if fast is not None:
        return fast
    m = record_to_map(record)
    try:
        return cbor2.dumps(m)
    except (cbor2.CBOREncodeError, TypeError, ValueError) as exc:  # pragma: no cover
        raise RecordError(f"{record.TYPE}: cannot encode: {exc}") from None


# The decoders build these frozen records through their slot descriptors rather than
# ``__init__`` (a third of the cost on recovery); every field is set, after the
# checks. ``test_the_fast_and_generic_paths_read_each_other`` compares the results.
_new = object.__new__
_ENQUEUE_SETTERS = tuple(getattr(MessageEnqueue, f.name).__set__ for f in fields(MessageEnqueue))
_SETTLE_SETTERS = {
    cls: tuple(getattr(cls, f.name).__set__ for f in fields(cls))
    for cls in (MessageAck, MessageDelivered)
}
_ENQUEUE_KEYS = frozenset(
    ("t", "id", "vhost", "queues", "exchange", "key", "body", "headers", "props", "at", "pk")
)
_ABSENT: Any = object()


def _decode_enqueue(m: dict[Any, Any]) -> MessageEnqueue | None:
    get = m.get
    journal_id, queues, exchange, body = get("id"), get("queues"), get("exchange"), get("body")
    vhost, key, at = get("vhost", "/"), get("key", ""), get("at", 0.0)
    headers, props, pk = get("headers", _ABSENT), get("props", _ABSENT), get("pk", "")
    if (
        type(pk) is not str
        or type(journal_id) is not int
        or not 0 <= journal_id <= MAX_JOURNAL_ID
        or type(queues) is not list
        or not queues
        or type(exchange) is not str
        or type(body) is not bytes
        or type(vhost) is not str
        or type(key) is not str
        or type(at) not in (float, int)
        or not m.keys() <= _ENQUEUE_KEYS
    ):
        return None
    for q in queues:
        if type(q) is not str:
            return None
    if len(queues) > 1 and len(set(queues)) != len(queues):
        return None
    if headers is _ABSENT:
        headers = {}
    elif check_headers(headers) is not None:
        return None
    if props is _ABSENT:
        props = {}
    elif check_props(props) is not None:
        return None
    record: MessageEnqueue = _new(MessageEnqueue)
    (
        s_id,
        s_vhost,
        s_queues,
        s_exchange,
        s_key,
        s_body,
        s_headers,
        s_props,
        s_at,
        s_deaths,
        s_pk,
        s_mesh,
    ) = _ENQUEUE_SETTERS
    s_id(record, journal_id)
    s_vhost(record, vhost)
    s_queues(record, tuple(queues))
    s_exchange(record, exchange)
    s_key(record, key)
    s_body(record, body)
    s_headers(record, headers)
    s_props(record, props)
    s_at(record, float(at))
    s_deaths(record, ())
    s_pk(record, pk)
    s_mesh(record, {})
    return record


def _settle_record(cls: type[MessageAck | MessageDelivered], journal_id: int, queue: str) -> Record:
    record = _new(cls)
    set_id, set_queue = _SETTLE_SETTERS[cls]
    set_id(record, journal_id)
    set_queue(record, queue)
    return record


def decode_record(payload: bytes | memoryview) -> Record:
    """Parse one CBOR record; raises RecordError for bad CBOR or an ill-typed record."""
    try:
        m = cbor2.loads(payload)
    except Exception as exc:  # cbor2 raises a variety of errors on bad input
        raise RecordError(f"not a CBOR record: {exc}") from None
    if type(m) is dict:
        kind = m.get("t")
        fast: Record | None = None
        if kind == MessageEnqueue.TYPE:
            fast = _decode_enqueue(m)
        elif (kind == MessageAck.TYPE or kind == MessageDelivered.TYPE) and len(m) == 3:
            journal_id, queue = m.get("id"), m.get("queue")
            if type(journal_id) is int and 0 <= journal_id <= MAX_JOURNAL_ID and type(queue) is str:
                cls = MessageAck if kind == MessageAck.TYPE else MessageDelivered
                fast = _settle_record(cls, journal_id, queue)
        if fast is not None:
            return fast
    return record_from_map(m)


# --- recovery's scan of message.enqueue ------------------------------------------------
#
# Why a third reader: recovery decodes every record of the journal, and a backlog is
# mostly ``message.enqueue`` records whose body and properties recovery does not keep
# (the body stays in the journal and is read back, and decoded in full, when a
# consumer needs it). Decoding each one whole (CBOR, a record object, the property
# checks) was about 10 us of a restart's 12 per message (issue 16). The scan reads only
# what the state's index keeps (id, vhost, queues, body size, time, publish key),
# skipping the body, and checks the headers and properties once per distinct
# encoding (a backlog's messages mostly share theirs). It accepts only what
# ``decode_record`` accepts with the same fields; anything it is unsure of (another
# key order, a tag, a cache miss it cannot settle, a kept property) returns None and
# the caller decodes the record in full, which raises the precise error.
# ``tests/store/test_scan.py`` checks with hypothesis, on good, damaged and cut
# records, that whatever the scan accepts ``decode_record`` decodes to the same fields.

_ENQUEUE_HEAD = _ENQUEUE + _K_ID
_UNPACK_FLOAT = _FLOAT.unpack_from
_SCAN_CACHE_MAX = 1024


def _length(data: bytes, pos: int, end: int, major: int) -> tuple[int, int] | None:
    """The argument of the item head of ``major`` at ``pos`` (definite, at most 8
    bytes) and the position after the head; None for anything else."""
    if pos >= end:
        return None
    b = data[pos]
    if b & 0xE0 != major:
        return None
    n = b & 0x1F
    if n < 24:
        return n, pos + 1
    if n > 27:
        return None
    size = 1 << (n - 24)
    if pos + 1 + size > end:
        return None
    return int.from_bytes(data[pos + 1 : pos + 1 + size], "big"), pos + 1 + size


def _text_at(data: bytes, pos: int, end: int) -> tuple[str, int] | None:
    got = _length(data, pos, end, 0x60)
    if got is None:
        return None
    n, pos = got
    if pos + n > end:
        return None
    try:
        return data[pos : pos + n].decode(), pos + n
    except UnicodeDecodeError:
        return None


def _item_end(data: bytes, pos: int, end: int, depth: int = 0) -> int:
    """Where the plain CBOR item at ``pos`` ends (definite lengths, no tags, the
    simple values false/true/null and floats only), or -1."""
    if pos >= end or depth > 8:
        return -1
    b = data[pos]
    major = b & 0xE0
    if major == 0xE0:
        if 0xF4 <= b <= 0xF6:
            return pos + 1
        size = {0xF9: 2, 0xFA: 4, 0xFB: 8}.get(b)
        return pos + 1 + size if size is not None and pos + 1 + size <= end else -1
    if major == 0xC0:  # a tag
        return -1
    got = _length(data, pos, end, major)
    if got is None:
        return -1
    n, pos = got
    if major <= 0x20:  # an integer
        return pos
    if major <= 0x60:  # bytes, text
        return pos + n if pos + n <= end else -1
    for _ in range(n * 2 if major == 0xA0 else n):
        pos = _item_end(data, pos, end, depth + 1)
        if pos < 0:
            return -1
    return pos


class EnqueueScan:
    """Reads the fields of ``message.enqueue`` frames that a restart's index needs
    (see the comment above); one per recovery, as it caches what it has checked."""

    __slots__ = ("_headers", "_maps", "_props", "_route", "_routes", "_tail")

    def __init__(self) -> None:
        # the last route seen: its encoding (queues to key), vhost, queues, pairs
        self._route: tuple[bytes, str, tuple[str, ...], int] | None = None
        self._routes: dict[bytes, tuple[str, tuple[str, ...], int]] = {}
        # checked header and property maps (encoding -> usable), and the last of each
        self._maps: dict[tuple[bytes, bytes], bool] = {}
        self._headers: bytes | None = None
        self._props: bytes | None = None
        # the properties (checked) and the time's key and float head after them, as
        # the last record that had both had them: one comparison for the usual tail
        self._tail: bytes | None = None

    def scan(self, data: bytes, pos: int, end: int) -> ScannedEnqueue | None:
        """``(id, vhost, queues, body size, enqueued_at, publish key)`` of the
        ``message.enqueue`` record in ``data[pos:end]``, or None (not one, or not
        one the scan is sure of: decode it in full)."""
        pairs = data[pos] - 0xA3  # t, id and body
        if not 0 <= pairs <= 20 or not data.startswith(_ENQUEUE_HEAD, pos + 1):
            return None
        pos += 1 + len(_ENQUEUE_HEAD)
        if pos >= end:
            return None
        b = data[pos]  # the id: _length inlined (this runs a million times)
        if b < 0x18:
            journal_id = b
            pos += 1
        elif b <= 0x1B:
            n = 1 << (b - 0x18)
            pos += 1 + n
            journal_id = int.from_bytes(data[pos - n : pos], "big")
            if journal_id > MAX_JOURNAL_ID:
                return None
        else:
            return None
        last = self._route
        if last is None or not data.startswith(last[0], pos):
            last = self._read_route(data, pos, end)
            if last is None:
                return None
            self._route = last
        route, vhost, queues, n = last  # route: queues to key, and the body's key
        pos += len(route)
        pairs -= n
        if pairs < 0 or pos >= end:
            return None
        b = data[pos]  # the body's length, likewise
        if 0x40 <= b < 0x58:
            size = b - 0x40
            pos += 1
        elif b == 0x58:  # 24 to 255 bytes: the usual small message
            if pos + 2 > end:
                return None
            size = data[pos + 1]
            pos += 2
        elif 0x59 <= b <= 0x5B:
            n = 1 << (b - 0x58)
            pos += 1 + n
            size = int.from_bytes(data[pos - n : pos], "big")
        else:
            return None
        pos += size
        if pos > end:
            return None
        at = 0.0
        pk = ""
        tail = self._tail
        if tail is not None and data.startswith(tail, pos):
            # the usual properties and the time's key and head, as the last record
            # had them (a whole map item: the one at pos is that one)
            pos += len(tail) + 8
            if pos > end:
                return None
            (at,) = _UNPACK_FLOAT(data, pos - 8)
            pairs -= 2
        else:
            props_at = -1
            if pairs and data.startswith(_K_HEADERS, pos):
                pos = self._checked(data, pos + len(_K_HEADERS), end, _K_HEADERS)
                pairs -= 1
            if pairs and pos > 0 and data.startswith(_K_PROPS, pos):
                pos += len(_K_PROPS)
                props_at = pos
                pos = self._checked(data, pos, end, _K_PROPS)
                pairs -= 1
            if pairs and pos > 0 and data.startswith(_K_AT, pos):
                pos += len(_K_AT)
                if pos + 9 > end or data[pos] != 0xFB:
                    return None
                (at,) = _UNPACK_FLOAT(data, pos + 1)
                if props_at > 0 and pos == props_at + len(self._props or b"") + len(_K_AT):
                    self._tail = _K_PROPS + (self._props or b"") + _K_AT + b"\xfb"
                pos += 9
                pairs -= 1
        if pairs and pos > 0 and data.startswith(_K_PK, pos):
            got_pk = _text_at(data, pos + len(_K_PK), end)
            if got_pk is None:
                return None
            pk, pos = got_pk
            pairs -= 1
        if pairs or pos != end:
            return None
        return journal_id, vhost, queues, size, at, pk

    def _read_route(
        self, data: bytes, start: int, end: int
    ) -> tuple[bytes, str, tuple[str, ...], int] | None:
        """The queues, exchange and (optional) vhost and key at ``start``, as the
        encoder writes them (``_route``), and the body's key after them: their
        encoding, the vhost, the queues and how many pairs they are."""
        if not data.startswith(_K_QUEUES, start):
            return None
        got = _length(data, start + len(_K_QUEUES), end, 0x80)
        if got is None:
            return None
        count, pos = got
        names = []
        for _ in range(count):
            text = _text_at(data, pos, end)
            if text is None:
                return None
            names.append(text[0])
            pos = text[1]
        if not names or len(set(names)) != len(names) or not data.startswith(_K_EXCHANGE, pos):
            return None
        text = _text_at(data, pos + len(_K_EXCHANGE), end)
        if text is None:
            return None
        pos = text[1]
        vhost, n = "/", 2
        if data.startswith(_K_VHOST, pos):
            text = _text_at(data, pos + len(_K_VHOST), end)
            if text is None:
                return None
            vhost, pos, n = text[0], text[1], n + 1
        if data.startswith(_K_KEY, pos):
            text = _text_at(data, pos + len(_K_KEY), end)
            if text is None:
                return None
            pos, n = text[1], n + 1
        if not data.startswith(_K_BODY, pos):
            return None
        encoded = data[start : pos + len(_K_BODY)]
        hit = self._routes.get(encoded)
        if hit is None:
            if len(self._routes) >= _SCAN_CACHE_MAX:
                self._routes.clear()
            hit = self._routes[encoded] = (vhost, tuple(names), n)
        return (encoded, *hit)

    def _checked(self, data: bytes, pos: int, end: int, key: bytes) -> int:
        """The end of the headers (``key`` is ``_K_HEADERS``) or properties map at
        ``pos`` when it is one ``decode_record`` accepts and no property keeps the
        record in memory; else -1."""
        last = self._headers if key is _K_HEADERS else self._props
        if last is not None and data.startswith(last, pos):  # a whole item: it is that one
            return pos + len(last)
        stop = _item_end(data, pos, end)
        if stop < 0:
            return -1
        encoded = data[pos:stop]
        usable = self._maps.get((key, encoded))
        if usable is None:
            try:
                value = cbor2.loads(encoded)
            except Exception:  # bad CBOR: the full decode says what
                return -1
            if key is _K_HEADERS:
                usable = check_headers(value) is None
            else:
                usable = check_props(value) is None and not any(k in value for k in KEPT_PROPS)
            if len(self._maps) >= _SCAN_CACHE_MAX:
                self._maps.clear()
            self._maps[(key, encoded)] = usable
        if not usable:
            return -1
        if key is _K_HEADERS:
            self._headers = encoded
        else:
            self._props = encoded
        return stop
