"""The current link of a client connection and the settling of its deliveries.

A :class:`~amqlite.client.Connection` owns one :class:`Settler`; each
:class:`~amqlite.client.Delivery` holds it (not the connection) to ack, nack or
reject itself, and the reconnector voids it when a link breaks.

A connection outlives its links when it reconnects: each link has a generation
(``gen``), and the callbacks of a link that is no longer current are ignored.
Delivery tags restart on every link, so the tags the application sees are offset by
``tag_base`` (the highest tag of the earlier links): they keep increasing across
links, and a tag at or below the base belongs to a dead link, whose ack must not
be sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from amqlite.errors import AmqliteError
from amqlite.protocol import events as ev

from .acks import AckCoalescer

if TYPE_CHECKING:
    from amqlite.link import FramedLink


class Settler:
    """The current link (``link``, generation ``gen``), its tag space and its
    coalesced acks. ``new_id`` is the connection's request-id source."""

    __slots__ = ("acks", "closed", "gen", "last_dtag", "link", "marks", "new_id", "tag_base")

    def __init__(self, link: FramedLink, new_id: Callable[[], int]) -> None:
        self.link = link
        self.new_id = new_id
        self.gen = 0
        self.tag_base = 0  # the highest delivery tag of the links before this one
        self.last_dtag = 0  # the highest tag the server gave on this link
        #: Why the connection ended; settling then raises it.
        self.closed: AmqliteError | None = None
        self.acks = AckCoalescer()
        self.marks = self.acks.marks

    def next_link(self) -> None:
        """The current link broke: a new generation, whose tags start past its own;
        acks not sent yet are void (the server requeues those messages)."""
        self.gen += 1
        self.tag_base += self.last_dtag
        self.last_dtag = 0
        self.acks.forget()

    def send(self, event: ev.Event) -> None:
        """Queue a control frame; acks marked before it go first (wire order = call order)."""
        if self.acks.pending:
            self.emit_acks()
        self.link.send(event)

    def emit_acks(self) -> None:
        """Turn marked acks into frames (the writer calls this before each flush)."""
        acks = self.acks
        if not acks.pending:
            return
        out = self.link.out
        send_ack = self.link.proto.send_ack
        new_id = self.new_id
        base = self.tag_base
        for dtag, multiple in acks.take():
            out += send_ack(new_id(), dtag - base, multiple)

    def ack_one(self, dtag: int) -> None:
        """Mark an unsettled delivery's tag for the next coalesced ack; a tag of a
        dead link is dropped (its message comes again, flagged ``redelivered``)."""
        if self.closed is not None:
            raise self.closed
        if dtag > self.tag_base:
            self.marks.add(dtag)
            link = self.link
            if not link.kicked:
                link.kick()

    def ack(self, dtag: int, multiple: bool) -> None:
        """Acknowledge by tag (with ``multiple``, every open tag up to it)."""
        if dtag <= self.tag_base:
            return
        self.acks.ack(dtag, multiple)
        self.link.kick()

    def settle(self, dtag: int, *, requeue: bool, reject: bool, multiple: bool = False) -> None:
        """Nack or reject ``dtag`` now (earlier acks go first); a dead link's tag is
        skipped: the server has requeued that message already."""
        if self.closed is not None:
            raise self.closed
        base = self.tag_base
        if dtag <= base:
            return
        self.emit_acks()  # earlier acks first: a nack must not overtake them
        rid = self.new_id()
        if reject:
            self.link.send(ev.Reject(rid, dtag - base, requeue))
        else:
            self.link.send(ev.Nack(rid, dtag - base, multiple, requeue))
        self.acks.settle(dtag, multiple)
