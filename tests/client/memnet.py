"""An in-memory network of fake brokers, for reconnect tests on a virtual clock.

``MemoryNetwork.install(monkeypatch)`` makes the client dial through it: each
``host:port`` maps to a :class:`FakeBroker` (a fresh in-memory stream per dial,
served in the test's nursery) or to nothing (the dial fails with "connection
refused"). Every dial is recorded with its virtual time.
"""

from __future__ import annotations

import errno

import pytest
import trio
import trio.testing

from amqlite.client import dial

from .fakeserver import FakeBroker


class MemoryNetwork:
    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.nodes: dict[int, FakeBroker | None] = {}
        self.dials: list[tuple[float, int]] = []  # (virtual time, port)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(dial, "open_stream", self.open_stream)

    def node(self, port: int, broker: FakeBroker | None) -> FakeBroker | None:
        """Put ``broker`` at ``port`` (None: nothing listens there)."""
        self.nodes[port] = broker
        return broker

    async def open_stream(self, host: str, port: int) -> trio.abc.Stream:
        self.dials.append((trio.current_time(), port))
        await trio.lowlevel.checkpoint()
        broker = self.nodes.get(port)
        if broker is None:
            raise OSError(errno.ECONNREFUSED, "Connection refused")
        client_end, server_end = trio.testing.memory_stream_pair()
        self._nursery.start_soon(broker.handle_stream, server_end)
        return client_end

    async def cut(self, port: int, *, down: bool = True) -> None:
        """Hang up on every client of the broker at ``port``; with ``down`` it stops
        answering dials too."""
        broker = self.nodes.get(port)
        if down:
            self.nodes[port] = None
        if broker is not None:
            await broker.drop_all()

    def passes(self, first_port: int) -> list[float]:
        """When each pass through the server list began (a dial of its first address)."""
        return [t for t, p in self.dials if p == first_port]
