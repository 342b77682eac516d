"""amqlite's native wire protocol, sans-IO.

Frames are a 4-byte big-endian length followed by one CBOR map. See
``docs/protocol.md`` for every method and :class:`Connection` for the API.
"""

from .codec import PROPERTY_TYPES, WireMessage, check_headers, check_props
from .connection import (
    DEFAULT_MAX_FRAME,
    NEED_DATA,
    Connection,
    DeliverMap,
    DeliverRun,
    OkRun,
    PublishRun,
)
from .events import *  # noqa: F403
from .events import BY_METHOD, PROTOCOL_VERSION, REPLIES, REQUESTS, WIRE_EVENTS, Role, Sender
from .heartbeat import HeartbeatClock
from .states import TRANSITIONS, ConnState, Trigger

__all__ = [
    "BY_METHOD",
    "DEFAULT_MAX_FRAME",
    "NEED_DATA",
    "PROPERTY_TYPES",
    "PROTOCOL_VERSION",
    "REPLIES",
    "REQUESTS",
    "TRANSITIONS",
    "WIRE_EVENTS",
    "ConnState",
    "Connection",
    "DeliverMap",
    "DeliverRun",
    "HeartbeatClock",
    "OkRun",
    "PublishRun",
    "Role",
    "Sender",
    "Trigger",
    "WireMessage",
    "check_headers",
    "check_props",
]
