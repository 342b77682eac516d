"""The client connection's link state: every transition lives in :data:`TRANSITIONS`,
and nothing else assigns a :class:`LinkState`.

::

    OPEN --lost--> RECONNECTING --restored--> OPEN
      |              |   ^--lost (again, while restoring)--'
      |              '--close--> CLOSING --ended--> CLOSED
      |--close--> CLOSING                              ^
      '--ended (a final loss, no reconnect) -----------'
    RECONNECTING --ended (gave up, or a final refusal)--> CLOSED

``lost`` is only fired when the connection reconnects (see :class:`ReconnectPolicy`);
a loss without reconnect is ``ended``. A (state, event) pair missing from the table
is a bug and raises.

The notifications a connection hands to ``on_disconnect`` / ``on_reconnect`` are here
too: :class:`Disconnected` and :class:`Reconnected`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from amqlite.errors import AmqliteError

from .addresses import Address


class LinkState(Enum):
    OPEN = "open"  # a live link to a server; requests go out at once
    RECONNECTING = "reconnecting"  # the link is gone; dialling and restoring
    CLOSING = "closing"  # we are closing (close sent, close-ok awaited)
    CLOSED = "closed"  # over: every call raises why


class LinkEvent(Enum):
    LOST = "lost"  # the link broke and we will reconnect
    RESTORED = "restored"  # a new link is up, topology and consumers restored
    CLOSE = "close"  # the application closes the connection
    ENDED = "ended"  # over for good: closed, a final loss, or gave up reconnecting


S, E = LinkState, LinkEvent

TRANSITIONS: dict[tuple[LinkState, LinkEvent], LinkState] = {
    (S.OPEN, E.LOST): S.RECONNECTING,
    (S.OPEN, E.CLOSE): S.CLOSING,
    (S.OPEN, E.ENDED): S.CLOSED,
    (S.RECONNECTING, E.LOST): S.RECONNECTING,  # the new link broke while restoring
    (S.RECONNECTING, E.RESTORED): S.OPEN,
    (S.RECONNECTING, E.CLOSE): S.CLOSING,
    (S.RECONNECTING, E.ENDED): S.CLOSED,
    (S.CLOSING, E.ENDED): S.CLOSED,
}


def next_state(state: LinkState, event: LinkEvent) -> LinkState:
    """The state after ``event``; raises RuntimeError for a pair the table lacks."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise RuntimeError(
            f"client link: no transition from {state.name} on {event.name}"
        ) from None


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The link to ``address`` broke; the connection is reconnecting."""

    address: Address
    error: AmqliteError


@dataclass(frozen=True, slots=True)
class Reconnected:
    """The connection is back, on ``address`` (``previous`` is the server it lost).

    ``downtime`` is seconds from the loss to now, ``attempts`` the passes through the
    server list it took, ``resent`` the requests and confirmed publishes sent again,
    and ``renamed_queues`` maps the old name of each server-named queue that had to
    be declared again under a new name to that new name.
    """

    address: Address
    previous: Address
    downtime: float
    attempts: int
    reconnects: int
    resent: int
    renamed_queues: Mapping[str, str] = field(default_factory=dict)
