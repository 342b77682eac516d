"""Low-level CBOR pieces for the hand-written encoders, sans-IO.

Three encoders write CBOR by hand on their per-message paths: the wire codec
(:mod:`amqlite.protocol.codec`: publish, deliver, get-ok, ack), the journal's
(:mod:`amqlite.store.codec`: enqueue, ack and delivered records) and peering's
(:mod:`amqlite.peering.cbor`: forwards runs). They share these helpers, so that
an item is encoded one way in the whole tree. Every helper gives exactly the bytes
``cbor2.dumps`` gives for the same value (the encoders' hypothesis tests compare
them with cbor2); that is the guarantee, the hand-writing is only speed.
"""

from __future__ import annotations

import struct
from typing import Final

import cbor2

#: Major types, shifted into the initial byte (RFC 8949, section 3.1).
UINT: Final = 0x00
NEGINT: Final = 0x20
BYTES: Final = 0x40
TEXT: Final = 0x60
ARRAY: Final = 0x80
MAP: Final = 0xA0


def head(major: int, n: int) -> bytes:
    """A CBOR item header: ``major`` (one of the constants above) and its length
    or value ``n`` (0 <= n < 2**64)."""
    if n < 24:
        return bytes((major | n,))
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return bytes((major | 25,)) + n.to_bytes(2, "big")
    if n < 0x100000000:
        return bytes((major | 26,)) + n.to_bytes(4, "big")
    return bytes((major | 27,)) + n.to_bytes(8, "big")


#: ``head(MAP, n)`` for the small maps the encoders write.
MAP_HEADS: Final = tuple(head(MAP, n) for n in range(24))

_UINT8 = tuple(head(UINT, n) for n in range(0x100))
_BYTES8 = tuple(head(BYTES, n) for n in range(0x100))
_PACK16 = struct.Struct(">BH").pack
_PACK32 = struct.Struct(">BI").pack
_PACK64 = struct.Struct(">BQ").pack


def uint(n: int) -> bytes:
    """An encoded integer: by hand for 0 <= n < 2**64 (ids, tags, sequence numbers,
    epochs, counts), by cbor2 otherwise (negative, or a bignum the other end may send)."""
    if 0 <= n < 0x100:
        return _UINT8[n]
    if 0x100 <= n < 0x10000:
        return _PACK16(0x19, n)
    if 0x10000 <= n < 0x100000000:
        return _PACK32(0x1A, n)
    if 0x100000000 <= n < 0x10000000000000000:
        return _PACK64(0x1B, n)
    return cbor2.dumps(n)


def bytes_head(n: int) -> bytes:
    """The header of a byte string of ``n`` bytes (the body follows it)."""
    return _BYTES8[n] if n < 0x100 else head(BYTES, n)


def text(s: str) -> bytes:
    """An encoded text string."""
    raw = s.encode()
    return head(TEXT, len(raw)) + raw


_TEXT_CACHE: dict[str, bytes] = {}
_TEXT_CACHE_MAX = 4096


def cached_text(s: str) -> bytes:
    """:func:`text`, from a bounded cache: for strings that repeat per message
    (node ids, exchanges, routing keys)."""
    enc = _TEXT_CACHE.get(s)
    if enc is None:
        enc = text(s)
        if len(_TEXT_CACHE) >= _TEXT_CACHE_MAX:
            _TEXT_CACHE.clear()
        _TEXT_CACHE[s] = enc
    return enc
