"""What the core asks its shell to do. Every link method returns a list of these,
in the order the shell must apply them; ``link`` names the link end (its
:attr:`~amqlite.peering.link.PeeringLink.id`)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count, repeat

from .addresses import Address
from .states import LinkState
from .wire import Envelope, PeeringMessage, PlainRun


@dataclass(frozen=True, slots=True)
class Connect:
    """Open a transport connection to ``address``; then call ``connected`` or
    ``connection_lost``."""

    link: str
    address: Address


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the link's connection (the link has already moved on: do not report
    the loss back)."""

    link: str
    reason: str


@dataclass(slots=True)  # per-message: not frozen (frozen init costs 4x); never mutate
class Send:
    """Encode ``message.to_map()`` and write it on the link's connection."""

    link: str
    message: PeeringMessage


@dataclass(slots=True)  # per-message: not frozen (frozen init costs 4x); never mutate
class Deliver:
    """Publish ``envelope`` into the local exchange; once it is safe (at once for a
    transient message, after the journal's fsync for a persistent one) call the
    link's ``confirm(tag)`` (cumulative, like an AMQP delivery tag: per link end,
    from 1, increasing); and offer it to the other links with ``published``."""

    link: str
    tag: int
    envelope: Envelope


@dataclass(slots=True)  # per-run: not frozen; never mutate
class DeliverRun:
    """:class:`Deliver` of each of ``run``'s envelopes, tags from ``tag`` on (what
    ``PeeringLink.receive(..., deliver_runs=True)`` gives for a compact run instead
    of one ``Deliver`` each: the shell may publish its keys and bodies without an
    envelope each, see :class:`~amqlite.peering.wire.PlainRun`)."""

    link: str
    tag: int
    run: PlainRun

    def delivers(self) -> list[Deliver]:
        """The single deliveries it stands for."""
        return list(map(Deliver, repeat(self.link), count(self.tag), self.run))


@dataclass(frozen=True, slots=True)
class Blocked:
    """``block`` policy: the link's buffer is full and it did not take ``envelope``.
    Push back on the publisher; offer it again to this link after
    :class:`BufferAvailable`. Until then the link refuses every later message too
    (in order behind this one: none may overtake it)."""

    link: str
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class BufferAvailable:
    """A link that refused a message has room again (at most half full)."""

    link: str


@dataclass(frozen=True, slots=True)
class Acked:
    """Everything up to ``seq`` has left the sending log of a link end that keeps
    it durably (acknowledged by the remote, or dropped by ``drop-oldest``): settle
    what was kept for those sequence numbers (a queue-fed end's peering-queue
    deliveries, see ``PeeringLink.take``; a durable log's journaled messages, see
    :class:`Persist`)."""

    link: str
    seq: int


@dataclass(slots=True)  # per-message: not frozen (frozen init costs 4x); never mutate
class Persist:
    """A link end with ``durable_log`` set took a persistent message under ``seq``:
    keep it (journal it) until an :class:`Acked` covers ``seq``, and give it back
    with ``PeeringLink.restore`` after a restart or failover."""

    link: str
    seq: int
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class StateChanged:
    """For the shell's log (``peering_link_state``); nothing to do."""

    link: str
    old: LinkState
    new: LinkState
    reason: str = ""


Action = (
    Connect
    | Disconnect
    | Send
    | Deliver
    | DeliverRun
    | Blocked
    | BufferAvailable
    | Acked
    | Persist
    | StateChanged
)
