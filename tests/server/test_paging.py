"""Paging transient messages to disk when memory is short (docs/storage.md,
"Backlogs on disk"): past the paging mark the queues' transient backlog moves to
the page file and publishers keep going; only when paging cannot bring memory
under the watermark are they blocked; nothing accepted is ever dropped.

The memory measurement is a model: a fixed base, plus the body bytes the queues
hold in memory (what paging frees), plus what a test adds that paging cannot free.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

import amqlite
from amqlite.broker.alarms import Resource
from amqlite.config import load_config
from amqlite.server import BrokerNode
from tests.waiting import wait_until

WATERMARK = 4_000_000
BASE = 500_000
BODY = 2_000


class ModelMemory:
    def __init__(self) -> None:
        self.node: BrokerNode | None = None
        self.unpageable = 0

    def __call__(self) -> int:
        held = 0
        if self.node is not None:
            for host in self.node.broker.all_vhosts():
                for queue in host.queues.values():
                    held += queue.ready_bytes
                    if queue.backlog is not None:
                        held += queue.backlog.held_bytes()
        return BASE + held + self.unpageable


@asynccontextmanager
async def node_with(memory: ModelMemory) -> AsyncIterator[BrokerNode]:
    config = load_config(
        overrides={
            "server.host": "127.0.0.1",
            "server.port": 0,
            "storage.persist": False,
            "limits.memory_high_watermark": WATERMARK,
        }
    )
    node = BrokerNode(config, memory_probe=memory)
    memory.node = node
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        try:
            yield node
        finally:
            node.stop()


async def wait_for(predicate: Callable[[], bool], deadline: float = 20.0) -> None:
    await wait_until(predicate, deadline=deadline)


def body(n: int) -> bytes:
    return (b"%08d" % n) * (BODY // 8)


async def test_transient_bodies_page_out_before_publishers_are_blocked() -> None:
    memory = ModelMemory()
    raised: list[frozenset[Resource]] = []
    async with node_with(memory) as node, amqlite.connect(f"127.0.0.1:{node.port}") as conn:
        on_change = node.alarms.on_change

        def watch(r: frozenset[Resource]) -> None:
            raised.append(r)
            on_change(r)

        node.alarms.on_change = watch
        await conn.declare_queue("t")
        count = 4 * WATERMARK // BODY  # four times what fits under the watermark
        for n in range(count):
            await conn.publish_nowait("", "t", body(n))
            if n % 200 == 199:  # let the sampler see the growth now and then
                await conn.declare_queue("t")
        await wait_for(lambda: node.broker.vhost("/").queues["t"].count() == count)  # type: ignore[union-attr]
        pages = node.pages
        assert pages is not None and pages.paged > 0 and pages.messages > 0
        # paging stops once memory is back, and starts again as messages pile up in
        # memory behind what waits on disk: the sampler keeps it under the watermark
        await wait_for(lambda: memory() < WATERMARK)
        assert raised == []  # paging kept up: nobody was blocked
        # now memory paging cannot free: publishers are blocked, consumers drain
        memory.unpageable = 2 * WATERMARK
        await wait_for(lambda: Resource.MEMORY in node.alarms.raised)
        got: list[int] = []
        # a blocked publisher's connection is not read: consume on another one
        async with amqlite.connect(f"127.0.0.1:{node.port}") as reader:
            consumer = await reader.consume("t", prefetch=100)
            with trio.fail_after(60):
                async for d in consumer:
                    assert d.body == body(int(d.body[:8])), "damaged body"
                    got.append(int(d.body[:8]))
                    await d.ack()
                    if len(got) == count:
                        break
        assert got == list(range(count))  # every one, in order, nothing dropped
        memory.unpageable = 0
        await wait_for(lambda: not node.alarms.raised and not node.alarms.paging)
        assert pages.messages == 0 and pages.status()["segments"] == 0


def test_without_a_data_dir_the_page_file_leaves_no_name_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An --in-memory node pages to unnamed files: a kill -9 leaves nothing in the
    temporary directory (it used to leave a directory per start)."""
    import tempfile

    from amqlite.broker import Message
    from amqlite.server.paging import PageFile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pages = PageFile(None)
    assert list(tmp_path.iterdir()) == []  # nothing made before a page goes out
    refs = pages.page_out([Message("", "q", b"x" * 100, {}, {"persistent": False})])
    assert list(tmp_path.iterdir()) == []  # the segment has no name
    [back] = pages.page_in(refs)
    assert back.body == b"x" * 100
    pages.close()
