from __future__ import annotations

import pytest

from amqlite.broker import Broker, Session


@pytest.fixture
def broker() -> Broker:
    return Broker(vhosts=("/", "other"), node_id="node-test")


@pytest.fixture
def s(broker: Broker) -> Session:
    """The session under test."""
    return broker.open_session("/", owner="s")


@pytest.fixture
def t(broker: Broker) -> Session:
    """A second session on the same vhost."""
    return broker.open_session("/", owner="t")
