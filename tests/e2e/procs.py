"""Real broker processes for end-to-end tests (loopback only, port 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import trio


@dataclass
class ServerProcess:
    proc: trio.Process
    port: int
    log_lines: list[dict[str, object]] = field(default_factory=list)
    #: every byte read from stderr so far, the lines already parsed included (a log
    #: file written by the tests starts with it: a node may log before it listens)
    output: bytearray = field(default_factory=bytearray)
    _buffer: bytes = b""

    async def read_log_until(self, event: str, deadline_s: float = 10.0) -> dict[str, object]:
        """Read JSON log lines from stderr until one has ``event``; returns it."""
        assert self.proc.stderr is not None
        with trio.fail_after(deadline_s):
            while True:
                while b"\n" in self._buffer:
                    line, self._buffer = self._buffer.split(b"\n", 1)
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    self.log_lines.append(record)
                    if record.get("event") == event:
                        return record
                chunk = await self.proc.stderr.receive_some(65536)
                if not chunk:  # say why it stopped: its last lines (a bind refused...)
                    tail = self.output[-1500:].decode(errors="replace")
                    raise EOFError(f"server exited before logging {event!r}; it said:\n{tail}")
                self.output += chunk
                self._buffer += chunk


CHECKOUT = Path(__file__).resolve().parents[2]


def checkout_env() -> dict[str, str]:
    """The environment for a child process that imports this checkout's amqlite
    (not whatever the venv's editable install points at)."""
    path = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


def amqlite_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "amqlite", *args]


async def start_server(*args: str, deadline_s: float = 10.0) -> ServerProcess:
    """Start ``amqlite server --port 0`` (plus args) and wait until it listens (it
    recovers its journal first: a big one takes a while on a busy machine)."""
    proc = await trio.lowlevel.open_process(
        amqlite_argv("server", "--host", "127.0.0.1", "--port", "0", "--log-format", "json", *args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=checkout_env(),
    )
    server = ServerProcess(proc, 0)
    record = await server.read_log_until("server_listening", deadline_s)
    server.port = int(record["port"])  # type: ignore[arg-type]
    return server


def run_cli(
    *args: str, input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the ``amqlite`` command line in a subprocess."""
    return subprocess.run(
        amqlite_argv(*args),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=checkout_env(),
    )


async def start_witness(*args: str) -> ServerProcess:
    """Start ``amqlite witness`` (``--port 0`` unless args name one) and wait until it
    listens."""
    argv = list(args) if "--port" in args else ["--port", "0", *args]
    proc = await trio.lowlevel.open_process(
        amqlite_argv("witness", "--host", "127.0.0.1", "--log-format", "json", *argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=checkout_env(),
    )
    witness = ServerProcess(proc, 0)
    record = await witness.read_log_until("witness_listening")
    witness.port = int(record["port"])  # type: ignore[arg-type]
    return witness
