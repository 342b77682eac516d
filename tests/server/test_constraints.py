"""Role constraints (``[[constraints]]``, docs/selectors.md "Role constraints"): a
vhost's exchange or queue names the roles that may send to it and subscribe to it;
a user without one of them is refused with 403 naming the constraint, and the
refusal is logged. Checked for native clients, AMQP clients (pika) and peering
links alike; a user with the role passes, and unconstrained resources are open to
anyone the permissions allow.

Users (all with full permissions on "/"): ``trader`` (roles traders), ``auditor``
(roles auditors), ``nobody`` (no roles), ``peer`` (peering tag, role traders),
``outsider`` (peering tag, no roles), ``webnobody`` and ``webtrader`` (administrator
for the HTTP API; no roles, role traders).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pika
import pytest
import trio
from pika.exceptions import ChannelClosedByBroker

import amqlite
from amqlite.config import Config, ConstraintConfig, UserConfig, VhostPermissions, load_config
from amqlite.errors import AccessRefused, ReplyCode
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode

from .test_privileges import _HASH, PASSWORD, _peer_hello, logged, opened, refusals


def _user(name: str, *roles: str, tags: tuple[str, ...] = ()) -> UserConfig:
    full = (VhostPermissions("/", ".*", ".*", ".*"),)
    return UserConfig(name, _HASH, full, tags, roles)


USERS = (
    _user("admin", tags=("administrator",)),
    _user("trader", "traders"),
    _user("auditor", "auditors"),
    _user("nobody"),
    _user("peer", "traders", tags=("peering",)),
    _user("outsider", tags=("peering",)),
    _user("webnobody", tags=("administrator",)),
    _user("webtrader", "traders", tags=("administrator",)),
)
CONSTRAINTS = (
    ConstraintConfig(exchange="orders", send=("traders",), subscribe=("traders", "auditors")),
    ConstraintConfig(queue="audit", send=("traders",), subscribe=("auditors",), name="audit-log"),
)


def _config() -> Config:
    base = load_config(
        overrides={
            "server.host": "127.0.0.1",
            "server.port": 0,
            "storage.persist": False,
            "amqp.port": 0,
            "http.port": 0,
        }
    )
    return dataclasses.replace(base, users=USERS, constraints=CONSTRAINTS)


@pytest.fixture
async def node(nursery: trio.Nursery) -> AsyncIterator[BrokerNode]:
    broker_node = BrokerNode(_config())
    await nursery.start(broker_node.run)
    async with amqlite.connect(_addr(broker_node), login="admin", password=PASSWORD) as conn:
        await conn.declare_exchange("orders", "topic")
        await conn.declare_exchange("open", "topic")
        for queue in ("audit", "free"):
            await conn.declare_queue(queue)
    yield broker_node
    broker_node.stop()


def _addr(node: BrokerNode) -> str:
    return f"127.0.0.1:{node.port}"


def _connect(node: BrokerNode, login: str) -> Any:
    return amqlite.connect(_addr(node), login=login, password=PASSWORD, reconnect=False)


# --- native clients ---------------------------------------------------------------------


async def test_native_publish_needs_the_send_role(node: BrokerNode) -> None:
    async with _connect(node, "trader") as conn:
        await conn.publish("orders", "a.b", b"ok", confirm=True)
        await conn.publish("", "audit", b"ok", confirm=True)
    with logged() as entries:
        async with _connect(node, "auditor") as conn:
            with pytest.raises(AccessRefused) as refused:
                await conn.publish("orders", "a.b", b"no", confirm=True)
    text = refused.value.text
    assert refused.value.code == ReplyCode.ACCESS_REFUSED
    assert "send on exchange 'orders' in vhost '/' needs one of the roles [traders]" in text
    assert "constraint exchange 'orders' in vhost '/'" in text
    assert "user 'auditor' has roles [auditors]" in text
    assert refusals(entries, "constraint_refused") == [text]


async def test_a_queues_send_constraint_covers_the_default_exchange(node: BrokerNode) -> None:
    async with _connect(node, "nobody") as conn:
        await conn.publish("", "free", b"ok", confirm=True)  # not constrained
        await conn.publish("open", "x", b"ok", confirm=True)
        with pytest.raises(AccessRefused) as refused:
            await conn.publish("", "audit", b"no", confirm=True)
    assert "(constraint 'audit-log')" in refused.value.text


async def test_native_consume_and_get_need_the_subscribe_role(node: BrokerNode) -> None:
    async with _connect(node, "trader") as trader:
        await trader.publish("", "audit", b"m", confirm=True)
        with pytest.raises(AccessRefused) as refused:
            await trader.consume("audit")
        assert "subscribe on queue 'audit'" in refused.value.text
        assert "needs one of the roles [auditors]" in refused.value.text
    async with _connect(node, "trader") as trader:
        with pytest.raises(AccessRefused):
            await trader.get("audit")
    async with _connect(node, "auditor") as auditor:
        got = await auditor.get("audit")
        assert got is not None and got.body == b"m"
        await got.ack()
        await auditor.consume("audit")


async def test_binding_to_an_exchange_is_subscribing_to_it(node: BrokerNode) -> None:
    async with _connect(node, "nobody") as conn:
        await conn.bind("free", "open", "#")
        with pytest.raises(AccessRefused) as refused:
            await conn.bind("free", "orders", "#")
    assert "subscribe on exchange 'orders'" in refused.value.text
    async with _connect(node, "auditor") as conn:
        await conn.bind("free", "orders", "#")


# --- AMQP clients ---------------------------------------------------------------------------


def _pika(node: BrokerNode, login: str) -> pika.BlockingConnection:
    assert node.amqp_port is not None
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            host="127.0.0.1",
            port=node.amqp_port,
            credentials=pika.PlainCredentials(login, PASSWORD),
            socket_timeout=10,
            stack_timeout=10,
        )
    )


def _pika_session(node: BrokerNode) -> dict[str, Any]:
    out: dict[str, Any] = {}
    conn = _pika(node, "auditor")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(ChannelClosedByBroker) as closed:
            ch.basic_publish("orders", "a.b", b"no")
        out["publish"] = (closed.value.reply_code, closed.value.reply_text)
        ch = conn.channel()
        ch.basic_consume("audit", lambda *args: None)  # the auditor may
        ch = conn.channel()
        ch.queue_bind("free", "orders", "#")  # and subscribe to orders
    finally:
        conn.close()
    conn = _pika(node, "trader")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("orders", "a.b", b"ok")
        with pytest.raises(ChannelClosedByBroker) as closed:
            ch.basic_consume("audit", lambda *args: None)
            ch.start_consuming()
        out["consume"] = (closed.value.reply_code, closed.value.reply_text)
    finally:
        conn.close()
    return out


async def test_amqp_clients_meet_the_same_constraints(node: BrokerNode) -> None:
    with logged() as entries:
        out = await trio.to_thread.run_sync(_pika_session, node)
    code, text = out["publish"]
    assert code == ReplyCode.ACCESS_REFUSED
    assert "send on exchange 'orders'" in text and "user 'auditor'" in text
    code, text = out["consume"]
    assert code == ReplyCode.ACCESS_REFUSED
    assert "subscribe on queue 'audit'" in text and "(constraint 'audit-log')" in text
    logged_refusals = refusals(entries, "constraint_refused")
    assert len(logged_refusals) == 2 and all("access refused" in r for r in logged_refusals)


# --- the HTTP API ---------------------------------------------------------------------------


async def test_an_http_publish_meets_the_same_constraints(node: BrokerNode) -> None:
    body = {"routing_key": "a.b", "payload": "hi", "payload_encoding": "string"}
    url = f"http://{node.http_listen}/api/exchanges/%2F/orders/publish"
    async with httpx.AsyncClient(timeout=10) as http:
        with logged() as entries:
            refused = await http.post(url, json=body, auth=("webnobody", PASSWORD))
        allowed = await http.post(url, json=body, auth=("webtrader", PASSWORD))
    assert refused.status_code == 403, refused.text
    assert "send on exchange 'orders'" in refused.text and "webnobody" in refused.text
    assert len(refusals(entries, "constraint_refused")) == 1
    assert allowed.status_code == 200, allowed.text


# --- peering links ------------------------------------------------------------------------


async def test_a_peering_link_needs_the_roles_of_the_exchange(node: BrokerNode) -> None:
    raw = await opened(node.port, "outsider", "peer-link")
    with logged() as entries:
        await raw.send(ev.PeerMessage(_peer_hello("orders")))
        with trio.fail_after(5):
            refused = await raw.receive()
            closed = await raw.receive()
    assert isinstance(refused, ev.PeerMessage) and refused.msg["type"] == "peer.refused"
    assert refused.msg["code"] == ReplyCode.ACCESS_REFUSED
    text = refused.msg["text"]
    assert "send on exchange 'orders'" in text and "user 'outsider' has roles [none]" in text
    assert isinstance(closed, ev.Close) and closed.code == ReplyCode.ACCESS_REFUSED
    assert refusals(entries, "constraint_refused") == [text]
    await raw.aclose()

    for login, exchange in (("outsider", "open"), ("peer", "orders")):
        allowed = await opened(node.port, login, "peer-link")
        await allowed.send(ev.PeerMessage(_peer_hello(exchange)))
        with trio.fail_after(5):
            reply = await allowed.receive()
        assert isinstance(reply, ev.PeerMessage) and reply.msg["type"] != "peer.refused", reply
        await allowed.aclose()
