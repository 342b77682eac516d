"""All the link ends of one local exchange, and what they share.

A :class:`PeeredExchange` is the shell's entry point for one (vhost, exchange):
it mints mesh identities for local publishes, fans each published message out to
its links, mirrors the exchange's bindings into interest advertisements, accepts
dialers' hellos (creating acceptor ends), and holds the receive-side marks that the
shell persists (:meth:`snapshot` / :meth:`restore`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from itertools import repeat as _repeat
from typing import Any

from amqlite.errors import ReplyCode

from .actions import Action, Disconnect, Send
from .errors import PeeringProtocolError
from .inbound import HighWaterMarks, SeenMessages
from .interest import EXCHANGE_TYPES, BindingKey, BindingMirror
from .link import PeeringLink
from .mode import OverflowPolicy
from .outbound import SpillStore
from .settings import ExchangeContext, LinkRole, LinkSettings
from .states import LinkState as S
from .wire import (
    VERSION,
    Envelope,
    Hello,
    MeshId,
    MeshStamp,
    PeeringMessage,
    Refused,
    from_map,
)

INF = float("inf")
SNAPSHOT_VERSION = 1
QUEUE_FED_LOG_BYTES = 1 << 60  # no cap of its own: the shell bounds it by the queue's prefetch
_new_mesh_id = tuple.__new__  # MeshId(...) without the Python-level __new__


class PeeredExchange:
    """One local exchange and its peering links (dialer and acceptor ends).

    ``node_id`` is this broker's peering identity (both members of an HA pair use
    the same one); ``epoch`` must grow every time the broker starts (a persisted
    counter), so that sequence numbers and mesh identities are never reused.
    ``rand`` is the random source for backoff jitter. ``acceptor`` holds the
    settings of acceptor ends (name, mode and addresses come from each hello).
    ``spill_store(link_id)`` makes the store of a ``spill`` link end.
    """

    def __init__(
        self,
        *,
        node_id: str,
        epoch: int,
        exchange: str,
        exchange_type: str,
        rand: Callable[[], float],
        vhost: str = "/",
        max_hops: int = 8,
        dedup_window: int = 16384,
        acceptor: LinkSettings | None = None,
        spill_store: Callable[[str], SpillStore] | None = None,
    ) -> None:
        if not node_id:
            raise ValueError("a peering node needs a node id")
        if exchange_type not in EXCHANGE_TYPES:
            raise ValueError(
                f"exchange type must be one of {', '.join(EXCHANGE_TYPES)}, got {exchange_type!r}"
            )
        if max_hops < 1:
            raise ValueError(f"max_hops must be at least 1, got {max_hops}")
        self.ctx = ExchangeContext(
            node_id=node_id,
            epoch=epoch,
            vhost=vhost,
            exchange=exchange,
            exchange_type=exchange_type,
            max_hops=max_hops,
            mirror=BindingMirror(),
            marks=HighWaterMarks(),
            seen=SeenMessages(dedup_window),
        )
        self.rand = rand
        self.acceptor = acceptor or LinkSettings(
            name="acceptor", overflow=OverflowPolicy.DROP_OLDEST
        )
        self.spill_store = spill_store
        self.links: dict[str, PeeringLink] = {}
        #: whether some link end takes offers (it sends, and a peering queue does not
        #: feed it): kept up to date where ``links`` changes (:meth:`_links_changed`)
        self.offers_taken = False
        self.taken = 0  # links that took the last published message
        self._minted = 0

    @property
    def node_id(self) -> str:
        return self.ctx.node_id

    def _spill_for(self, link_id: str, settings: LinkSettings) -> SpillStore | None:
        if settings.overflow is not OverflowPolicy.SPILL:
            return None
        if self.spill_store is None:
            raise ValueError(f"link {link_id!r}: overflow 'spill' needs a spill store")
        return self.spill_store(link_id)

    # --- links --------------------------------------------------------------------------

    def add_link(self, settings: LinkSettings) -> PeeringLink:
        """A dialer end, from a ``[[cluster_mta]]`` entry; call ``start(now)`` on it."""
        if settings.name in self.links:
            raise ValueError(f"a link named {settings.name!r} already exists")
        if not settings.addresses:
            raise ValueError(f"link {settings.name!r} needs at least one remote address")
        link = PeeringLink(
            settings,
            self.ctx,
            LinkRole.DIALER,
            rand=self.rand,
            spill=self._spill_for(settings.name, settings),
        )
        self.links[link.id] = link
        self._links_changed()
        return link

    def _links_changed(self) -> None:
        self.offers_taken = any(link.sends and not link.queue_fed for link in self.links.values())

    @staticmethod
    def acceptor_id(node: str, link: str) -> str:
        return f"{node}/{link}"

    def attach(
        self, hello: Mapping[str, Any] | PeeringMessage, now: float
    ) -> tuple[PeeringLink | None, list[Action]]:
        """The first message on an incoming peering connection. Finds or creates the
        acceptor end for that dialer and link and attaches it; returns it with the
        actions. A hello that does not fit this exchange gets a ``peer.refused`` and
        a ``Disconnect`` (and no link). A malformed first message raises
        :class:`~amqlite.peering.errors.PeeringProtocolError`: close the connection.
        If the returned link already had a connection, the shell closes the old one.
        A hello of another ``version`` gets a ``peer.refused`` that says so.
        """
        if isinstance(hello, Mapping) and hello.get("type") == Hello.TYPE:
            version = hello.get("version")
            if type(version) is int and version != VERSION:
                link_id = self.acceptor_id(str(hello.get("node")), str(hello.get("link")))
                text = f"peer.hello: unsupported version {version} (we speak {VERSION})"
                return None, [
                    Send(link_id, Refused(ReplyCode.PRECONDITION_FAILED, text)),
                    Disconnect(link_id, f"refused: {text}"),
                ]
        msg = from_map(hello) if isinstance(hello, Mapping) else hello
        if not isinstance(msg, Hello):
            raise PeeringProtocolError(
                f"a peering connection must start with peer.hello, not {msg.TYPE}"
            )
        link_id = self.acceptor_id(msg.node, msg.link)
        link = self.links.get(link_id)
        if link is not None and (
            link.mode is not msg.mode
            or link.role is not LinkRole.ACCEPTOR
            or link.state is S.CLOSED
        ):
            self.links.pop(link_id).close(now)  # the dialer was reconfigured, or we closed it
            self._links_changed()
            link = None
        if link is None:
            settings = dataclasses.replace(
                self.acceptor, name=msg.link, mode=msg.mode, addresses=()
            )
            if not msg.mode.dialer_sends:  # queue-fed: the peering queue has the cap
                settings = dataclasses.replace(
                    settings, buffer_bytes=QUEUE_FED_LOG_BYTES, overflow=OverflowPolicy.BLOCK
                )
            link = PeeringLink(
                settings,
                self.ctx,
                LinkRole.ACCEPTOR,
                rand=self.rand,
                spill=self._spill_for(link_id, settings),
                link_id=link_id,
            )
            mismatch = link.hello_mismatch(msg)
            if mismatch:
                code = ReplyCode.PRECONDITION_FAILED
                return None, [
                    Send(link_id, Refused(code, mismatch)),
                    Disconnect(link_id, f"refused: {mismatch}"),
                ]
            self.links[link_id] = link
            self._links_changed()
        try:
            return link, link.attach(msg, now)
        except PeeringProtocolError as exc:
            code = ReplyCode.SYNTAX_ERROR
            return None, [Send(link_id, Refused(code, exc.text)), Disconnect(link_id, exc.text)]

    def remove_link(self, link_id: str, now: float) -> list[Action]:
        """Close a link end and forget it (its log goes with it)."""
        link = self.links.pop(link_id, None)
        if link is None:
            return []
        self._links_changed()
        return link.close(now)

    # --- messages -----------------------------------------------------------------------

    def stamp(self) -> MeshStamp:
        """The identity :meth:`envelope` would mint for a message a client published
        here without headers or properties, as a :class:`MeshStamp` (what a
        received plain message carries as ``Message.mesh``), without the envelope.

        Why it exists beside :meth:`envelope`: while no link end takes offers
        (:attr:`offers_taken` False: a subscriber's remote, whose ends a peering
        queue feeds), such a message's envelope is kept only as its identity, for
        a peering queue to send it on; a stamp is one tuple made in C where the
        envelope was a Python ``__init__`` and a mesh id, and a peering queue's
        batch of stamps goes to its link end as one :class:`PlainRun`
        (``tests/server/test_peering_applier.py`` checks the subscriber gets
        what the envelopes give)."""
        self._minted += 1
        ctx = self.ctx
        return _new_mesh_id(MeshStamp, (ctx.node_id, ctx.epoch, self._minted, ctx.exchange, (), 0))

    def stamp_run(self, n: int) -> list[MeshStamp]:
        """:meth:`stamp` of ``n`` messages one after the other, minted in one go
        (the stamps built in C, as :meth:`PlainRun.stamps` builds them).

        Why it exists beside :meth:`stamp`: a client's read of plain publishes on
        a subscriber's remote is published as one run
        (``RequestDispatcher.publish_run``), each message needing a stamp only
        (``tests/server/test_peering_applier.py`` checks a run gets the stamps,
        queue and frames that :meth:`stamp` of each gives)."""
        first = self._minted + 1
        self._minted += n
        ctx = self.ctx
        return list(
            map(
                _new_mesh_id,
                _repeat(MeshStamp),
                zip(
                    _repeat(ctx.node_id),
                    _repeat(ctx.epoch),
                    range(first, first + n),
                    _repeat(ctx.exchange),
                    _repeat(()),
                    _repeat(0),
                    strict=False,
                ),
            )
        )

    def envelope(
        self,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> Envelope:
        """The envelope of a message a client published here (mints its mesh id)."""
        self._minted += 1
        ctx = self.ctx
        mesh_id = _new_mesh_id(MeshId, (ctx.node_id, ctx.epoch, self._minted))
        exchange = ctx.exchange
        if not headers and not properties:  # the usual case: its size() is known at once
            size = 64 + len(body) + len(routing_key) + len(exchange)
            # the (empty) maps given are kept, not copied: nothing changes a message's
            # maps in place (the broker copies them to change them: dead letters), so
            # the publish's own serve, and two fewer objects live per message while
            # it waits in a sending log
            return Envelope(
                mesh_id,
                routing_key,
                body,
                {} if headers is None else headers,
                {} if properties is None else properties,
                exchange,
                (),
                0,
                size,
            )
        return Envelope(
            mesh_id,
            routing_key,
            body,
            dict(headers) if headers else {},
            dict(properties) if properties else {},
            exchange,
        )

    def published(self, envelope: Envelope, *, routed_locally: bool, now: float) -> list[Action]:
        """A message was published on the local exchange (by a client, or delivered
        from a link); ``routed_locally`` says whether a local queue took it. Offers
        it to every link end. Afterwards ``taken`` says how many links took it (sent
        or to be sent: a full ``block`` link holds it), so a mandatory publish that
        no local queue took is not returned when another site will route it."""
        links = self.links
        if len(links) == 1:
            # Why this exists beside _offer_each: a client publish on a peered
            # exchange goes through here, and one link is the usual case; its offer
            # is the whole answer (tests/peering/test_fast_paths.py checks both give
            # the same actions, ``taken`` and link state)
            for link in links.values():
                offered = link.offer(envelope, routed_locally=routed_locally, now=now)
                self.taken = 1 if link.took else 0
                return offered
        return self._offer_each(envelope, routed_locally=routed_locally, now=now)

    def published_run(
        self, envelopes: list[Envelope], routed: list[bool], *, now: float
    ) -> list[Action]:
        """:meth:`published` for each of ``envelopes`` in order (``routed[i]`` for
        ``envelopes[i]``), when nobody needs to know between them whether a link
        took one (``taken`` is left as the last one's). One link takes the run
        at once (:meth:`PeeringLink.offer_run`: its forwards as runs); with more,
        each message is offered to each link in turn, as :meth:`published` does."""
        links = self.links
        if len(links) == 1:
            for link in links.values():
                offered = link.offer_run(envelopes, routed, now)
                self.taken = 1 if link.took else 0
                return offered
        actions: list[Action] = []
        for envelope, routed_locally in zip(envelopes, routed, strict=True):
            actions += self.published(envelope, routed_locally=routed_locally, now=now)
        return actions

    def published_plain_run(
        self, keys: list[str], bodies: list[bytes], *, now: float
    ) -> list[Action]:
        """:meth:`published_run` of ``[envelope(k, b) for k, b in zip(keys, bodies)]``
        (client publishes without headers or properties), none routed locally,
        minted here and now (in order: the same mesh ids). One link takes them
        without the minted envelopes (:meth:`PeeringLink.offer_plain_run`); the
        lists are the caller's no more."""
        first = self._minted + 1
        links = self.links
        if len(links) == 1:
            self._minted += len(bodies)
            for link in links.values():
                offered = link.offer_plain_run(first, keys, bodies, now)
                self.taken = 1 if link.took else 0
                return offered
        envelope = self.envelope
        envelopes = [envelope(k, b) for k, b in zip(keys, bodies, strict=True)]
        return self.published_run(envelopes, [False] * len(envelopes), now=now)

    def skip_mints(self, n: int) -> None:
        """Use up ``n`` mesh ids unsent (as :meth:`envelope` would for messages
        offered to no link), so the ids that follow are the same either way."""
        self._minted += n

    def _offer_each(self, envelope: Envelope, *, routed_locally: bool, now: float) -> list[Action]:
        """:meth:`published`'s general rule: offer it to each link in turn."""
        actions: list[Action] = []
        taken = 0
        for link in self.links.values():
            offered = link.offer(envelope, routed_locally=routed_locally, now=now)
            if link.took:
                taken += 1
            if offered:
                actions += offered
        self.taken = taken
        return actions

    def has_room(self, envelope: Envelope) -> bool:
        """Would every link take this message without overflowing?"""
        return all(link.has_room(envelope) for link in self.links.values())

    # --- bindings -----------------------------------------------------------------------

    def bind(
        self, queue: str, key: str, arguments: Mapping[str, Any] | None = None, *, now: float
    ) -> list[Action]:
        """A binding was made on the local exchange."""
        added = self.ctx.mirror.add(queue, key, arguments)
        return self._interest_changed((added,) if added else (), (), now)

    def unbind(
        self, queue: str, key: str, arguments: Mapping[str, Any] | None = None, *, now: float
    ) -> list[Action]:
        """A binding was removed from the local exchange."""
        removed = self.ctx.mirror.remove(queue, key, arguments)
        return self._interest_changed((), (removed,) if removed else (), now)

    def unbind_queue(self, queue: str, *, now: float) -> list[Action]:
        """A queue bound to the local exchange was deleted."""
        return self._interest_changed((), tuple(self.ctx.mirror.remove_queue(queue)), now)

    def filter_changed(self, selector: str | None, now: float) -> list[Action]:
        """The consumers of the queues bound here now want only what ``selector``
        accepts (None: everything): subscribe links tell their remotes."""
        actions: list[Action] = []
        for link in self.links.values():
            actions += link.filter_changed(selector, now)
        return actions

    def _interest_changed(
        self, added: tuple[BindingKey, ...], removed: tuple[BindingKey, ...], now: float
    ) -> list[Action]:
        actions: list[Action] = []
        if added or removed:
            for link in self.links.values():
                actions += link.interest_changed(added, removed, now)
        return actions

    # --- time ---------------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for link in list(self.links.values()):
            actions += link.tick(now)
        return actions

    def next_deadline(self) -> float:
        """The earliest of the link ends' :meth:`PeeringLink.next_deadline`. (A loop,
        not ``min`` of a generator: the shell asks after every turn of work.)"""
        due = INF
        for link in self.links.values():
            at = link.next_deadline()
            if at < due:
                due = at
        return due

    # --- persistence and figures -----------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The receive-side marks as plain data: persist it (with the messages it
        covers) so a restarted broker drops what it already delivered."""
        return {
            "version": SNAPSHOT_VERSION,
            "marks": self.ctx.marks.snapshot(),
            "seen": self.ctx.seen.snapshot(),
        }

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Load a :meth:`snapshot` (at start-up, before any link is attached or
        started); a malformed one raises ValueError."""
        if not isinstance(snapshot, Mapping) or snapshot.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"not a peering snapshot (version {SNAPSHOT_VERSION})")
        marks = HighWaterMarks.restore(snapshot.get("marks", ()))
        seen = SeenMessages.restore(
            snapshot.get("seen", ()), self.ctx.seen.window, self.ctx.seen.epochs_kept
        )
        self.ctx.marks, self.ctx.seen = marks, seen

    def status(self, now: float) -> list[dict[str, Any]]:
        """One map per link end, for ``amqlite status`` under ``links``."""
        return [link.stats(now) for link in self.links.values()]
