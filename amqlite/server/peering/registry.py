"""Every link end this node runs and what the shell keeps beside each one: its
peered exchange, its connection, its peering queue, the messages held for it.

Plain data shared by the service (which adds and removes link ends) and the
action applier (which looks them up for every action).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import trio

from amqlite.peering import Envelope, PeeredExchange, PeeringLink

from .peering_queue import PeeringQueue
from .transport import LinkConnection


@dataclass
class HeldEnvelopes:
    """``block`` policy: messages a full link refused, re-offered in order."""

    envelopes: deque[tuple[Envelope, bool]] = field(default_factory=deque)  # (env, routed)
    waiting: bool = False  # for the link's next ``BufferAvailable``


class LinkRegistry:
    """The link ends of one node, by link id."""

    def __init__(self) -> None:
        self.owner: dict[str, PeeredExchange] = {}  # link id -> its exchange
        self.conns: dict[str, LinkConnection] = {}  # link id -> its connection
        self.queues: dict[str, PeeringQueue] = {}  # subscribe acceptor end -> its queue
        self.held: dict[str, HeldEnvelopes] = {}
        self.waiting_since: dict[str, float] = {}  # acceptor ends whose dialer is away
        #: set (and replaced) whenever a ``block`` link may have room again: the
        #: publishers it held back look again (:meth:`room_changed`)
        self.room = trio.Event()

    def room_changed(self) -> None:
        """Wake every publisher held back by a full link: it checks again."""
        room, self.room = self.room, trio.Event()
        room.set()

    def link(self, link_id: str) -> PeeringLink | None:
        px = self.owner.get(link_id)
        return px.links.get(link_id) if px is not None else None

    def forget(self, link_id: str) -> None:
        """A link end was removed: drop what was kept for it (not its queue)."""
        self.owner.pop(link_id, None)
        self.held.pop(link_id, None)
        self.waiting_since.pop(link_id, None)
        self.room_changed()

    def held_count(self, link_id: str) -> int:
        held = self.held.get(link_id)
        return len(held.envelopes) if held is not None else 0
