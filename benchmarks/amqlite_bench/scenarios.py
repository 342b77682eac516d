"""The benchmark scenarios, and how one of them is run against one system.

- ``1to1-transient``: 100-byte transient messages, 1 publisher -> 1 queue -> 1
  consumer (manual acks, prefetch 1000). msgs/s = messages consumed / (first
  publish -> last consumed).
- ``1to1-persistent-confirm``: the same shape on a durable queue, persistent
  messages, publisher confirms with at most 1,000 outstanding; a quarter of
  ``--messages``. msgs/s as above; the run ends when every message is consumed
  and every confirm is in.
- ``fanout-1to10``: a fanout exchange bound to 10 queues, one consumer (and one
  connection) each; it publishes a tenth of ``--messages`` so it moves as many
  deliveries as the 1->1 run. msgs/s = messages published / (first publish ->
  last of the 10 copies delivered); deliveries/s = 10 x that.
- ``latency-at-5k``: 5,000 msg/s for 5 s, each message stamped with its send
  time; the consumer records publish -> delivery latency in an HdrHistogram.
- ``selectors-1to10`` (amqlite only, not in the default set): 1 publisher -> 1
  queue -> 10 consumers on it, each with a selector taking a tenth of the messages
  (header ``k`` = 0..9, consumer j: ``k = j``). msgs/s as ``1to1-transient``, whose
  rate it is compared with.
- ``groups-10x1000`` (amqlite only, not in the default set): 1 queue, 10 consumers,
  every message in one of 1,000 message groups (``group_id``); the broker keeps
  each group on one consumer. msgs/s as ``1to1-transient``.
- ``failover`` (not in the default set: it takes minutes): an HA pair the bench
  starts, kill -9 of its master N times under confirmed load, and the cost of
  replication; run by :mod:`amqlite_bench.failover`, on ``amqlite-pair`` only.

Every run is bounded: it fails with :class:`BenchError` when the counts stop
moving for ``stall_timeout`` seconds, and after ``time_limit`` seconds at most.
CPU time and peak memory are taken between two marks: when the consumers are
subscribed and the publisher starts, and when the last message is in.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from amqlite.errors import AmqliteError

from .errors import BenchError, collapse_errors
from .plan import (
    GROUP,
    SELECT,
    SELECT_HEADER,
    SELECT_SHARES,
    ClientReport,
    ConsumeTally,
    PublishPlan,
    PublishTally,
    Route,
    SharedCount,
    new_histogram,
)
from .procs import child_env
from .procstat import ServerMeter, own_cpu_seconds
from .systems import Target
from .worker import worker_spec

ONE_TO_ONE = "1to1-transient"
PERSISTENT = "1to1-persistent-confirm"
FANOUT = "fanout-1to10"
LATENCY = "latency-at-5k"
FAILOVER = "failover"
SELECTORS = "selectors-1to10"
GROUPS = "groups-10x1000"
#: Scenarios of amqlite's own consumer features (native client only).
AMQLITE_ONLY: tuple[str, ...] = (SELECTORS, GROUPS)
#: The scenarios run when ``--scenarios`` is not given.
SCENARIO_NAMES: tuple[str, ...] = (ONE_TO_ONE, PERSISTENT, FANOUT, LATENCY)
#: Every scenario ``--scenarios`` accepts.
KNOWN_SCENARIOS: tuple[str, ...] = (*SCENARIO_NAMES, *AMQLITE_ONLY, FAILOVER)
#: Consumers of the selector and group scenarios (on one queue).
SHARED_QUEUE_CONSUMERS = SELECT_SHARES

DEFAULT_MESSAGES = 200_000
QUICK_MESSAGES = 20_000
FANOUT_QUEUES = 10
#: The persistent run publishes ``--messages`` // this (every message is written to disk).
PERSISTENT_SHARE = 4
CONFIRM_WINDOW = 1000
LATENCY_RATE = 5_000.0
LATENCY_SECONDS = 5.0
QUICK_LATENCY_SECONDS = 2.0
BODY_SIZE = 100

#: Client placements: both client roles in the bench process; the publisher in a
#: child process (:mod:`amqlite_bench.worker`) and the consumers here; or both
#: roles in one child process (:mod:`amqlite_bench.clientproc`), as every peer runs.
CLIENT_MODES: tuple[str, ...] = ("shared", "split", "process")


@dataclass(frozen=True, slots=True)
class Scenario:
    """``consumers``: how many consume (0: one per queue; more: they share the queues
    round robin, as the selector and group scenarios do on their one queue)."""

    name: str
    queues: int
    plan: PublishPlan
    consumers: int = 0

    @property
    def consumer_count(self) -> int:
        return self.consumers or self.queues

    def tallies(self) -> list[ConsumeTally]:
        """One count per consumer, each expecting its share."""
        plan = self.plan
        n = self.consumer_count
        if plan.pattern == GROUP:
            shared = SharedCount(plan.messages)
            return [ConsumeTally(plan.messages, shared=shared) for _ in range(n)]
        if plan.pattern == SELECT:  # consumer j takes the messages numbered j mod n
            base, extra = divmod(plan.messages, n)
            return [
                ConsumeTally(base + (1 if j < extra else 0), selector=f"{SELECT_HEADER} = {j}")
                for j in range(n)
            ]
        return [
            ConsumeTally(plan.messages, new_histogram() if plan.stamp else None) for _ in range(n)
        ]

    @property
    def deliveries(self) -> int:
        return self.plan.messages * self.queues

    @property
    def durable(self) -> bool:
        return self.plan.persistent

    def time_limit(self) -> float:
        """The most a run may take: generous (1,000 deliveries/s; 100/s when every
        message goes to disk) plus a minute."""
        if self.plan.rate is not None:
            return self.plan.messages / self.plan.rate + 60.0
        floor = 100 if self.plan.persistent else 1_000
        return self.deliveries / floor + 60.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "queues": self.queues,
            "plan": self.plan.to_json(),
            "consumers": self.consumers,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Scenario:
        return cls(
            str(d["name"]),
            int(d["queues"]),
            PublishPlan.from_json(d["plan"]),
            int(d.get("consumers", 0)),
        )


def build_scenarios(
    names: list[str] | tuple[str, ...], *, messages: int, latency_seconds: float
) -> list[Scenario]:
    """The scenarios named (in the given order); raises ValueError for unknown names."""
    out: list[Scenario] = []
    for name in names:
        if name == ONE_TO_ONE:
            out.append(Scenario(name, 1, PublishPlan(messages, BODY_SIZE)))
        elif name in (PERSISTENT, FAILOVER):  # failover: its replication-cost runs
            n = max(1, messages // PERSISTENT_SHARE)
            plan = PublishPlan(n, BODY_SIZE, persistent=True, confirm=CONFIRM_WINDOW)
            out.append(Scenario(name, 1, plan))
        elif name == FANOUT:
            per_queue = max(1, messages // FANOUT_QUEUES)
            out.append(Scenario(name, FANOUT_QUEUES, PublishPlan(per_queue, BODY_SIZE)))
        elif name in AMQLITE_ONLY:
            pattern = SELECT if name == SELECTORS else GROUP
            plan = PublishPlan(messages, BODY_SIZE, pattern=pattern)
            out.append(Scenario(name, 1, plan, SHARED_QUEUE_CONSUMERS))
        elif name == LATENCY:
            n = max(1, round(LATENCY_RATE * latency_seconds))
            out.append(Scenario(name, 1, PublishPlan(n, BODY_SIZE, LATENCY_RATE, stamp=True)))
        else:
            known = ", ".join(KNOWN_SCENARIOS)
            raise ValueError(f"unknown scenario {name!r} (known: {known})")
    return out


@dataclass(slots=True)
class RunResult:
    """One (system, scenario) measurement; ``to_json`` is a row of ``--json``.

    ``server_cpu``, ``client_cpu`` and ``other_cpu`` are shares of one core over the
    run; ``server_cpu_s`` / ``client_cpu_s`` are CPU seconds, shown per delivery.
    ``msgs_per_s`` is None for a run that measures something else (``failover``).
    """

    system: str
    scenario: str
    msgs_per_s: float | None
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
    server_cpu_s: float | None = None
    client_cpu_s: float | None = None
    server_peak_rss_kib: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def per_delivery_us(self, cpu_s: float | None) -> float | None:
        if cpu_s is None or self.consumed <= 0:
            return None
        return cpu_s / self.consumed * 1e6

    def to_json(self) -> dict[str, Any]:
        rss = self.server_peak_rss_kib
        d = {
            "system": self.system,
            "scenario": self.scenario,
            "msgs_per_s": _round(self.msgs_per_s, 1),
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
            "server_cpu_us_per_msg": _round(self.per_delivery_us(self.server_cpu_s), 2),
            "client_cpu_us_per_msg": _round(self.per_delivery_us(self.client_cpu_s), 2),
            "server_peak_rss_mb": None if rss is None else round(rss / 1024, 1),
        }
        d.update(self.extra)
        return d


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def make_result(
    system: str,
    scenario: Scenario,
    report: ClientReport,
    meter: ServerMeter,
    window_s: float,
    clients: str,
) -> RunResult:
    """One run's row from what the clients counted and what the meter read.

    ``window_s`` is the wall time between the meter's marks (publisher start ->
    last message in), the period every CPU share is taken over.
    """
    window = max(1e-9, window_s)
    seconds = max(1e-9, (report.done_ns - report.first_ns) / 1e9)
    publish_seconds = max(1e-9, (report.last_ns - report.first_ns) / 1e9)
    p50 = p99 = p999 = None
    if report.hist is not None:
        hist = report.hist
        p50, p99, p999 = (hist.get_value_at_percentile(p) / 1000 for p in (50, 99, 99.9))
    server_cpu = None if meter.cpu_s is None else meter.cpu_s / window
    client_cpu = report.client_cpu_s / window
    other_cpu = None
    if meter.busy_s is not None and server_cpu is not None:
        # the rest of the machine: what else ran during the run (0 on a quiet machine)
        other_cpu = max(0.0, meter.busy_s / window - server_cpu - client_cpu)
    return RunResult(
        system=system,
        scenario=scenario.name,
        msgs_per_s=(report.consumed / scenario.queues) / seconds,
        p50_ms=p50,
        p99_ms=p99,
        p999_ms=p999,
        published=report.published,
        consumed=report.consumed,
        expected=scenario.deliveries,
        seconds=seconds,
        deliveries_per_s=report.consumed / seconds,
        publish_msgs_per_s=report.published / publish_seconds,
        clients=clients,
        server_cpu=server_cpu,
        client_cpu=client_cpu,
        other_cpu=other_cpu,
        server_cpu_s=meter.cpu_s,
        client_cpu_s=report.client_cpu_s,
        server_peak_rss_kib=meter.peak_rss_kib,
    )


# --- running one scenario against one system, clients in this process -----------------

ProgressHook = Callable[[int, int], None]
Mark = Callable[[], None]


def _nothing() -> None:
    return None


async def run_scenario(
    target: Target,
    scenario: Scenario,
    *,
    clients: str = "shared",
    stall_timeout: float = 30.0,
    server_pid: int | None = None,
    on_progress: ProgressHook | None = None,
) -> RunResult:
    """Run ``scenario`` once against ``target`` with the clients in this process
    (``shared``) or the publisher in a child (``split``)."""
    if clients not in ("shared", "split"):
        raise ValueError(f"clients must be 'shared' or 'split' here, got {clients!r}")
    meter = ServerMeter(server_pid)
    meter.reset_peak()
    marks: list[float] = []

    def started() -> None:
        meter.start()
        marks.append(time.perf_counter())

    def finished() -> None:
        meter.stop()
        marks.append(time.perf_counter())

    report = await run_clients(
        target,
        scenario,
        clients=clients,
        stall_timeout=stall_timeout,
        on_progress=on_progress,
        on_started=started,
        on_finished=finished,
    )
    window = marks[1] - marks[0] if len(marks) == 2 else 0.0
    return make_result(target.system, scenario, report, meter, window, clients)


async def run_clients(
    target: Target,
    scenario: Scenario,
    *,
    clients: str = "shared",
    stall_timeout: float = 30.0,
    on_progress: ProgressHook | None = None,
    on_started: Mark = _nothing,
    on_finished: Mark = _nothing,
) -> ClientReport:
    """Set up the route, subscribe the consumers, then publish (here, or in a child
    process with ``clients="split"``); count, clean up, and report.

    ``on_started`` is called just before the publisher starts, ``on_finished`` as
    soon as every message is in (before the clean-up).
    """
    what = f"{target.system} {scenario.name}"
    plan = scenario.plan
    route = await _prepare(target, scenario, what)
    tallies = scenario.tallies()
    pub = PublishTally()
    child_cpu: list[float] = []
    cpu0 = cpu1 = 0.0

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
                    on_started()
                    cpu0 = own_cpu_seconds()
                    inner.start_soon(publisher)
                cpu1 = own_cpu_seconds()
                on_finished()
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
    hist = None
    if plan.stamp:
        hist = new_histogram()
        for t in tallies:
            assert t.hist is not None
            hist.add(t.hist)
    return ClientReport(
        published=pub.published,
        consumed=done(),
        first_ns=pub.first_ns,
        last_ns=pub.last_ns,
        done_ns=max(t.done_ns for t in tallies),
        client_cpu_s=cpu1 - cpu0 + sum(child_cpu),
        hist=hist,
    )


async def _prepare(target: Target, scenario: Scenario, what: str) -> Route:
    try:
        with trio.fail_after(30):
            return await target.prepare(scenario.name, scenario.queues, durable=scenario.durable)
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
    """Publish from ``python -m amqlite_bench.worker``; fills ``tally``, returns its CPU s."""
    spec = worker_spec(target.system, target.address, target.auth, route, plan)
    result = await trio.run_process(
        [sys.executable, "-m", "amqlite_bench.worker"],
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
