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
from collections.abc import Iterator
from typing import Any

import pytest

from amqlite.server.background import BackgroundNode as ThreadedBroker

OPT_OUT = "AMQLITE_SKIP_SPARK"


def _spark_or_skip() -> None:
    if os.environ.get(OPT_OUT) == "1":
        pytest.skip(f"Spark tests opted out ({OPT_OUT}=1)")
    if importlib.util.find_spec("pyspark") is None:
        pytest.fail(
            "pyspark is not installed: install the spark extra (`pip install -e '.[spark]'`, "
            f"which scripts/test does) or set {OPT_OUT}=1 to skip these tests",
            pytrace=False,
        )


#: pytest-timeout's limit for a Spark test (pyproject's default is 120 s): whichever
#: test runs first also starts the session's JVM, which takes 50-100 s on a loaded
#: 2-core machine, and the audit test's own work takes a minute more there
SPARK_TIMEOUT = 300


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("spark") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))


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
