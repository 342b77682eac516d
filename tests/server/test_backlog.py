"""Backlogs on disk, in-process: a restart queues the journaled messages by id
(bodies left in the journal), consumers get every one back exactly once, in order,
bodies intact, across a compaction that moves them, with transient messages
published meanwhile keeping their place."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio

import amqlite
from amqlite.broker import backlog as backlog_module
from amqlite.broker import queue as queue_module
from amqlite.store import MessageRef
from tests.server.test_storage import addr, running


def body(n: int) -> bytes:
    return b"%d:" % n + hashlib.sha256(b"%d" % n).hexdigest().encode() * 3


def check(raw: bytes) -> int:
    n = int(raw.split(b":", 1)[0])
    assert raw == body(n), f"body of message {n} damaged"
    return n


async def publish_all(conn: amqlite.Connection, numbers: range, *, persistent: bool) -> None:
    pending = [
        await conn.publish_nowait("", "jobs", body(n), persistent=persistent) for n in numbers
    ]
    with trio.fail_after(60):
        for p in pending:
            await p.wait()


async def test_a_restarted_backlog_comes_back_from_the_journal(tmp_path: Path) -> None:
    total = 3 * queue_module.HEAD
    async with running(tmp_path) as node, amqlite.connect(addr(node)) as conn:
        await conn.declare_queue("jobs", durable=True)
        await publish_all(conn, range(total), persistent=True)
        queue = node.broker.vhost("/").queues["jobs"]  # type: ignore[union-attr]
        assert queue.backlog is not None  # publishing far ahead of consumers pages
        assert queue.count() == total and len(queue.ready) == queue_module.HEAD
        for _ in range(100):  # take some before the restart
            got = await conn.get("jobs")
            assert got is not None
            await got.ack()
    async with running(tmp_path) as node, amqlite.connect(addr(node)) as conn:
        storage = node.storage
        assert storage is not None and storage.journal is not None
        journal = storage.journal
        refs = [r for r in journal.state.snapshot_refs() if isinstance(r, MessageRef)]
        assert len(refs) == total - 100
        assert all(r.record is None for r in refs)  # no body held by the journal's state
        queue = node.broker.vhost("/").queues["jobs"]  # type: ignore[union-attr]
        assert queue.backlog is not None and len(queue.ready) == 0
        # transient messages published now wait behind the backlog
        await publish_all(conn, range(total, total + 50), persistent=False)
        consumer = await conn.consume("jobs", prefetch=50)
        got: list[int] = []
        with trio.fail_after(60):
            async for d in consumer:
                got.append(check(d.body))
                await d.ack()
                if len(got) == total // 2:
                    await trio.to_thread.run_sync(journal.compact)  # moves every message
                if len(got) == total - 100 + 50:
                    break
        assert got == list(range(100, total + 50))
        assert queue.count() == 0 and queue.backlog is None
        assert storage.source.reads >= total - 100


async def test_a_backlog_in_chunks_is_written_out_again_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With chunks of 64, a backlog's middle is in the page file while it waits, and
    again once a restart has rebuilt it (the page file opens before the rebuild);
    consumers get every message once, in order, bodies intact, the chunks read back
    and dropped as they go."""
    monkeypatch.setattr(backlog_module, "CHUNK", 64)
    total = queue_module.HEAD + 20 * 64
    async with running(tmp_path) as node, amqlite.connect(addr(node)) as conn:
        await conn.declare_queue("jobs", durable=True)
        await publish_all(conn, range(total), persistent=True)
        assert node.pages is not None and node.pages.chunks >= 15
    async with running(tmp_path) as node, amqlite.connect(addr(node)) as conn:
        pages = node.pages
        assert pages is not None and pages.chunks >= 15  # written out by the rebuild
        assert list((tmp_path / "page").glob("page-*.bin"))
        queue = node.broker.vhost("/").queues["jobs"]  # type: ignore[union-attr]
        assert queue.backlog is not None and queue.backlog.spilled >= 15 * 64
        consumer = await conn.consume("jobs", prefetch=100)
        got: list[int] = []
        with trio.fail_after(60):
            async for d in consumer:
                got.append(check(d.body))
                await d.ack()
                if len(got) == total:
                    break
        assert got == list(range(total))
        assert queue.count() == 0 and pages.chunks == 0
