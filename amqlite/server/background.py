"""A broker node running in a thread of its own, for synchronous programs.

Spark's tests and benchmarks (and a notebook) are plain synchronous code: they
cannot ``nursery.start`` a node. :class:`BackgroundNode` runs a
:class:`~amqlite.server.BrokerNode` under its own ``trio.run`` in a daemon thread,
on 127.0.0.1 and a free port unless told otherwise, and stops it gracefully.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from amqlite.client import Connection, connect
from amqlite.config import load_config

from .node import BrokerNode


class BackgroundNode:
    """A BrokerNode on 127.0.0.1 (a free port) in a thread of its own; ``overrides``
    are config keys (``"storage.persist": False``)."""

    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        self.config = load_config(
            overrides={
                "server.host": "127.0.0.1",
                "server.port": 0,
                "server.data_dir": str(data_dir),
                **overrides,
            }
        )
        self.node = BrokerNode(self.config)
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self) -> BackgroundNode:
        ready: queue.Queue[int | BaseException] = queue.Queue()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                ready.put(await nursery.start(self.node.run))

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:
                ready.put(exc)

        self._thread = threading.Thread(target=run, name="amqlite-node", daemon=True)
        self._thread.start()
        got = ready.get(timeout=30)
        if isinstance(got, BaseException):
            raise got
        self.port = got
        return self

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._token is not None:
            trio.from_thread.run_sync(self.node.stop, trio_token=self._token)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def call(self, fn: Callable[[Connection], Awaitable[Any]]) -> Any:
        """Run ``await fn(conn)`` on a fresh client connection (from a sync test)."""

        async def run() -> Any:
            async with connect(self.servers, reconnect=False) as conn:
                return await fn(conn)

        return trio.run(run)
