"""Message groups across a kill -9 failover of an HA pair and a kill -9 restart of a
lone node, with real processes and a ledger of who held what when.

Several consumers (each its own reconnecting connection) work through grouped
persistent messages. A consumer *holds* a message from the moment its application
receives it until it has acked it (or, for a delivery the failover made stale, until
it has finished with it: its ack is then a no-op). Just before the kill every
consumer is given slow work, so each is still busy with a message of its groups
while the new master (or the restarted node) hands the groups out again. The rules
(docs/selectors.md, "Message groups"):

- never two consumers hold messages of one group at once;
- each group's messages are first received in publish order;
- every confirmed message is received.
"""

from __future__ import annotations

import random
import signal
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

import amqlite
from amqlite.client import ReconnectPolicy

from ..ports import fixed_port
from ..waiting import wait_until
from .procs import ServerProcess, start_server
from .test_ha_pair import ha_pair

pytestmark = pytest.mark.e2e

QUEUE = "grouped"
GROUPS = 30
CONSUMERS = 4
TOTAL = 900
KILL_AFTER = 250  # messages received
SLOW_WORK = 2.5  # seconds: longer than a failover and the clients' reconnects


@dataclass
class GroupLedger:
    """Per group: hold intervals (consumer, seq, start, end) and first receptions."""

    holds: dict[str, list[tuple[int, int, float, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    first_seen: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    seen: set[tuple[str, int]] = field(default_factory=set)
    confirmed: set[tuple[str, int]] = field(default_factory=set)
    received = 0
    slow = False  # the next message each consumer takes is slow work
    slow_started: set[int] = field(default_factory=set)
    stale = 0  # holds that ended with a no-op ack (the link had broken)

    def check(self) -> None:
        overlaps = []
        for group, holds in self.holds.items():
            ordered = sorted(holds, key=lambda h: h[2])
            busy_until: dict[int, float] = {}
            for consumer, seq, start, end in ordered:
                others = [c for c, until in busy_until.items() if c != consumer and until > start]
                if others:
                    overlaps.append((group, seq, consumer, others))
                busy_until[consumer] = max(busy_until.get(consumer, 0.0), end)
        assert not overlaps, f"two consumers held one group at once: {overlaps[:5]}"
        for group, seqs in self.first_seen.items():
            assert seqs == sorted(seqs), f"group {group} first received out of order: {seqs}"
        lost = self.confirmed - self.seen
        assert not lost, f"{len(lost)} confirmed messages never received: {sorted(lost)[:5]}"


async def _consumer(index: int, servers: str, ledger: GroupLedger) -> None:
    policy = ReconnectPolicy(give_up_after=60)
    async with amqlite.connect(servers, reconnect=policy) as conn:
        await conn.declare_queue(QUEUE, durable=True)
        consumer = await conn.consume(QUEUE, prefetch=4)
        rng = random.Random(index)
        async for d in consumer:
            group = d.properties["group_id"]
            seq = int(d.body)
            start = trio.current_time()
            if (group, seq) not in ledger.seen:
                ledger.seen.add((group, seq))
                ledger.first_seen[group].append(seq)
            ledger.received += 1
            if ledger.slow and index not in ledger.slow_started:
                ledger.slow_started.add(index)
                await trio.sleep(SLOW_WORK)  # the work, during which the master dies
            else:
                await trio.sleep(rng.random() * 0.004)
            stale = d.stale
            await d.ack()
            ledger.stale += stale
            ledger.holds[group].append((index, seq, start, trio.current_time()))


BARRIER = "groups.barrier"  # a queue of its own: the ledger's queue is left alone


async def _run(servers: str, kill: Callable[[], Awaitable[None]], ledger: GroupLedger) -> None:
    published = trio.Event()
    async with trio.open_nursery() as nursery:
        for i in range(CONSUMERS):
            nursery.start_soon(_consumer, i, servers, ledger)

        async def publish() -> None:
            async with amqlite.connect(servers, reconnect=ReconnectPolicy(give_up_after=60)) as pub:
                await pub.declare_queue(QUEUE, durable=True)
                seqs: dict[str, int] = defaultdict(int)
                rng = random.Random(7)
                async with trio.open_nursery() as confirms:
                    for _ in range(TOTAL):
                        group = f"g{rng.randrange(GROUPS)}"
                        seq = seqs[group]
                        seqs[group] += 1
                        pending = await pub.publish_nowait(
                            "", QUEUE, str(seq), persistent=True, properties={"group_id": group}
                        )

                        async def confirm(
                            key: tuple[str, int] = (group, seq),
                            pending: amqlite.PendingConfirm = pending,
                        ) -> None:
                            await pending.wait()
                            ledger.confirmed.add(key)

                        confirms.start_soon(confirm)
                        await trio.sleep(0.002)  # a steady stream, not one burst
            published.set()

        nursery.start_soon(publish)
        with trio.fail_after(60):
            await wait_until(
                lambda: ledger.received >= KILL_AFTER, "the first deliveries", deadline=60
            )
            ledger.slow = True
            await wait_until(
                lambda: len(ledger.slow_started) >= CONSUMERS, "every consumer at work", deadline=60
            )
            # the journal has the assignments on disk: a persistent publish confirmed
            # now follows a commit of every record appended before it (commits write
            # in order), the group.owner records of the deliveries above included
            async with amqlite.connect(servers) as barrier:
                await barrier.declare_queue(BARRIER, durable=True)
                await barrier.publish("", BARRIER, "after", persistent=True, confirm=True)
            await kill()
        with trio.fail_after(90):
            await published.wait()
            await wait_until(
                lambda: ledger.seen >= ledger.confirmed, "every confirmed seen", deadline=90
            )
        nursery.cancel_scope.cancel()
    assert len(ledger.confirmed) == TOTAL


async def test_groups_stay_on_one_consumer_across_a_kill_9_failover(tmp_path: Path) -> None:
    ledger = GroupLedger()
    async with ha_pair(tmp_path) as pair:
        await pair.start("primary")
        await pair.start("backup")
        await pair.wait_states("active", "passive")

        async def kill() -> None:
            await pair.kill("primary")

        await _run(pair.servers, kill, ledger)
        assert await pair.state("backup") == "active"
    assert ledger.stale >= CONSUMERS  # each slow worker finished a delivery made stale
    ledger.check()


async def test_groups_stay_on_one_consumer_across_a_kill_9_restart(tmp_path: Path) -> None:
    ledger = GroupLedger()
    port = fixed_port()
    args = ("--port", str(port), "--data-dir", str(tmp_path / "data"))
    servers: list[ServerProcess] = [await start_server(*args)]

    async def drain(server: ServerProcess) -> None:
        assert server.proc.stderr is not None
        while await server.proc.stderr.receive_some(65536):
            pass

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, servers[0])

            async def kill() -> None:
                servers[0].proc.send_signal(signal.SIGKILL)
                with trio.fail_after(10):
                    await servers[0].proc.wait()
                servers.append(await start_server(*args))
                nursery.start_soon(drain, servers[-1])

            await _run(f"127.0.0.1:{port}", kill, ledger)
            nursery.cancel_scope.cancel()
    finally:
        for server in servers:
            if server.proc.returncode is None:
                server.proc.kill()
                with trio.move_on_after(10):
                    await server.proc.wait()
    assert ledger.stale >= CONSUMERS
    ledger.check()
