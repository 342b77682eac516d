"""The connection state machine: every state transition of a protocol connection
lives in :data:`TRANSITIONS`, and nothing else assigns a connection state.

Frames sent and frames received drive the same table (the handshake and the close
are symmetric enough that the direction does not matter once the sender role has
been checked). A (state, trigger) pair missing from the table is a protocol error.

::

    HANDSHAKE --hello--> AUTHENTICATING --welcome--> OPEN --close--> CLOSING --close-ok--> CLOSED
                                       \\--refused--> CLOSED
    any state --protocol error--> ERROR --close--> CLOSED
"""

from enum import Enum

from . import events as ev


class ConnState(Enum):
    HANDSHAKE = "handshake"  # nothing yet: the client must say hello
    AUTHENTICATING = "authenticating"  # hello seen, welcome or refused pending
    OPEN = "open"
    CLOSING = "closing"  # a close was sent or received; close-ok pending
    CLOSED = "closed"
    ERROR = "error"  # a protocol error: only a close (with the error code) may follow


class Trigger(Enum):
    HELLO = "hello"
    WELCOME = "welcome"
    REFUSED = "refused"
    OPERATION = "operation"  # any request, reply or delivery
    HEARTBEAT = "heartbeat"
    CLOSE = "close"
    CLOSE_OK = "close-ok"
    PROTOCOL_ERROR = "protocol-error"


S, T = ConnState, Trigger

TRANSITIONS: dict[tuple[ConnState, Trigger], ConnState] = {
    (S.HANDSHAKE, T.HELLO): S.AUTHENTICATING,
    (S.HANDSHAKE, T.CLOSE): S.CLOSING,
    (S.HANDSHAKE, T.PROTOCOL_ERROR): S.ERROR,
    (S.AUTHENTICATING, T.WELCOME): S.OPEN,
    (S.AUTHENTICATING, T.REFUSED): S.CLOSED,
    (S.AUTHENTICATING, T.HEARTBEAT): S.AUTHENTICATING,
    (S.AUTHENTICATING, T.CLOSE): S.CLOSING,
    (S.AUTHENTICATING, T.PROTOCOL_ERROR): S.ERROR,
    (S.OPEN, T.OPERATION): S.OPEN,
    (S.OPEN, T.HEARTBEAT): S.OPEN,
    (S.OPEN, T.CLOSE): S.CLOSING,
    (S.OPEN, T.PROTOCOL_ERROR): S.ERROR,
    # frames the other end sent before it saw our close are still read (and dropped)
    (S.CLOSING, T.OPERATION): S.CLOSING,
    (S.CLOSING, T.HEARTBEAT): S.CLOSING,
    (S.CLOSING, T.CLOSE): S.CLOSING,  # both sides closed at once: answer close-ok
    (S.CLOSING, T.CLOSE_OK): S.CLOSED,
    (S.CLOSING, T.PROTOCOL_ERROR): S.ERROR,
    (S.ERROR, T.CLOSE): S.CLOSED,  # the error frame is the last thing we send
    (S.ERROR, T.PROTOCOL_ERROR): S.ERROR,
}

_TRIGGER_OF: dict[type[ev.Event], Trigger] = {
    ev.Hello: T.HELLO,
    ev.Welcome: T.WELCOME,
    ev.Refused: T.REFUSED,
    ev.Heartbeat: T.HEARTBEAT,
    ev.Close: T.CLOSE,
    ev.CloseOk: T.CLOSE_OK,
}


def trigger_of(event_type: type[ev.Event]) -> Trigger:
    """The trigger a frame of this type fires (most frames are operations)."""
    return _TRIGGER_OF.get(event_type, T.OPERATION)


def next_state(state: ConnState, trigger: Trigger) -> ConnState | None:
    """The state after ``trigger`` in ``state``, or None when the pair is illegal."""
    return TRANSITIONS.get((state, trigger))
