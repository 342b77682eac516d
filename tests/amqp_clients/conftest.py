"""A real broker process with its AMQP listener, shared by a test module.

Real clients (pika, aio-pika, kombu) are blocking or asyncio, so these tests are
plain functions: the broker runs as a subprocess whose JSON log a thread reads.
Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.waiting import poll_until

WAIT = 10.0  # seconds any one condition may take
#: The checkout these tests belong to: its ``amqlite`` is the one to run, whatever
#: the working directory (tests run in a tmp dir) or the installed package.
CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass
class AmqpServer:
    """``amqlite server --amqp-port 0`` running as a process."""

    proc: subprocess.Popen[bytes]
    port: int = 0  # the native listener
    amqp_port: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            with self.changed:
                self.records.append(record)
                self.changed.notify_all()
        with self.changed:
            self.records.append({"event": "<eof>"})
            self.changed.notify_all()

    def wait_for_log(
        self, event: str, since: int = 0, timeout: float = WAIT, **fields: Any
    ) -> dict[str, Any]:
        """The first log record from index ``since`` on with ``event`` and ``fields``."""

        def found() -> dict[str, Any] | None:
            for record in self.records[since:]:
                if record.get("event") == event and all(
                    record.get(k) == v for k, v in fields.items()
                ):
                    return record
                if record.get("event") == "<eof>":
                    raise EOFError(f"server exited before logging {event!r}")
            return None

        with self.changed:
            record = self.changed.wait_for(found, timeout)
        assert record is not None, f"no {event!r} {fields} logged within {timeout}s"
        return record

    def connect(self, **kwargs: Any) -> pika.BlockingConnection:
        return pika.BlockingConnection(self.parameters(**kwargs))

    def parameters(self, **kwargs: Any) -> pika.ConnectionParameters:
        kwargs.setdefault("credentials", pika.PlainCredentials("guest", "guest"))
        return pika.ConnectionParameters(
            host="127.0.0.1",
            port=self.amqp_port,
            socket_timeout=WAIT,
            stack_timeout=WAIT,
            blocked_connection_timeout=WAIT,
            **kwargs,
        )

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)


def start_amqp_server(
    data_dir: Path | None, *args: str, port: int = 0, env: dict[str, str] | None = None
) -> AmqpServer:
    """Start the broker (native ``port``, 0 for a free one; ``env`` added to its
    environment) and wait until it listens."""
    where = ["--data-dir", str(data_dir)] if data_dir is not None else ["--in-memory"]
    argv = [
        sys.executable,
        "-m",
        "amqlite",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--amqp-port",
        "0",
        "--log-format",
        "json",
        *where,
        *args,
    ]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p
            ),
            **(env or {}),
        },
    )
    server = AmqpServer(proc)
    threading.Thread(target=server.read_log, daemon=True).start()
    try:
        record = server.wait_for_log("server_listening", timeout=20)
    except BaseException:
        server.stop()
        raise
    server.port = int(record["port"])
    server.amqp_port = int(str(record["amqp"]).rsplit(":", 1)[1])
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpServer]:
    """One broker (journal in a tmp dir, batch fsync) for the whole module."""
    amqp_server = start_amqp_server(tmp_path_factory.mktemp("amqp-node"))
    try:
        yield amqp_server
    finally:
        amqp_server.stop()
    # the broker logs a crashed request (a bug of ours) and goes on: fail on it
    crashes = [r for r in amqp_server.records if "crashed" in str(r.get("event"))]
    assert not crashes, crashes


@pytest.fixture
def conn(server: AmqpServer) -> Iterator[pika.BlockingConnection]:
    connection = server.connect()
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


def wait_until(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll ``condition`` (cheap, client-side) until true; fail after ``timeout``."""
    poll_until(condition, "condition", deadline=timeout, every=0.005)
