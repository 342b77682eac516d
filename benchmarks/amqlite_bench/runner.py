"""``amqlite bench``: start the servers, run every scenario on each system, report.

Unless ``-s SERVERS`` names a running broker, the bench starts its own
(``amqlite server`` on a free loopback port; for ``1to1-persistent-confirm`` one
per fsync policy, each with a data dir of its own) and the raw-trio relay
(``python -m amqlite_bench.baseline``), each in its own process; with
``--vs rabbitmq,nats`` it also has those peers started by ``scripts/peers``.
``failover`` starts, kills and restarts an HA pair of its own
(:mod:`amqlite_bench.failover`); it runs once, whatever ``--repeat`` says.
It stops everything it started, by pid, when it ends, however it ends. Each
scenario runs on every system in turn, ``--repeat`` times, interleaved, so their
ratio compares like with like; the median run is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import structlog
import trio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from amqlite.log import configure_logging

from .childclients import run_in_child
from .clientproc import client_spec
from .contenders import FSYNC_MODES, Contender, Lineup, fsync_system
from .errors import BenchError, collapse_errors
from .failover import (
    DEFAULT_KILLS,
    DEFAULT_RATE,
    DEFAULT_REPLICATION_RUNS,
    PAIR_SYSTEM,
    QUICK_KILLS,
    FailoverOptions,
    run_failover,
)
from .hapair import DEFAULT_FAILOVER_TIMEOUT_MS, DEFAULT_HEARTBEAT_MS, PairTiming
from .peers import INSTALL_HINT, PEERS, RABBITMQ
from .plan import GROUPS as GROUPS_PER_QUEUE
from .plan import SELECT_HEADER
from .report import dumps, failover_lines, markdown_table, print_report
from .scenarios import (
    AMQLITE_ONLY,
    CLIENT_MODES,
    CONFIRM_WINDOW,
    DEFAULT_MESSAGES,
    FAILOVER,
    FANOUT,
    FANOUT_QUEUES,
    LATENCY_SECONDS,
    ONE_TO_ONE,
    PERSISTENT,
    PERSISTENT_SHARE,
    QUICK_LATENCY_SECONDS,
    QUICK_MESSAGES,
    SCENARIO_NAMES,
    SELECTORS,
    RunResult,
    Scenario,
    build_scenarios,
    run_scenario,
)
from .systems import AMQLITE, AMQLITE_AMQP, AMQLITE_TLS, RAW_TRIO, make_target

#: Where the bench clients run by default (see benchmarks/README.md for the measurement).
DEFAULT_CLIENTS = "shared"
#: ... and with --vs, where every system's clients run the way the peers' must.
VS_CLIENTS = "process"
#: The amqlite-side systems ``--systems`` takes, in the order they run.
SYSTEMS: tuple[str, ...] = (RAW_TRIO, AMQLITE, AMQLITE_TLS, AMQLITE_AMQP)
#: ... those run when --systems is not given and there is no --vs
DEFAULT_SYSTEMS: tuple[str, ...] = (RAW_TRIO, AMQLITE)
#: Systems whose clients are trio clients (the others' run in a child process).
TRIO_SYSTEMS: tuple[str, ...] = (RAW_TRIO, AMQLITE)
#: Runs per (scenario, system) with --vs when --repeat is not given.
VS_REPEAT = 3
PAUSE_BETWEEN_RUNS = 0.3

EPILOG = f"""\
scenarios: {", ".join(SCENARIO_NAMES)} (the default), {", ".join(AMQLITE_ONLY)}, {FAILOVER}
examples:
  amqlite bench                              # the default scenarios, 200,000 messages
  amqlite bench --quick --json               # 20,000 messages, 2 s of latency, JSON on stdout
  amqlite bench --scenarios 1to1-transient --clients split
  amqlite bench -s 127.0.0.1:5555            # against a running broker (baseline still local)
  amqlite bench --vs rabbitmq,nats --plot benchmarks/vs.png   # side by side with the peers
  amqlite bench --vs rabbitmq --systems amqlite-amqp --quick  # AMQP 0-9-1: pika on both
  amqlite bench --scenarios failover --kills 5   # an HA pair: kill -9 of its master 5 times
  amqlite bench --systems amqlite,{AMQLITE_TLS} --scenarios 1to1-transient   # TLS vs plain

Each scenario runs against amqlite and against the raw-trio relay (the same
framing and codec, no broker) in the same invocation; the table shows their ratio.
--vs adds RabbitMQ (pika) and NATS (nats-py), started by scripts/peers on their
own loopback ports ({INSTALL_HINT} for the clients; scripts/peers install for the
servers); a peer that cannot be had is named and left out. With --vs rabbitmq,
{AMQLITE_AMQP} runs too: amqlite's AMQP 0-9-1 listener (--amqp-port) driven by the
same pika clients as RabbitMQ, with its ratio to RabbitMQ and server CPU per message
side by side.
{AMQLITE_TLS} is amqlite over TLS: a broker of its own with a TLS-only listener and a
throwaway CA made by trustme at run time; its rows carry ratio_vs_amqlite (TLS msgs/s
over plain).
{FAILOVER} runs on {PAIR_SYSTEM} only, a pair it starts itself: the time from a
kill -9 of the master to the first confirmed publish on the new one, the longest
gap in deliveries, every confirmed message counted, and persistent confirmed
throughput with a live backup over the same without one.
Progress goes to stderr, results to stdout.
"""


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``amqlite bench``'s flags to ``parser`` (run it with :func:`run_bench`)."""
    parser.description = "Measure amqlite against a raw-trio relay and its peers on this machine."
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "-s", "--servers", metavar="SERVERS",
        help="use this running broker (host:port[,host:port]) instead of starting one",
    )  # fmt: skip
    parser.add_argument(
        "--scenarios", metavar="A,B", default=",".join(SCENARIO_NAMES),
        help=f"comma-separated scenarios to run (default: all but {FAILOVER}, which takes "
        "minutes)",
    )  # fmt: skip
    parser.add_argument(
        "--systems", metavar="A,B",
        help=f"amqlite-side systems to run: {', '.join(SYSTEMS)} (default: "
        f"{','.join(DEFAULT_SYSTEMS)}; with --vs: {AMQLITE}, and {AMQLITE_AMQP} when "
        f"{RABBITMQ} is a peer)",
    )  # fmt: skip
    parser.add_argument(
        "--vs", metavar="PEERS", default="",
        help=f"also run every scenario on these peers ({', '.join(PEERS)}), in the same "
        f"invocation, and report amqlite/peer ratios (--repeat defaults to {VS_REPEAT})",
    )  # fmt: skip
    parser.add_argument(
        "--messages", "-n", type=int, metavar="N",
        help=f"messages per throughput run (default {DEFAULT_MESSAGES:,}; --quick "
        f"{QUICK_MESSAGES:,}); {FANOUT} publishes N/{FANOUT_QUEUES}, {PERSISTENT} "
        f"N/{PERSISTENT_SHARE}",
    )  # fmt: skip
    parser.add_argument(
        "--latency-seconds", type=float, metavar="S",
        help=f"length of the latency run (default {LATENCY_SECONDS:g}; --quick "
        f"{QUICK_LATENCY_SECONDS:g})",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true", help="a short run (20,000 messages; failover: 5 kills)"
    )
    parser.add_argument(
        "--clients", choices=CLIENT_MODES,
        help="shared: publisher and consumers in this process; split: the publisher "
        "in a child process; process: both in one child process per run (default "
        f"{DEFAULT_CLIENTS}; with --vs {VS_CLIENTS}, as the peers' clients always run)",
    )  # fmt: skip
    parser.add_argument(
        "--repeat", type=int, metavar="N",
        help="run each scenario N times per system, interleaved, and report the median run "
        f"(by msgs/s; by p99 for latency) (default 1; with --vs {VS_REPEAT})",
    )  # fmt: skip
    parser.add_argument(
        "--stall-timeout", type=float, default=30.0, metavar="S",
        help="fail a run when no message moves for this long (default 30)",
    )  # fmt: skip
    ha = parser.add_argument_group(f"{FAILOVER} scenario")
    ha.add_argument(
        "--kills", type=int, metavar="N",
        help=f"kill -9 the master N times (default {DEFAULT_KILLS}; --quick {QUICK_KILLS})",
    )  # fmt: skip
    ha.add_argument(
        "--failover-rate", type=float, default=DEFAULT_RATE, metavar="MSGS",
        help=f"persistent confirmed publishes a second during the kills (default "
        f"{DEFAULT_RATE:,.0f})",
    )  # fmt: skip
    ha.add_argument(
        "--heartbeat-ms", type=int, default=DEFAULT_HEARTBEAT_MS, metavar="MS",
        help=f"the pair's [cluster] heartbeat_ms (default {DEFAULT_HEARTBEAT_MS})",
    )  # fmt: skip
    ha.add_argument(
        "--failover-timeout-ms", type=int, default=DEFAULT_FAILOVER_TIMEOUT_MS, metavar="MS",
        help=f"the pair's [cluster] failover_timeout_ms (default "
        f"{DEFAULT_FAILOVER_TIMEOUT_MS})",
    )  # fmt: skip
    ha.add_argument(
        "--ha-logs", metavar="DIR",
        help="keep the pair's server logs (primary.log, backup.log) in DIR",
    )  # fmt: skip
    parser.add_argument("--vhost", default="/", help="amqlite virtual host (default /)")
    parser.add_argument("--login", default="guest", help="amqlite login (default guest)")
    parser.add_argument("--password", default="guest", help="amqlite password (default guest)")
    parser.add_argument("--save", metavar="FILE", help="also write the --json document to FILE")
    parser.add_argument(
        "--plot", metavar="FILE.png",
        help=f"also draw msgs/s and latency percentiles per system to FILE.png ({INSTALL_HINT})",
    )  # fmt: skip
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the results as JSON")
    output.add_argument("--markdown", action="store_true", help="print a Markdown table")


@dataclass(frozen=True, slots=True)
class BenchOptions:
    scenarios: tuple[Scenario, ...]
    systems: tuple[str, ...]
    clients: str
    servers: str | None
    stall_timeout: float
    repeat: int = 1
    vhost: str = "/"
    login: str = "guest"
    password: str = "guest"
    peers: tuple[str, ...] = ()
    failover: FailoverOptions = field(default_factory=FailoverOptions)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """Validated options; raises ValueError naming the bad flag."""
    names = _names(args.scenarios)
    if not names:
        raise ValueError("--scenarios: name at least one scenario")
    messages = args.messages
    if messages is None:
        messages = QUICK_MESSAGES if args.quick else DEFAULT_MESSAGES
    if messages < 1:
        raise ValueError("--messages must be at least 1")
    seconds = args.latency_seconds
    if seconds is None:
        seconds = QUICK_LATENCY_SECONDS if args.quick else LATENCY_SECONDS
    if seconds <= 0:
        raise ValueError("--latency-seconds must be positive")
    peers = tuple(dict.fromkeys(_names(args.vs)))
    unknown_peers = [p for p in peers if p not in PEERS]
    if unknown_peers:
        raise ValueError(f"--vs: choose from {', '.join(PEERS)} (got {args.vs!r})")
    repeat = args.repeat if args.repeat is not None else (VS_REPEAT if peers else 1)
    if repeat < 1:
        raise ValueError("--repeat must be at least 1")
    if args.stall_timeout <= 0:
        raise ValueError("--stall-timeout must be positive")
    try:
        scenarios = build_scenarios(names, messages=messages, latency_seconds=seconds)
    except ValueError as exc:
        raise ValueError(f"--scenarios: {exc}") from None
    if args.systems is not None:
        systems = tuple(_names(args.systems))
    elif peers:
        systems = (AMQLITE, AMQLITE_AMQP) if RABBITMQ in peers else (AMQLITE,)
    else:
        systems = DEFAULT_SYSTEMS
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise ValueError(f"--systems: choose from {', '.join(SYSTEMS)} (got {args.systems!r})")
    clients = args.clients or (VS_CLIENTS if peers else DEFAULT_CLIENTS)
    failover = _failover_options(args)
    return BenchOptions(
        scenarios=tuple(scenarios),
        systems=tuple(s for s in SYSTEMS if s in systems),
        clients=clients,
        servers=args.servers,
        stall_timeout=args.stall_timeout,
        repeat=repeat,
        vhost=args.vhost,
        login=args.login,
        password=args.password,
        peers=peers,
        failover=failover,
    )


def _failover_options(args: argparse.Namespace) -> FailoverOptions:
    kills = args.kills
    if kills is None:
        kills = QUICK_KILLS if args.quick else DEFAULT_KILLS
    if kills < 1:
        raise ValueError("--kills must be at least 1")
    if not args.failover_rate > 0:
        raise ValueError("--failover-rate must be positive")
    try:
        timing = PairTiming(args.heartbeat_ms, args.failover_timeout_ms)
    except ValueError as exc:
        raise ValueError(f"--heartbeat-ms/--failover-timeout-ms: {exc}") from None
    runs = args.repeat if args.repeat is not None else DEFAULT_REPLICATION_RUNS
    return FailoverOptions(
        kills=kills,
        rate=args.failover_rate,
        timing=timing,
        replication_runs=max(1, runs),
        log_dir=args.ha_logs,
    )


@dataclass(slots=True)
class BenchOutcome:
    """The median rows, and what was left out or failed (one line each)."""

    results: list[RunResult] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def run_bench(args: argparse.Namespace) -> int:
    """Entry point of ``amqlite bench``; returns the exit status."""
    err = Console(stderr=True)
    try:
        opts = options_from_args(args)
    except ValueError as exc:
        print(f"amqlite bench: error: {exc}", file=sys.stderr)
        return 2
    progress = ProgressLog(err)
    try:
        with _client_logs_on_stderr():
            outcome = trio.run(run_benchmarks, opts, progress)
    except BenchError as exc:
        print(f"amqlite bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("amqlite bench: interrupted", file=sys.stderr)
        return 130
    results = outcome.results
    status = 1 if outcome.failures else 0
    if args.save:
        try:
            with open(args.save, "w") as f:
                f.write(dumps(results) + "\n")
        except OSError as exc:
            print(f"amqlite bench: error: cannot write {args.save}: {exc}", file=sys.stderr)
            status = 1
    if args.plot:
        status = max(status, _plot(results, args.plot, opts))
    all_notes = notes(opts) + [f"left out: {line}" for line in outcome.left_out]
    all_notes += [f"FAILED: {line}" for line in outcome.failures]
    if args.json:
        print(dumps(results))
    elif args.markdown:
        print(markdown_table(results))
        for note in all_notes:
            print(f"- {note}")
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=200)
        print_report(results, all_notes, out)
    return status


@contextlib.contextmanager
def _client_logs_on_stderr() -> Iterator[None]:
    """The client's warnings (a failover's clients reconnect) go to stderr, never
    into the results on stdout, whatever structlog was configured to before (an
    unconfigured structlog prints to stdout, and so does one configured with only
    some of its settings, as ``structlog.testing.capture_logs`` leaves it); the
    previous configuration is put back afterwards."""
    was_configured = structlog.is_configured()
    previous = structlog.get_config()
    configure_logging("console", "warning", sys.stderr)
    try:
        yield
    finally:
        if was_configured:
            structlog.configure(**previous)
        else:
            structlog.reset_defaults()


def _plot(results: list[RunResult], path: str, opts: BenchOptions) -> int:
    try:
        from .plot import plot_results

        title = f"amqlite bench, median of {opts.repeat} run(s); {machine_description()}"
        plot_results([r for r in results if r.msgs_per_s is not None], path, title)
    except ImportError as exc:
        print(f"amqlite bench: --plot needs matplotlib ({INSTALL_HINT}): {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"amqlite bench: error: cannot draw {path}: {exc}", file=sys.stderr)
        return 1
    print(f"bench: chart written to {path}", file=sys.stderr)
    return 0


async def run_benchmarks(opts: BenchOptions, progress: ProgressLog | None = None) -> BenchOutcome:
    """Start what the options need, run every (scenario, system), stop it all.

    A system that cannot be had, or cannot take part in a scenario, is named in
    ``left_out``; a run that fails is named in ``failures`` and its system takes
    no further part in that scenario (or in any, when its server died).
    """
    outcome = BenchOutcome()

    def say(line: str) -> None:
        outcome.left_out.append(line)
        if progress:
            progress.line(line)

    lineup = Lineup(say)
    try:
        async with trio.open_nursery() as nursery:
            if threading.current_thread() is threading.main_thread():
                nursery.start_soon(_interrupt_on_sigterm)
            try:
                auth = {"vhost": opts.vhost, "login": opts.login, "password": opts.password}
                contenders = await lineup.start(
                    nursery,
                    systems=opts.systems,
                    peers=opts.peers,
                    scenarios=tuple(s.name for s in opts.scenarios),
                    servers=opts.servers,
                    auth=auth,
                )
                for scenario in opts.scenarios:
                    await _run_scenario_everywhere(opts, contenders, scenario, progress, outcome)
            finally:
                await lineup.stop()
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise collapse_errors(group, "bench") from None
    return outcome


async def _run_scenario_everywhere(
    opts: BenchOptions,
    contenders: list[Contender],
    scenario: Scenario,
    progress: ProgressLog | None,
    outcome: BenchOutcome,
) -> None:
    for c in contenders:
        why = c.skip.get(scenario.name)
        if why is not None and c.dead is None:
            line = f"{c.system}: {scenario.name} not run: {why}"
            outcome.left_out.append(line)
            if progress:
                progress.line(line)
    runs = [c for c in contenders if c.runs(scenario.name)]
    failed: set[str] = set()
    repeats: dict[tuple[str, str], list[RunResult]] = {}
    repeat = 1 if scenario.name == FAILOVER else opts.repeat  # its kills are the repeats
    for _ in range(repeat):  # interleaved: a disturbance hits every system alike
        for c in runs:
            if c.system in failed or not c.runs(scenario.name):
                continue
            try:
                rows = await _run_one(opts, c, scenario, progress)
            except BenchError as exc:
                outcome.failures.append(str(exc))
                if progress:
                    progress.line(f"FAILED: {exc}")
                failed.add(c.system)
                if c.server is not None and c.server.proc.poll() is not None:
                    c.dead = str(exc)
                continue
            for r in rows:
                repeats.setdefault((r.system, r.scenario), []).append(r)
                lost = r.extra.get("lost")
                if lost:
                    line = (
                        f"{r.system} {r.scenario}: {lost} confirmed message(s) never delivered "
                        "(lost)"
                    )
                    outcome.failures.append(line)
                    if progress:
                        progress.line(f"FAILED: {line}")
            await trio.sleep(PAUSE_BETWEEN_RUNS)
    outcome.results.extend(median_run(rs) for rs in repeats.values())


def median_run(runs: list[RunResult]) -> RunResult:
    """The median of repeated runs (by p99 when they measured latency, else by msgs/s);
    its ``extra`` lists every run's figure."""
    if len(runs) == 1:
        return runs[0]
    if runs[0].p99_ms is not None:
        ordered = sorted(runs, key=lambda r: r.p99_ms or 0.0)
    else:
        ordered = sorted(runs, key=lambda r: r.msgs_per_s or 0.0)
    chosen = ordered[(len(ordered) - 1) // 2]
    if len(runs) > 1:
        chosen.extra["repeats"] = len(runs)
        chosen.extra["msgs_per_s_runs"] = [round(r.msgs_per_s or 0.0, 1) for r in runs]
        if chosen.p99_ms is not None:
            chosen.extra["p99_ms_runs"] = [round(r.p99_ms or 0.0, 3) for r in runs]
    return chosen


async def _interrupt_on_sigterm() -> None:
    """SIGTERM ends the bench like Ctrl-C does: servers stopped, exit status 130."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            raise KeyboardInterrupt


async def _run_one(
    opts: BenchOptions,
    c: Contender,
    scenario: Scenario,
    progress: ProgressLog | None,
) -> list[RunResult]:
    if c.driver == PAIR_SYSTEM:
        return await _run_failover(opts, c, scenario, progress)
    label = f"{c.system} {scenario.name}"
    hook = progress.begin(label, scenario.deliveries) if progress else None
    in_child = opts.clients == "process" or c.driver not in TRIO_SYSTEMS
    try:
        if in_child:
            spec = client_spec(c.system, c.driver, c.address, c.auth, scenario, opts.stall_timeout)
            result = await run_in_child(
                c.system,
                spec,
                scenario,
                stall_timeout=opts.stall_timeout,
                server_pid=c.pid,
                on_progress=hook,
            )
        else:
            target = make_target(c.driver, c.address, **c.auth)
            target.system = c.system
            result = await run_scenario(
                target,
                scenario,
                clients=opts.clients,
                stall_timeout=opts.stall_timeout,
                server_pid=c.pid,
                on_progress=hook,
            )
    except BenchError:
        c.check_alive()  # a dead server explains the failure better
        raise
    finally:
        if progress:
            progress.end()
    c.check_alive()
    if progress:
        progress.line(
            f"{label}: {result.msgs_per_s or 0:,.0f} msgs/s, {result.consumed:,} deliveries "
            f"in {result.seconds:.2f} s"
            + (f", p99 {result.p99_ms:.3f} ms" if result.p99_ms is not None else "")
        )
    return [result]


async def _run_failover(
    opts: BenchOptions, c: Contender, scenario: Scenario, progress: ProgressLog | None
) -> list[RunResult]:
    label = f"{c.system} {scenario.name}"
    kills = opts.failover.kills
    hook = progress.begin(label, kills, unit="kills") if progress else None
    try:
        rows = await run_failover(
            scenario,
            opts.failover,
            auth=c.auth,
            stall_timeout=opts.stall_timeout,
            say=progress.line if progress else None,
            on_progress=hook,
        )
    finally:
        if progress:
            progress.end()
    if progress:
        for line in failover_lines(rows):
            progress.line(line)
    return rows


class ProgressLog:
    """Progress on stderr: a rich bar on a terminal, otherwise one line per run."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live = console.is_terminal
        self._progress: Progress | None = None

    def begin(
        self, label: str, total: int, unit: str = "deliveries"
    ) -> Callable[[int, int], None] | None:
        self.line(f"{label}: running ({total:,} {unit})")
        if not self._live:
            return None
        progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            auto_refresh=False,  # refreshed by the run's progress task: no extra thread
        )
        task = progress.add_task(label, total=total)
        progress.start()
        self._progress = progress

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, refresh=True)

        return update

    def end(self) -> None:
        progress = self._progress
        if progress is not None:
            progress.stop()
            self._progress = None

    def line(self, text: str) -> None:
        self.console.print(f"bench: {text}", highlight=False, soft_wrap=True)


def machine_description() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}"


def notes(opts: BenchOptions) -> list[str]:
    out = [f"machine: {machine_description()}"]
    if opts.repeat > 1:
        out.append(
            f"each row is the median of {opts.repeat} runs, interleaved across systems "
            "(by msgs/s; by p99 for latency); every run's figure is in --json"
        )
    if opts.clients == "shared":
        out.append(
            "clients: publisher and consumers share the bench process; each server has "
            "its own process (measured faster than --clients split on 2 cores)"
        )
    elif opts.clients == "split":
        out.append("clients: the publisher runs in a child process, consumers in the bench process")
    else:
        out.append(
            "clients: each run's publisher and consumers share one child process (one event "
            "loop); each server has its own process"
        )
    if opts.peers:
        out.append(
            "peers' clients always run in a child process: rabbitmq with pika's SelectConnection "
            "(one I/O loop, acks coalesced per read like amqlite's client), nats with nats-py "
            "(asyncio, core NATS: no queue, no ack, at most once)"
        )
    for s in opts.scenarios:
        if s.name == FANOUT:
            out.append(
                f"{FANOUT}: {s.plan.messages:,} published x {s.queues} queues; msgs/s counts a "
                "message once all its copies are delivered, deliveries/s counts every copy"
            )
        if s.name in AMQLITE_ONLY:
            what = (
                f"each selecting a tenth (header {SELECT_HEADER} = 0..9)"
                if s.name == SELECTORS
                else f"sharing {GROUPS_PER_QUEUE:,} message groups (group_id)"
            )
            out.append(
                f"{s.name}: {s.plan.messages:,} messages to one queue, {s.consumer_count} "
                f"consumers {what}; compare its msgs/s with {ONE_TO_ONE}'s (amqlite only)"
            )
        if s.name == PERSISTENT:
            amqlites = [x for x in (AMQLITE, AMQLITE_AMQP) if x in opts.systems]
            modes = ", ".join(fsync_system(m, x) for x in amqlites for m in FSYNC_MODES)
            out.append(
                f"{PERSISTENT}: {s.plan.messages:,} persistent messages to a durable queue, "
                f"confirms with at most {CONFIRM_WINDOW:,} outstanding; amqlite as {modes} "
                "(--data-dir, --fsync)"
            )
        if s.name == FAILOVER:
            f = opts.failover
            out.append(
                f"{FAILOVER}: an HA pair on loopback (heartbeat {f.timing.heartbeat_ms} ms, "
                f"failover timeout {f.timing.failover_timeout_ms} ms), {f.kills} x kill -9 of "
                f"the master under {f.rate:,.0f} persistent confirmed msgs/s; failover = kill -> "
                "first confirm from the new master; gap = longest wait between two deliveries "
                "from the kill to the next; percentiles nearest-rank over the kills; clients "
                "in the bench process"
            )
            out.append(
                f"persistent-confirm-replicated: {s.plan.messages:,} persistent messages, "
                f"window {CONFIRM_WINDOW:,}, --fsync batch, on the pair (backup attached) and on "
                f"a standalone broker, alternating, median of {f.replication_runs}; both nodes "
                "share this machine's cores"
            )
    if AMQLITE_AMQP in opts.systems:
        out.append(
            f"{AMQLITE_AMQP}: amqlite's broker (the same processes as amqlite's rows) over its "
            "AMQP 0-9-1 listener (--amqp-port), driven by the pika clients rabbitmq's runs use"
        )
    if AMQLITE_TLS in opts.systems:
        out.append(
            f"{AMQLITE_TLS}: a broker of its own (--tls, a throwaway CA and certificate made by "
            "trustme at start), the same amqlite clients over amqlites:// verifying it; "
            "'TLS / plain' = its msgs/s over amqlite's in the same scenario"
        )
    if RAW_TRIO in opts.systems:
        out.append(
            "raw-trio: a relay decoding each publish (cbor2) and encoding deliveries with the "
            "broker's encoder, no broker logic"
        )
    out.append(
        "vs X = amqlite's msgs/s over X's in the same scenario (above 1: amqlite faster); "
        "'p99 r' = amqlite's p99 over X's (below 1: amqlite's is lower)"
    )
    out.append(
        "CPU: share of one core over the run (server, clients, everything else on the machine: "
        "high = a disturbed run); us/msg = CPU microseconds per delivery; server peak MB = "
        "VmHWM during the run"
    )
    return out
