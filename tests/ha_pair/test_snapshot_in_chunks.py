"""A backup that joins a primary holding more than one ``ha.sync`` chunk of state
receives the snapshot in chunks, applies it whole (a chunk at a time, in a task),
and then holds every message: after the primary dies it serves them all."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import trio

import amqlite
from amqlite.ha import SYNC_CHUNK
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode

from .test_pair_inprocess import pair_config, point_at_each_other, wait_for

BODY = b"x" * 4096
COUNT = (3 * SYNC_CHUNK) // len(BODY)  # three chunks and more


async def test_a_joining_backup_gets_a_snapshot_of_several_chunks(tmp_path: Path) -> None:
    primary = BrokerNode(pair_config(tmp_path, "primary"))  # type: ignore[arg-type]
    backup = BrokerNode(pair_config(tmp_path, "backup"))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        primary_scope, backup_scope = trio.CancelScope(), trio.CancelScope()

        async def run(node: BrokerNode, scope: trio.CancelScope) -> None:
            with scope:
                await node.run()

        nursery.start_soon(run, primary, primary_scope)
        nursery.start_soon(run, backup, backup_scope)
        await wait_for(lambda: primary.port != 0 and backup.port != 0)
        point_at_each_other(primary, backup)
        await wait_for(lambda: primary.state == "active" and backup.state == "passive")
        backup_scope.cancel()  # the backup goes away; the primary serves alone
        ha = primary.ha
        assert ha is not None
        await wait_for(lambda: not ha.replicating)
        async with amqlite.connect(f"127.0.0.1:{primary.port}", reconnect=False) as conn:
            await conn.declare_queue("jobs", durable=True)
            for i in range(COUNT):
                await conn.publish("", "jobs", BODY + b"%d" % i, persistent=True, confirm=True)
        backup = BrokerNode(pair_config(tmp_path, "backup"))  # type: ignore[arg-type]
        backup_scope = trio.CancelScope()
        nursery.start_soon(run, backup, backup_scope)  # it comes back: a snapshot
        await wait_for(lambda: backup.port != 0)
        point_at_each_other(primary, backup)
        storage = primary.storage
        assert storage is not None
        await wait_for(lambda: ha.replicating and ha.synced_upto >= storage.appended, 30)
        assert backup.ha is not None and backup.ha.syncs_received >= 4  # several chunks
        # the passive node holds them in its journal's state (its broker follows the
        # topology only; the messages are queued when it takes over)
        journal = backup.storage.journal  # type: ignore[union-attr]
        assert journal is not None and len(journal.state.messages("/", "jobs")) == COUNT
        primary_scope.cancel()  # the master dies; the backup takes over with everything
        with trio.fail_after(10):
            await primary.stopped.wait()
        async with amqlite.connect(f"127.0.0.1:{backup.port}", connect_timeout=5) as conn:
            assert backup.state == "active"
            got = 0
            while (d := await conn.get("jobs", no_ack=True)) is not None:
                assert d.body == BODY + b"%d" % got
                got += 1
            assert got == COUNT
        backup_scope.cancel()


async def test_a_backup_that_took_a_snapshot_before_it_was_passive_takes_over_with_it(
    tmp_path: Path,
) -> None:
    """A master starts replicating as soon as it hears a starting backup; the backup
    may take the snapshot before it hears the master active and turns passive (its
    own dial to the master late or failing). If the master then dies and a client's
    vote makes that backup active, it must serve what it took, as a passive node
    would (a CI run once got 0 of 384: the broker followed the topology only)."""
    primary = BrokerNode(pair_config(tmp_path, "primary"))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        primary_scope, backup_scope = trio.CancelScope(), trio.CancelScope()

        async def run(node: BrokerNode, scope: trio.CancelScope) -> None:
            with scope:
                await node.run()

        nursery.start_soon(run, primary, primary_scope)
        await wait_for(lambda: primary.port != 0)
        async with amqlite.connect(f"127.0.0.1:{primary.port}", reconnect=False) as conn:
            await conn.declare_queue("jobs", durable=True)
            for i in range(COUNT):
                await conn.publish("", "jobs", BODY + b"%d" % i, persistent=True, confirm=True)
        backup = BrokerNode(pair_config(tmp_path, "backup"))  # type: ignore[arg-type]
        nursery.start_soon(run, backup, backup_scope)
        await wait_for(lambda: backup.port != 0)
        # only the master knows where the backup is, and its heartbeats are lost: the
        # backup takes the snapshot without hearing the master active
        assert primary.ha is not None and backup.ha is not None
        send = primary.ha._send_link

        def no_heartbeats(event: object) -> None:
            if not isinstance(event, ev.HaHeartbeat):
                send(event)  # type: ignore[arg-type]

        primary.ha._send_link = no_heartbeats  # type: ignore[method-assign]
        primary.ha.config = dataclasses.replace(
            primary.ha.config, backup_peer=f"127.0.0.1:{backup.port}"
        )
        primary.cluster_addresses = primary.ha.config.addresses
        storage = primary.storage
        assert storage is not None
        ha = primary.ha
        await wait_for(lambda: ha.replicating and ha.synced_upto >= storage.appended, 30)
        assert backup.state == "backup"  # took the snapshot, never passive
        primary_scope.cancel()
        with trio.fail_after(10):
            await primary.stopped.wait()
        async with amqlite.connect(f"127.0.0.1:{backup.port}", connect_timeout=5) as conn:
            assert backup.state == "active"
            got = 0
            while (d := await conn.get("jobs", no_ack=True)) is not None:
                assert d.body == BODY + b"%d" % got
                assert d.redelivered  # a failover: any of them may have been seen
                got += 1
            assert got == COUNT
        backup_scope.cancel()
