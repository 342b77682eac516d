"""The link connections of exchange peering: what the service writes on, and the
dialer's side of a connection (:func:`amqlite.link.dial` with role
``peer-link``, then ``peer`` frames both ways on a FramedLink).

The service sees a connection only through :class:`LinkConnection` (send an
encoded peering map or a map, close) and, on the dialer's side, through
:meth:`DialedLink.run` (which hands every received peering map to a callback and
returns why the connection ended). The accepting side rides on ordinary server
connections (:class:`AcceptedConnection`, implemented by the server's connection
shell), which hand their ``peer`` frames to ``PeeringService.on_frame``.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable
from typing import Any, Protocol

import structlog
import trio

from amqlite.errors import AmqliteError, ProtocolError
from amqlite.link import DialFailed, FramedLink, dial
from amqlite.peering import Address
from amqlite.protocol import events as ev

log = structlog.get_logger("amqlite.peering")


class LinkConnection(Protocol):
    """One link end's connection, dialed or accepted: what the service writes on."""

    def send_map(self, msg: dict[str, Any]) -> None:
        """One ``peer`` frame holding the peering map ``msg``."""

    def send_peer(self, frame: bytes) -> None:
        """One ``peer`` frame holding ``frame``, already CBOR-encoded."""

    def close(self, reason: str) -> None:
        """The link moved on (or a newer connection replaced this one)."""

    @property
    def tls(self) -> bool:
        """The connection runs over TLS."""


class AcceptedConnection(LinkConnection, Protocol):
    """A server connection opened with ``hello`` role ``peer-link``."""

    @property
    def vhost(self) -> str: ...

    @property
    def user(self) -> str: ...

    @property
    def remote_address(self) -> str: ...

    def may_peer(self, exchange: str) -> bool:
        """May the connection's user publish to and read from ``exchange``?"""

    def constraint_refusal(self, exchange: str) -> str | None:
        """Why a role constraint stops the connection's user from peering with
        ``exchange`` (send and subscribe), or None."""

    def close_from_server(self, code: int, text: str) -> None:
        """Close with ``code`` and ``text`` (a refusal)."""


class DialedLink:
    """The dialer's side of one link connection: a :class:`~amqlite.link.FramedLink`
    opened by :func:`~amqlite.link.dial` and its reader (:meth:`run`). No
    ``heartbeat`` frames of its own: peering's ``peer.heartbeat`` maps keep it alive."""

    def __init__(
        self, name: str, *, max_frame_size: int, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.name = name  # the link id, for the log
        self._max_frame_size = max_frame_size
        self._tls = ssl_context  # dial over TLS (the remote verified by its host name)
        self.tls = ssl_context is not None
        self._link: FramedLink | None = None  # once welcomed
        self._cancel_scope = trio.CancelScope()  # the dial, before there is a link

    def send_map(self, msg: dict[str, Any]) -> None:
        link = self._link
        if link is not None:
            with contextlib.suppress(AmqliteError):
                link.send(ev.PeerMessage(msg))

    def send_peer(self, frame: bytes) -> None:
        link = self._link
        if link is not None:
            with contextlib.suppress(AmqliteError):
                link.send_bytes(link.proto.send_peer(frame))

    def close(self, reason: str) -> None:
        """Stop :meth:`run` wherever it is (dialing, in the hello, serving)."""
        if self._link is not None:
            self._link.abort()
        else:
            self._cancel_scope.cancel()

    async def run(
        self,
        address: Address,
        hello: ev.Hello,
        *,
        timeout: float,  # noqa: ASYNC109 (the link's connect timeout: a DialFailed naming it)
        opened: Callable[[], bool],
        received: Callable[[dict[str, Any], float], None],
    ) -> str:
        """Connect to ``address`` and say ``hello`` within ``timeout`` seconds; once
        welcomed, call ``opened()`` (False: the link does not want this connection
        any more, stop) and then hand every received peering map to
        ``received(map, now)`` until the connection ends. Returns why it ended;
        never raises for a failed or broken connection (nor for a bug in a
        callback: that costs this connection only)."""
        reason = "connection closed"
        with self._cancel_scope:
            try:
                link, _ = await dial(
                    address.host,
                    address.port,
                    hello,
                    max_frame_size=self._max_frame_size,
                    timeout=timeout,
                    ssl_context=self._tls,
                )
            except DialFailed as exc:
                if exc.refused:
                    return f"{address} refused the link: {exc.code} {exc.text}"
                return f"{address}: {exc.text}"
            self._link = link
            try:
                if not opened():
                    await link.aclose()
                    return reason

                async def reader() -> None:
                    nonlocal reason
                    reason = await self._read(link, address, received)

                await link.run(reader)
                if link.error is not None:
                    reason = link.error.text
            except Exception as exc:  # a bug costs this connection, never the node
                log.error("peering_link_crashed", link=self.name, exc_info=exc)
                await link.aclose()
                reason = f"internal error: {exc!r}"
        return reason

    @staticmethod
    async def _read(
        link: FramedLink, address: Address, received: Callable[[dict[str, Any], float], None]
    ) -> str:
        events = link.proto.events
        while True:
            now = trio.current_time()  # once per read: a run of frames arrived at once
            try:
                batch = events()
            except ProtocolError as exc:
                return f"protocol error from {address}: {exc.text}"
            for event in batch:
                if isinstance(event, ev.PeerMessage):
                    received(event.msg, now)
                elif isinstance(event, ev.Close):
                    return f"the remote closed the connection: {event.code} {event.text}"
                elif isinstance(event, ev.EndOfStream):
                    return "the remote closed the connection"
            if not await link.receive() and link.dead:
                return "the connection broke"  # link.error says how
