"""The link connections of exchange peering: what the service writes on, and the
dialer's side of a connection (dial, ``hello`` with role ``peer-link``, then
``peer`` frames both ways).

The service sees a connection only through :class:`LinkConnection` (send an
encoded peering map or a map, close) and, on the dialer's side, through
:meth:`DialedLink.run` (which hands every received peering map to a callback and
returns why the connection ended). The accepting side rides on ordinary server
connections (:class:`AcceptedConnection`, implemented by the server's connection
shell), which hand their ``peer`` frames to ``PeeringService.on_frame``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import structlog
import trio

from amqlite.errors import AmqliteError
from amqlite.peering import Address
from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev

log = structlog.get_logger("amqlite.peering")

RECEIVE_SIZE = 256 * 1024
_LINK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, AmqliteError)


class LinkConnection(Protocol):
    """One link end's connection, dialed or accepted: what the service writes on."""

    def send_map(self, msg: dict[str, Any]) -> None:
        """One ``peer`` frame holding the peering map ``msg``."""

    def send_peer(self, frame: bytes) -> None:
        """One ``peer`` frame holding ``frame``, already CBOR-encoded."""

    def close(self, reason: str) -> None:
        """The link moved on (or a newer connection replaced this one)."""


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

    def close_from_server(self, code: int, text: str) -> None:
        """Close with ``code`` and ``text`` (a refusal)."""


class _LinkFailed(Exception):
    """The dialed connection could not be opened or ended; ``args[0]`` says why."""


class DialedLink:
    """The dialer's side of one link connection: a protocol connection, its
    outgoing buffer and the tasks that read and write it (:meth:`run`)."""

    def __init__(self, name: str, *, max_frame_size: int) -> None:
        self.name = name  # the link id, for the log
        self._proto = Connection(Role.CLIENT, max_frame_size=max_frame_size)
        self._out = bytearray()
        self._wake = trio.Event()
        self._cancel_scope = trio.CancelScope()

    def send_map(self, msg: dict[str, Any]) -> None:
        with contextlib.suppress(AmqliteError):
            self._out += self._proto.send(ev.PeerMessage(msg))
            self._wake.set()

    def send_peer(self, frame: bytes) -> None:
        with contextlib.suppress(AmqliteError):
            self._out += self._proto.send_peer(frame)
            self._wake.set()

    def close(self, reason: str) -> None:
        """Cancel :meth:`run` wherever it is (connecting, in the hello, serving)."""
        self._cancel_scope.cancel()

    async def run(
        self,
        address: Address,
        hello: ev.Hello,
        *,
        opened: Callable[[], bool],
        received: Callable[[dict[str, Any], float], None],
    ) -> str:
        """Connect to ``address`` and say ``hello``; once welcomed, call ``opened()``
        (False: the link does not want this connection any more, stop) and then
        hand every received peering map to ``received(map, now)`` until the
        connection ends. Returns why it ended; never raises for a failed or broken
        connection (nor for a bug in a callback: that costs this connection only)."""
        reason = "connection closed"
        try:
            with self._cancel_scope:
                stream = await trio.open_tcp_stream(address.host, address.port)
                async with stream:
                    await self._hello(stream, hello, address)
                    if not opened():
                        return reason
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._writer, stream)
                        reason = await self._reader(stream, received)
                        nursery.cancel_scope.cancel()
        except* _LinkFailed as group:
            reason = str(group.exceptions[0])
        except* _LINK_ERRORS as group:
            reason = f"{address}: {type(group.exceptions[0]).__name__}: {group.exceptions[0]}"
        except* Exception as group:  # a bug costs this connection, never the node
            log.error("peering_link_crashed", link=self.name, exc_info=group)
            reason = f"internal error: {group.exceptions[0]!r}"
        return reason

    async def _hello(self, stream: trio.SocketStream, hello: ev.Hello, address: Address) -> None:
        await stream.send_all(self._proto.send(hello))
        reply = await self._handshake_reply(stream)  # the link's connect timeout bounds it
        if isinstance(reply, ev.Refused):
            raise _LinkFailed(f"{address} refused the link: {reply.code} {reply.text}")
        if not isinstance(reply, ev.Welcome):
            raise _LinkFailed(f"{address} answered hello with {reply.METHOD!r}")

    async def _handshake_reply(self, stream: trio.SocketStream) -> ev.Event:
        proto = self._proto
        while True:
            event = proto.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, ev.Event)
                if isinstance(event, ev.Heartbeat):
                    continue
                return event
            data = await stream.receive_some(RECEIVE_SIZE)
            proto.receive_data(data)
            if not data:
                raise _LinkFailed("the remote closed the connection during the handshake")

    async def _writer(self, stream: trio.SocketStream) -> None:
        while True:
            if not self._out:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            data, self._out = self._out, bytearray()
            await stream.send_all(data)

    async def _reader(
        self, stream: trio.SocketStream, received: Callable[[dict[str, Any], float], None]
    ) -> str:
        proto = self._proto
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            proto.receive_data(data)
            now = trio.current_time()  # once per read: a run of frames arrived at once
            while True:
                event = proto.next_event()
                if event is NEED_DATA:
                    break
                if isinstance(event, ev.PeerMessage):
                    received(event.msg, now)
                elif isinstance(event, ev.Close):
                    return f"the remote closed the connection: {event.code} {event.text}"
                elif isinstance(event, ev.EndOfStream):
                    return "the remote closed the connection"
            if not data:
                return "the remote closed the connection"
            await trio.lowlevel.checkpoint()
