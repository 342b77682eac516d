"""Received bytes -> events, with a fast path for the frames that come per message.

Frames are split here and each payload is decoded once with ``cbor2.loads``. A
``deliver`` map is handed on as the map itself (the connection builds its
:class:`~amqlite.client.Delivery` straight from it), a bare ``ok`` as the int it
answers, and an ``ok`` with ``info`` as an :class:`~amqlite.protocol.events.Ok`,
after the same field checks the codec makes. That costs well under half of the
generic path. Every other frame, and any frame the fast path does not like, goes
whole through the sans-IO :class:`amqlite.protocol.Connection`, which validates
it, runs the state table and raises on protocol errors. The fast path is only
taken while the connection is OPEN, where those frames change no state.
"""

from __future__ import annotations

import struct
from typing import Any

import cbor2

from amqlite.protocol import Connection, ConnState, check_headers, check_props
from amqlite.protocol import events as ev

_LEN = struct.Struct(">I")
_DELIVER_KEYS = frozenset(
    {
        "m",
        "ctag",
        "dtag",
        "exchange",
        "key",
        "body",
        "headers",
        "props",
        "redelivered",
        "queue",
        "offset",
    }
)

#: What :meth:`FrameReader.feed` returns: protocol events, deliver maps, and the
#: ``re`` of each bare ``ok`` (no ``info``) as an int.
Item = ev.Event | dict[str, Any] | int


def deliver_map_ok(m: dict[str, Any]) -> bool:
    """True when ``m`` is a well-typed ``deliver`` map (the codec's checks). A map
    with a key the client does not know is not: it takes the codec's path, which
    ignores such keys."""
    get = m.get
    if not (
        type(get("ctag")) is str
        and type(get("dtag")) is int
        and type(get("exchange")) is str
        and type(get("key")) is str
        and type(get("body")) is bytes
    ):
        return False
    if len(m) == 6:
        return True
    if not _DELIVER_KEYS.issuperset(m):
        return False
    headers = get("headers")
    if headers is not None and check_headers(headers) is not None:
        return False
    props = get("props")
    if props is not None and check_props(props) is not None:
        return False
    offset = get("offset")
    return (
        type(get("redelivered", False)) is bool
        and type(get("queue", "")) is str
        and (offset is None or type(offset) is int)
    )


def _ok_event(m: dict[str, Any]) -> ev.Ok | int | None:
    re = m.get("re")
    if type(re) is not int:
        return None
    if len(m) == 2:
        return re  # a bare ok (a publish confirm, mostly): just its id
    info = m.get("info")
    if len(m) == 3 and type(info) is dict and all(type(k) is str for k in info):
        return ev.Ok(re, info)
    return None


class FrameReader:
    """Turns received chunks into events and deliver maps (see the module docstring)."""

    __slots__ = ("_proto", "_rest")

    def __init__(self, proto: Connection) -> None:
        self._proto = proto
        self._rest = b""

    def feed(self, data: bytes) -> list[Item]:
        """What ``data`` completes (``b""`` = end of stream), in order."""
        proto = self._proto
        buf = self._rest + data if self._rest else data
        out: list[Item] = []
        append = out.append
        pos = 0
        n = len(buf)
        limit = proto.max_frame_size
        fast = proto.state is ConnState.OPEN
        loads = cbor2.loads
        unpack = _LEN.unpack_from
        while n - pos >= 4:
            (size,) = unpack(buf, pos)
            end = pos + 4 + size
            if size > limit:  # the protocol connection raises the frame error
                break
            if end > n:
                break
            item: Item | None = None
            if fast:
                try:
                    m = loads(buf[pos + 4 : end])
                except Exception:  # cbor2 raises several types; proto will report it
                    m = None
                if type(m) is dict:
                    get = m.get
                    method = get("m")
                    if method == "deliver":
                        if (
                            len(m) == 6
                            and type(get("ctag")) is str
                            and type(get("dtag")) is int
                            and type(get("exchange")) is str
                            and type(get("key")) is str
                            and type(get("body")) is bytes
                        ) or deliver_map_ok(m):
                            item = m
                    elif method == "ok":
                        item = _ok_event(m)
            if item is None:
                proto.receive_data(buf[pos:end])
                out.extend(proto.events())
                fast = proto.state is ConnState.OPEN
            else:
                append(item)
            pos = end
        if n - pos >= 4 and _LEN.unpack_from(buf, pos)[0] > limit:
            proto.receive_data(buf[pos:])
            self._rest = b""
            out.extend(proto.events())  # raises RemoteProtocolError
            return out
        self._rest = buf[pos:]
        if not data:
            if self._rest:
                proto.receive_data(self._rest)
                self._rest = b""
            proto.receive_data(b"")
            out.extend(proto.events())
        return out
