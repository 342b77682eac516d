"""The node's journal, in-process: confirms wait for the disk, a restart brings the
durable state back, a disk error refuses (never confirms) what it did not store,
and a data dir serves one broker at a time."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import amqlite
from amqlite.config import load_config
from amqlite.errors import PublishNacked, ReplyCode
from amqlite.server import BrokerNode
from amqlite.store import StoreLocked
from amqlite.store.journal import Journal
from tests.store.support import TestLayer
from tests.waiting import wait_until


def config(data_dir: Path, **overrides: Any) -> Any:
    return load_config(
        overrides={
            "server.host": "127.0.0.1",
            "server.port": 0,
            "server.data_dir": str(data_dir),
            **overrides,
        }
    )


@asynccontextmanager
async def running(
    data_dir: Path, layer: TestLayer | None = None, **overrides: Any
) -> AsyncIterator[BrokerNode]:
    node = BrokerNode(config(data_dir, **overrides), file_layer=layer)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        try:
            yield node
        finally:
            node.stop()


def addr(node: BrokerNode) -> str:
    return f"127.0.0.1:{node.port}"


async def test_gathered_marks_reach_the_disk_with_the_next_commit(tmp_path: Path) -> None:
    """A standalone node gathers delivery marks and acks and has them appended just
    before each commit (``Recorder.gather_marks``): they are in the files without a
    close, so a ``kill -9`` after that commit loses neither."""
    data = tmp_path / "data"
    async with running(data) as node, amqlite.connect(addr(node)) as conn:
        await conn.declare_queue("q", durable=True)
        for i in range(3):
            await conn.publish("", "q", f"p{i}", persistent=True, confirm=True)
        acked = await conn.get("q")
        assert acked is not None
        await acked.ack()
        held = await conn.get("q")  # delivered, never acked
        assert held is not None
        storage = node.storage
        assert storage is not None and storage.journal is not None
        recorder = node.broker.recorder
        assert recorder is not None
        journal = storage.journal
        await wait_until(  # the ack travels, then the committer runs
            lambda: (
                not recorder.marks_waiting
                and journal.committed >= journal.appended
                and journal.stats().live_messages == 2
            ),
            "the marks committed",
        )
        copy = tmp_path / "copy"  # the files as a kill -9 now would leave them
        copy.mkdir()
        for f in data.iterdir():
            if f.name.endswith(".log"):
                (copy / f.name).write_bytes(f.read_bytes())
        assert any(copy.iterdir())
    recovered = Journal(str(copy))
    try:
        state = recovered.recover().state
        got = [(m.record.body, m.redelivered) for m in state.messages("/", "q")]
    finally:
        recovered.close()
    assert got == [(b"p1", True), (b"p2", False)]


async def test_durable_state_survives_a_restart(tmp_path: Path) -> None:
    async with running(tmp_path) as node, amqlite.connect(addr(node)) as conn:
        await conn.declare_exchange("orders", "topic", durable=True)
        await conn.declare_queue("eu", durable=True)
        await conn.declare_queue("scratch")  # not durable: gone after the restart
        await conn.bind("eu", "orders", "eu.#")
        for i in range(10):
            await conn.publish("orders", "eu.fr", f"p{i}", persistent=True, confirm=True)
        await conn.publish("orders", "eu.fr", "transient", confirm=True)
        got = await conn.get("eu")
        assert got is not None and got.body == b"p0"
        await got.ack()
        held = await conn.get("eu")  # delivered, never acked
        assert held is not None and held.body == b"p1"
    async with running(tmp_path) as node, amqlite.connect(addr(node)) as conn:
        info = await conn.declare_queue("eu", passive=True)
        assert info.messages == 9  # p1..p9; the transient one is gone
        bodies = []
        while (d := await conn.get("eu", no_ack=True)) is not None:
            bodies.append((d.body, d.redelivered))
        assert bodies == [(b"p1", True)] + [(f"p{i}".encode(), False) for i in range(2, 10)]
        with pytest.raises(amqlite.NotFound):
            await conn.declare_queue("scratch", passive=True)
        await conn.publish("orders", "eu.de", "after", persistent=True, confirm=True)
        assert (await conn.get("eu", no_ack=True)).body == b"after"  # type: ignore[union-attr]


class SlowDisk(TestLayer):
    """fsync blocks until the test lets it go."""

    def __init__(self) -> None:
        super().__init__(hook=self._hook)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()

    def _hook(self, op: str, path: str) -> None:
        if op == "fsync" and not self.gate.is_set():
            self.waiting.set()
            self.gate.wait(10)


@pytest.mark.parametrize("policy", ["always", "batch"])
async def test_a_confirm_waits_for_the_fsync_that_covers_it(tmp_path: Path, policy: str) -> None:
    disk = SlowDisk()
    async with (
        running(tmp_path, disk, **{"storage.fsync": policy}) as node,
        amqlite.connect(addr(node)) as conn,
    ):
        await conn.declare_queue("q", durable=True)
        await conn.publish("", "q", "transient", confirm=True)  # no fsync involved
        disk.gate.clear()
        pending = await conn.publish_nowait("", "q", "persistent", persistent=True)
        await trio.to_thread.run_sync(disk.waiting.wait, 10)
        with trio.move_on_after(0.2):
            await pending.wait()
            pytest.fail("confirmed before the fsync finished")
        fsyncs = disk.ops["fsync"]
        disk.gate.set()
        with trio.fail_after(10):
            await pending.wait()
        assert disk.ops["fsync"] >= fsyncs


async def test_a_declaration_ok_waits_for_the_disk_too(tmp_path: Path) -> None:
    disk = SlowDisk()
    async with running(tmp_path, disk) as node, amqlite.connect(addr(node)) as conn:
        disk.gate.clear()
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def declare() -> None:
                await conn.declare_queue("d", durable=True)
                done.set()

            nursery.start_soon(declare)
            await trio.to_thread.run_sync(disk.waiting.wait, 10)
            assert not done.is_set()
            disk.gate.set()
        assert done.is_set()


class FullDisk(TestLayer):
    """Writes fail with ENOSPC while ``full`` is set."""

    def __init__(self) -> None:
        super().__init__(hook=self._hook)
        self.full = False

    def _hook(self, op: str, path: str) -> None:
        if self.full and op in ("write", "fsync"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def test_disk_full_refuses_what_it_did_not_store_and_recovers(tmp_path: Path) -> None:
    disk = FullDisk()
    async with running(tmp_path, disk) as node, amqlite.connect(addr(node)) as conn:
        await conn.declare_queue("q", durable=True)
        await conn.publish("", "q", "stored", persistent=True, confirm=True)
        disk.full = True
        with pytest.raises(PublishNacked) as refused:
            await conn.publish("", "q", "lost", persistent=True, confirm=True)
        assert refused.value.code == ReplyCode.RESOURCE_ERROR
        assert "disk full" in refused.value.text
        # reads and transient traffic carry on
        await conn.publish("", "q", "transient", confirm=True)
        status = await conn.status()
        assert status["storage"]["write_errors"] >= 1
        assert "No space left" in status["storage"]["last_error"]
        disk.full = False
        await conn.publish("", "q", "stored again", persistent=True, confirm=True)
        status = await conn.status()
        assert status["storage"]["last_error"] is None
    async with running(tmp_path) as node, amqlite.connect(addr(node)) as conn:
        bodies = []
        while (d := await conn.get("q", no_ack=True)) is not None:
            bodies.append(d.body)
        # "lost" may or may not be back (it was nacked, never confirmed); what was
        # confirmed is there, in order
        assert [b for b in bodies if b != b"lost"] == [b"stored", b"stored again"]


async def test_a_second_broker_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    async with running(tmp_path):
        node = BrokerNode(config(tmp_path))
        with pytest.raises(BaseExceptionGroup) as caught:
            await node.run()
        (exc,) = caught.value.exceptions
        assert isinstance(exc, StoreLocked)
        assert f"in use by pid {os.getpid()}" in str(exc)


async def test_status_shows_the_journal(tmp_path: Path) -> None:
    async with running(tmp_path, **{"storage.fsync": "always"}) as node:
        async with amqlite.connect(addr(node)) as conn:
            await conn.declare_queue("q", durable=True)
            await conn.declare_queue("t")
            for _ in range(3):
                await conn.publish("", "q", "x", persistent=True, confirm=True)
            await conn.publish("", "t", "x", persistent=True, confirm=True)
            status = await conn.status()
        storage = status["storage"]
        assert storage["persist"] is True
        assert storage["data_dir"] == str(tmp_path)
        assert storage["fsync"] == "always"
        assert storage["segments"] == 1
        assert storage["journal_bytes"] > 0
        assert storage["live_messages"] == 3
        # each confirm followed a commit (fsync always); a commit covers one record or more
        assert 1 <= storage["commits"] <= storage["appended"]
        queues = {q["name"]: q for q in status["vhosts"][0]["queues"]}
        assert queues["q"]["persistent"] == 3
        assert queues["t"]["persistent"] == 0


async def test_in_memory_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with (
        running(tmp_path / "unused", **{"storage.persist": False}) as node,
        amqlite.connect(addr(node)) as conn,
    ):
        await conn.declare_queue("q", durable=True)
        await conn.publish("", "q", "x", persistent=True, confirm=True)
        status = await conn.status()
    assert status["storage"] == {"persist": False}
    assert os.listdir(tmp_path) == []


async def test_consuming_recovered_messages_gets_them_all(tmp_path: Path) -> None:
    """A consume that starts pushing journaled messages at once records their first
    delivery; its ok must still come before the pushes (it is not held)."""
    async with running(tmp_path) as node, amqlite.connect(addr(node)) as conn:
        await conn.declare_queue("jobs", durable=True)
        for i in range(5):
            await conn.publish("", "jobs", f"job {i}", persistent=True, confirm=True)
    async with running(tmp_path) as node, amqlite.connect(addr(node)) as conn:
        consumer = await conn.consume("jobs", prefetch=10)
        got = []
        with trio.fail_after(10):
            async for d in consumer:
                got.append(d.body)
                await d.ack()
                if len(got) == 5:
                    break
        assert got == [f"job {i}".encode() for i in range(5)]
