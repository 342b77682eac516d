"""A minimal client for server tests: a socket plus the sans-IO client protocol.

It lets tests speak the protocol frame by frame (including frames a real client
would never send) without depending on amqlite.client.
"""

from __future__ import annotations

from typing import Any

import trio

from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev


class RawClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.proto = Connection(Role.CLIENT)
        self._ids = 0

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def send(self, *events: ev.Event) -> None:
        await self.stream.send_all(b"".join(self.proto.send(e) for e in events))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> ev.Event:
        """The next event from the server (EndOfStream when it closed)."""
        while True:
            event = self.proto.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, ev.Event)
                return event
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            self.proto.receive_data(data)

    async def receive_until(self, cls: type[ev.Event]) -> ev.Event:
        while True:
            event = await self.receive()
            if isinstance(event, cls | ev.EndOfStream):
                return event

    async def handshake(
        self, login: str = "guest", password: str = "guest", vhost: str = "/"
    ) -> ev.Event:
        await self.send(ev.Hello(self.next_id(), vhost=vhost, login=login, password=password))
        return await self.receive()

    async def request(self, make: Any, **fields: Any) -> ev.Event:
        """Send ``make(id=..., **fields)`` and return the reply that answers it."""
        rid = self.next_id()
        await self.send(make(id=rid, **fields))
        while True:
            event = await self.receive()
            if getattr(event, "re", None) == rid or isinstance(event, ev.EndOfStream | ev.Close):
                return event

    async def aclose(self) -> None:
        await self.stream.aclose()


async def read_raw_until_closed(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes the socket."""
    chunks = []
    while True:
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)
