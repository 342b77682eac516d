"""What the shell's parts need of the node, as protocols, so that none imports it.

The node (:mod:`.node`) owns the broker, the journal, the HA and peering services
and the connections; connections, endpoints and services see it only through
these narrow views. That keeps the arrows pointing one way (node -> connection ->
endpoints -> services) with no import circle in ``amqlite/server``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from amqlite.auth import Authenticator
    from amqlite.broker import Broker, Message, PublishOutcome
    from amqlite.config import ClusterConfig, Config
    from amqlite.peering import Envelope
    from amqlite.protocol import events as ev

    from .storage import NodeStorage

#: Sends one reply event on a connection (dropped once the connection is gone).
Replier = Callable[["ev.Event"], None]


class PeerLinkEnd(Protocol):
    """The accepting end of an exchange peering link, as the peering service sees it."""

    peer_link_id: str | None
    peer: str  # the remote address
    user: str  # who logged in
    vhost: str  # the vhost named in its hello

    def send_map(self, msg: dict[str, Any]) -> None: ...
    def send_peer(self, msg: bytes) -> None: ...
    def may_peer(self, exchange: str) -> bool: ...
    def close(self, reason: str) -> None: ...
    def close_from_server(self, code: int, text: str) -> None: ...


class HaView(Protocol):
    """The HA service, as connections and endpoints see it."""

    inbound_links: int

    @property
    def config(self) -> ClusterConfig: ...
    async def admit(self, deadline: float) -> tuple[bool, str]: ...
    def on_peer_heartbeat(self, hb: ev.HaHeartbeat) -> None: ...
    def on_sync(self, sync: ev.HaSync, conn: Any) -> None: ...
    def heartbeat_event(self) -> ev.HaHeartbeat | None: ...
    def start_switchover(self, request: ev.HaSwitchover, reply: Replier) -> None: ...


class PublishHookView(Protocol):
    """Exchange peering's hook on one peered exchange (see ``RequestDispatcher``)."""

    def envelope(self, message: Message) -> Envelope: ...
    def has_room(self, envelope: Envelope) -> bool: ...
    def published(
        self, envelope: Envelope, outcome: PublishOutcome, now: float, publish_key: str
    ) -> bool: ...


class PeeringView(Protocol):
    """The exchange peering service, as connections and endpoints see it."""

    def hook_for(self, vhost: str) -> Mapping[str, PublishHookView]: ...
    def on_frame(self, conn: PeerLinkEnd, msg: dict[str, Any]) -> None: ...
    def on_closed(self, conn: PeerLinkEnd) -> None: ...


class NodeView(Protocol):
    """The node, as its connections and endpoints see it (read-only)."""

    @property
    def config(self) -> Config: ...
    @property
    def node_id(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def cluster_addresses(self) -> list[str]: ...
    @property
    def authenticator(self) -> Authenticator: ...
    @property
    def broker(self) -> Broker: ...
    @property
    def storage(self) -> NodeStorage | None: ...
    @property
    def ha(self) -> HaView | None: ...
    @property
    def peering(self) -> PeeringView | None: ...
    @property
    def connections(self) -> Collection[Any]: ...

    def pump(self) -> None: ...
    def status(self) -> dict[str, Any]: ...
