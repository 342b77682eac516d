"""What every role endpoint is, and what it may ask of the connection under it.

After the handshake a native connection becomes one role endpoint (a client
session, the HA peer, a peering link, a monitor). The connection (on its framed
link) moves bytes, runs the heartbeat and the handshake; the endpoint turns each request into calls
on the broker or a service and answers through the :class:`Link` it was given.
"""

from __future__ import annotations

from typing import Any, Protocol

from amqlite.errors import ReplyCode
from amqlite.protocol import Connection
from amqlite.protocol import events as ev


class Link(Protocol):
    """The connection under an endpoint (the native connection's side of it, over
    its :class:`amqlite.link.FramedLink`)."""

    remote_address: str
    proto: Connection
    #: the connection came in over TLS (a listener with ``tls = true``)
    tls: bool

    @property
    def out(self) -> bytearray:
        """Bytes queued for the writer: an endpoint may append encoded frames to it
        and then call :meth:`kick` (the writer swaps it out: read it again after
        an ``await``)."""

    @property
    def closing(self) -> bool: ...
    def send(self, event: ev.Event) -> None: ...
    def kick(self) -> None: ...
    def close_from_server(self, code: int, text: str) -> None: ...


class Endpoint(Protocol):
    """One role's handling of a connection's requests after the handshake."""

    #: the role named in ``hello`` ("client", "monitor", "ha-peer", "peer-link")
    role: str

    def opened(self) -> None:
        """The welcome went out: first frames of the role (e.g. an HA heartbeat)."""

    def handle(self, event: ev.Event, now: float) -> None:
        """Run one request (a frame the protocol classes as a request)."""

    def drained(self, pending: int) -> None:
        """The writer sent a batch and fewer than ``LOW_WATER`` bytes still wait:
        ``pending`` of them (flow control)."""

    def closed(self, now: float) -> None:
        """The connection is gone: release what the endpoint holds. Called once."""

    def info(self) -> dict[str, Any] | None:
        """The endpoint's line in ``status`` ``connections`` (None: not listed)."""


def not_allowed(link: Link, event: ev.Event, where: str) -> None:
    """Answer a request the role does not take with 530 NOT_ALLOWED."""
    rid = getattr(event, "id", None)
    text = f"{event.METHOD!r} is not allowed on {where}"
    link.send(ev.Error(rid, ReplyCode.NOT_ALLOWED, text))
