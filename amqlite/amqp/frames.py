"""AMQP 0-9-1 framing: the protocol header, the four frame types, and a frame
reader that asks for more bytes (:data:`NEED_DATA`) instead of failing on a
partial frame.

A frame is ``type (1) | channel (2) | size (4) | payload (size) | 0xCE``. The
negotiated ``frame_max`` bounds the whole frame, these 8 bytes of overhead
included; a larger frame is refused (501) from its 7-byte header, before its
payload is read. Bad input raises :class:`~amqlite.amqp.errors.AmqpError` with the
reply code to close the connection with: 501 FRAME_ERROR for a malformed frame,
502 SYNTAX_ERROR for undecodable arguments, 540 NOT_IMPLEMENTED for an unknown
method.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from ..errors import ReplyCode
from .errors import AmqpError, ProtocolHeaderMismatch
from .properties import (
    BASIC_CLASS_ID,
    NO_PROPERTIES,
    BasicProperties,
    decode_header_payload,
    encode_header_payload,
)
from .spec import Method, decode_method

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_END: Final = 0xCE
FRAME_OVERHEAD: Final = 8
#: The smallest frame_max a peer may negotiate (the spec's frame-min-size).
FRAME_MIN_SIZE: Final = 4096
#: RabbitMQ's default frame_max.
DEFAULT_FRAME_MAX: Final = 131072

_FRAME_HEAD = struct.Struct(">BHI")
_HEARTBEAT_BYTES: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"
_END = bytes((FRAME_END,))


class FrameType(IntEnum):
    METHOD = 1
    HEADER = 2
    BODY = 3
    HEARTBEAT = 8


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


#: What :meth:`FrameReader.next_frame` returns when it holds no whole frame yet.
NEED_DATA: Final = _NeedData()


@dataclass(frozen=True, slots=True)
class ProtocolHeaderFrame:
    """The 8-byte protocol header a client opens with."""


@dataclass(frozen=True, slots=True)
class MethodFrame:
    channel: int
    method: Method


@dataclass(frozen=True, slots=True)
class HeaderFrame:
    channel: int
    class_id: int
    body_size: int
    properties: BasicProperties


@dataclass(frozen=True, slots=True)
class BodyFrame:
    channel: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class HeartbeatFrame:
    channel: int = 0


Frame = ProtocolHeaderFrame | MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame


# --- encoding --------------------------------------------------------------------------


def _frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + _END


def encode_method_frame(channel: int, method: Method) -> bytes:
    return _frame(FrameType.METHOD, channel, method.encode())


def encode_header_frame(
    channel: int, body_size: int, properties: BasicProperties = NO_PROPERTIES
) -> bytes:
    return _frame(FrameType.HEADER, channel, encode_header_payload(body_size, properties))


def encode_body_frame(channel: int, payload: bytes) -> bytes:
    return _frame(FrameType.BODY, channel, payload)


def encode_heartbeat_frame() -> bytes:
    return _HEARTBEAT_BYTES


def encode_content(
    channel: int,
    method: Method,
    properties: BasicProperties,
    body: bytes,
    frame_max: int = DEFAULT_FRAME_MAX,
) -> bytes:
    """A content-bearing method, its header frame and the body split into frames no
    larger than ``frame_max`` (0 = no limit). An empty body has no body frame."""
    parts = [
        _frame(FrameType.METHOD, channel, method.encode()),
        _frame(FrameType.HEADER, channel, encode_header_payload(len(body), properties)),
    ]
    chunk = frame_max - FRAME_OVERHEAD if frame_max else len(body) or 1
    for start in range(0, len(body), chunk):
        parts.append(_frame(FrameType.BODY, channel, body[start : start + chunk]))
    return b"".join(parts)


# --- decoding --------------------------------------------------------------------------


def decode_frame(frame_type: int, channel: int, payload: bytes) -> Frame:
    """One frame from its type, channel and payload (the splitter's output)."""
    if frame_type == FrameType.METHOD:
        try:
            return MethodFrame(channel, decode_method(payload))
        except AmqpError as exc:
            exc.channel = channel
            raise
    if frame_type == FrameType.BODY:
        return BodyFrame(channel, payload)
    if frame_type == FrameType.HEADER:
        try:
            class_id, body_size, props = decode_header_payload(payload)
        except AmqpError as exc:
            exc.channel = channel
            raise
        return HeaderFrame(channel, class_id, body_size, props)
    if frame_type == FrameType.HEARTBEAT:
        if channel != 0 or payload:
            raise AmqpError("heartbeat frame on a channel or with a payload", ReplyCode.FRAME_ERROR)
        return HeartbeatFrame()
    raise AmqpError(f"unknown frame type {frame_type}", ReplyCode.FRAME_ERROR)


class FrameReader:
    """Splits a byte stream into frames.

    ``receive_data`` appends bytes; ``next_frame`` returns the next whole frame or
    :data:`NEED_DATA`. With ``expect_protocol_header`` (a server's reader) the
    stream must open with :data:`PROTOCOL_HEADER`; a wrong header raises
    :class:`ProtocolHeaderMismatch` as soon as its first differing byte arrives.
    ``max_frame_size`` (whole frame, overhead included; 0 = no limit) may be
    lowered once ``connection.tune-ok`` settles it.
    """

    __slots__ = ("_buffer", "_expect_header", "_offset", "max_frame_size")

    def __init__(
        self, *, max_frame_size: int = DEFAULT_FRAME_MAX, expect_protocol_header: bool = False
    ) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._offset = 0
        self._expect_header = expect_protocol_header

    def receive_data(self, data: bytes | bytearray) -> None:
        if self._offset and self._offset * 2 >= len(self._buffer):
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buffer) - self._offset

    def next_frame(self) -> Frame | _NeedData:
        buf, offset = self._buffer, self._offset
        available = len(buf) - offset
        if self._expect_header:
            seen = bytes(buf[offset : offset + len(PROTOCOL_HEADER)])
            if not PROTOCOL_HEADER.startswith(seen):
                raise ProtocolHeaderMismatch(
                    f"not an AMQP 0-9-1 protocol header: {seen!r}", received=seen
                )
            if len(seen) < len(PROTOCOL_HEADER):
                return NEED_DATA
            self._offset += len(PROTOCOL_HEADER)
            self._expect_header = False
            return ProtocolHeaderFrame()
        if available < 7:
            if available >= 4 and buf[offset : offset + 4] == b"AMQP":
                raise self._header_instead_of_frame()
            return NEED_DATA
        frame_type, channel, size = _FRAME_HEAD.unpack_from(buf, offset)
        if frame_type == 0x41 and buf[offset : offset + 4] == b"AMQP":
            raise self._header_instead_of_frame()
        if frame_type not in _FRAME_TYPES:
            raise AmqpError(f"unknown frame type {frame_type}", ReplyCode.FRAME_ERROR)
        total = size + FRAME_OVERHEAD
        if self.max_frame_size and total > self.max_frame_size:
            raise AmqpError(
                f"frame of {total} bytes exceeds frame_max {self.max_frame_size}",
                ReplyCode.FRAME_ERROR,
                channel=channel,
            )
        if available < total:
            return NEED_DATA
        if buf[offset + total - 1] != FRAME_END:
            raise AmqpError(
                f"frame end octet is {buf[offset + total - 1]:#04x}, not 0xce",
                ReplyCode.FRAME_ERROR,
                channel=channel,
            )
        payload = bytes(buf[offset + 7 : offset + 7 + size])
        self._offset = offset + total
        return decode_frame(frame_type, channel, payload)

    def peek_publish(self) -> tuple[int, bytes, bytes, bytes, int] | None:
        """The fast path's look at the buffer: when it opens with a whole
        ``basic.publish`` message in its usual shape (method frame, header frame and
        at most one body frame of exactly the declared size, all on one channel,
        each within ``max_frame_size`` and ending with 0xCE) return ``(channel,
        method payload, header payload, body, end)``, consuming nothing (the caller
        decodes, then :meth:`skip_to` ``end``); otherwise None, and
        :meth:`next_frame` takes the frames one at a time.

        It exists because a publish is three frames, and taking them through
        :meth:`next_frame`, the content assembler and three channel-table steps
        costs about a quarter of the broker's CPU per AMQP message. Anything
        unusual (a body in several frames, a frame cut by the buffer's end, a bad
        end octet) goes the general way, which also raises the errors: the two are
        checked to agree by tests/amqp/test_fast_content.py."""
        if self._expect_header:
            return None
        buf = self._buffer
        offset = self._offset
        end = len(buf)
        if end - offset < 11:
            return None
        # (each frame's head read in one unpack: most of this path's time was in the
        # slices and look-ups of reading it field by field)
        frame_type, channel, size, ids = _PUBLISH_HEAD.unpack_from(buf, offset)
        if frame_type != 1 or ids != _PUBLISH_IDS:
            return None
        limit = self.max_frame_size
        if limit and size + FRAME_OVERHEAD > limit:
            return None
        method_end = offset + 7 + size
        # the method's end octet, the header frame's head, class, weight, body size
        # (a header frame shorter than that is refused below anyway)
        if method_end + 20 > end:
            return None
        method_close, header_type, header_channel, header_size, _, _, body_size = (
            _HEADER_HEAD.unpack_from(buf, method_end)
        )
        header_start = method_end + 8
        header_end = header_start + header_size
        if (
            method_close != FRAME_END
            or header_type != _HEADER_FRAME
            or header_channel != channel
            or header_size < 14
            or (limit and header_size + FRAME_OVERHEAD > limit)
            or header_end >= end
        ):
            return None
        if body_size == 0:
            if buf[header_end] != FRAME_END:
                return None
            body = b""
            done = header_end + 1
        else:
            if header_end + 8 > end:
                return None
            header_close, body_type, body_channel, size = _BODY_HEAD.unpack_from(buf, header_end)
            body_start = header_end + 8
            done = body_start + size + 1
            if (
                header_close != FRAME_END
                or body_type != _BODY_FRAME
                or body_channel != channel
                or size != body_size
                or (limit and size + FRAME_OVERHEAD > limit)
                or done > end
                or buf[done - 1] != FRAME_END
            ):
                return None
            body = bytes(buf[body_start : done - 1])
        return (
            channel,
            bytes(buf[offset + 7 : method_end]),
            bytes(buf[header_start:header_end]),
            body,
            done,
        )

    def skip_to(self, end: int) -> None:
        """Consume the buffer up to ``end`` (what :meth:`peek_publish` returned)."""
        self._offset = end

    def _header_instead_of_frame(self) -> ProtocolHeaderMismatch:
        seen = bytes(self._buffer[self._offset : self._offset + len(PROTOCOL_HEADER)])
        return ProtocolHeaderMismatch(
            f"the other end answered with a protocol header {seen!r}: it does not speak AMQP 0-9-1",
            received=seen,
        )


_FRAME_TYPES = frozenset(int(t) for t in FrameType)
_PUBLISH_IDS = 60 << 16 | 40  # basic.publish: class 60, method 40
# (ints, not FrameType members: on Python 3.11 a member's look-up on its class
# costs as much as a short function call)
_HEADER_FRAME = int(FrameType.HEADER)
_BODY_FRAME = int(FrameType.BODY)
#: a method frame's head and its class and method ids
_PUBLISH_HEAD = struct.Struct(">BHII")
#: the end octet of the frame before, a header frame's head, class, weight, body size
_HEADER_HEAD = struct.Struct(">BBHIHHQ")
#: the end octet of the frame before and a frame's head
_BODY_HEAD = struct.Struct(">BBHI")


__all__ = [
    "BASIC_CLASS_ID",
    "DEFAULT_FRAME_MAX",
    "FRAME_END",
    "FRAME_MIN_SIZE",
    "FRAME_OVERHEAD",
    "NEED_DATA",
    "PROTOCOL_HEADER",
    "BodyFrame",
    "Frame",
    "FrameReader",
    "FrameType",
    "HeaderFrame",
    "HeartbeatFrame",
    "MethodFrame",
    "ProtocolHeaderFrame",
    "decode_frame",
    "encode_body_frame",
    "encode_content",
    "encode_header_frame",
    "encode_heartbeat_frame",
    "encode_method_frame",
]
