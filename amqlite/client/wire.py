"""Hand-built frames for the client's per-message hot path: ``publish`` and ``ack``.

They produce exactly the frames :func:`amqlite.protocol.codec.encode` would (a
4-byte length, then one CBOR map; key order differs, which CBOR maps ignore) at a
fraction of the cost, and append them straight into the outgoing buffer. Every
other frame goes through :meth:`amqlite.protocol.Connection.send`.
"""

from __future__ import annotations

import struct
from typing import Any

import cbor2

_LEN = struct.Struct(">I")
_K_M_PUBLISH = cbor2.dumps("m") + cbor2.dumps("publish")
_K_M_ACK = cbor2.dumps("m") + cbor2.dumps("ack")
_K_ID = cbor2.dumps("id")
_K_EXCHANGE = cbor2.dumps("exchange")
_K_KEY = cbor2.dumps("key")
_K_BODY = cbor2.dumps("body")
_K_HEADERS = cbor2.dumps("headers")
_K_PROPS = cbor2.dumps("props")
_K_DTAG = cbor2.dumps("dtag")
_MANDATORY = cbor2.dumps("mandatory") + b"\xf5"
_CONFIRM = cbor2.dumps("confirm") + b"\xf5"
_MULTIPLE = cbor2.dumps("multiple") + b"\xf5"
_PUBLISH_HEAD = b"\xa5" + _K_M_PUBLISH + _K_ID
_U32 = struct.Struct(">BI")
_TEXT_CACHE: dict[str, bytes] = {}
_ROUTE_CACHE: dict[tuple[str, str], bytes] = {}
_TEXT_CACHE_MAX = 4096


def uint(n: int) -> bytes:
    """A CBOR unsigned integer."""
    if n < 24:
        return bytes((n,))
    if n < 0x100:
        return bytes((0x18, n))
    if n < 0x10000:
        return b"\x19" + n.to_bytes(2, "big")
    if n < 0x100000000:
        return b"\x1a" + n.to_bytes(4, "big")
    return b"\x1b" + n.to_bytes(8, "big")


def _bytes_head(n: int) -> bytes:
    if n < 24:
        return bytes((0x40 + n,))
    if n < 0x100:
        return bytes((0x58, n))
    if n < 0x10000:
        return b"\x59" + n.to_bytes(2, "big")
    if n < 0x100000000:
        return b"\x5a" + n.to_bytes(4, "big")
    return b"\x5b" + n.to_bytes(8, "big")


def _text(s: str) -> bytes:
    enc = _TEXT_CACHE.get(s)
    if enc is None:
        enc = cbor2.dumps(s)
        if len(_TEXT_CACHE) < _TEXT_CACHE_MAX:
            _TEXT_CACHE[s] = enc
    return enc


def _route(exchange: str, key: str) -> bytes:
    """The encoded ``exchange``, ``key`` and ``body`` key of a publish, cached."""
    route = _ROUTE_CACHE.get((exchange, key))
    if route is None:
        route = _K_EXCHANGE + _text(exchange) + _K_KEY + _text(key) + _K_BODY
        if len(_ROUTE_CACHE) < _TEXT_CACHE_MAX:
            _ROUTE_CACHE[(exchange, key)] = route
    return route


def append_publish(
    out: bytearray,
    rid: int,
    exchange: str,
    key: str,
    body: bytes,
    headers: dict[str, Any] | None,
    props: dict[str, Any] | None,
    mandatory: bool,
    confirm: bool,
) -> int:
    """Append one ``publish`` frame to ``out``; returns the payload size."""
    rid_enc = _U32.pack(0x1A, rid) if 0xFFFF < rid <= 0xFFFFFFFF else uint(rid)
    if not (headers or props or mandatory or confirm):
        payload = b"".join(
            (_PUBLISH_HEAD, rid_enc, _route(exchange, key), _bytes_head(len(body)), body)
        )
    else:
        n = 5
        tail = b""
        if headers:
            tail += _K_HEADERS + cbor2.dumps(headers)
            n += 1
        if props:
            tail += _K_PROPS + cbor2.dumps(props)
            n += 1
        if mandatory:
            tail += _MANDATORY
            n += 1
        if confirm:
            tail += _CONFIRM
            n += 1
        payload = b"".join(
            (
                bytes((0xA0 + n,)),
                _K_M_PUBLISH,
                _K_ID,
                rid_enc,
                _route(exchange, key),
                _bytes_head(len(body)),
                body,
                tail,
            )
        )
    out += _LEN.pack(len(payload))
    out += payload
    return len(payload)


def append_ack(out: bytearray, rid: int, dtag: int, multiple: bool) -> None:
    """Append one ``ack`` frame to ``out``."""
    if multiple:
        payload = b"\xa4" + _K_M_ACK + _K_ID + uint(rid) + _K_DTAG + uint(dtag) + _MULTIPLE
    else:
        payload = b"\xa3" + _K_M_ACK + _K_ID + uint(rid) + _K_DTAG + uint(dtag)
    out += _LEN.pack(len(payload))
    out += payload
