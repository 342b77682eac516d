"""JSON text frames of the native protocol's methods, for the browser channels.

A frame is one JSON object whose ``m`` names the method; its other keys are the
native frame's fields (docs/protocol.md), with one change: JSON has no bytes, so a
body travels as ``body`` (text, sent as its UTF-8 bytes) or ``body64`` (base64).
A delivered body whose bytes are valid UTF-8 comes as ``body``, any other as
``body64``; a header value that is bytes comes as text when it is UTF-8, else as
base64 text (header values are scalars: text, number, boolean, null).

Decoding checks every field as the CBOR decoder does (:func:`event_from_map`): a
frame that is not a JSON object, has no integer ``id`` or names no known client
request raises :class:`FrameError` carrying the reply to send. Nothing here does
I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from amqlite.errors import ReplyCode
from amqlite.protocol import events as ev
from amqlite.protocol.codec import FieldError, event_from_map, event_to_map

__all__ = [
    "REQUESTS",
    "FrameError",
    "decode_request",
    "deliver_frame",
    "encode",
    "notice",
]

#: the requests a browser session may send (the handshake is the channel's own)
REQUESTS: dict[str, type[ev.Event]] = {
    cls.METHOD: cls
    for cls in (
        ev.ExchangeDeclare,
        ev.ExchangeDelete,
        ev.QueueDeclare,
        ev.QueueDelete,
        ev.QueuePurge,
        ev.QueueBind,
        ev.QueueUnbind,
        ev.Publish,
        ev.Consume,
        ev.Cancel,
        ev.Ack,
        ev.Nack,
        ev.Reject,
        ev.Get,
        ev.Status,
        ev.OffsetStore,
        ev.OffsetQuery,
    )
}
_BODIED = (ev.Publish,)


class FrameError(Exception):
    """A frame that cannot be run; ``reply`` is the JSON ``error`` frame to send
    (the channel stays open)."""

    def __init__(self, rid: int | None, code: int, text: str) -> None:
        super().__init__(text)
        self.rid = rid
        self.code = code
        self.text = text

    @property
    def reply(self) -> str:
        return encode(ev.Error(self.rid, self.code, self.text))


def parse(text: str | bytes) -> Any:
    """The JSON value of ``text``; FrameError when it is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FrameError(None, ReplyCode.SYNTAX_ERROR, f"not JSON: {exc}") from None


def decode_request(value: Any) -> ev.Event:
    """The request event of one parsed JSON frame; FrameError when it cannot be run."""
    if type(value) is not dict:
        raise FrameError(None, ReplyCode.FRAME_ERROR, "a frame must be one JSON object")
    rid = value.get("id")
    if type(rid) is not int:
        raise FrameError(None, ReplyCode.SYNTAX_ERROR, "a request needs an integer 'id'")
    method = value.get("m")
    if type(method) is not str:
        raise FrameError(rid, ReplyCode.SYNTAX_ERROR, "frame has no method name ('m' must be text)")
    cls = REQUESTS.get(method)
    if cls is None:
        raise FrameError(rid, ReplyCode.NOT_IMPLEMENTED, f"unknown method {method!r}")
    m = value
    if cls in _BODIED:
        m = dict(value)
        body64 = m.pop("body64", None)
        body = m.get("body")
        if type(body) is str:
            m["body"] = body.encode("utf-8", "surrogatepass")
        elif type(body) is bytes:
            pass  # a CBOR frame
        elif body is None and type(body64) is str:
            try:
                m["body"] = base64.b64decode(body64, validate=True)
            except binascii.Error:
                raise FrameError(rid, ReplyCode.SYNTAX_ERROR, "'body64' is not base64") from None
        else:
            text = f"{method}: needs 'body' (text) or 'body64' (base64 text)"
            raise FrameError(rid, ReplyCode.SYNTAX_ERROR, text)
    try:
        return event_from_map(cls, m)
    except FieldError as exc:
        raise FrameError(rid, exc.code, exc.text) from None


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    return repr(value)


def _dumps(m: dict[str, Any]) -> str:
    return json.dumps(m, ensure_ascii=False, separators=(",", ":"), default=_plain)


def _put_body(m: dict[str, Any], body: bytes) -> None:
    try:
        m["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        m.pop("body", None)
        m["body64"] = base64.b64encode(body).decode("ascii")


def encode(event: ev.Event) -> str:
    """One JSON frame for a reply (``ok``, ``error``, ``get-ok``, ``cancelled``, ...)."""
    m = event_to_map(event)
    body = m.get("body")
    if isinstance(body, bytes):
        _put_body(m, body)
    return _dumps(m)


def deliver_frame(
    ctag: str,
    dtag: int,
    redelivered: bool,
    exchange: str,
    key: str,
    body: bytes,
    headers: dict[str, Any],
    props: dict[str, Any],
    queue: str,
) -> str:
    """The JSON ``deliver`` frame of one delivery."""
    m: dict[str, Any] = {"m": "deliver", "ctag": ctag, "dtag": dtag, "exchange": exchange}
    m["key"] = key
    _put_body(m, body)
    if headers:
        m["headers"] = headers
    if props:
        m["props"] = props
    if redelivered:
        m["redelivered"] = True
    if queue:
        m["queue"] = queue
    return _dumps(m)


def notice(method: str, **fields: Any) -> str:
    """A frame of the channels' own (``welcome``, ``refused``, ``dropped``, ...)."""
    return _dumps({"m": method, **fields})
