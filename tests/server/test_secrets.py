"""Passwords never reach a log line, a status map or a config's repr.

Three nodes in-process, logging for real (JSON, debug level, into a buffer): the
target (users, the AMQP listener), a dialer with two peering links to it (one with
the right password, one with a wrong one) and an HA primary whose peer address is
the target (its cluster login is refused there). Clients log in with wrong and
right passwords over the native protocol and AMQP; everyone's status is read.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
import structlog
import trio

import amqlite
from amqlite.auth import hash_password
from amqlite.config import (
    Config,
    PeeringConfig,
    PeeringMode,
    UserConfig,
    VhostPermissions,
    load_config,
    parse_addresses,
)
from amqlite.log import configure_logging
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode
from tests.waiting import wait_until

from .rawclient import RawClient

APP_PW = "app-pw-1c9e5f"
ADMIN_PW = "admin-pw-77ad02"
PEER_PW = "peer-pw-0be4d1"
PAIR_PW = "pair-pw-f3a8c6"
WRONG = ("wrong-pw-5d1e7a", "wrong-peer-pw-93bb0f", "wrong-amqp-pw-4e2c19")
SECRETS = (APP_PW, ADMIN_PW, PEER_PW, PAIR_PW, *WRONG)
SALT = b"0123456789abcdef"


def _user(name: str, password: str, *tags: str) -> UserConfig:
    grant = VhostPermissions("/", ".*", ".*", ".*")
    return UserConfig(name, hash_password(password, salt=SALT, n=2**4), (grant,), tags)


def _config(**overrides: Any) -> Config:
    base = {"server.host": "127.0.0.1", "server.port": 0, "storage.persist": False}
    return load_config(overrides=base | overrides)


def _link(name: str, port: int, password: str) -> PeeringConfig:
    hosts = parse_addresses(f"127.0.0.1:{port}")
    return PeeringConfig(name, hosts, PeeringMode.PUBLISH, login="peer", password=password)


async def _wait(predicate: Callable[[], bool], what: str) -> None:
    await wait_until(predicate, what)


def _amqp(port: int, password: str) -> str:
    """Log in over AMQP with pika (blocking: run in a thread)."""
    params = pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("app", password)
    )
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.ProbableAuthenticationError:
        return "refused"
    return "open"


async def _status(port: int, login: str, password: str) -> dict[str, Any]:
    raw = await RawClient.connect(port)
    await raw.send(ev.Hello(raw.next_id(), login=login, password=password, role="monitor"))
    with trio.fail_after(5):
        assert isinstance(await raw.receive(), ev.Welcome)
    reply = await raw.request(ev.Status)
    await raw.aclose()
    assert isinstance(reply, ev.Ok)
    return reply.info


@pytest.fixture
def log_buffer() -> Any:
    buffer = io.StringIO()
    configure_logging("json", "debug", buffer)
    yield buffer
    structlog.reset_defaults()


async def test_passwords_appear_in_no_log_line_and_no_status(
    tmp_path: Path, log_buffer: io.StringIO
) -> None:
    users = (
        _user("app", APP_PW),
        _user("admin", ADMIN_PW, "administrator", "monitoring"),
        _user("peer", PEER_PW, "peering"),
        _user("pair", PAIR_PW, "cluster"),
    )
    target = BrokerNode(dataclasses.replace(_config(**{"amqp.port": 0}), users=users))
    async with trio.open_nursery() as nursery:
        await nursery.start(target.run)
        assert target.amqp_port is not None
        async with amqlite.connect(
            f"127.0.0.1:{target.port}", login="admin", password=ADMIN_PW
        ) as conn:
            await conn.declare_exchange("x", "topic", durable=True)
        links = (_link("x", target.port, PEER_PW), _link("y", target.port, WRONG[1]))
        dialer = BrokerNode(dataclasses.replace(_config(), cluster_mta=links))
        await nursery.start(dialer.run)
        primary_config = _config(
            **{
                "storage.persist": True,
                "server.data_dir": str(tmp_path / "primary"),
                "cluster.role": "primary",
                "cluster.backup_peer": f"127.0.0.1:{target.port}",
                "cluster.login": "pair",
                "cluster.password": PAIR_PW,
            }
        )
        primary = BrokerNode(primary_config)
        await nursery.start(primary.run)

        # native: a wrong password, then the right one
        with pytest.raises(amqlite.ConnectionRefused, match="bad login or password"):
            async with amqlite.connect(f"127.0.0.1:{target.port}", login="app", password=WRONG[0]):
                pass
        async with amqlite.connect(
            f"127.0.0.1:{target.port}", login="app", password=APP_PW
        ) as conn:
            await conn.declare_queue("q")
        # AMQP: the same
        assert await trio.to_thread.run_sync(_amqp, target.amqp_port, WRONG[2]) == "refused"
        assert await trio.to_thread.run_sync(_amqp, target.amqp_port, APP_PW) == "open"

        def logged(event: str) -> bool:
            return f'"event": "{event}"' in log_buffer.getvalue()

        assert dialer.peering is not None
        await _wait(lambda: logged("ha_link_refused"), "the HA primary dialed and was refused")
        await _wait(
            lambda: (
                {item["state"] for item in dialer.peering.status()} >= {"up"}  # type: ignore[union-attr]
                and logged("peering_link_accepted")
                and log_buffer.getvalue().count('"login": "peer"') >= 1
            ),
            "the right peering login got in, the wrong one was refused",
        )
        statuses: list[Any] = [node.status() for node in (target, dialer, primary)]
        statuses.append(await _status(target.port, "admin", ADMIN_PW))  # over the wire
        assert len(statuses[1]["links"]) == 2 and statuses[2]["ha"]  # the links are in them
        configs = [node.config for node in (target, dialer, primary)]
        for node in (primary, dialer, target):
            node.stop()

    lines = log_buffer.getvalue().splitlines()
    events = [json.loads(line)["event"] for line in lines]
    # the test saw what it means to check: refusals over each path, logins that worked
    for event in ("connection_refused", "amqp_connection_refused", "ha_link_refused"):
        assert event in events, event
    assert any("y" in line and "refused" in line.lower() for line in lines if "peer" in line)
    for secret in SECRETS:
        assert [line for line in lines if secret in line] == [], secret
        assert secret not in repr(statuses), secret
        assert secret not in json.dumps(statuses, default=repr), secret
        for config in configs:
            assert secret not in repr(config) and secret not in str(config), secret


def test_no_repr_shows_a_password() -> None:
    """What might be logged whole: a hello, a client's dial parameters, the Spark
    bridge's access, a config."""
    from amqlite.client.dial import HelloParams
    from amqlite.spark.bridge import ServerAccess

    secret = "repr-secret-2b7d"
    things: list[object] = [
        ev.Hello(1, password=secret),
        HelloParams(password=secret),
        ServerAccess("127.0.0.1:5555", password=secret),
        _link("x", 1, secret),
        _config(**{"cluster.password": secret}),
    ]
    for thing in things:
        assert secret not in repr(thing) and secret not in str(thing), type(thing)
