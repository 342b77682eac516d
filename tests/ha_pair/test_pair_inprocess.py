"""An HA pair in one process: who becomes active, replication, failover, fencing."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

import amqlite
import amqlite.server.ha as ha_service
from amqlite.config import load_config
from amqlite.ha import SendHeartbeat
from amqlite.server import BrokerNode
from amqlite.store import StoredMessage
from tests.waiting import wait_until


def pair_config(tmp_path: Path, role: str) -> object:
    return load_config(
        overrides={
            "server.host": "127.0.0.1",
            "server.port": 0,
            "server.data_dir": str(tmp_path / role),
            "cluster.role": role,
            "cluster.heartbeat_ms": 50,
            "cluster.failover_timeout_ms": 300,
        }
    )


def slow_commits(tmp_path: Path, role: str) -> object:
    """:func:`pair_config` with ``fsync = "batch"`` and a batch wait (60 s) far past
    any test's bound: a commit comes only when something wants it now."""
    c = pair_config(tmp_path, role)
    slow = dataclasses.replace(c.storage, fsync="batch", batch_ms=60_000.0)  # type: ignore[attr-defined]
    return dataclasses.replace(c, storage=slow)  # type: ignore[type-var]


async def wait_for(predicate: Callable[[], bool], deadline: float = 10.0) -> None:
    await wait_until(predicate, deadline=deadline)


def point_at_each_other(primary: BrokerNode, backup: BrokerNode) -> None:
    for node in (primary, backup):
        assert node.ha is not None
        node.ha.config = dataclasses.replace(
            node.ha.config,
            primary_peer=f"127.0.0.1:{primary.port}",
            backup_peer=f"127.0.0.1:{backup.port}",
        )
        node.cluster_addresses = node.ha.config.addresses


def backup_messages(node: BrokerNode, queue: str) -> Callable[[], list[StoredMessage]]:
    """What a passive node holds of ``queue``: its journal's state (the broker of a
    passive node follows the topology only, docs/ha.md)."""

    def held() -> list[StoredMessage]:
        assert node.storage is not None and node.storage.journal is not None
        return node.storage.journal.state.messages("/", queue)

    return held


async def test_pair_elects_replicates_and_fails_over(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        primary = BrokerNode(pair_config(tmp_path, "primary"))  # type: ignore[arg-type]
        backup = BrokerNode(pair_config(tmp_path, "backup"))  # type: ignore[arg-type]
        primary_scope = trio.CancelScope()

        async def run_primary() -> None:
            with primary_scope:
                await primary.run()

        await nursery.start(backup.run)
        async with trio.open_nursery() as inner:
            inner.start_soon(run_primary)
            await wait_for(lambda: primary.port != 0)
            point_at_each_other(primary, backup)
            await wait_for(lambda: primary.state == "active" and backup.state == "passive")
            servers = f"127.0.0.1:{primary.port},127.0.0.1:{backup.port}"
            async with amqlite.connect(servers, reconnect=False) as conn:
                assert conn.server_state == "active"
                await conn.declare_queue("jobs", durable=True)
                for i in range(20):
                    await conn.publish("", "jobs", f"m{i}", persistent=True, confirm=True)
                got = await conn.get("jobs")
                assert got is not None
                await got.ack()
            assert backup.ha is not None and backup.ha.syncs_received > 0
            # the passive node holds the replicated queue: its journal's state (its
            # broker follows the topology; the messages are queued at takeover)
            held = backup_messages(backup, "jobs")
            await wait_for(lambda: len(held()) == 19)
            # its broker follows the syncs folded, at the latest FOLD_IDLE after the last
            # one (docs/ha.md, "The lazy fold"); its status is read folded
            await wait_for(lambda: "jobs" in backup.broker.vhost("/").queues)  # type: ignore[union-attr]
            primary_scope.cancel()  # the master dies
        # a client asking the backup makes it take over once the primary is silent
        async with amqlite.connect(f"127.0.0.1:{backup.port}", connect_timeout=5) as conn:
            assert backup.state == "active"
            bodies = []
            while (d := await conn.get("jobs", no_ack=True)) is not None:
                bodies.append(d.body)
            assert bodies == [f"m{i}".encode() for i in range(1, 20)]
        backup.stop()


async def test_an_idle_node_ticks_at_its_heartbeat_not_in_a_busy_loop(tmp_path: Path) -> None:
    """The HA ticker sleeps until the machine's next deadline (a node whose peer is
    gone once spun at 100% CPU, the ticker waking itself after every tick)."""
    async with trio.open_nursery() as nursery:
        node = BrokerNode(pair_config(tmp_path, "primary"))  # type: ignore[arg-type]
        assert node.ha is not None
        with socket.socket() as s:  # a loopback port nobody listens on: the peer is gone
            s.bind(("127.0.0.1", 0))
            gone = f"127.0.0.1:{s.getsockname()[1]}"
        node.ha.config = dataclasses.replace(node.ha.config, backup_peer=gone)
        await nursery.start(node.run)
        ha = node.ha
        assert ha is not None and ha.machine is not None
        machine = ha.machine
        ticks = heartbeats = 0
        ten_sent = trio.Event()
        real_tick = machine.tick

        def counting_tick(now: float) -> list[object]:
            nonlocal ticks, heartbeats
            ticks += 1
            actions = real_tick(now)
            heartbeats += sum(isinstance(a, SendHeartbeat) for a in actions)
            if heartbeats >= 10:
                ten_sent.set()
            return actions

        machine.tick = counting_tick  # type: ignore[method-assign]
        with trio.fail_after(10):  # the window measured: ten heartbeats of 50 ms
            await ten_sent.wait()
        node.stop()
    # a heartbeat is due every tick or two (the silence report takes one more)
    assert 10 <= ticks <= 25, ticks


async def test_a_journal_turn_reaches_the_passive_node_in_one_sync(tmp_path: Path) -> None:
    """The records of one journal turn (a peering batch and the mark that covers it)
    are never split between two ha.syncs, even when they outgrow a chunk: a master
    killed between two would leave its successor half of the turn."""
    from amqlite.broker import Message
    from amqlite.ha import SYNC_CHUNK

    async with trio.open_nursery() as nursery:
        primary = BrokerNode(pair_config(tmp_path, "primary"))  # type: ignore[arg-type]
        backup = BrokerNode(pair_config(tmp_path, "backup"))  # type: ignore[arg-type]
        await nursery.start(backup.run)
        await nursery.start(primary.run)
        point_at_each_other(primary, backup)
        await wait_for(lambda: primary.state == "active" and backup.state == "passive")
        assert primary.ha is not None and backup.ha is not None
        await wait_for(lambda: primary.ha is not None and primary.ha.replicating)
        session = primary.broker.open_session()
        session.declare_queue("turns", durable=True)
        storage = primary.storage
        assert storage is not None
        uptos: list[int] = []
        real_on_sync = backup.ha.on_sync

        def on_sync(sync: object, conn: object) -> None:
            uptos.append(sync.upto)  # type: ignore[attr-defined]
            real_on_sync(sync, conn)  # type: ignore[arg-type]

        backup.ha.on_sync = on_sync  # type: ignore[method-assign]
        body = b"x" * (SYNC_CHUNK // 4)
        storage.hold()
        first = storage.appended + 1
        for _ in range(10):  # 2.5 chunks in one turn
            session.publish(Message("", "turns", body, None, {"persistent": True}), now=0)
        last = storage.appended
        storage.release()
        held = backup_messages(backup, "turns")
        await wait_for(lambda: len(held()) == 10)
        assert last - first == 9
        assert not [u for u in uptos if first <= u < last], uptos  # no sync ends inside it
        assert last in uptos
        primary.stop()
        backup.stop()


async def test_both_nodes_commit_as_a_sync_goes_out_not_after_the_batch_wait(
    tmp_path: Path,
) -> None:
    """``fsync = "batch"`` with a batch wait far past the test's bound: a persistent
    publish is still committed on both nodes at once. In a pair a confirm waits for
    both commits; the passive node's starts as the sync arrives (``after_commit``),
    the active node's as the sync goes out (``commit_now``), not after the wait."""
    from amqlite.broker import Message

    async with trio.open_nursery() as nursery:
        primary = BrokerNode(slow_commits(tmp_path, "primary"))  # type: ignore[arg-type]
        backup = BrokerNode(slow_commits(tmp_path, "backup"))  # type: ignore[arg-type]
        await nursery.start(backup.run)
        await nursery.start(primary.run)
        point_at_each_other(primary, backup)
        await wait_for(lambda: primary.state == "active" and backup.state == "passive")
        await wait_for(lambda: primary.ha is not None and primary.ha.replicating)
        storage, passive = primary.storage, backup.storage
        assert storage is not None and storage.journal is not None
        assert passive is not None and passive.journal is not None
        session = primary.broker.open_session()
        session.declare_queue("soon", durable=True)
        session.publish(Message("", "soon", b"x", None, {"persistent": True}), now=0)
        position = storage.appended
        journal, passive_journal = storage.journal, passive.journal
        # (60 s of batch wait against a 10 s bound)
        await wait_for(lambda: passive_journal.committed >= position)
        await wait_for(lambda: journal.committed >= position)
        primary.stop()
        backup.stop()


async def test_a_takeover_from_a_master_back_from_a_quick_restart_flags_every_message(
    tmp_path: Path,
) -> None:
    """The master gathers its delivery marks until its next commit (here a batch
    wait far past the test), so the passive node has not heard of three deliveries
    when the master dies. Back before anyone votes it dead, the master announces
    itself starting and the passive node takes over (``peer_primary``, no
    ``ha.handover``): every ready message comes flagged ``redelivered``, the three
    handed out among them (docs/ha.md, "Takeover flags what may have been seen")."""

    async with trio.open_nursery() as nursery:
        primary = BrokerNode(slow_commits(tmp_path, "primary"))  # type: ignore[arg-type]
        backup = BrokerNode(slow_commits(tmp_path, "backup"))  # type: ignore[arg-type]
        primary_scope = trio.CancelScope()
        primary_gone = trio.Event()

        async def run_primary() -> None:
            try:
                with primary_scope:
                    await primary.run()
            finally:
                primary_gone.set()

        await nursery.start(backup.run)
        nursery.start_soon(run_primary)
        await wait_for(lambda: primary.port != 0)
        point_at_each_other(primary, backup)
        await wait_for(lambda: primary.state == "active" and backup.state == "passive")
        await wait_for(lambda: primary.ha is not None and primary.ha.replicating)
        held = backup_messages(backup, "seen")
        with trio.CancelScope() as client_scope:
            async with amqlite.connect(f"127.0.0.1:{primary.port}", reconnect=False) as conn:
                await conn.declare_queue("seen", durable=True)
                for i in range(6):
                    await conn.publish("", "seen", f"m{i}", persistent=True, confirm=True)
                consumer = await conn.consume("seen", prefetch=3)
                got = []
                with trio.fail_after(10):
                    async for d in consumer:
                        got.append(d)
                        if len(got) == 3:
                            break
                assert [d.body for d in got] == [b"m0", b"m1", b"m2"]
                assert not any(d.redelivered for d in got)
                # the passive node holds all six and knows of no delivery
                await wait_for(lambda: len(held()) == 6)
                assert not any(m.redelivered for m in held())
                primary_scope.cancel()  # the master dies, its deliveries unacked
                await primary_gone.wait()
                client_scope.cancel()
        again = BrokerNode(slow_commits(tmp_path, "primary"))  # type: ignore[arg-type]
        nursery.start_soon(again.run)
        await wait_for(lambda: again.port != 0)
        point_at_each_other(again, backup)
        await wait_for(lambda: backup.state == "active" and again.state == "passive")
        async with amqlite.connect(f"127.0.0.1:{backup.port}", reconnect=False) as conn:
            seen = {}
            while (d := await conn.get("seen", no_ack=True)) is not None:
                seen[d.body] = d.redelivered
        assert seen == {f"m{i}".encode(): True for i in range(6)}
        again.stop()
        backup.stop()


async def test_a_takeover_folds_the_syncs_journaled_unfolded_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The passive node journals syncs unfolded (docs/ha.md, "The lazy fold"); the
    node that takes over folds them before it serves: the messages, the queue and the
    publish keys of syncs never folded are there."""
    monkeypatch.setattr(ha_service, "FOLD_IDLE", 3600.0)  # only the takeover folds
    async with trio.open_nursery() as nursery:
        primary = BrokerNode(pair_config(tmp_path, "primary"))  # type: ignore[arg-type]
        backup = BrokerNode(pair_config(tmp_path, "backup"))  # type: ignore[arg-type]
        primary_scope = trio.CancelScope()

        async def run_primary() -> None:
            with primary_scope:
                await primary.run()

        await nursery.start(backup.run)
        async with trio.open_nursery() as inner:
            inner.start_soon(run_primary)
            await wait_for(lambda: primary.port != 0)
            point_at_each_other(primary, backup)
            await wait_for(lambda: primary.state == "active" and backup.state == "passive")
            await wait_for(lambda: primary.ha is not None and primary.ha.replicating)
            servers = f"127.0.0.1:{primary.port},127.0.0.1:{backup.port}"
            async with amqlite.connect(servers) as conn:  # reconnecting: publish keys
                await conn.declare_queue("jobs", durable=True)
                for i in range(20):  # each confirm follows the passive node's commit
                    await conn.publish("", "jobs", f"m{i}", persistent=True, confirm=True)
                for _ in range(10):  # these keys are in no message the journal holds
                    got = await conn.get("jobs")
                    assert got is not None
                    await got.ack()
            assert primary.storage is not None and backup.ha is not None
            await wait_for(lambda: len(backup_messages(primary, "jobs")()) == 10)
            follower = backup.ha.follower
            await wait_for(lambda: follower.holds_upto >= primary.storage.appended)  # type: ignore[union-attr]
            assert backup.storage is not None and backup.storage.journal is not None
            assert backup.storage.journal.unfolded_bytes > 0  # journaled, not folded
            assert "jobs" not in backup.broker.vhost("/").queues  # type: ignore[union-attr]
            primary_scope.cancel()  # the master dies
        async with amqlite.connect(f"127.0.0.1:{backup.port}", connect_timeout=5) as conn:
            assert backup.state == "active"
            bodies = []
            while (d := await conn.get("jobs", no_ack=True)) is not None:
                bodies.append(d.body)
            assert bodies == [f"m{i}".encode() for i in range(10, 20)]
            keys = backup.broker.vhost("/").publish_keys  # type: ignore[union-attr]
            assert len(keys) == 20  # a publish sent again is recognised, acked or not
        backup.stop()
