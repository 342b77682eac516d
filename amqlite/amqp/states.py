"""The AMQP 0-9-1 state machines: every state transition of a connection and of a
channel lives in :data:`CONNECTION_TRANSITIONS` or :data:`CHANNEL_TRANSITIONS`,
and nothing else assigns one of these states. A (state, trigger) pair missing from
a table is a protocol error; :func:`connection_error_code` and
:func:`channel_error_code` say which reply code it earns.

Connection (channel 0). Handshake methods drive it whichever end sends them (the
connection checks that each method comes from the end allowed to send it);
closing is directional, since after sending ``close`` a peer discards what still
arrives, while after receiving one it only answers ``close-ok``::

    AWAIT_PROTOCOL_HEADER -header-> AWAIT_START -start-> AWAIT_START_OK -start-ok->
    AWAIT_TUNE [-secure-> AWAIT_SECURE_OK -secure-ok-> AWAIT_TUNE] -tune->
    AWAIT_TUNE_OK -tune-ok-> AWAIT_OPEN -open-> AWAIT_OPEN_OK -open-ok-> OPEN
    (any state after start) -send close-> CLOSE_SENT -recv close-ok-> CLOSED
    (any state after start) -recv close-> CLOSE_RECEIVED -send close-ok-> CLOSED

Channel (1..channel_max). Outgoing content goes out whole (method, header and
body in one write), so only incoming content has the AWAIT_HEADER / AWAIT_BODY
states; outgoing methods may interleave with an incoming message::

    CLOSED -open-> OPENING -open-ok-> OPEN
    OPEN -recv content method-> AWAIT_HEADER -recv header-> AWAIT_BODY
         -recv last body frame-> OPEN   (an empty body completes at the header)
    OPEN/OPENING/AWAIT_* -send close-> CLOSE_SENT -recv close-ok-> CLOSED
    OPEN/OPENING -recv close-> CLOSE_RECEIVED -send close-ok-> CLOSED
"""

from __future__ import annotations

from enum import Enum

from ..errors import ReplyCode


class _TableEnum(Enum):
    """An Enum hashed by identity. Enum's own ``__hash__`` is Python code
    (``hash(self._name_)``) and the transition tables hash a (state, trigger) pair
    for every frame in and out, about 20 times a message; members are singletons
    compared by identity (Enum keeps ``object.__eq__``), so identity hashing agrees
    with equality and the tables behave the same."""

    __hash__ = object.__hash__


class ConnState(_TableEnum):
    AWAIT_PROTOCOL_HEADER = "await-protocol-header"
    AWAIT_START = "await-start"
    AWAIT_START_OK = "await-start-ok"
    AWAIT_TUNE = "await-tune"  # or connection.secure
    AWAIT_SECURE_OK = "await-secure-ok"
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    AWAIT_OPEN_OK = "await-open-ok"
    OPEN = "open"
    CLOSE_SENT = "close-sent"
    CLOSE_RECEIVED = "close-received"
    CLOSED = "closed"


class ConnTrigger(_TableEnum):
    PROTOCOL_HEADER = "protocol-header"
    START = "start"
    START_OK = "start-ok"
    SECURE = "secure"
    SECURE_OK = "secure-ok"
    TUNE = "tune"
    TUNE_OK = "tune-ok"
    OPEN = "open"
    OPEN_OK = "open-ok"
    SEND_TRAFFIC = "send-traffic"  # channel frames, connection.blocked/unblocked/...
    RECV_TRAFFIC = "recv-traffic"
    SEND_HEARTBEAT = "send-heartbeat"
    RECV_HEARTBEAT = "recv-heartbeat"
    SEND_CLOSE = "send-close"
    RECV_CLOSE = "recv-close"
    SEND_CLOSE_OK = "send-close-ok"
    RECV_CLOSE_OK = "recv-close-ok"


class ChannelState(_TableEnum):
    CLOSED = "closed"  # never opened, or closed: only channel.open may come
    OPENING = "opening"  # channel.open seen, open-ok pending
    OPEN = "open"
    AWAIT_HEADER = "await-header"  # incoming content method seen
    AWAIT_BODY = "await-body"  # incoming header seen, body frames pending
    CLOSE_SENT = "close-sent"  # we sent channel.close: incoming frames are dropped
    CLOSE_RECEIVED = "close-received"  # they sent channel.close: we owe close-ok


class ChannelTrigger(_TableEnum):
    SEND_OPEN = "send-open"
    RECV_OPEN = "recv-open"
    SEND_OPEN_OK = "send-open-ok"
    RECV_OPEN_OK = "recv-open-ok"
    SEND_METHOD = "send-method"
    RECV_METHOD = "recv-method"
    SEND_CONTENT = "send-content"  # method, header and body at once
    RECV_CONTENT_METHOD = "recv-content-method"
    RECV_HEADER = "recv-header"  # a body follows
    RECV_HEADER_LAST = "recv-header-last"  # empty body: the message is complete
    RECV_BODY = "recv-body"
    RECV_BODY_LAST = "recv-body-last"
    SEND_CLOSE = "send-close"
    RECV_CLOSE = "recv-close"
    SEND_CLOSE_OK = "send-close-ok"
    RECV_CLOSE_OK = "recv-close-ok"


S, T = ConnState, ConnTrigger
#: States after connection.start, where either end may close.
_STARTED = (
    S.AWAIT_START_OK,
    S.AWAIT_TUNE,
    S.AWAIT_SECURE_OK,
    S.AWAIT_TUNE_OK,
    S.AWAIT_OPEN,
    S.AWAIT_OPEN_OK,
    S.OPEN,
)
#: States where heartbeats flow (anything after the protocol header, before CLOSED).
_LIVE = (S.AWAIT_START, *_STARTED, S.CLOSE_SENT, S.CLOSE_RECEIVED)

CONNECTION_TRANSITIONS: dict[tuple[ConnState, ConnTrigger], ConnState] = {
    (S.AWAIT_PROTOCOL_HEADER, T.PROTOCOL_HEADER): S.AWAIT_START,
    (S.AWAIT_START, T.START): S.AWAIT_START_OK,
    (S.AWAIT_START_OK, T.START_OK): S.AWAIT_TUNE,
    (S.AWAIT_TUNE, T.SECURE): S.AWAIT_SECURE_OK,
    (S.AWAIT_SECURE_OK, T.SECURE_OK): S.AWAIT_TUNE,
    (S.AWAIT_TUNE, T.TUNE): S.AWAIT_TUNE_OK,
    (S.AWAIT_TUNE_OK, T.TUNE_OK): S.AWAIT_OPEN,
    (S.AWAIT_OPEN, T.OPEN): S.AWAIT_OPEN_OK,
    (S.AWAIT_OPEN_OK, T.OPEN_OK): S.OPEN,
    (S.OPEN, T.SEND_TRAFFIC): S.OPEN,
    (S.OPEN, T.RECV_TRAFFIC): S.OPEN,
    **{(state, T.SEND_HEARTBEAT): state for state in _LIVE},
    **{(state, T.RECV_HEARTBEAT): state for state in _LIVE},
    **{(state, T.SEND_CLOSE): S.CLOSE_SENT for state in _STARTED},
    **{(state, T.RECV_CLOSE): S.CLOSE_RECEIVED for state in _STARTED},
    # after our close, what the other end sent before seeing it is read and dropped
    (S.CLOSE_SENT, T.RECV_TRAFFIC): S.CLOSE_SENT,
    (S.CLOSE_SENT, T.RECV_CLOSE): S.CLOSE_SENT,  # both closed at once
    (S.CLOSE_SENT, T.SEND_CLOSE_OK): S.CLOSE_SENT,
    (S.CLOSE_SENT, T.RECV_CLOSE_OK): S.CLOSED,
    (S.CLOSE_RECEIVED, T.SEND_CLOSE_OK): S.CLOSED,
}

C, CT = ChannelState, ChannelTrigger
_RECEIVING = (
    CT.RECV_OPEN_OK,
    CT.RECV_METHOD,
    CT.RECV_CONTENT_METHOD,
    CT.RECV_HEADER,
    CT.RECV_HEADER_LAST,
    CT.RECV_BODY,
    CT.RECV_BODY_LAST,
)
_CONTENT_PENDING = (C.AWAIT_HEADER, C.AWAIT_BODY)

CHANNEL_TRANSITIONS: dict[tuple[ChannelState, ChannelTrigger], ChannelState] = {
    (C.CLOSED, CT.SEND_OPEN): C.OPENING,
    (C.CLOSED, CT.RECV_OPEN): C.OPENING,
    (C.OPENING, CT.SEND_OPEN_OK): C.OPEN,
    (C.OPENING, CT.RECV_OPEN_OK): C.OPEN,
    (C.OPEN, CT.SEND_METHOD): C.OPEN,
    (C.OPEN, CT.RECV_METHOD): C.OPEN,
    (C.OPEN, CT.SEND_CONTENT): C.OPEN,
    (C.OPEN, CT.RECV_CONTENT_METHOD): C.AWAIT_HEADER,
    (C.AWAIT_HEADER, CT.RECV_HEADER): C.AWAIT_BODY,
    (C.AWAIT_HEADER, CT.RECV_HEADER_LAST): C.OPEN,
    (C.AWAIT_BODY, CT.RECV_BODY): C.AWAIT_BODY,
    (C.AWAIT_BODY, CT.RECV_BODY_LAST): C.OPEN,
    # our own traffic may interleave with an incoming message
    **{(state, CT.SEND_METHOD): state for state in _CONTENT_PENDING},
    **{(state, CT.SEND_CONTENT): state for state in _CONTENT_PENDING},
    **{(state, CT.SEND_CLOSE): C.CLOSE_SENT for state in (C.OPENING, C.OPEN, *_CONTENT_PENDING)},
    (C.OPENING, CT.RECV_CLOSE): C.CLOSE_RECEIVED,
    (C.OPEN, CT.RECV_CLOSE): C.CLOSE_RECEIVED,
    **{(C.CLOSE_SENT, trigger): C.CLOSE_SENT for trigger in _RECEIVING},
    (C.CLOSE_SENT, CT.RECV_CLOSE): C.CLOSE_SENT,  # both closed at once
    (C.CLOSE_SENT, CT.SEND_CLOSE_OK): C.CLOSE_SENT,
    (C.CLOSE_SENT, CT.RECV_CLOSE_OK): C.CLOSED,
    (C.CLOSE_RECEIVED, CT.SEND_CLOSE_OK): C.CLOSED,
}

_CONTENT_FRAMES = frozenset({CT.RECV_HEADER, CT.RECV_HEADER_LAST, CT.RECV_BODY, CT.RECV_BODY_LAST})


def connection_error_code(state: ConnState, trigger: ConnTrigger) -> int:
    """The reply code for a frame the connection table does not allow."""
    if trigger is T.RECV_TRAFFIC and state is not S.OPEN:
        return ReplyCode.CHANNEL_ERROR  # channel frames before connection.open-ok
    return ReplyCode.COMMAND_INVALID


def channel_error_code(state: ChannelState, trigger: ChannelTrigger) -> int:
    """The reply code for a frame the channel table does not allow (RabbitMQ's:
    505 for content out of order, 504 for a channel not open or opened twice)."""
    if trigger in _CONTENT_FRAMES or state in _CONTENT_PENDING:
        return ReplyCode.UNEXPECTED_FRAME
    if state is C.CLOSED or trigger is CT.RECV_OPEN:
        return ReplyCode.CHANNEL_ERROR
    return ReplyCode.COMMAND_INVALID
