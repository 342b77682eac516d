"""Tags gate the node's privileged actions: a restricted user is refused (403, the
reason in the text, a log line) for each, a properly tagged user is accepted.

Users (vhost "/" unless said): ``app`` (no tags, ``^app\\.``), ``mon``
(monitoring), ``admin`` (administrator, also vhost "other"), ``pair`` (cluster),
``peer`` (peering, may write only ``^app\\.``).
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from structlog.testing import capture_logs

import amqlite
from amqlite.auth import hash_password
from amqlite.config import Config, UserConfig, VhostPermissions, load_config
from amqlite.errors import ReplyCode
from amqlite.peering.wire import VERSION
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode

from .rawclient import RawClient

PASSWORD = "pw"
_HASH = hash_password(PASSWORD, salt=b"0123456789abcdef", n=2**4)
APP = r"^app\."


def _user(
    name: str, *tags: str, pattern: str = ".*", vhosts: tuple[str, ...] = ("/",)
) -> UserConfig:
    grants = tuple(VhostPermissions(v, pattern, pattern, pattern) for v in vhosts)
    return UserConfig(name, _HASH, grants, tags)


USERS = (
    _user("app", pattern=APP),
    _user("mon", "monitoring"),
    _user("admin", "administrator", vhosts=("/", "other")),
    _user("pair", "cluster"),
    _user("peer", "peering", pattern=APP),
)


def _config(**overrides: Any) -> Config:
    base = {"server.host": "127.0.0.1", "server.port": 0, "server.vhosts": ["/", "other"]}
    return dataclasses.replace(load_config(overrides=base | overrides), users=USERS)


@pytest.fixture
async def node(nursery: trio.Nursery) -> AsyncIterator[BrokerNode]:
    """A standalone node with the users above (no persistence)."""
    broker_node = BrokerNode(_config(**{"storage.persist": False}))
    await nursery.start(broker_node.run)
    yield broker_node
    broker_node.stop()


@pytest.fixture
async def ha_node(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[BrokerNode]:
    """The primary of an HA pair whose backup is not there."""
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{s.getsockname()[1]}"
    config = _config(
        **{
            "server.data_dir": str(tmp_path / "primary"),
            "cluster.role": "primary",
            "cluster.backup_peer": gone,
            "cluster.login": "pair",
            "cluster.password": PASSWORD,
        }
    )
    broker_node = BrokerNode(config)
    await nursery.start(broker_node.run)
    yield broker_node
    broker_node.stop()


@contextmanager
def logged() -> Iterator[list[dict[str, Any]]]:
    was_configured = structlog.is_configured()
    try:
        with capture_logs() as entries:
            yield entries
    finally:
        # capture_logs restores the processors with structlog.configure(), which
        # marks structlog configured (with its stdout defaults): later code that
        # keeps "a configuration in place" (the bench's runner) would then print
        # logs into its JSON on stdout
        if not was_configured:
            structlog.reset_defaults()


def refusals(entries: list[dict[str, Any]], event: str) -> list[str]:
    return [str(e.get("reason")) for e in entries if e["event"] == event]


async def hello(port: int, login: str, role: str) -> ev.Event:
    raw = await RawClient.connect(port)
    await raw.send(ev.Hello(raw.next_id(), login=login, password=PASSWORD, role=role))
    with trio.fail_after(5):
        reply = await raw.receive()
    await raw.aclose()
    return reply


async def opened(port: int, login: str, role: str = "client") -> RawClient:
    raw = await RawClient.connect(port)
    await raw.send(ev.Hello(raw.next_id(), login=login, password=PASSWORD, role=role))
    with trio.fail_after(5):
        assert isinstance(await raw.receive(), ev.Welcome)
    return raw


def assert_refused(reply: ev.Event, *fragments: str) -> None:
    assert isinstance(reply, ev.Refused | ev.Error), reply
    assert reply.code == ReplyCode.ACCESS_REFUSED
    for fragment in fragments:
        assert fragment in reply.text


# --- roles at the hello --------------------------------------------------------------


@pytest.mark.parametrize("login", ["app", "mon", "admin", "peer"])
async def test_an_ha_peer_hello_needs_the_cluster_tag(ha_node: BrokerNode, login: str) -> None:
    with logged() as entries:
        reply = await hello(ha_node.port, login, "ha-peer")
    assert_refused(reply, "HA peer link", "needs the 'cluster' tag", f"user {login!r}")
    assert any("'cluster' tag" in r for r in refusals(entries, "connection_refused"))


async def test_the_cluster_user_opens_the_ha_peer_link(ha_node: BrokerNode) -> None:
    assert isinstance(await hello(ha_node.port, "pair", "ha-peer"), ev.Welcome)


@pytest.mark.parametrize("login", ["app", "pair", "peer"])
async def test_a_monitor_connection_needs_monitoring(node: BrokerNode, login: str) -> None:
    with logged() as entries:
        reply = await hello(node.port, login, "monitor")
    assert_refused(reply, "monitor connection", "needs the 'monitoring' tag")
    assert refusals(entries, "connection_refused") == [reply.text]  # type: ignore[attr-defined]


@pytest.mark.parametrize("login", ["mon", "admin"])
async def test_monitoring_and_administrator_open_a_monitor(node: BrokerNode, login: str) -> None:
    raw = await opened(node.port, login, "monitor")
    status = await raw.request(ev.Status)
    assert isinstance(status, ev.Ok) and "filtered" not in status.info
    await raw.aclose()


@pytest.mark.parametrize("login", ["app", "mon", "pair"])
async def test_a_peering_link_needs_the_peering_tag(node: BrokerNode, login: str) -> None:
    with logged() as entries:
        reply = await hello(node.port, login, "peer-link")
    assert_refused(reply, "peering link", "needs the 'peering' tag")
    assert len(refusals(entries, "connection_refused")) == 1


# --- switchover ------------------------------------------------------------------------


async def test_switchover_needs_administrator(ha_node: BrokerNode) -> None:
    raw = await opened(ha_node.port, "mon", "monitor")
    with logged() as entries:
        reply = await raw.request(ev.HaSwitchover, timeout=1.0)
    assert_refused(reply, "a switchover needs the 'administrator' tag", "user 'mon'")
    assert refusals(entries, "privilege_refused") == [reply.text]  # type: ignore[attr-defined]
    await raw.aclose()
    admin = await opened(ha_node.port, "admin", "monitor")
    reply = await admin.request(ev.HaSwitchover, timeout=1.0)
    # past the gate: the HA service answers (this lone primary is not active)
    assert isinstance(reply, ev.Error) and reply.code == ReplyCode.NOT_ALLOWED
    assert reply.text.startswith("switchover failed:")
    await admin.aclose()


# --- trace -----------------------------------------------------------------------------


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("login", ["app", "mon"])
async def test_trace_on_and_off_need_administrator(
    node: BrokerNode, login: str, enabled: bool
) -> None:
    raw = await opened(node.port, login)
    with logged() as entries:
        reply = await raw.request(ev.Trace, enabled=enabled)
    switch = "on" if enabled else "off"
    assert_refused(reply, f"switching the trace {switch} needs the 'administrator' tag")
    assert refusals(entries, "privilege_refused") == [reply.text]  # type: ignore[attr-defined]
    assert node.broker.tracer is None
    await raw.aclose()


async def test_an_administrator_switches_the_trace(node: BrokerNode) -> None:
    raw = await opened(node.port, "admin")
    assert isinstance(await raw.request(ev.Trace, enabled=True), ev.Ok)
    assert node.broker.tracer is not None
    assert isinstance(await raw.request(ev.Trace, enabled=False), ev.Ok)
    assert node.broker.tracer is None
    await raw.aclose()


# --- status ----------------------------------------------------------------------------


async def _populate(node: BrokerNode) -> None:
    addr = f"127.0.0.1:{node.port}"
    async with amqlite.connect(addr, login="admin", password=PASSWORD) as conn:
        for name in ("app.q", "secret.q"):
            await conn.declare_queue(name)
        for name in ("app.x", "secret.x"):
            await conn.declare_exchange(name, "topic")
        await conn.bind("app.q", "app.x", "#")
        await conn.bind("secret.q", "app.x", "#")
    async with amqlite.connect(addr, login="admin", password=PASSWORD, vhost="other") as conn:
        await conn.declare_queue("app.elsewhere")


async def test_status_without_monitoring_shows_only_what_the_user_may_see(
    node: BrokerNode,
) -> None:
    await _populate(node)
    other = await opened(node.port, "mon")  # someone else's connection
    raw = await opened(node.port, "app")
    reply = await raw.request(ev.Status)
    assert isinstance(reply, ev.Ok)
    status = reply.info
    assert status["filtered"] is True
    assert [v["name"] for v in status["vhosts"]] == ["/"]  # no rights on "other"
    (root,) = status["vhosts"]
    assert [q["name"] for q in root["queues"]] == ["app.q"]
    exchanges = {x["name"]: x for x in root["exchanges"]}
    assert "app.x" in exchanges and "secret.x" not in exchanges and "amq.topic" not in exchanges
    assert [b["queue"] for b in exchanges["app.x"]["bindings"]] == ["app.q"]
    assert {c["user"] for c in status["connections"]} == {"app"}
    for hidden in ("data_dir", "storage", "ha", "links", "limits"):
        assert hidden not in status
    assert status["node_id"] == node.node_id and status["state"] == node.state
    assert status["alarms"] == []  # a publisher needs to know why it is blocked

    full = await other.request(ev.Status)
    assert isinstance(full, ev.Ok) and "filtered" not in full.info
    assert {v["name"] for v in full.info["vhosts"]} == {"/", "other"}
    assert {c["user"] for c in full.info["connections"]} == {"app", "mon"}
    assert "secret.q" in [q["name"] for v in full.info["vhosts"] for q in v["queues"]]
    await raw.aclose()
    await other.aclose()


# --- a peering link ---------------------------------------------------------------------


def _peer_hello(exchange: str) -> dict[str, Any]:
    return {
        "type": "peer.hello", "version": VERSION, "node": "remote", "link": "l", "vhost": "/",
        "exchange": exchange, "exchange_type": "topic", "mode": 2, "epoch": 1,
        "resume": None, "heartbeat": 0.0,
    }  # fmt: skip


async def test_a_peering_link_may_only_write_to_exchanges_its_login_may_write(
    node: BrokerNode,
) -> None:
    await _populate(node)
    raw = await opened(node.port, "peer", "peer-link")
    with logged() as entries:
        await raw.send(ev.PeerMessage(_peer_hello("secret.x")))
        with trio.fail_after(5):
            refused = await raw.receive()
            closed = await raw.receive()
    assert isinstance(refused, ev.PeerMessage) and refused.msg["type"] == "peer.refused"
    assert refused.msg["code"] == ReplyCode.ACCESS_REFUSED
    text = refused.msg["text"]
    assert "user 'peer' may not write and read exchange 'secret.x'" in text
    assert isinstance(closed, ev.Close) and closed.code == ReplyCode.ACCESS_REFUSED
    assert refusals(entries, "peering_link_refused") == [text]
    await raw.aclose()

    allowed = await opened(node.port, "peer", "peer-link")
    await allowed.send(ev.PeerMessage(_peer_hello("app.x")))
    with trio.fail_after(5):
        reply = await allowed.receive()
    assert isinstance(reply, ev.PeerMessage) and reply.msg["type"] != "peer.refused", reply
    await allowed.aclose()
