"""The servers a bench starts for itself: an amqlite broker and the raw-trio relay.

Each is a child process listening on a free loopback port; it names the port in
a JSON log line on stderr. A task keeps draining stderr (a full pipe would stall
the server) and keeps the last lines for error messages (and every line in a log
file, when given one). :meth:`stop` ends the process by its pid (SIGTERM, then
SIGKILL after a grace period) and reaps it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import trio

import amqlite
import amqlite_bench

from .errors import BenchError

READY_TIMEOUT = 20.0
STOP_GRACE = 8.0


def child_env() -> dict[str, str]:
    """The environment for child processes: unbuffered, and importing this very
    ``amqlite`` and ``amqlite_bench`` (the directories they were imported from
    first on ``PYTHONPATH``), however each was had: installed, editable, or on
    the parent's ``PYTHONPATH``."""
    roots = [str(Path(m.__path__[0]).resolve().parent) for m in (amqlite, amqlite_bench)]
    path = os.environ.get("PYTHONPATH")
    entries = list(dict.fromkeys([*roots, *(path.split(os.pathsep) if path else [])]))
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(entries)}


def broker_argv(*extra: str) -> list[str]:
    return [
        sys.executable, "-m", "amqlite", "server",
        "--host", "127.0.0.1", "--port", "0", "--log-format", "json", *extra,
    ]  # fmt: skip


class ServerExited(BenchError):
    """The server exited before it was listening (``returncode``, its last log lines)."""

    def __init__(self, text: str, returncode: int | None, log_tail: list[str]) -> None:
        super().__init__(text)
        self.returncode = returncode
        self.log_tail = log_tail

    def rejected_flag(self, flag: str) -> bool:
        """Whether it exited because its argument parser does not know ``flag``."""
        return self.returncode == 2 and any(
            "unrecognized arguments" in line and flag in line for line in self.log_tail
        )


def baseline_argv() -> list[str]:
    return [sys.executable, "-m", "amqlite_bench.baseline", "--host", "127.0.0.1", "--port", "0"]


#: Log events whose times a :class:`ServerProcess` keeps (an HA node's takeover,
#: and a client it refused as passive: both explain a slow failover).
TIMED_EVENTS = ("ha_became_active", "connection_refused_not_active")


class ServerProcess:
    """A server child process; ``port`` is where it listens."""

    def __init__(self, name: str, proc: trio.Process, log_path: Path | None = None) -> None:
        self.name = name
        self.proc = proc
        self.port = 0
        #: the JSON log record that said it was listening (``server_listening``: its
        #: ``amqp`` field is the AMQP 0-9-1 listener's ``host:port``, or null)
        self.ready_record: dict[str, object] = {}
        self.log_tail: deque[str] = deque(maxlen=20)
        #: when (``perf_counter``, as its line was read) the server logged each of
        #: :data:`TIMED_EVENTS`: what the failover scenario times a takeover by
        self.event_times: dict[str, list[float]] = {e: [] for e in TIMED_EVENTS}
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def amqp_address(self) -> str | None:
        """Where its AMQP 0-9-1 listener is (an amqlite broker started with
        ``--amqp-port``), or None."""
        amqp = self.ready_record.get("amqp")
        return amqp if isinstance(amqp, str) and amqp else None

    @classmethod
    async def start(
        cls,
        nursery: trio.Nursery,
        name: str,
        argv: list[str],
        ready_event: str,
        *,
        log_path: Path | None = None,
        ready_timeout: float = READY_TIMEOUT,
    ) -> ServerProcess:
        """Start ``argv`` and wait (``ready_timeout`` s at most) until it logs
        ``ready_event`` with its ``port``.

        The stderr drain runs in ``nursery`` and ends when the process does; with
        ``log_path`` it appends everything the server logs to that file. On any
        failure the process is stopped before this raises.
        """
        proc = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=child_env(),
        )
        server = cls(name, proc, log_path)
        try:
            with trio.fail_after(ready_timeout):
                server.port = await nursery.start(server._drain, ready_event)
        except trio.TooSlowError:
            await server.stop()
            raise BenchError(
                f"the {name} did not start listening within {ready_timeout:g} s"
                f"{server._tail_text()}"
            ) from None
        except BaseException:
            await server.stop()
            raise
        return server

    async def _drain(self, ready_event: str, *, task_status: trio.TaskStatus[int]) -> None:
        stderr = self.proc.stderr
        assert stderr is not None
        buf = b""
        ready = False
        with contextlib.ExitStack() as files:
            log = files.enter_context(self.log_path.open("ab")) if self.log_path else None
            while True:
                chunk = await stderr.receive_some(65536)
                if not chunk:
                    break
                if log is not None:
                    log.write(chunk)
                    log.flush()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace").rstrip()
                    self.log_tail.append(line)
                    for event in TIMED_EVENTS:
                        if f'"{event}"' in line:
                            self.event_times[event].append(time.perf_counter())
                    if not ready and f'"{ready_event}"' in line:
                        try:
                            record = json.loads(line)
                        except ValueError:
                            continue
                        if record.get("event") == ready_event:
                            ready = True
                            self.ready_record = record
                            task_status.started(int(record["port"]))
        if not ready:
            await self.proc.wait()
            raise ServerExited(
                f"the {self.name} exited with status {self.proc.returncode} before it "
                f"was listening{self._tail_text()}",
                self.proc.returncode,
                list(self.log_tail),
            )

    def check_alive(self) -> None:
        """Raise BenchError if the process has died."""
        if self.proc.poll() is not None:
            raise BenchError(
                f"the {self.name} (pid {self.pid}) died with status {self.proc.returncode}"
                f"{self._tail_text()}"
            )

    def _tail_text(self) -> str:
        if not self.log_tail:
            return ""
        return "; its last log lines:\n  " + "\n  ".join(self.log_tail)

    async def stop(self) -> int | None:
        """SIGTERM by pid, SIGKILL after :data:`STOP_GRACE` s; always reaped. Shielded."""
        proc = self.proc
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                with trio.move_on_after(STOP_GRACE):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        return proc.returncode
