"""Shared fixtures: a broker served in-process on 127.0.0.1, port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import settings

from amqlite.config import load_config
from amqlite.server import BrokerNode

from .tls_certs import TlsFiles, make_tls_files

# No hypothesis deadline: it is a wall-clock assert, and on two busy cores one example
# can take longer than its 200 ms (a CI run's test_plain_delivery took 430 ms for an
# example that took 1.3 ms again at once). Tests that set their own settings keep them.
settings.register_profile("amqlite", deadline=None)
settings.load_profile("amqlite")
# ``pytest --hypothesis-profile=soak``: every hypothesis test runs ten times as many
# examples (tests/examples.py scales the tests that name their own count).
settings.register_profile("soak", parent=settings.get_profile("amqlite"), max_examples=1000)

SPARK_TESTS = "tests/spark/"
SPARK_GROUP = "spark"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (scripts/test runs ``-n auto``) the tests spread one by one
    over the workers, except those under tests/spark (marked ``spark``): they all go
    to one worker, so a run starts one SparkSession (JVM), as tests/spark/conftest.py
    promises, not one per worker. That group, the largest unit, is handed out first.
    (xdist's own ``--dist loadgroup`` does not group under pytest 9.2: it renames
    ``item._nodeid``, which pytest no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SparkOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SPARK_GROUP if nodeid.startswith(SPARK_TESTS) else nodeid

    return SparkOnOneWorker(config, log)


@pytest.fixture(autouse=True)
def _run_in_a_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in its own empty working directory, so brokers' default data
    dirs (``./amqlite-data/node-<port>``) never land in the checkout or collide."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
async def node(nursery: trio.Nursery) -> AsyncIterator[BrokerNode]:
    """A running broker node (guest/guest, vhost "/") on a free loopback port."""
    config = load_config(overrides={"server.host": "127.0.0.1", "server.port": 0})
    broker_node = BrokerNode(config)
    await nursery.start(broker_node.run)
    yield broker_node
    broker_node.stop()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """Certificates made by trustme for this test session (tests/tls_certs.py)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))
