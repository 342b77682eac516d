"""``amqlite bench``: start the servers, run every scenario on each system, report.

Unless ``-s SERVERS`` names a running broker, the bench starts its own
(``amqlite server`` on a free loopback port) and always the raw-trio relay
(``python -m amqlite.bench.baseline``), each in its own process, and stops both
by pid when it ends, however it ends. Each scenario runs on the baseline, then
on amqlite, in the same invocation, so their ratio compares like with like.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import trio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from .errors import BenchError, collapse_errors
from .procs import ServerProcess, baseline_argv, broker_argv
from .report import dumps, markdown_table, print_report
from .scenarios import (
    CLIENT_MODES,
    DEFAULT_MESSAGES,
    FANOUT,
    FANOUT_QUEUES,
    LATENCY_SECONDS,
    QUICK_LATENCY_SECONDS,
    QUICK_MESSAGES,
    SCENARIO_NAMES,
    RunResult,
    Scenario,
    build_scenarios,
    run_scenario,
)
from .systems import AMQLITE, RAW_TRIO, AmqliteTarget, RelayTarget, Target

#: Where the bench clients run by default (see benchmarks/README.md for the measurement).
DEFAULT_CLIENTS = "shared"
SYSTEMS: tuple[str, ...] = (RAW_TRIO, AMQLITE)
PAUSE_BETWEEN_RUNS = 0.3

EPILOG = f"""\
scenarios: {", ".join(SCENARIO_NAMES)}
examples:
  amqlite bench                              # all scenarios, 200,000 messages
  amqlite bench --quick --json               # 20,000 messages, 2 s of latency, JSON on stdout
  amqlite bench --scenarios 1to1-transient --clients split
  amqlite bench -s 127.0.0.1:5555            # against a running broker (baseline still local)

Each scenario runs against amqlite and against the raw-trio relay (the same
framing and codec, no broker) in the same invocation; the table shows their ratio.
Progress goes to stderr, results to stdout.
"""


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``amqlite bench``'s flags to ``parser`` (run it with :func:`run_bench`)."""
    parser.description = "Measure amqlite against a raw-trio relay on this machine."
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "-s", "--servers", metavar="SERVERS",
        help="use this running broker (host:port[,host:port]) instead of starting one",
    )  # fmt: skip
    parser.add_argument(
        "--scenarios", metavar="A,B", default=",".join(SCENARIO_NAMES),
        help="comma-separated scenarios to run (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--systems", metavar="A,B", default=",".join(SYSTEMS),
        help=f"systems to run: {', '.join(SYSTEMS)} (default: both)",
    )  # fmt: skip
    parser.add_argument(
        "--messages", "-n", type=int, metavar="N",
        help=f"messages per throughput run (default {DEFAULT_MESSAGES:,}; --quick "
        f"{QUICK_MESSAGES:,}); {FANOUT} publishes N/{FANOUT_QUEUES}",
    )  # fmt: skip
    parser.add_argument(
        "--latency-seconds", type=float, metavar="S",
        help=f"length of the latency run (default {LATENCY_SECONDS:g}; --quick "
        f"{QUICK_LATENCY_SECONDS:g})",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a short run (20,000 messages)")
    parser.add_argument(
        "--clients", choices=CLIENT_MODES, default=DEFAULT_CLIENTS,
        help="shared: publisher and consumers in this process; split: the publisher "
        f"in a child process (default {DEFAULT_CLIENTS})",
    )  # fmt: skip
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N",
        help="run each scenario N times per system, interleaved, and report the median run "
        "(by msgs/s; by p99 for latency) (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--stall-timeout", type=float, default=30.0, metavar="S",
        help="fail a run when no message moves for this long (default 30)",
    )  # fmt: skip
    parser.add_argument("--vhost", default="/", help="amqlite virtual host (default /)")
    parser.add_argument("--login", default="guest", help="amqlite login (default guest)")
    parser.add_argument("--password", default="guest", help="amqlite password (default guest)")
    parser.add_argument("--save", metavar="FILE", help="also write the --json document to FILE")
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


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """Validated options; raises ValueError naming the bad flag."""
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
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
    if args.repeat < 1:
        raise ValueError("--repeat must be at least 1")
    if args.stall_timeout <= 0:
        raise ValueError("--stall-timeout must be positive")
    try:
        scenarios = build_scenarios(names, messages=messages, latency_seconds=seconds)
    except ValueError as exc:
        raise ValueError(f"--scenarios: {exc}") from None
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise ValueError(f"--systems: choose from {', '.join(SYSTEMS)} (got {args.systems!r})")
    return BenchOptions(
        scenarios=tuple(scenarios),
        systems=tuple(s for s in SYSTEMS if s in systems),
        clients=args.clients,
        servers=args.servers,
        stall_timeout=args.stall_timeout,
        repeat=args.repeat,
        vhost=args.vhost,
        login=args.login,
        password=args.password,
    )


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
        results = trio.run(run_benchmarks, opts, progress)
    except BenchError as exc:
        print(f"amqlite bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("amqlite bench: interrupted", file=sys.stderr)
        return 130
    if args.save:
        try:
            with open(args.save, "w") as f:
                f.write(dumps(results) + "\n")
        except OSError as exc:
            print(f"amqlite bench: error: cannot write {args.save}: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(dumps(results))
    elif args.markdown:
        print(markdown_table(results))
        for note in notes(opts):
            print(f"- {note}")
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=160)
        print_report(results, notes(opts), out)
    return 0


async def run_benchmarks(
    opts: BenchOptions, progress: ProgressLog | None = None
) -> list[RunResult]:
    """Start the servers the options need, run every (scenario, system), stop the servers."""
    results: list[RunResult] = []
    started: list[ServerProcess] = []
    try:
        async with trio.open_nursery() as nursery:
            if threading.current_thread() is threading.main_thread():
                nursery.start_soon(_interrupt_on_sigterm)
            try:
                runs: list[tuple[Target, ServerProcess | None]] = []
                if RAW_TRIO in opts.systems:
                    relay = await ServerProcess.start(
                        nursery, "raw-trio relay", baseline_argv(), "baseline_listening"
                    )
                    started.append(relay)
                    runs.append((RelayTarget(relay.address), relay))
                if AMQLITE in opts.systems:
                    broker: ServerProcess | None = None
                    address = opts.servers
                    if address is None:
                        broker = await ServerProcess.start(
                            nursery, "amqlite broker", broker_argv(), "server_listening"
                        )
                        started.append(broker)
                        address = broker.address
                    amq = AmqliteTarget(
                        address, vhost=opts.vhost, login=opts.login, password=opts.password
                    )
                    runs.append((amq, broker))
                for scenario in opts.scenarios:
                    repeats: dict[str, list[RunResult]] = {}
                    for _ in range(opts.repeat):  # interleaved: a disturbance hits both
                        for target, server in runs:
                            r = await _run_one(opts, target, server, scenario, progress)
                            repeats.setdefault(target.system, []).append(r)
                            await trio.sleep(PAUSE_BETWEEN_RUNS)
                    results.extend(median_run(rs) for rs in repeats.values())
            finally:
                for server in reversed(started):
                    await server.stop()
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise collapse_errors(group, "bench") from None
    return results


def median_run(runs: list[RunResult]) -> RunResult:
    """The median of repeated runs (by p99 when they measured latency, else by msgs/s);
    its ``extra`` lists every run's figure."""
    if runs[0].p99_ms is not None:
        ordered = sorted(runs, key=lambda r: r.p99_ms or 0.0)
    else:
        ordered = sorted(runs, key=lambda r: r.msgs_per_s)
    chosen = ordered[(len(ordered) - 1) // 2]
    if len(runs) > 1:
        chosen.extra["repeats"] = len(runs)
        chosen.extra["msgs_per_s_runs"] = [round(r.msgs_per_s, 1) for r in runs]
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
    target: Target,
    server: ServerProcess | None,
    scenario: Scenario,
    progress: ProgressLog | None,
) -> RunResult:
    label = f"{target.system} {scenario.name}"
    hook = progress.begin(label, scenario.deliveries) if progress else None
    try:
        result = await run_scenario(
            target,
            scenario,
            clients=opts.clients,
            stall_timeout=opts.stall_timeout,
            server_pid=server.pid if server else None,
            on_progress=hook,
        )
    except BenchError:
        if server is not None:
            server.check_alive()  # a dead server explains the failure better
        raise
    finally:
        if progress:
            progress.end()
    if server is not None:
        server.check_alive()
    if progress:
        progress.line(
            f"{label}: {result.msgs_per_s:,.0f} msgs/s, {result.consumed:,} deliveries "
            f"in {result.seconds:.2f} s"
            + (f", p99 {result.p99_ms:.3f} ms" if result.p99_ms is not None else "")
        )
    return result


class ProgressLog:
    """Progress on stderr: a rich bar on a terminal, otherwise one line per run."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live = console.is_terminal
        self._progress: Progress | None = None

    def begin(self, label: str, total: int) -> Callable[[int, int], None] | None:
        self.line(f"{label}: running ({total:,} deliveries)")
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
    if opts.clients == "shared":
        out.append(
            "clients: publisher and consumers share the bench process; each server has "
            "its own process (measured faster than --clients split on 2 cores)"
        )
    else:
        out.append("clients: the publisher runs in a child process, consumers in the bench process")
    for s in opts.scenarios:
        if s.name == FANOUT:
            out.append(
                f"{FANOUT}: {s.plan.messages:,} published x {s.queues} queues; msgs/s counts a "
                "message once all its copies are delivered, deliveries/s counts every copy"
            )
    out.append(
        "raw-trio: a relay decoding each publish (cbor2) and encoding deliveries with the "
        "broker's encoder, no broker logic; amqlite/baseline = ratio of msgs/s"
    )
    out.append(
        "CPU columns: CPU time / run time (100% = one core) of the server process, of the "
        "bench clients, and of everything else on the machine (high = a disturbed run)"
    )
    return out
