"""The benchmark scenarios, and how one of them is run against one system.

- ``1to1-transient``: 100-byte transient messages, 1 publisher -> 1 queue -> 1
  consumer (manual acks, prefetch 1000). msgs/s = messages consumed / (first
  publish -> last consumed).
- ``fanout-1to10``: a fanout exchange bound to 10 queues, one consumer (and one
  connection) each; it publishes a tenth of ``--messages`` so it moves as many
  deliveries as the 1->1 run. msgs/s = messages published / (first publish ->
  last of the 10 copies delivered); deliveries/s = 10 x that.
- ``latency-at-5k``: 5,000 msg/s for 5 s, each message stamped with its send
  time; the consumer records publish -> delivery latency in an HdrHistogram.

Every run is bounded: it fails with :class:`BenchError` when the counts stop
moving for ``stall_timeout`` seconds, and after ``time_limit`` seconds at most.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from amqlite.errors import AmqliteError

from .errors import BenchError, collapse_errors
from .plan import ConsumeTally, PublishPlan, PublishTally, Route, new_histogram
from .procs import child_env
from .systems import Target
from .worker import worker_spec

ONE_TO_ONE = "1to1-transient"
FANOUT = "fanout-1to10"
LATENCY = "latency-at-5k"
SCENARIO_NAMES: tuple[str, ...] = (ONE_TO_ONE, FANOUT, LATENCY)

DEFAULT_MESSAGES = 200_000
QUICK_MESSAGES = 20_000
FANOUT_QUEUES = 10
LATENCY_RATE = 5_000.0
LATENCY_SECONDS = 5.0
QUICK_LATENCY_SECONDS = 2.0
BODY_SIZE = 100

#: Client placements: both client roles in the bench process, or the publisher
#: in a child process (:mod:`amqlite.bench.worker`) and the consumers here.
CLIENT_MODES: tuple[str, ...] = ("shared", "split")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    queues: int
    plan: PublishPlan

    @property
    def deliveries(self) -> int:
        return self.plan.messages * self.queues

    def time_limit(self) -> float:
        """The most a run may take: generous (1,000 deliveries/s) plus a minute."""
        if self.plan.rate is not None:
            return self.plan.messages / self.plan.rate + 60.0
        return self.deliveries / 1_000 + 60.0


def build_scenarios(
    names: list[str] | tuple[str, ...], *, messages: int, latency_seconds: float
) -> list[Scenario]:
    """The scenarios named (in the given order); raises ValueError for unknown names."""
    out: list[Scenario] = []
    for name in names:
        if name == ONE_TO_ONE:
            out.append(Scenario(name, 1, PublishPlan(messages, BODY_SIZE)))
        elif name == FANOUT:
            per_queue = max(1, messages // FANOUT_QUEUES)
            out.append(Scenario(name, FANOUT_QUEUES, PublishPlan(per_queue, BODY_SIZE)))
        elif name == LATENCY:
            n = max(1, round(LATENCY_RATE * latency_seconds))
            out.append(Scenario(name, 1, PublishPlan(n, BODY_SIZE, LATENCY_RATE, stamp=True)))
        else:
            known = ", ".join(SCENARIO_NAMES)
            raise ValueError(f"unknown scenario {name!r} (known: {known})")
    return out


@dataclass(slots=True)
class RunResult:
    """One (system, scenario) measurement; ``to_json`` is a row of ``--json``."""

    system: str
    scenario: str
    msgs_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    published: int
    consumed: int
    expected: int
    seconds: float
    deliveries_per_s: float
    publish_msgs_per_s: float
    clients: str
    server_cpu: float | None
    client_cpu: float
    other_cpu: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = {
            "system": self.system,
            "scenario": self.scenario,
            "msgs_per_s": round(self.msgs_per_s, 1),
            "p50_ms": _round(self.p50_ms),
            "p99_ms": _round(self.p99_ms),
            "p999_ms": _round(self.p999_ms),
            "published": self.published,
            "consumed": self.consumed,
            "expected": self.expected,
            "seconds": round(self.seconds, 4),
            "deliveries_per_s": round(self.deliveries_per_s, 1),
            "publish_msgs_per_s": round(self.publish_msgs_per_s, 1),
            "clients": self.clients,
            "server_cpu": _round(self.server_cpu),
            "client_cpu": round(self.client_cpu, 3),
            "other_cpu": _round(self.other_cpu),
        }
        d.update(self.extra)
        return d


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


# --- CPU accounting (Linux /proc), to show who is saturated ---------------------------

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` (None when /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def machine_busy_seconds() -> float | None:
    """CPU time all processes on this machine have used (all cores, from /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS  # all but idle and iowait


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- running one scenario against one system ------------------------------------------

ProgressHook = Callable[[int, int], None]


async def run_scenario(
    target: Target,
    scenario: Scenario,
    *,
    clients: str = "shared",
    stall_timeout: float = 30.0,
    server_pid: int | None = None,
    on_progress: ProgressHook | None = None,
) -> RunResult:
    """Run ``scenario`` once against ``target``: consumers subscribe first, then the
    publisher starts (here, or in a child process with ``clients="split"``)."""
    if clients not in CLIENT_MODES:
        raise ValueError(f"clients must be one of {CLIENT_MODES}, got {clients!r}")
    what = f"{target.system} {scenario.name}"
    plan = scenario.plan
    route = await _prepare(target, scenario, what)
    tallies = [
        ConsumeTally(plan.messages, new_histogram() if plan.stamp else None)
        for _ in range(scenario.queues)
    ]
    pub = PublishTally()
    child_cpu: list[float] = []
    server_cpu0 = process_cpu_seconds(server_pid) if server_pid else None
    own_cpu0 = _own_cpu_seconds()
    busy0 = machine_busy_seconds()
    wall0 = time.perf_counter()

    def done() -> int:
        return sum(t.consumed for t in tallies)

    def describe() -> str:
        return (
            f"published {pub.published:,}/{plan.messages:,}, "
            f"consumed {done():,}/{scenario.deliveries:,}"
        )

    async def publisher() -> None:
        if clients == "split":
            child_cpu.append(await _publish_in_child(target, route, plan, pub, what))
        else:
            await target.publish(route, plan, pub)

    try:
        with trio.move_on_after(scenario.time_limit()) as limit:
            async with trio.open_nursery() as outer:
                outer.start_soon(_watchdog, what, stall_timeout, done, pub, describe)
                outer.start_soon(_report_progress, on_progress, done, scenario.deliveries)
                async with trio.open_nursery() as inner:
                    for i, tally in enumerate(tallies):
                        await inner.start(target.consume, route, i, tally)
                    inner.start_soon(publisher)
                outer.cancel_scope.cancel()
        if limit.cancelled_caught:
            raise BenchError(
                f"{what}: did not finish within its time limit of "
                f"{scenario.time_limit():.0f} s ({describe()})"
            )
    except BaseExceptionGroup as group:
        raise collapse_errors(group, what) from None
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            try:
                await target.cleanup(route)
            except Exception as exc:  # cleanup is best-effort; the run's error matters more
                print(f"bench: cleanup after {what} failed: {exc}", file=sys.stderr)
    if on_progress is not None:
        on_progress(done(), scenario.deliveries)

    server_cpu1 = process_cpu_seconds(server_pid) if server_pid else None
    busy1 = machine_busy_seconds()
    window = max(1e-9, time.perf_counter() - wall0)  # the CPU figures' common period
    client_cpu = (_own_cpu_seconds() - own_cpu0 + sum(child_cpu)) / window
    end_ns = max(t.done_ns for t in tallies)
    seconds = max(1e-9, (end_ns - pub.first_ns) / 1e9)
    publish_seconds = max(1e-9, (pub.last_ns - pub.first_ns) / 1e9)
    consumed = done()
    p50 = p99 = p999 = None
    if plan.stamp:
        hist = new_histogram()
        for t in tallies:
            assert t.hist is not None
            hist.add(t.hist)
        p50, p99, p999 = (hist.get_value_at_percentile(p) / 1000 for p in (50, 99, 99.9))
    server_cpu = None
    if server_cpu0 is not None and server_cpu1 is not None:
        server_cpu = (server_cpu1 - server_cpu0) / window
    other_cpu = None
    if busy0 is not None and busy1 is not None and server_cpu is not None:
        # the rest of the machine: what else ran during the run (0 on a quiet machine)
        other_cpu = max(0.0, (busy1 - busy0) / window - server_cpu - client_cpu)
    return RunResult(
        system=target.system,
        scenario=scenario.name,
        msgs_per_s=(consumed / scenario.queues) / seconds,
        p50_ms=p50,
        p99_ms=p99,
        p999_ms=p999,
        published=pub.published,
        consumed=consumed,
        expected=scenario.deliveries,
        seconds=seconds,
        deliveries_per_s=consumed / seconds,
        publish_msgs_per_s=pub.published / publish_seconds,
        clients=clients,
        server_cpu=server_cpu,
        client_cpu=client_cpu,
        other_cpu=other_cpu,
    )


async def _prepare(target: Target, scenario: Scenario, what: str) -> Route:
    try:
        with trio.fail_after(30):
            return await target.prepare(scenario.name, scenario.queues)
    except trio.TooSlowError:
        raise BenchError(f"{what}: setting up queues took more than 30 s") from None
    except (OSError, trio.BrokenResourceError, AmqliteError) as exc:
        raise BenchError(f"{what}: cannot set up on {target.address}: {exc}") from None


async def _watchdog(
    what: str,
    stall_timeout: float,
    done: Callable[[], int],
    pub: PublishTally,
    describe: Callable[[], str],
) -> None:
    last = -1
    since = trio.current_time()
    while True:
        await trio.sleep(0.25)
        value = done() + pub.published
        now = trio.current_time()
        if value != last:
            last, since = value, now
        elif now - since >= stall_timeout:
            raise BenchError(f"{what}: stalled, no progress for {stall_timeout:g} s ({describe()})")


async def _report_progress(hook: ProgressHook | None, done: Callable[[], int], total: int) -> None:
    if hook is None:
        return
    while True:
        hook(done(), total)
        await trio.sleep(0.5)


async def _publish_in_child(
    target: Target, route: Route, plan: PublishPlan, tally: PublishTally, what: str
) -> float:
    """Publish from ``python -m amqlite.bench.worker``; fills ``tally``, returns its CPU s."""
    spec = worker_spec(target.system, target.address, target.auth, route, plan)
    result = await trio.run_process(
        [sys.executable, "-m", "amqlite.bench.worker"],
        stdin=json.dumps(spec).encode(),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=child_env(),
    )
    if result.returncode != 0:
        tail = result.stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise BenchError(
            f"{what}: the publisher process exited with {result.returncode}: " + " | ".join(tail)
        )
    report = json.loads(result.stdout.decode().strip().splitlines()[-1])
    done = PublishTally.from_json(report)
    tally.published, tally.first_ns, tally.last_ns = done.published, done.first_ns, done.last_ns
    return float(report["cpu_s"])
