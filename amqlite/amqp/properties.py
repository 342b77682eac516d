"""The content header: class id, weight, body size and the 14 basic properties.

Property flags (a 16-bit word) say which properties follow, first property in the
highest bit: content-type is bit 15, cluster-id bit 2; bit 0 would announce a
further flag word, which no basic property set needs (decoding one is a 502).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from .errors import syntax_error
from .values import (
    FieldTable,
    decode_shortstr,
    decode_table,
    decode_timestamp,
    encode_shortstr,
    encode_table,
    encode_timestamp,
)

BASIC_CLASS_ID = 60
_HEADER = struct.Struct(">HHQH")  # class id, weight, body size, property flags


@dataclass(frozen=True, slots=True)
class BasicProperties:
    """The basic class's properties; ``None`` = absent (its flag bit is clear)."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: FieldTable | None = None
    delivery_mode: int | None = None  # 1 transient, 2 persistent
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: datetime | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


#: (name, kind, flag bit) in wire order.
_LAYOUT: tuple[tuple[str, str, int], ...] = tuple(
    (f.name, kind, 1 << (15 - i))
    for i, (f, kind) in enumerate(
        zip(
            fields(BasicProperties),
            (
                "shortstr",
                "shortstr",
                "table",
                "octet",
                "octet",
                "shortstr",
                "shortstr",
                "shortstr",
                "shortstr",
                "timestamp",
                "shortstr",
                "shortstr",
                "shortstr",
                "shortstr",
            ),
            strict=True,
        )
    )
)
NO_PROPERTIES = BasicProperties()
#: The properties of most messages (pika's ``delivery_mode`` alone): shared values
#: whose encoding is made once (:func:`encode_header_payload`); ``from_native``
#: hands them out.
PERSISTENT_PROPERTIES = BasicProperties(delivery_mode=2)
TRANSIENT_PROPERTIES = BasicProperties(delivery_mode=1)


def encode_properties(props: BasicProperties) -> tuple[int, bytes]:
    """(property flags, property list) for ``props``."""
    flags = 0
    out: list[bytes] = []
    for name, kind, bit in _LAYOUT:
        value = getattr(props, name)
        if value is None:
            continue
        flags |= bit
        if kind == "shortstr":
            out.append(encode_shortstr(value))
        elif kind == "octet":
            out.append(bytes((value,)))
        elif kind == "table":
            out.append(encode_table(value))
        else:
            out.append(encode_timestamp(value))
    return flags, b"".join(out)


def encode_header_payload(
    body_size: int, props: BasicProperties, class_id: int = BASIC_CLASS_ID
) -> bytes:
    """A content header frame's payload."""
    if props is NO_PROPERTIES:
        return _HEADER.pack(class_id, 0, body_size, 0)
    known = _ENCODED.get(id(props))
    if known is not None and known[0] is props:
        return _HEADER.pack(class_id, 0, body_size, known[1]) + known[2]
    flags, plist = encode_properties(props)
    return _HEADER.pack(class_id, 0, body_size, flags) + plist


#: the encodings of the shared values, made once (checked by identity)
_ENCODED: dict[int, tuple[BasicProperties, int, bytes]] = {
    id(p): (p, *encode_properties(p)) for p in (PERSISTENT_PROPERTIES, TRANSIENT_PROPERTIES)
}


#: Property lists decoded before, by their bytes (the flag word and what follows).
#: Why it exists: a publisher sends the same properties with every message (pika's
#: ``BasicProperties(delivery_mode=2)``, a content type and a few headers), so the
#: same bytes come again and again; decoding them and building the (frozen, so
#: shareable) :class:`BasicProperties` was about 2 us of every publish. Only lists
#: up to ``_CACHED_BYTES`` long are kept, at most ``_CACHED`` of them (the cache
#: starts again when full): properties unique to each message (a message id, a
#: timestamp) simply go the general way every time. ``tests/amqp/test_fast_content.py``
#: checks with hypothesis that a cached decode equals the general one.
_DECODED: dict[bytes, BasicProperties] = {}
_CACHED = 256
_CACHED_BYTES = 96


def decode_header_payload(payload: bytes) -> tuple[int, int, BasicProperties]:
    """(class id, body size, properties) from a content header frame's payload."""
    size = len(payload)
    if _HEADER.size < size <= _HEADER.size + _CACHED_BYTES:
        key = payload[_HEADER.size - 2 :]  # the flag word and the property list
        known = _DECODED.get(key)
        if known is not None:
            class_id, _weight, body_size, _flags = _HEADER.unpack_from(payload, 0)
            return class_id, body_size, known
        class_id, body_size, props = _decode_header_payload(payload)
        if len(_DECODED) >= _CACHED:
            _DECODED.clear()
        _DECODED[key] = props
        return class_id, body_size, props
    return _decode_header_payload(payload)


def _decode_header_payload(payload: bytes) -> tuple[int, int, BasicProperties]:
    """:func:`decode_header_payload`, the general way (every property decoded)."""
    if len(payload) < _HEADER.size:
        raise syntax_error("content header shorter than its fixed part")
    class_id, _weight, body_size, flags = _HEADER.unpack_from(payload, 0)
    if flags & 1:
        raise syntax_error("content header announces more property flags than basic has")
    if flags & 0b10:
        raise syntax_error("content header sets an unknown property flag")
    offset = _HEADER.size
    if not flags:
        if offset != len(payload):
            raise syntax_error("content header has bytes after its properties")
        return class_id, body_size, NO_PROPERTIES
    values: dict[str, Any] = {}
    for name, kind, bit in _LAYOUT:
        if not flags & bit:
            continue
        value: Any
        if kind == "shortstr":
            value, offset = decode_shortstr(payload, offset)
        elif kind == "octet":
            if offset >= len(payload):
                raise syntax_error("content header property runs past the frame")
            value, offset = payload[offset], offset + 1
        elif kind == "table":
            value, offset = decode_table(payload, offset)
        else:
            value, offset = decode_timestamp(payload, offset)
        values[name] = value
    if offset != len(payload):
        raise syntax_error("content header has bytes after its properties")
    return class_id, body_size, BasicProperties(**values)
