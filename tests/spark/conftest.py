"""Fixtures for the Spark tests: ONE SparkSession (``local[2]``) and ONE broker per
test run, both session-scoped; each test uses its own queue names.

The broker runs in-process, in a thread of its own with its own ``trio.run``, so
the (synchronous) Spark calls of a test and the broker never share an event loop.
Without pyspark the tests fail, naming the fix, unless ``AMQLITE_SKIP_SPARK=1``
opts out, which skips them with that reason.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import amqlite
from amqlite.config import load_config
from amqlite.server import BrokerNode

OPT_OUT = "AMQLITE_SKIP_SPARK"


class ThreadedBroker:
    """A BrokerNode on 127.0.0.1 (a free port) in a thread of its own."""

    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        self.config = load_config(
            overrides={
                "server.host": "127.0.0.1",
                "server.port": 0,
                "server.data_dir": str(data_dir),
                **overrides,
            }
        )
        self.node = BrokerNode(self.config)
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self) -> ThreadedBroker:
        ready: queue.Queue[int | BaseException] = queue.Queue()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                ready.put(await nursery.start(self.node.run))

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:
                ready.put(exc)

        self._thread = threading.Thread(target=run, name="spark-test-broker", daemon=True)
        self._thread.start()
        got = ready.get(timeout=30)
        if isinstance(got, BaseException):
            raise got
        self.port = got
        return self

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._token is not None:
            trio.from_thread.run_sync(self.node.stop, trio_token=self._token)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def call(self, fn: Callable[[amqlite.Connection], Any]) -> Any:
        """Run ``await fn(conn)`` on a fresh client connection (from a sync test)."""

        async def run() -> Any:
            async with amqlite.connect(self.servers, reconnect=False) as conn:
                return await fn(conn)

        return trio.run(run)


def _spark_or_skip() -> None:
    if os.environ.get(OPT_OUT) == "1":
        pytest.skip(f"Spark tests opted out ({OPT_OUT}=1)")
    if importlib.util.find_spec("pyspark") is None:
        pytest.fail(
            "pyspark is not installed: install the spark extra (`pip install -e '.[spark]'`, "
            f"which scripts/test does) or set {OPT_OUT}=1 to skip these tests",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    _spark_or_skip()
    from amqlite.spark import session

    spark = session(
        "local[2]",
        "amqlite-tests",
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.stopTimeout": "30s",
            "spark.local.dir": str(tmp_path_factory.mktemp("spark-local")),
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedBroker]:
    _spark_or_skip()
    running = ThreadedBroker(tmp_path_factory.mktemp("broker")).start()
    yield running
    running.stop()


_names = itertools.count(1)


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A queue name no other test uses."""
    return f"{request.node.name.replace('[', '-').rstrip(']')}-{next(_names)}"
