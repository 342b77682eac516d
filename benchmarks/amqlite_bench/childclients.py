"""Running one scenario with the clients in a child process (``--clients process``).

The parent starts ``python -m amqlite_bench.clientproc``, reads its event lines
(:mod:`amqlite_bench.clientproc`), takes the server's CPU time between the
``started`` and ``finished`` lines, and watches for stalls: a child whose counts
stop moving for ``stall_timeout`` seconds, or that outlives the scenario's time
limit, is killed by its pid and the run fails with a :class:`BenchError`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import deque
from typing import Any

import trio

from .errors import BenchError, collapse_errors
from .plan import ClientReport
from .procs import child_env
from .procstat import ServerMeter
from .scenarios import ProgressHook, RunResult, Scenario, make_result

#: Seconds a child may take to start and set up before its first message moves.
SETUP_ALLOWANCE = 60.0


class _ChildRun:
    def __init__(self, what: str, meter: ServerMeter, on_progress: ProgressHook | None) -> None:
        self.what = what
        self.meter = meter
        self.on_progress = on_progress
        self.marks: list[float] = []
        self.published = 0
        self.consumed = 0
        self.report: ClientReport | None = None
        self.stderr_tail: deque[str] = deque(maxlen=8)
        self.stalled = False

    def handle(self, record: dict[str, Any], total: int) -> None:
        event = record.get("event")
        if event == "started":
            self.meter.start()
            self.marks.append(time.perf_counter())
        elif event == "progress":
            self.published = max(self.published, int(record.get("published", -1)))
            self.consumed = max(self.consumed, int(record.get("consumed", 0)))
            if self.on_progress is not None:
                self.on_progress(self.consumed, total)
        elif event == "finished":
            self.meter.stop()
            self.marks.append(time.perf_counter())
        elif event == "report":
            self.report = ClientReport.from_json(record)

    def describe(self, scenario: Scenario) -> str:
        published = "?" if self.published < 0 else f"{self.published:,}"
        return (
            f"published {published}/{scenario.plan.messages:,}, "
            f"consumed {self.consumed:,}/{scenario.deliveries:,}"
        )

    def failure(self, returncode: int | None) -> BenchError:
        lines = [ln for ln in self.stderr_tail if ln.strip()]
        why = lines[-1] if lines else f"the client process exited with {returncode}"
        if not why.startswith(self.what):
            why = f"{self.what}: {why}"
        return BenchError(why)


async def run_in_child(
    system: str,
    spec: dict[str, Any],
    scenario: Scenario,
    *,
    stall_timeout: float = 30.0,
    server_pid: int | None = None,
    on_progress: ProgressHook | None = None,
) -> RunResult:
    """Run the clients ``spec`` describes (:func:`~amqlite_bench.clientproc.client_spec`)
    in a child process and measure ``server_pid`` meanwhile."""
    what = f"{system} {scenario.name}"
    meter = ServerMeter(server_pid)
    meter.reset_peak()
    run = _ChildRun(what, meter, on_progress)
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "amqlite_bench.clientproc"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    limit = scenario.time_limit() + SETUP_ALLOWANCE
    try:
        assert proc.stdin is not None
        await proc.stdin.send_all(json.dumps(spec).encode())
        await proc.stdin.aclose()
        with trio.move_on_after(limit) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_read_stderr, proc, run)
                nursery.start_soon(_watch, run, scenario, stall_timeout, nursery.cancel_scope)
                await _read_stdout(proc, run, scenario.deliveries)
                await proc.wait()
                nursery.cancel_scope.cancel()
        if scope.cancelled_caught:
            raise BenchError(
                f"{what}: did not finish within its time limit of {limit:.0f} s "
                f"({run.describe(scenario)})"
            )
        if run.stalled:
            raise BenchError(
                f"{what}: stalled, no progress for {stall_timeout:g} s ({run.describe(scenario)})"
            )
        if proc.returncode != 0 or run.report is None:
            raise run.failure(proc.returncode)
    except BaseExceptionGroup as group:
        raise collapse_errors(group, what) from None
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    report = run.report
    assert report is not None
    window = run.marks[1] - run.marks[0] if len(run.marks) == 2 else 0.0
    return make_result(system, scenario, report, meter, window, "process")


async def _read_stdout(proc: trio.Process, run: _ChildRun, total: int) -> None:
    stdout = proc.stdout
    assert stdout is not None
    buf = b""
    while True:
        chunk = await stdout.receive_some(65536)
        if not chunk:
            return
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                run.handle(record, total)


async def _read_stderr(proc: trio.Process, run: _ChildRun) -> None:
    stderr = proc.stderr
    assert stderr is not None
    buf = b""
    while True:
        chunk = await stderr.receive_some(65536)
        if not chunk:
            if buf:
                run.stderr_tail.append(buf.decode(errors="replace").rstrip())
            return
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            run.stderr_tail.append(raw.decode(errors="replace").rstrip())


async def _watch(
    run: _ChildRun, scenario: Scenario, stall_timeout: float, scope: trio.CancelScope
) -> None:
    """Cancel the run (and mark it stalled) when its counts stop moving once the
    publisher has started (the set-up before is bounded by the time limit)."""
    last = (-2, -2)
    since = trio.current_time()
    while True:
        await trio.sleep(0.25)
        now = trio.current_time()
        value = (run.published, run.consumed)
        if not run.marks or value != last:
            last, since = value, now
        elif now - since >= stall_timeout:
            run.stalled = True
            scope.cancel()
            return
