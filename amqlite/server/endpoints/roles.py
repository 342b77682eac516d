"""The endpoints of the node's own roles: the HA peer, a peering link, a monitor.

Each takes only the requests of its role and answers anything else with 530
NOT_ALLOWED; none has a broker session.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import structlog

from amqlite.auth import require_tag
from amqlite.errors import AccessRefused, AmqliteError, ReplyCode
from amqlite.protocol import events as ev

from .base import not_allowed

log = structlog.get_logger("amqlite.server")

if TYPE_CHECKING:
    from amqlite.auth import AuthenticatedUser, Permissions

    from ..context import HaView, NodeView, PeeringView
    from .base import Link


class _RoleEndpoint:
    """What the node's role endpoints share: replies that may come late."""

    role = ""
    where = ""

    def __init__(self, link: Link) -> None:
        self.link = link
        self._released = False

    def opened(self) -> None:
        pass

    def drained(self, pending: int) -> None:
        pass

    def closed(self, now: float) -> None:
        self._released = True

    def info(self) -> dict[str, Any] | None:
        return None

    def send_reply(self, reply: ev.Event) -> None:
        """Send a reply that a service answers later (dropped once closed)."""
        if self._released:
            return
        with contextlib.suppress(AmqliteError):
            self.link.send(reply)


class HaPeerEndpoint(_RoleEndpoint):
    """The HA pair's peer link, as opened by the other node (``role = "ha-peer"``):
    its heartbeats (answered here, so it hears us before our own link is up) and
    the replication it streams while it is the active node."""

    role = "ha-peer"
    where = "the HA peer link"

    def __init__(self, link: Link, ha: HaView) -> None:
        super().__init__(link)
        self.ha = ha
        ha.inbound_links += 1

    def opened(self) -> None:
        self._send_heartbeat()

    def handle(self, event: ev.Event, now: float) -> None:
        if isinstance(event, ev.HaHeartbeat):
            self.ha.on_peer_heartbeat(event)
            self._send_heartbeat()
        elif isinstance(event, ev.HaSync):
            self.ha.on_sync(event, self)
        elif isinstance(event, ev.HaHandover):
            self.ha.on_handover(event)
        else:
            not_allowed(self.link, event, self.where)

    def _send_heartbeat(self) -> None:
        heartbeat = self.ha.heartbeat_event()
        if heartbeat is not None:
            self.send_reply(heartbeat)

    def closed(self, now: float) -> None:
        if not self._released:
            self.ha.inbound_links -= 1
        super().closed(now)


class PeeringEndpoint(_RoleEndpoint):
    """The accepting end of an exchange peering link (``role = "peer-link"``): its
    ``peer`` frames go to the peering service, which answers through this object."""

    role = "peer-link"
    where = "a peering link"

    def __init__(
        self,
        link: Link,
        peering: PeeringView | None,
        permissions: Permissions,
        *,
        user: str,
        vhost: str,
        login: AuthenticatedUser | None = None,
    ) -> None:
        super().__init__(link)
        self.peering = peering
        self.permissions = permissions
        self._login = login
        self.remote_address = link.remote_address
        self.tls = link.tls
        self.user = user
        self.vhost = vhost

    def handle(self, event: ev.Event, now: float) -> None:
        if isinstance(event, ev.PeerMessage) and self.peering is not None:
            self.peering.on_frame(self, event.msg)
        else:
            not_allowed(self.link, event, self.where)

    def send_map(self, msg: dict[str, Any]) -> None:
        """Send one ``peer`` frame."""
        if not self.link.closing:
            self.send_reply(ev.PeerMessage(msg))

    def send_peer(self, msg: bytes) -> None:
        """Send one ``peer`` frame whose map ``msg`` is already encoded."""
        link = self.link
        if self._released or link.closing:
            return
        with contextlib.suppress(AmqliteError):
            out = link.out
            out += link.proto.send_peer(msg)
            link.kick()

    def may_peer(self, exchange: str) -> bool:
        """May this link's user publish to and read from ``exchange``?"""
        perms = self.permissions
        return all(perms.allows(kind, exchange or "amq.default") for kind in ("write", "read"))

    def constraint_refusal(self, exchange: str) -> str | None:
        """Why a role constraint stops this link's user from peering with
        ``exchange`` (a link both sends into it and subscribes to it), or None."""
        login = self._login
        if login is None:
            return None
        return login.refusal("send", "exchange", exchange) or login.refusal(
            "subscribe", "exchange", exchange
        )

    def close(self, reason: str) -> None:
        """The link moved on (or a newer connection replaced this one)."""
        self.link.close_from_server(ReplyCode.CONNECTION_FORCED, reason)

    def close_from_server(self, code: int, text: str) -> None:
        self.link.close_from_server(code, text)

    def closed(self, now: float) -> None:
        if not self._released and self.peering is not None:
            self.peering.on_closed(self)
        super().closed(now)


class MonitorEndpoint(_RoleEndpoint):
    """A monitor connection (``role = "monitor"``, opened only by a user with the
    ``monitoring`` tag): the full status, and switchover on an HA pair (the
    ``administrator`` tag)."""

    role = "monitor"
    where = "a monitor connection"

    def __init__(self, link: Link, node: NodeView, user: AuthenticatedUser) -> None:
        super().__init__(link)
        self.node = node
        self.user = user

    def handle(self, event: ev.Event, now: float) -> None:
        ha = self.node.ha
        if isinstance(event, ev.Status):
            self.send_reply(ev.Ok(event.id, self.node.status()))
        elif isinstance(event, ev.HaSwitchover) and ha is not None:
            try:
                require_tag(self.user, "administrator", "a switchover")
            except AccessRefused as exc:
                log.warning(
                    "privilege_refused",
                    user=self.user.name,
                    remote=self.link.remote_address,
                    reason=exc.text,
                )
                self.send_reply(ev.Error(event.id, exc.code, exc.text))
                return
            log.warning(
                "switchover_requested", user=self.user.name, remote=self.link.remote_address
            )
            ha.start_switchover(event, self.send_reply)
        else:
            not_allowed(self.link, event, self.where)
