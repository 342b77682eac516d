"""An HA pair of ``amqlite server`` processes that the bench starts, kills and
restarts: the servers of the ``failover`` scenario.

Both nodes listen on free loopback ports, each with its own data dir, and share
one config file naming both (``[cluster]`` ``primary_peer``, ``backup_peer``,
``heartbeat_ms``, ``failover_timeout_ms``); ``--is_primary 1`` / ``--is_backup 1``
picks the side, as in ``docs/ha.md``. A node is killed by its pid with SIGKILL
and restarted on the same port and data dir, as an operator would restart it.
States are read with ``status`` on a monitor connection, which even a passive or
starting node answers. :func:`open_pair` stops whatever is still running, by pid,
when its block ends.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

import amqlite
from amqlite.errors import AmqliteError

from .errors import BenchError
from .ports import fixed_port
from .procs import ServerProcess, broker_argv

PRIMARY = "primary"
BACKUP = "backup"
SIDES: tuple[str, ...] = (PRIMARY, BACKUP)
#: How often the pair's states are polled while waiting for them.
POLL_INTERVAL = 0.05
#: The most one ``status`` call may take (a node may be starting or dead).
STATUS_TIMEOUT = 3.0
#: The most a node may take to listen: a restarted node replays its journal first
#: (up to a segment of history before compaction: seconds, more on a busy machine).
READY_TIMEOUT = 60.0


def other(side: str) -> str:
    return BACKUP if side == PRIMARY else PRIMARY


DEFAULT_HEARTBEAT_MS = 200
DEFAULT_FAILOVER_TIMEOUT_MS = 1000


@dataclass(frozen=True, slots=True)
class PairTiming:
    """The pair's ``[cluster]`` timing (docs/ha.md: 200 ms and 1 s by default)."""

    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS
    failover_timeout_ms: int = DEFAULT_FAILOVER_TIMEOUT_MS

    def __post_init__(self) -> None:
        if not 10 <= self.heartbeat_ms <= 60_000:
            raise ValueError(f"heartbeat_ms must be 10..60000, got {self.heartbeat_ms}")
        if self.failover_timeout_ms <= self.heartbeat_ms:
            raise ValueError(
                f"failover_timeout_ms ({self.failover_timeout_ms}) must exceed "
                f"heartbeat_ms ({self.heartbeat_ms})"
            )


def cluster_config(ports: Mapping[str, int], timing: PairTiming, witness: str = "") -> str:
    """The TOML both nodes read (the command-line flag picks the side); ``witness``
    (``host:port``) names the pair's witness."""
    return (
        "[cluster]\n"
        f'primary_peer = "127.0.0.1:{ports[PRIMARY]}"\n'
        f'backup_peer = "127.0.0.1:{ports[BACKUP]}"\n'
        f"heartbeat_ms = {timing.heartbeat_ms}\n"
        f"failover_timeout_ms = {timing.failover_timeout_ms}\n"
        + (f'witness = "{witness}"\n' if witness else "")
    )


def _state(status: Mapping[str, Any] | None) -> str | None:
    return None if status is None else str(status.get("state"))


def replicating(status: Mapping[str, Any] | None) -> bool:
    """Whether a node's status says it streams its journal to an attached peer."""
    ha = status.get("ha") if status is not None else None
    return isinstance(ha, dict) and bool(ha.get("replicating"))


class HaPair:
    """The two nodes; make one with :func:`open_pair`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        directory: Path,
        timing: PairTiming,
        *,
        log_dir: Path | None = None,
        fsync: str = "batch",
    ) -> None:
        self._nursery = nursery
        self.directory = directory
        self.timing = timing
        self.log_dir = log_dir or directory
        self.fsync = fsync
        self.ports = {side: fixed_port() for side in SIDES}
        self.config = directory / "pair.toml"
        self.config.write_text(cluster_config(self.ports, timing))
        self.procs: dict[str, ServerProcess] = {}
        #: the pair's ``amqlite witness`` (:meth:`start_witness`), when it has one
        self.witness: ServerProcess | None = None
        self.starts = {side: 0 for side in SIDES}
        self._ended_by_us: set[int] = set()  # pids we killed or stopped
        #: Nodes that exited without being killed or stopped by us, one line each.
        self.unexpected_exits: list[str] = []
        self._began = time.perf_counter()

    def address(self, side: str) -> str:
        return f"127.0.0.1:{self.ports[side]}"

    @property
    def servers(self) -> str:
        """The client's server list: primary first."""
        return ",".join(self.address(side) for side in SIDES)

    def pid(self, side: str) -> int | None:
        proc = self.procs.get(side)
        return None if proc is None or proc.proc.returncode is not None else proc.pid

    def log_path(self, side: str) -> Path:
        return self.log_dir / f"{side}.log"

    async def start(self, side: str) -> ServerProcess:
        """Start (or restart) ``side`` on its port and data dir; returns once it listens."""
        flag = "--is_primary" if side == PRIMARY else "--is_backup"
        argv = broker_argv(
            "--config", str(self.config), "--port", str(self.ports[side]),
            "--data-dir", str(self.directory / side), "--fsync", self.fsync, flag, "1",
        )  # fmt: skip
        self.starts[side] += 1
        server = await ServerProcess.start(
            self._nursery,
            f"HA {side} ({self.address(side)})",
            argv,
            "server_listening",
            log_path=self.log_path(side),
            ready_timeout=READY_TIMEOUT,
        )
        self.procs[side] = server
        self._nursery.start_soon(self._watch_exit, side, server)
        return server

    async def start_witness(self) -> ServerProcess:
        """Start an ``amqlite witness`` and name it in the pair's config (before the
        nodes start)."""
        argv = [
            sys.executable, "-m", "amqlite", "witness", "--host", "127.0.0.1", "--port", "0",
            "--log-format", "json", "--state", str(self.directory / "witness.json"),
        ]  # fmt: skip
        witness = await ServerProcess.start(
            self._nursery,
            "HA witness",
            argv,
            "witness_listening",
            log_path=self.log_dir / "witness.log",
            ready_timeout=READY_TIMEOUT,
        )
        self.witness = witness
        address = f"127.0.0.1:{witness.port}"
        self.config.write_text(cluster_config(self.ports, self.timing, witness=address))
        return witness

    async def _watch_exit(self, side: str, server: ServerProcess) -> None:
        code = await server.proc.wait()
        if server.pid not in self._ended_by_us:
            signalled = [line for line in server.log_tail if '"signal_received"' in line]
            why = ""
            if signalled:  # someone else stopped it (our own stops are not counted)
                why = f" after it logged {signalled[-1]!r}: stopped from outside the bench"
            self.unexpected_exits.append(
                f"the {side} (pid {server.pid}) exited with status {code}{why}, "
                f"{time.perf_counter() - self._began:.1f} s after the pair started"
            )

    def check_alive(self) -> None:
        """Raise BenchError if a node has exited without our asking."""
        if self.unexpected_exits:
            raise BenchError(
                "the HA pair lost a node: " + "; ".join(self.unexpected_exits) + self.log_tails()
            )

    async def kill(self, side: str) -> float:
        """SIGKILL ``side`` by its pid and reap it; returns ``time.perf_counter()``
        taken just before the signal."""
        proc = self.procs[side].proc
        self._ended_by_us.add(proc.pid)
        at = time.perf_counter()
        proc.send_signal(signal.SIGKILL)
        with trio.fail_after(10):
            await proc.wait()
        return at

    async def status(self, side: str) -> dict[str, Any] | None:
        """``side``'s status map, or None when it does not answer."""
        try:
            with trio.fail_after(STATUS_TIMEOUT):
                async with amqlite.connect(
                    self.address(side),
                    role="monitor",
                    reconnect=False,
                    connect_timeout=STATUS_TIMEOUT,
                ) as conn:
                    return await conn.status()
        except (AmqliteError, OSError, trio.TooSlowError):
            return None

    async def statuses(self) -> dict[str, dict[str, Any] | None]:
        return {side: await self.status(side) for side in SIDES}

    async def wait_settled(self, active: str, deadline_s: float) -> float:
        """Wait until ``active`` is active and replicating to its peer, and the peer
        is passive; returns the seconds it took. Raises BenchError after
        ``deadline_s`` naming both nodes' last known states."""
        began = trio.current_time()
        seen: dict[str, dict[str, Any] | None] = {}
        with trio.move_on_after(deadline_s):
            while True:
                seen = await self.statuses()
                if (
                    _state(seen[active]) == "active"
                    and replicating(seen[active])
                    and _state(seen[other(active)]) == "passive"
                ):
                    return trio.current_time() - began
                await trio.sleep(POLL_INTERVAL)
        raise BenchError(
            f"the HA pair did not settle within {deadline_s:g} s (wanted {active} active and "
            f"replicating, {other(active)} passive; last seen: {self.describe(seen)})"
            f"{self.log_tails()}"
        )

    def describe(self, seen: Mapping[str, Mapping[str, Any] | None]) -> str:
        parts = list(self.unexpected_exits)
        for side in SIDES:
            status = seen.get(side)
            if status is None:
                parts.append(f"{side} not answering")
            else:
                streams = ", replicating" if replicating(status) else ""
                parts.append(f"{side} {_state(status)}{streams}")
        return ", ".join(parts)

    def log_tails(self) -> str:
        out = ""
        for side, proc in self.procs.items():
            out += f"\n  {side}'s last log lines ({self.log_path(side)}):"
            out += "".join(f"\n    {line}" for line in list(proc.log_tail)[-8:])
        return out

    async def stop(self) -> None:
        """Stop both nodes by pid (SIGTERM, then SIGKILL). Shielded."""
        for server in self.procs.values():
            self._ended_by_us.add(server.pid)
            await server.stop()
        if self.witness is not None:
            await self.witness.stop()


@asynccontextmanager
async def open_pair(
    directory: Path,
    timing: PairTiming,
    *,
    log_dir: Path | None = None,
    fsync: str = "batch",
) -> AsyncIterator[HaPair]:
    """An HA pair under ``directory`` (nothing started yet); both nodes are stopped,
    by pid, when the block ends, however it ends."""
    async with trio.open_nursery() as nursery:
        pair = HaPair(nursery, directory, timing, log_dir=log_dir, fsync=fsync)
        try:
            yield pair
        finally:
            await pair.stop()
            nursery.cancel_scope.cancel()
