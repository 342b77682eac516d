"""Each limit of ``[limits]`` refused over the native protocol with a code and a
text naming its setting, against a node served in-process (the AMQP side is in
tests/amqp_clients/test_limits.py, the socket flood in tests/e2e/test_limits_flood.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio

import amqlite
from amqlite.auth import hash_password
from amqlite.config import UserConfig, VhostPermissions, load_config
from amqlite.errors import AmqliteError, ConnectionRefused, ReplyCode
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode
from tests.waiting import wait_until

from .rawclient import RawClient, read_raw_until_closed
from .test_privileges import logged

PASSWORD = "pw"
_HASH = hash_password(PASSWORD, salt=b"0123456789abcdef", n=2**4)
USERS = tuple(
    UserConfig(name, _HASH, (VhostPermissions("/", ".*", ".*", ".*"),)) for name in ("ann", "bob")
)
WAIT = 5.0


async def start_node(nursery: trio.Nursery, users: bool = False, **limits: Any) -> BrokerNode:
    overrides = {"server.host": "127.0.0.1", "server.port": 0, "storage.persist": False}
    overrides |= {f"limits.{key}": value for key, value in limits.items()}
    config = load_config(overrides=overrides)
    if users:
        config = dataclasses.replace(config, users=USERS)
    node = BrokerNode(config)
    await nursery.start(node.run)
    return node


def connect(node: BrokerNode, login: str = "guest", **kwargs: Any) -> Any:
    password = "guest" if login == "guest" else PASSWORD
    return amqlite.connect(
        f"127.0.0.1:{node.port}", login=login, password=password, reconnect=False, **kwargs
    )


async def wait_for(condition: Callable[[], bool]) -> None:
    await wait_until(condition, deadline=WAIT)


# --- connections ---------------------------------------------------------------------------


async def test_one_connection_past_the_node_limit_is_refused_530(nursery: trio.Nursery) -> None:
    node = await start_node(nursery, max_connections=2)
    async with AsyncExitStack() as stack:
        for _ in range(2):
            await stack.enter_async_context(connect(node))
        with logged() as entries, pytest.raises(ConnectionRefused) as info:
            async with connect(node):
                pass  # pragma: no cover
        assert info.value.code == ReplyCode.NOT_ALLOWED
        assert "node connection limit (2) is reached (limits.max_connections)" in str(info.value)
        assert [e["reason"] for e in entries if e["event"] == "connection_refused"] == [
            "node connection limit (2) is reached (limits.max_connections)"
        ]
    # the two closed: their places are free again
    await wait_for(lambda: node.limits.open == 0)
    async with connect(node) as conn:
        await conn.declare_queue("served")


async def test_the_per_user_limit_refuses_that_user_only(nursery: trio.Nursery) -> None:
    node = await start_node(nursery, users=True, max_connections_per_user=1)
    async with connect(node, "ann"), connect(node, "bob"):
        with pytest.raises(ConnectionRefused) as info:
            async with connect(node, "ann"):
                pass  # pragma: no cover
        assert info.value.code == ReplyCode.NOT_ALLOWED
        assert "user connection limit (1) of user 'ann' is reached" in str(info.value)
        assert "limits.max_connections_per_user" in str(info.value)


async def test_a_mute_socket_is_closed_after_the_handshake_timeout(
    nursery: trio.Nursery,
) -> None:
    node = await start_node(nursery, handshake_timeout=0.2)
    async with connect(node) as conn:  # opened first: no longer held to the timeout
        raw = await RawClient.connect(node.port)
        await raw.send_raw(b"\x00\x00")  # half a frame length, then nothing
        with logged() as entries:
            with trio.fail_after(WAIT):
                assert await read_raw_until_closed(raw.stream) == b""
            await wait_for(lambda: node.limits.pending == 0)
        (timeout,) = [e for e in entries if e["event"] == "handshake_timeout"]
        assert timeout["timeout_s"] == 0.2
        assert timeout["listener"] == "native"
        # the mute socket came later and its timeout has passed: ours is still served
        await conn.declare_queue("still-open")
        assert node.limits.open == 1


async def test_past_the_unauthenticated_bound_the_oldest_socket_is_closed(
    nursery: trio.Nursery,
) -> None:
    node = await start_node(nursery, max_unauthenticated_connections=3)
    idle = [await trio.open_tcp_stream("127.0.0.1", node.port) for _ in range(3)]
    await wait_for(lambda: node.limits.pending == 3)
    with logged() as entries:
        newer = [await trio.open_tcp_stream("127.0.0.1", node.port) for _ in range(2)]
        with trio.fail_after(WAIT):
            for stream in idle[:2]:  # the two oldest made room
                assert await read_raw_until_closed(stream) == b""
    assert node.limits.evicted == 2
    (line,) = [e for e in entries if e["event"] == "unauthenticated_connections_evicted"]
    assert line["limit"] == 3
    assert "limits.max_unauthenticated_connections" in line["reason"]
    # a real client still gets in (evicting one more idle socket), and publishes
    async with connect(node) as conn:
        await conn.declare_queue("q")
        await conn.publish("", "q", b"through", confirm=True)
    assert node.limits.evicted == 3
    for stream in idle + newer:
        await stream.aclose()


# --- per connection and per vhost ------------------------------------------------------------


async def test_a_consumer_past_the_connection_limit_is_530(nursery: trio.Nursery) -> None:
    node = await start_node(nursery, max_consumers_per_connection=2)
    async with connect(node) as conn:
        await conn.declare_queue("q")
        first = await conn.consume("q")
        await conn.consume("q")
        with pytest.raises(AmqliteError) as info:
            await conn.consume("q")
        assert info.value.code == ReplyCode.NOT_ALLOWED
        assert info.value.text == (
            "reached maximum (2) of consumers per connection (limits.max_consumers_per_connection)"
        )
        await first.cancel()
        await conn.consume("q")  # the cancel gave its place back
        async with connect(node) as other:
            await other.consume("q")  # a count per connection


async def test_a_queue_past_the_vhost_limit_is_406(nursery: trio.Nursery) -> None:
    node = await start_node(nursery, max_queues_per_vhost=2)
    async with connect(node) as conn:
        await conn.declare_queue("a")
        await conn.declare_queue("b")
        with pytest.raises(AmqliteError) as info:
            await conn.declare_queue("c")
        assert info.value.code == ReplyCode.PRECONDITION_FAILED
        assert info.value.text == (
            "cannot declare queue 'c': queue limit in vhost '/' (2) is reached "
            "(limits.max_queues_per_vhost)"
        )
        await conn.declare_queue("a")  # an existing one: fine


async def test_a_message_over_the_size_limit_is_406_and_the_connection_goes_on(
    nursery: trio.Nursery,
) -> None:
    node = await start_node(nursery, max_message_size=1000)
    async with connect(node) as conn:
        await conn.declare_queue("q")
        with pytest.raises(AmqliteError) as info:
            await conn.publish("", "q", b"x" * 1001, confirm=True)
        assert info.value.code == ReplyCode.PRECONDITION_FAILED
        assert info.value.text == (
            "message size 1001 is larger than configured max size 1000 (limits.max_message_size)"
        )
        await conn.publish("", "q", b"x" * 1000, confirm=True)
        got = await conn.get("q", no_ack=True)
        assert got is not None and len(got.body) == 1000


async def test_raw_refusal_is_a_refused_frame_naming_the_limit(nursery: trio.Nursery) -> None:
    """What any native client sees: ``refused`` {code 530, text}."""
    node = await start_node(nursery, max_connections=1)
    async with connect(node):
        raw = await RawClient.connect(node.port)
        with trio.fail_after(WAIT):
            reply = await raw.handshake()
        assert isinstance(reply, ev.Refused)
        assert reply.code == ReplyCode.NOT_ALLOWED
        assert reply.text == "node connection limit (1) is reached (limits.max_connections)"
        await raw.aclose()


async def test_a_full_node_still_takes_a_monitor(nursery: trio.Nursery) -> None:
    """``amqlite status`` must work when clients have used every connection."""
    node = await start_node(nursery, max_connections=1)
    async with connect(node):
        async with connect(node, role="monitor") as monitor:
            status = await monitor.status()
        assert status["limits"]["connections"]["open"] == 1
        with pytest.raises(ConnectionRefused):
            async with connect(node):
                pass  # pragma: no cover
