"""AMQP 0-9-1, sans-IO: the codec (frames, methods, field tables, basic
properties), content assembly and the connection and channel state machines.
No sockets, clock or logging here (tests/test_sans_io.py); the listener that
drives it is a trio shell. See docs/amqp.md.
"""

from . import methods
from .connection import DEFAULT_CHANNEL_MAX, AmqpConnection
from .content import Content, ContentAssembler
from .errors import (
    CHANNEL_CODES,
    CONNECTION_CODES,
    AmqpError,
    AmqpLocalError,
    ProtocolHeaderMismatch,
    is_connection_error,
)
from .events import (
    ContentReceived,
    Event,
    HeartbeatReceived,
    MethodReceived,
    ProtocolHeaderReceived,
    Role,
)
from .frames import (
    DEFAULT_FRAME_MAX,
    FRAME_MIN_SIZE,
    NEED_DATA,
    PROTOCOL_HEADER,
    FrameReader,
    FrameType,
)
from .properties import BasicProperties
from .spec import METHODS, Method, Sender, decode_method
from .states import ChannelState, ConnState

__all__ = [
    "CHANNEL_CODES",
    "CONNECTION_CODES",
    "DEFAULT_CHANNEL_MAX",
    "DEFAULT_FRAME_MAX",
    "FRAME_MIN_SIZE",
    "METHODS",
    "NEED_DATA",
    "PROTOCOL_HEADER",
    "AmqpConnection",
    "AmqpError",
    "AmqpLocalError",
    "BasicProperties",
    "ChannelState",
    "ConnState",
    "Content",
    "ContentAssembler",
    "ContentReceived",
    "Event",
    "FrameReader",
    "FrameType",
    "HeartbeatReceived",
    "Method",
    "MethodReceived",
    "ProtocolHeaderMismatch",
    "ProtocolHeaderReceived",
    "Role",
    "Sender",
    "decode_method",
    "is_connection_error",
    "methods",
]
