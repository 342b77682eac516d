"""A small WebSocket client for the browser channel's tests (wsproto over trio)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    RejectConnection,
    Request,
    TextMessage,
)


class Rejected(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"WebSocket refused with HTTP {status}")
        self.status = status


class WsClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.frames: list[Any] = []
        self.closed: int | None = None
        self._text: list[str] = []
        self._binary: list[bytes] = []

    @classmethod
    async def connect(cls, port: int, origin: str | None = None) -> WsClient:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        client = cls(stream)
        headers = [(b"origin", origin.encode())] if origin else []
        await client._send(
            client.ws.send(Request(host=f"127.0.0.1:{port}", target="/ws", extra_headers=headers))
        )
        while True:
            for event in await client._events():
                if isinstance(event, AcceptConnection):
                    return client
                if isinstance(event, RejectConnection):
                    await stream.aclose()
                    raise Rejected(event.status_code)

    async def _send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _events(self) -> list[Any]:
        data = await self.stream.receive_some(65536)
        self.ws.receive_data(data or None)
        return list(self.ws.events())

    async def send(self, value: Any) -> None:
        await self._send(self.ws.send(TextMessage(json.dumps(value))))

    async def send_text(self, text: str) -> None:
        await self._send(self.ws.send(TextMessage(text)))

    async def send_bytes(self, data: bytes) -> None:
        await self._send(self.ws.send(BytesMessage(data)))

    async def recv(self) -> Any:
        """The next frame (arrays of frames are split); None once closed."""
        while not self.frames:
            if self.closed is not None:
                return None
            for event in await self._events():
                if isinstance(event, Message):
                    if isinstance(event, TextMessage):
                        self._text.append(event.data)
                        if event.message_finished:
                            value = json.loads("".join(self._text))
                            self._text.clear()
                            self.frames.extend(value if isinstance(value, list) else [value])
                elif isinstance(event, CloseConnection):
                    self.closed = event.code
                    with contextlib.suppress(Exception):
                        await self._send(self.ws.send(event.response()))
                    return None if not self.frames else self.frames.pop(0)
            if self.ws.state.name == "CLOSED" and not self.frames:
                return None
        return self.frames.pop(0)

    async def recv_until(self, method: str) -> Any:
        while True:
            frame = await self.recv()
            if frame is None or frame.get("m") == method:
                return frame

    async def hello(self, login: str = "guest", password: str = "guest") -> Any:
        await self.send({"m": "hello", "id": 1, "login": login, "password": password})
        return await self.recv()

    async def aclose(self) -> None:
        await self.stream.aclose()
