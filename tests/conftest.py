"""Shared fixtures: a broker served in-process on 127.0.0.1, port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from hypothesis import settings

from amqlite.config import load_config
from amqlite.server import BrokerNode

from .tls_certs import TlsFiles, make_tls_files

# ``pytest --hypothesis-profile=soak``: every hypothesis test runs ten times as many
# examples (tests/examples.py scales the tests that name their own count).
settings.register_profile("soak", max_examples=1000)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (scripts/test: ``-n auto --dist loadgroup``) every test
    marked ``spark`` goes to one worker, so a run starts one SparkSession (JVM), as
    tests/spark/conftest.py promises, not one per worker. They are collected first, so
    that worker starts on them while the others share the rest, instead of the group
    (a fifth of the suite's time) running alone at the end."""
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.xdist_group("spark"))
    items.sort(key=lambda item: item.get_closest_marker("spark") is None)  # stable


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
