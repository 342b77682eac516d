from __future__ import annotations

import pytest
import trio

from .fakeserver import FakeBroker


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeBroker:
    """A fake broker listening on 127.0.0.1 (port 0)."""
    broker = FakeBroker()
    await nursery.start(broker.serve)
    return broker


@pytest.fixture
def addr(fake: FakeBroker) -> str:
    return f"127.0.0.1:{fake.port}"
