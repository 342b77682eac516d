"""The HA pair under partitions, with real processes: a witness (``amqlite witness``)
or ``on_peer_silence = "hold"`` keeps every confirmed message.

Every link a node opens goes through a fault-injecting proxy: each node's dial of
its peer, and each node's link to the witness; clients reach the nodes directly.
While one client publishes persistent messages with confirms (it tries the primary
first) and another keeps knocking at the backup alone, a link is cut, then healed.
Checked: every confirmed message is on the final master, and at no sampled moment
do two nodes confirm in the same epoch (a node "confirms" while it is active and
either replicates to its peer or may confirm alone).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

import amqlite
from amqlite.errors import AmqliteError

from ..faultproxy import FaultProxy
from ..ports import fixed_port
from ..waiting import wait_until
from .procs import start_witness
from .test_ha_pair import Pair, _drain

pytestmark = pytest.mark.e2e

QUEUE = "witnessed"
FAILOVER_MS = 600


@dataclass
class Rig:
    pair: Pair
    to_primary: FaultProxy  # the backup dials its peer through this
    to_backup: FaultProxy  # the primary dials its peer through this
    witness_from: dict[str, FaultProxy] = field(default_factory=dict)  # per node
    witness_args: tuple[str, ...] = ()
    samples: list[tuple[Any, ...]] = field(default_factory=list)
    confirmed: set[str] = field(default_factory=set)
    refused_at_backup: int = 0

    def cut_peer_link(self) -> None:
        self.to_primary.partition()
        self.to_backup.partition()

    def heal_peer_link(self) -> None:
        self.to_primary.heal(drop=True)
        self.to_backup.heal(drop=True)

    async def ha(self, side: str) -> dict[str, Any]:
        got: list[dict[str, Any]] = []

        async def answered() -> bool:
            status = await self.pair.status(side)
            if status is not None:
                got.append(status["ha"])
            return bool(got)

        await wait_until(answered, f"{side}'s status", every=0.05)
        return got[0]

    async def wait_ha(self, side: str, predicate: Callable[[dict[str, Any]], bool]) -> None:
        """Poll ``side``'s HA status until ``predicate`` holds (bounded)."""

        async def holds() -> bool:
            return predicate(await self.ha(side))

        await wait_until(holds, f"{side}'s HA status", deadline=30, every=0.05)


def _confirms(ha: dict[str, Any] | None) -> bool:
    """Whether a node may send a confirm now: active, and replicating to its peer
    or allowed to confirm alone."""
    return bool(
        ha is not None
        and ha["state"] == "active"
        and (ha["replicating"] or ha.get("confirms_alone"))
    )


@asynccontextmanager
async def rig(tmp_path: Path, *, witness: bool, extra: str = "") -> AsyncIterator[Rig]:
    """A started pair with every node-opened link proxied (see the module)."""
    ports = {"primary": fixed_port(), "backup": fixed_port()}
    async with trio.open_nursery() as nursery:
        pair = Pair(tmp_path, tmp_path / "unused.toml", ports)
        pair.nursery = nursery
        to_primary = FaultProxy(("127.0.0.1", ports["primary"]))
        to_backup = FaultProxy(("127.0.0.1", ports["backup"]))
        await nursery.start(to_primary.run)
        await nursery.start(to_backup.run)
        r = Rig(pair, to_primary, to_backup)
        if witness:
            r.witness_args = ("--state", str(tmp_path / "witness.json"))
            pair.witness = await start_witness(*r.witness_args)
            r.witness_args = ("--port", str(pair.witness.port), *r.witness_args)
            nursery.start_soon(_drain, pair.witness, tmp_path / "witness.log")
            for side in ("primary", "backup"):
                proxy = FaultProxy(("127.0.0.1", pair.witness.port))
                await nursery.start(proxy.run)
                r.witness_from[side] = proxy
        timing = f"heartbeat_ms = 100\nfailover_timeout_ms = {FAILOVER_MS}\n{extra}"
        for side, primary, backup in (
            ("primary", f"127.0.0.1:{ports['primary']}", to_backup.address),
            ("backup", to_primary.address, f"127.0.0.1:{ports['backup']}"),
        ):
            lines = f'[cluster]\nprimary_peer = "{primary}"\nbackup_peer = "{backup}"\n{timing}'
            if witness:
                lines += f'witness = "{r.witness_from[side].address}"\n'
            path = tmp_path / f"{side}.toml"
            path.write_text(lines)
            pair.configs[side] = path
        try:
            await pair.start("primary")
            await pair.start("backup")
            await pair.wait_states("active", "passive")
            yield r
        finally:
            procs = dict(pair.procs)
            if pair.witness is not None:
                procs["witness"] = pair.witness
            for proc in procs.values():
                if proc.proc.returncode is None:
                    proc.proc.kill()
                    await proc.proc.wait()
            nursery.cancel_scope.cancel()


async def _sampler(r: Rig, stop: trio.Event) -> None:
    while not stop.is_set():
        p, b = await r.pair.status("primary"), await r.pair.status("backup")
        ph = None if p is None else p["ha"]
        bh = None if b is None else b["ha"]
        r.samples.append(
            (
                None if ph is None else ph["state"],
                None if ph is None else ph["epoch"],
                _confirms(ph),
                None if bh is None else bh["state"],
                None if bh is None else bh["epoch"],
                _confirms(bh),
            )
        )
        await trio.sleep(0.02)


async def _publisher(r: Rig, servers: str, label: str, stop: trio.Event) -> None:
    """Publish persistent messages with confirms until ``stop``; every confirmed body
    goes to ``r.confirmed``. A nack (held past the bound) or a lost connection is
    not a confirm; the client re-sends what was unconfirmed when it reconnects."""

    async def wait_one(body: str, pending: amqlite.PendingConfirm) -> None:
        try:
            await pending.wait()
        except AmqliteError:
            return
        r.confirmed.add(body)

    async with (
        amqlite.connect(servers, connect_timeout=2) as conn,
        trio.open_nursery() as waits,
    ):
        await conn.declare_queue(QUEUE, durable=True)
        n = 0
        while not stop.is_set():
            body = f"{label}-{n}"
            with trio.move_on_after(0.5):  # a full confirm window: check stop again
                pending = await conn.publish_nowait("", QUEUE, body, persistent=True)
                waits.start_soon(wait_one, body, pending)
                n += 1
            await trio.sleep(0.01)  # a steady rate, not a flood


async def _knock_at_backup(r: Rig, stop: trio.Event) -> None:
    """A client that reaches only the backup: publishes there whenever it is served."""
    address = r.pair.address("backup")
    while not stop.is_set():
        try:
            async with amqlite.connect(address, reconnect=False, connect_timeout=3) as conn:
                await conn.declare_queue(QUEUE, durable=True)
                n = 0
                while not stop.is_set():
                    body = f"backup-{n}"
                    await conn.publish("", QUEUE, body, persistent=True, confirm=True)
                    r.confirmed.add(body)
                    n += 1
                    await trio.sleep(0.01)
        except AmqliteError:
            r.refused_at_backup += 1
        await trio.sleep(0.1)


async def _all_on_the_master(r: Rig) -> str:
    """Every confirmed message is in the queue of the final master; its name."""
    with trio.fail_after(30):
        async with amqlite.connect(r.pair.servers) as conn:
            info = await conn.declare_queue(QUEUE, durable=True, passive=True)
            seen: set[str] = set()
            consumer = await conn.consume(QUEUE, prefetch=500)
            while len(seen) < info.messages:
                d = await consumer.__anext__()
                seen.add(d.body.decode())
                await d.ack()
            lost = r.confirmed - seen
            assert not lost, f"{len(lost)} confirmed messages lost: {sorted(lost)[:10]}"
            return conn.server_name


def _no_two_confirm_in_one_epoch(r: Rig) -> None:
    assert r.samples, "no sample taken"
    both = [s for s in r.samples if s[2] and s[5]]
    assert all(s[1] != s[4] for s in both), both


async def _split(
    r: Rig,
    cut: Callable[[], None],
    heal: Callable[[], None],
    during: Callable[[], Any],
) -> None:
    """Publish (primary first, and at the backup alone), cut, run ``during`` (the
    checks of the cut), heal, wait for a stable pair, stop and check."""
    stop = trio.Event()
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_sampler, r, stop)
            nursery.start_soon(_publisher, r, r.pair.servers, "main", stop)
            nursery.start_soon(_knock_at_backup, r, stop)
            await _wait_confirmed(r, 20)
            if inspect.isawaitable(result := cut()):
                await result
            await during()
            heal()
            await _settled(r)
            before = len(r.confirmed)
            await _wait_confirmed(r, before + 20)  # the pair confirms again
            stop.set()
    _no_two_confirm_in_one_epoch(r)
    await _all_on_the_master(r)


async def _wait_confirmed(r: Rig, count: int) -> None:
    await wait_until(lambda: len(r.confirmed) >= count, f"{count} confirmed", deadline=30)


async def _settled(r: Rig) -> None:
    """One node active and replicating to the other, passive."""

    async def settled() -> bool:
        p, b = await r.ha("primary"), await r.ha("backup")
        states = {p["state"], b["state"]}
        return states == {"active", "passive"} and bool(p["replicating"] or b["replicating"])

    await wait_until(settled, "one node active, replicating", deadline=30, every=0.05)


async def test_with_a_witness_a_cut_peer_link_loses_nothing_and_makes_no_second_master(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, witness=True) as r:

        async def during() -> None:
            # the backup hears nothing: a client at the backup makes it ask the witness,
            # which refuses (the primary holds the lease and confirms alone)
            await r.wait_ha("backup", lambda ha: not ha["peer_alive"])
            await r.wait_ha("primary", lambda ha: ha["confirms_alone"])
            before, refused = len(r.confirmed), r.refused_at_backup
            await _wait_confirmed(r, before + 30)  # the old master keeps confirming
            await wait_until(
                lambda: r.refused_at_backup >= refused + 2, "two refusals", deadline=30
            )
            assert (await r.ha("backup"))["state"] == "passive"

        await _split(r, r.cut_peer_link, r.heal_peer_link, during)
        assert not [s for s in r.samples if s[3] == "active"], "the backup took over"
        assert (await r.ha("primary"))["state"] == "active"


async def test_with_a_witness_losing_both_links_holds_confirms_and_the_backup_takes_over(
    tmp_path: Path,
) -> None:
    """The witness is cut from the master (nothing changes: its confirms go through
    replication), then the peer link too: the master stops confirming (its lease
    runs out and it was in sync: the witness lets the backup take over), the
    backup takes over in a new epoch; after healing, the old master is fenced."""
    async with rig(tmp_path, witness=True, extra="hold_timeout_ms = 2000\n") as r:
        witness_link = r.witness_from["primary"]

        def cut() -> None:
            witness_link.partition(refuse_new=True)

        async def during() -> None:
            await r.wait_ha("primary", lambda ha: not ha["witness"]["lease_held"])
            before = len(r.confirmed)
            await _wait_confirmed(r, before + 20)  # still confirming: replication
            r.cut_peer_link()
            await r.wait_ha("primary", lambda ha: ha["confirms_held"])
            await r.wait_ha("backup", lambda ha: ha["state"] == "active")

        def heal() -> None:
            witness_link.heal(drop=True)
            r.heal_peer_link()

        await _split(r, cut, heal, during)
        assert (await r.ha("backup"))["state"] == "active"
        assert (await r.ha("primary"))["state"] == "passive"


async def test_with_a_witness_killed_and_restarted_the_master_keeps_its_promise(
    tmp_path: Path,
) -> None:
    """kill -9 of the witness: the pair goes on (confirms through replication); the
    witness restarts from its state file, the master renews its lease, and a cut of
    the peer link then changes nothing for the master's publishers."""
    async with rig(tmp_path, witness=True) as r:
        pair = r.pair

        async def kill_witness() -> None:
            assert pair.witness is not None
            pair.witness.proc.kill()
            await pair.witness.proc.wait()

        async def during() -> None:
            await r.wait_ha("primary", lambda ha: not ha["witness_link_up"])
            before = len(r.confirmed)
            await _wait_confirmed(r, before + 20)  # confirms go on through replication
            pair.witness = await start_witness(*r.witness_args)
            assert pair.nursery is not None
            pair.nursery.start_soon(_drain, pair.witness, pair.tmp / "witness-2.log")
            await r.wait_ha("primary", lambda ha: ha["witness"]["lease_held"])
            r.cut_peer_link()
            await r.wait_ha("primary", lambda ha: ha["confirms_alone"])
            before = len(r.confirmed)
            await _wait_confirmed(r, before + 20)

        await _split(r, kill_witness, r.heal_peer_link, during)
        assert not [s for s in r.samples if s[3] == "active"], "the backup took over"


async def test_hold_without_a_witness_loses_nothing_confirmed_when_the_peer_link_is_cut(
    tmp_path: Path,
) -> None:
    """on_peer_silence = "hold": the cut-off master stops confirming (the held
    confirms fail after hold_timeout_ms); the backup takes over on the vote of the
    client that reaches it alone, and holds its confirms too (its peer is silent):
    nothing is confirmed during the cut. After healing, the old master is fenced,
    the new one replicates to it and confirms again, and nothing confirmed is
    missing."""
    extra = 'on_peer_silence = "hold"\nhold_timeout_ms = 1500\n'
    async with rig(tmp_path, witness=False, extra=extra) as r:
        during_cut: list[int] = []

        async def during() -> None:
            await r.wait_ha("primary", lambda ha: ha["confirms_held"])
            assert (await r.ha("primary"))["promise"] == "hold"
            held_from = len(r.confirmed)
            await r.wait_ha("backup", lambda ha: ha["state"] == "active")
            await r.wait_ha("backup", lambda ha: ha["confirms_held"])
            await r.wait_ha("primary", lambda ha: ha["held_confirms_failed"] > 0)
            during_cut.append(len(r.confirmed) - held_from)

        await _split(r, r.cut_peer_link, r.heal_peer_link, during)
        assert during_cut == [0], "confirmed while neither node could hold the peer"
        assert (await r.ha("primary"))["state"] == "passive"
