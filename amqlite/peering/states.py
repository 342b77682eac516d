"""The link state machine: every state transition of a peering link lives in
:data:`TRANSITIONS`, and nothing else assigns a link state.

A link has two ends. The *dialer* (the broker whose ``[[cluster_mta]]`` names the
remote) connects, backs off and retries; the *acceptor* (the remote broker) keeps
its end of the link, with its outbound log, while the dialer is away. Both ends use
this one table; each end fires only the events of its role. A (state, event) pair
missing from the table raises :class:`~amqlite.peering.errors.LinkStateError`.

::

    dialer:   IDLE --start--> CONNECTING --connected--> SYNCING --handshake-done--> UP
              CONNECTING/SYNCING/UP --lost--> BACKOFF --retry-due--> CONNECTING
              SYNCING --refused--> BACKOFF
    acceptor: IDLE --attached--> UP --detached--> WAITING --attached--> UP
              UP --attached--> UP            (the dialer came back on a new connection)
    any state but CLOSED --close--> CLOSED  (final)
"""

from __future__ import annotations

from enum import Enum

from .errors import LinkStateError


class LinkState(Enum):
    IDLE = "idle"  # created, not started
    CONNECTING = "connecting"  # dialer: a transport connection is being opened
    SYNCING = "syncing"  # dialer: connected, our hello sent, the remote's hello pending
    UP = "up"  # handshake done: messages, interest and acks flow
    BACKOFF = "backoff"  # dialer: waiting (jittered, exponential) before the next address
    WAITING = "waiting"  # acceptor: the dialer is away; the log keeps what it must send
    CLOSED = "closed"  # final: the link was removed


class LinkEvent(Enum):
    START = "start"  # dialer: the shell starts the link
    CONNECTED = "connected"  # dialer: the transport connection is open
    HANDSHAKE_DONE = "handshake-done"  # dialer: the remote's hello was accepted
    REFUSED = "refused"  # dialer: the remote refused the hello, or its hello did not fit
    LOST = "lost"  # dialer: connect failed, the connection dropped or the remote went silent
    RETRY_DUE = "retry-due"  # dialer: the backoff delay has passed
    ATTACHED = "attached"  # acceptor: a dialer's hello arrived on a connection
    DETACHED = "detached"  # acceptor: that connection dropped or went silent
    CLOSE = "close"


S, E = LinkState, LinkEvent

TRANSITIONS: dict[tuple[LinkState, LinkEvent], LinkState] = {
    (S.IDLE, E.START): S.CONNECTING,
    (S.IDLE, E.ATTACHED): S.UP,
    (S.IDLE, E.CLOSE): S.CLOSED,
    (S.CONNECTING, E.CONNECTED): S.SYNCING,
    (S.CONNECTING, E.LOST): S.BACKOFF,
    (S.CONNECTING, E.CLOSE): S.CLOSED,
    (S.SYNCING, E.HANDSHAKE_DONE): S.UP,
    (S.SYNCING, E.REFUSED): S.BACKOFF,
    (S.SYNCING, E.LOST): S.BACKOFF,
    (S.SYNCING, E.CLOSE): S.CLOSED,
    (S.UP, E.LOST): S.BACKOFF,
    (S.UP, E.ATTACHED): S.UP,
    (S.UP, E.DETACHED): S.WAITING,
    (S.UP, E.CLOSE): S.CLOSED,
    (S.BACKOFF, E.RETRY_DUE): S.CONNECTING,
    (S.BACKOFF, E.CLOSE): S.CLOSED,
    (S.WAITING, E.ATTACHED): S.UP,
    (S.WAITING, E.CLOSE): S.CLOSED,
}


def next_state(state: LinkState, event: LinkEvent) -> LinkState:
    """The state after ``event`` in ``state``; an illegal pair raises LinkStateError."""
    new = TRANSITIONS.get((state, event))
    if new is None:
        raise LinkStateError(f"link event {event.value!r} is not allowed in state {state.value!r}")
    return new
