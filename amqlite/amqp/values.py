"""AMQP 0-9-1 field values: short and long strings, timestamps and field tables.

Field tables speak RabbitMQ's dialect of the 0-9-1 spec (its errata): ``t`` bool,
``b``/``B`` signed/unsigned 8 bits, ``s``/``u`` signed/unsigned 16, ``I``/``i``
signed/unsigned 32, ``l`` signed 64, ``f``/``d`` float/double, ``D`` decimal,
``S`` long string, ``x`` byte array, ``T`` timestamp, ``F`` table, ``A`` array,
``V`` void. The spec's own ``U`` (signed 16) and ``L`` (unsigned 64) decode too.

Decoding maps ``S`` to ``str`` when it is UTF-8 and to ``bytes`` otherwise, ``x``
to ``bytes``, ``T`` to an aware UTC ``datetime`` and ``D`` to ``Decimal``.
Encoding picks the tag from the Python type: ``bool`` -> ``t``, ``int`` -> ``I``
(or ``l`` past 32 bits), ``float`` -> ``d``, ``str`` -> ``S``, ``bytes`` -> ``x``,
``Decimal`` -> ``D``, ``datetime`` -> ``T``, ``dict`` -> ``F``, ``list``/``tuple``
-> ``A``, ``None`` -> ``V``. So a decoded table re-encodes to equal values, not
always to the same tags.

Decoders take ``(data, offset)`` and return ``(value, next_offset)``; anything
that does not decode raises :class:`~amqlite.amqp.errors.AmqpError` 502.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from .errors import AmqpLocalError, syntax_error

FieldTable = dict[str, Any]

_OCTET = struct.Struct(">B")
_SHORT = struct.Struct(">H")
_LONG = struct.Struct(">I")
_LONGLONG = struct.Struct(">Q")
_DECIMAL = struct.Struct(">Bi")

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_FLOAT = struct.Struct(">f")
_DOUBLE = struct.Struct(">d")

_EMPTY_TABLE = b"\x00\x00\x00\x00"
#: Deeper tables than this are refused (a crafted frame must not blow the stack).
MAX_DEPTH = 64


def _short_of(data: bytes, offset: int, size: int) -> None:
    if offset + size > len(data):
        raise syntax_error(f"field runs past the end of its frame (needs {size} bytes)")


# --- strings and timestamps ------------------------------------------------------------


def encode_shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise AmqpLocalError(f"short string longer than 255 bytes: {value[:40]!r}...")
    return bytes((len(raw),)) + raw


def decode_shortstr(data: bytes, offset: int) -> tuple[str, int]:
    # the hottest decoder (names, keys, properties): bounds checked inline
    if offset >= len(data):
        raise syntax_error("short string runs past the end of its frame")
    end = offset + 1 + data[offset]
    if end > len(data):
        raise syntax_error("short string runs past the end of its frame")
    try:
        return data[offset + 1 : end].decode("utf-8"), end
    except UnicodeDecodeError:
        raise syntax_error("short string is not UTF-8") from None


def encode_longstr(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return _LONG.pack(len(raw)) + raw


def decode_longbytes(data: bytes, offset: int) -> tuple[bytes, int]:
    start = offset + 4
    if start > len(data):
        raise syntax_error("long string runs past the end of its frame")
    (size,) = _LONG.unpack_from(data, offset)
    end = start + size
    if end > len(data):
        raise syntax_error("long string runs past the end of its frame")
    return data[start:end], end


def decode_longstr(data: bytes, offset: int) -> tuple[str, int]:
    raw, end = decode_longbytes(data, offset)
    try:
        return raw.decode("utf-8"), end
    except UnicodeDecodeError:
        raise syntax_error("long string is not UTF-8") from None


def encode_timestamp(value: datetime) -> bytes:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    seconds = int(value.timestamp())
    if seconds < 0:
        raise AmqpLocalError(f"timestamp before 1970: {value}")
    return _LONGLONG.pack(seconds)


def decode_timestamp(data: bytes, offset: int) -> tuple[datetime, int]:
    _short_of(data, offset, 8)
    (seconds,) = _LONGLONG.unpack_from(data, offset)
    try:
        return datetime.fromtimestamp(seconds, tz=UTC), offset + 8
    except (OverflowError, OSError, ValueError):
        raise syntax_error(f"timestamp out of range: {seconds}") from None


# --- field tables ----------------------------------------------------------------------


def encode_table(table: Mapping[str, Any] | None) -> bytes:
    """A field table with its 4-byte length."""
    if not table:
        return _EMPTY_TABLE
    out = bytearray(_EMPTY_TABLE)
    _put_table_items(out, table, 0)
    _LONG.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _put_table_items(out: bytearray, table: Mapping[str, Any], depth: int) -> None:
    for key, value in table.items():
        if not isinstance(key, str):
            raise AmqpLocalError(f"field table keys are strings, not {type(key).__name__}")
        out += encode_shortstr(key)
        _put_value(out, value, depth)


def _put_value(out: bytearray, value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise AmqpLocalError("field table nested too deep")
    if isinstance(value, bool):
        out += b"t\x01" if value else b"t\x00"
    elif isinstance(value, int):
        if -(2**31) <= value < 2**31:
            out += b"I" + _INT32.pack(value)
        elif -(2**63) <= value < 2**63:
            out += b"l" + _INT64.pack(value)
        elif 0 <= value < 2**64:  # only the spec's unsigned `L` decodes to these
            out += b"L" + _LONGLONG.pack(value)
        else:
            raise AmqpLocalError(f"integer too large for a field table: {value}")
    elif isinstance(value, float):
        out += b"d" + _DOUBLE.pack(value)
    elif isinstance(value, str):
        out += b"S" + encode_longstr(value)
    elif isinstance(value, bytes | bytearray | memoryview):
        out += b"x" + encode_longstr(bytes(value))
    elif isinstance(value, Decimal):
        out += b"D" + _encode_decimal(value)
    elif isinstance(value, datetime):
        out += b"T" + encode_timestamp(value)
    elif isinstance(value, Mapping):
        start = len(out) + 1
        out += b"F" + _EMPTY_TABLE
        _put_table_items(out, value, depth + 1)
        _LONG.pack_into(out, start, len(out) - start - 4)
    elif isinstance(value, list | tuple):
        start = len(out) + 1
        out += b"A" + _EMPTY_TABLE
        for item in value:
            _put_value(out, item, depth + 1)
        _LONG.pack_into(out, start, len(out) - start - 4)
    elif value is None:
        out += b"V"
    else:
        raise AmqpLocalError(f"no AMQP field type for {type(value).__name__}")


def _encode_decimal(value: Decimal) -> bytes:
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int):
        raise AmqpLocalError(f"decimal is not finite: {value}")
    scale = max(0, -exponent)
    mantissa = int(value.scaleb(scale))
    if scale > 255 or not -(2**31) <= mantissa < 2**31:
        raise AmqpLocalError(f"decimal does not fit AMQP's scale and 32-bit value: {value}")
    return _DECIMAL.pack(scale, mantissa)


def decode_table(data: bytes, offset: int, depth: int = 0) -> tuple[FieldTable, int]:
    _short_of(data, offset, 4)
    (size,) = _LONG.unpack_from(data, offset)
    start = offset + 4
    end = start + size
    _short_of(data, start, size)
    if depth > MAX_DEPTH:
        raise syntax_error("field table nested too deep")
    table: FieldTable = {}
    while start < end:
        key, start = decode_shortstr(data, start)
        value, start = _decode_value(data, start, end, depth)
        table[key] = value
    if start != end:
        raise syntax_error("field table entry runs past the table's length")
    return table, end


def _decode_array(data: bytes, offset: int, depth: int) -> tuple[list[Any], int]:
    _short_of(data, offset, 4)
    (size,) = _LONG.unpack_from(data, offset)
    start = offset + 4
    end = start + size
    _short_of(data, start, size)
    if depth > MAX_DEPTH:
        raise syntax_error("field array nested too deep")
    items: list[Any] = []
    while start < end:
        value, start = _decode_value(data, start, end, depth)
        items.append(value)
    if start != end:
        raise syntax_error("field array entry runs past the array's length")
    return items, end


def _fixed(st: struct.Struct) -> Callable[[bytes, int], tuple[Any, int]]:
    size = st.size

    def decode(data: bytes, offset: int) -> tuple[Any, int]:
        _short_of(data, offset, size)
        return st.unpack_from(data, offset)[0], offset + size

    return decode


def _decode_bool(data: bytes, offset: int) -> tuple[bool, int]:
    _short_of(data, offset, 1)
    return data[offset] != 0, offset + 1


def _decode_decimal(data: bytes, offset: int) -> tuple[Decimal, int]:
    _short_of(data, offset, 5)
    scale, mantissa = _DECIMAL.unpack_from(data, offset)
    try:
        return Decimal(mantissa).scaleb(-scale), offset + 5
    except InvalidOperation:  # pragma: no cover - scale is at most 255
        raise syntax_error("decimal out of range") from None


def _decode_text_or_bytes(data: bytes, offset: int) -> tuple[str | bytes, int]:
    raw, end = decode_longbytes(data, offset)
    try:
        return raw.decode("utf-8"), end
    except UnicodeDecodeError:
        return raw, end


def _decode_void(data: bytes, offset: int) -> tuple[None, int]:
    return None, offset


_DECODERS: dict[int, Callable[[bytes, int], tuple[Any, int]]] = {
    ord("t"): _decode_bool,
    ord("b"): _fixed(_INT8),
    ord("B"): _fixed(_OCTET),
    ord("s"): _fixed(_INT16),
    ord("U"): _fixed(_INT16),
    ord("u"): _fixed(_SHORT),
    ord("I"): _fixed(_INT32),
    ord("i"): _fixed(_LONG),
    ord("l"): _fixed(_INT64),
    ord("L"): _fixed(_LONGLONG),
    ord("f"): _fixed(_FLOAT),
    ord("d"): _fixed(_DOUBLE),
    ord("D"): _decode_decimal,
    ord("S"): _decode_text_or_bytes,
    ord("x"): decode_longbytes,
    ord("T"): decode_timestamp,
    ord("V"): _decode_void,
}


def _decode_value(data: bytes, offset: int, end: int, depth: int) -> tuple[Any, int]:
    if offset >= end:
        raise syntax_error("field value missing its type tag")
    tag = data[offset]
    value: Any
    if tag == 0x46:  # F
        value, after = decode_table(data, offset + 1, depth + 1)
    elif tag == 0x41:  # A
        value, after = _decode_array(data, offset + 1, depth + 1)
    else:
        decoder = _DECODERS.get(tag)
        if decoder is None:
            raise syntax_error(f"unknown field value type {bytes((tag,))!r}")
        value, after = decoder(data, offset + 1)
    if after > end:
        raise syntax_error("field value runs past its table")
    return value, after
