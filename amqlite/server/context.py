"""What the shell's parts need of the node, as protocols, so that none imports it.

The node (:mod:`.node`) owns the broker, the journal, the HA and peering services
and the connections; connections, endpoints and services see it only through
these narrow views. That keeps the arrows pointing one way (node -> connection ->
endpoints -> services) with no import circle in ``amqlite/server``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from amqlite.auth import Authenticator
    from amqlite.broker import Broker
    from amqlite.broker.alarms import Resource
    from amqlite.broker.limits import LimitReached
    from amqlite.config import ClusterConfig, Config
    from amqlite.protocol import events as ev
    from amqlite.protocol.heartbeat import HeartbeatClock

    from .peering import PeeringService, PublishHook
    from .peering.transport import AcceptedConnection
    from .storage import NodeStorage

#: Sends one reply event on a connection (dropped once the connection is gone).
Replier = Callable[["ev.Event"], None]


class HaPeerEnd(Hashable, Protocol):
    """The accepted end of the HA peer link, as the HA service sees it: what the
    active node streams arrives on it, and ``ha.synced`` goes back on it."""

    def send_reply(self, event: ev.Event) -> None: ...


class HaView(Protocol):
    """The HA service, as connections and endpoints see it."""

    inbound_links: int

    @property
    def config(self) -> ClusterConfig: ...
    async def admit(self, deadline: float) -> tuple[bool, str]: ...
    def on_peer_heartbeat(self, hb: ev.HaHeartbeat) -> None: ...
    def on_sync(self, sync: ev.HaSync, conn: HaPeerEnd) -> None: ...
    def on_handover(self, handover: ev.HaHandover) -> None: ...
    def heartbeat_event(self) -> ev.HaHeartbeat | None: ...
    def start_switchover(self, request: ev.HaSwitchover, reply: Replier) -> None: ...


class PeeringView(Protocol):
    """The exchange peering service, as connections and endpoints see it."""

    def hook_for(self, vhost: str) -> Mapping[str, PublishHook]: ...
    def on_frame(self, conn: AcceptedConnection, msg: dict[str, Any]) -> None: ...
    def on_closed(self, conn: AcceptedConnection) -> None: ...
    def room_changed(self) -> None: ...
    async def hold_back(
        self,
        held_back: Callable[[], bool],
        clock: HeartbeatClock,
        closing: Callable[[], bool],
        flow: Callable[[bool], None],
    ) -> None: ...


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
    @property
    def alarms_raised(self) -> frozenset[Resource]: ...
    def client_read(self, nbytes: int) -> None: ...

    def pump(self) -> None: ...
    def pump_sized(self) -> int: ...
    def status(self) -> dict[str, Any]: ...
    def admit_connection(
        self, slot: object, user: str, *, counted: bool = True
    ) -> LimitReached | None: ...
    def add_connection(self, conn: Any) -> None: ...
    def remove_connection(self, conn: Any) -> None: ...


class HaNode(Protocol):
    """The node, as its HA service drives it: the service sets its state and
    cluster addresses, replaces its broker by a fresh one before a snapshot, and
    closes its clients when fenced or handing over."""

    state: str
    cluster_addresses: list[str]
    broker: Broker

    @property
    def config(self) -> Config: ...
    @property
    def node_id(self) -> str: ...
    @property
    def storage(self) -> NodeStorage | None: ...
    @property
    def peering(self) -> PeeringService | None: ...

    def new_broker(self) -> Broker: ...
    def close_clients(self, code: int, text: str) -> None: ...
