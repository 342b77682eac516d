"""A real Celery worker (a subprocess) against the broker, results over ``rpc://``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .conftest import CHECKOUT, WAIT, AmqpServer

celery = pytest.importorskip("celery")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

TASKS = """
import os

from celery import Celery

app = Celery("amqlite_tasks", broker=os.environ["BROKER_URL"], backend="rpc://")
app.conf.task_default_queue = os.environ["TASK_QUEUE"]
app.conf.broker_connection_retry_on_startup = True


@app.task
def add(x, y):
    return x + y


@app.task
def fail(text):
    raise ValueError(text)

"""


class Worker:
    """``celery worker`` as a process; its output read by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append("<eof>")
            self.changed.notify_all()

    def wait_ready(self, timeout: float = 20) -> None:
        def ready() -> bool:
            return any(" ready." in line or line == "<eof>" for line in self.lines)

        with self.changed:
            assert self.changed.wait_for(ready, timeout), "worker not ready:\n" + "".join(
                self.lines
            )
        assert "<eof>" not in self.lines, "worker exited:\n" + "".join(self.lines)


@contextmanager
def celery_worker(broker_url: str, tmp_path: Path) -> Iterator[tuple[Any, Worker]]:
    """The tasks module, imported here as the client, with a worker running it."""
    name = f"w{uuid.uuid4().hex[:6]}@amqlite"
    (tmp_path / "amqlite_tasks.py").write_text(TASKS)
    env = {
        **os.environ,
        "BROKER_URL": broker_url,
        "TASK_QUEUE": f"celery-{uuid.uuid4().hex[:8]}",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(CHECKOUT)]),
        "PYTHONUNBUFFERED": "1",
    }
    argv = [
        sys.executable, "-m", "celery", "-A", "amqlite_tasks", "worker",
        "--pool=solo", "-c", "1", "--without-mingle", "--without-gossip",
        "--without-heartbeat", "--loglevel=INFO", "-n", name,
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker = Worker(proc)
    old_env = {k: os.environ.get(k) for k in ("BROKER_URL", "TASK_QUEUE")}
    os.environ.update(BROKER_URL=env["BROKER_URL"], TASK_QUEUE=env["TASK_QUEUE"])
    sys.path.insert(0, str(tmp_path))
    try:
        worker.wait_ready()
        import amqlite_tasks  # type: ignore[import-not-found]

        yield amqlite_tasks, worker
        # the remote-control shutdown (over the celery.pidbox fanout exchange): an
        # idle worker notices SIGTERM only when its event loop next wakes, up to 10 s
        amqlite_tasks.app.control.shutdown(destination=[name])
        amqlite_tasks.app.close()
        proc.wait(WAIT)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("amqlite_tasks", None)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(WAIT)


@pytest.fixture(scope="module")
def tasks(server: AmqpServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    url = f"amqp://guest:guest@127.0.0.1:{server.amqp_port}//"
    with celery_worker(url, tmp_path_factory.mktemp("celery")) as (module, worker):
        yield module
    # a worker that lost or could not reach the broker failed, whatever the results
    output = "".join(worker.lines)
    for trouble in ("Cannot connect", "Connection to broker lost", "Unrecoverable", "CRITICAL"):
        assert trouble not in output, output


def test_celery_worker_runs_tasks_and_returns_results(tasks: Any) -> None:
    results = [tasks.add.delay(n, 100) for n in range(10)]
    assert [r.get(timeout=WAIT) for r in results] == [n + 100 for n in range(10)]
    assert all(r.successful() for r in results)


def test_a_failing_task_raises_its_error_in_the_caller(tasks: Any) -> None:
    result = tasks.fail.delay("boom")
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=WAIT)
    assert result.failed()
    assert result.state == "FAILURE"


def test_a_group_and_a_chain(tasks: Any) -> None:
    # (no chord: Celery's rpc:// backend does not support chords, on any broker)
    group = celery.group(tasks.add.s(n, n) for n in range(5))()
    assert group.get(timeout=WAIT) == [0, 2, 4, 6, 8]
    chain = celery.chain(tasks.add.s(1, 2), tasks.add.s(10), tasks.add.s(100))()
    assert chain.get(timeout=WAIT) == 113
