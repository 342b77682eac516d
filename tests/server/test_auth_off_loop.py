"""scrypt (about 50 ms a login, on purpose) runs in a worker thread: while one login
is being checked, the node serves everyone else, over the native protocol and AMQP.

The check for the login ``slow`` is held until another client has connected and
been served. Were it run on the event loop, nobody else could be served: the held
check would give up after a few seconds and fail the test.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pika
import pytest
import trio

import amqlite
from amqlite.auth import hash_password
from amqlite.config import UserConfig, VhostPermissions, load_config
from amqlite.server import BrokerNode

PASSWORD = "pw"
HELD = 5.0  # seconds the slow check waits for the others before it fails


def _user(name: str) -> UserConfig:
    grant = VhostPermissions("/", ".*", ".*", ".*")
    return UserConfig(name, hash_password(PASSWORD, salt=b"0123456789abcdef", n=2**4), (grant,))


class SlowCheck:
    """Wraps ``check_credentials``: the login ``slow`` waits for :attr:`release`."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.entered = threading.Event()
        self.release = threading.Event()
        self.others_served_first = False

    def __call__(self, login: str, *rest: Any) -> Any:
        if login == "slow":
            self.entered.set()
            self.others_served_first = self.release.wait(HELD)
        return self.real(login, *rest)


@pytest.fixture
async def node(nursery: trio.Nursery) -> AsyncIterator[BrokerNode]:
    overrides = {
        "server.host": "127.0.0.1",
        "server.port": 0,
        "storage.persist": False,
        "amqp.port": 0,
    }
    config = dataclasses.replace(
        load_config(overrides=overrides), users=(_user("slow"), _user("fast"))
    )
    broker_node = BrokerNode(config)
    await nursery.start(broker_node.run)
    yield broker_node
    broker_node.stop()


@pytest.fixture
def slow_check(node: BrokerNode, monkeypatch: pytest.MonkeyPatch) -> SlowCheck:
    check = SlowCheck(node.authenticator.check_credentials)
    monkeypatch.setattr(node.authenticator, "check_credentials", check)
    return check


async def test_a_native_login_does_not_hold_up_the_others(
    node: BrokerNode, slow_check: SlowCheck
) -> None:
    address = f"127.0.0.1:{node.port}"
    slow_done = trio.Event()

    async def slow_client() -> None:
        async with amqlite.connect(address, login="slow", password=PASSWORD) as conn:
            await conn.declare_queue("slow-q")
        slow_done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_client)
        with trio.fail_after(HELD):
            await trio.to_thread.run_sync(slow_check.entered.wait)
        with trio.fail_after(HELD / 2):  # served while the slow check is held
            async with amqlite.connect(address, login="fast", password=PASSWORD) as conn:
                await conn.declare_queue("fast-q")
                await conn.publish("", "fast-q", "m", confirm=True)
        assert not slow_done.is_set()
        slow_check.release.set()
    assert slow_done.is_set() and slow_check.others_served_first


def _amqp_login(port: int, login: str) -> None:
    params = pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials(login, PASSWORD)
    )
    connection = pika.BlockingConnection(params)
    connection.channel().queue_declare(f"{login}-q")
    connection.close()


async def test_an_amqp_login_does_not_hold_up_the_others(
    node: BrokerNode, slow_check: SlowCheck
) -> None:
    port = node.amqp_port
    assert port is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, _amqp_login, port, "slow")
        with trio.fail_after(HELD):
            await trio.to_thread.run_sync(slow_check.entered.wait)
        with trio.fail_after(HELD / 2):
            await trio.to_thread.run_sync(_amqp_login, port, "fast")
        slow_check.release.set()
    assert slow_check.others_served_first
