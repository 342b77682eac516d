"""Failover against real brokers (amqlite.server) served in-process on 127.0.0.1:0.

Two independent nodes stand in for an HA pair. The broker keeps messages in memory
only, so the second node starts empty: the client must declare again what it
declared, and messages confirmed by the first node die with it (what was not
confirmed is sent again).
"""

from __future__ import annotations

from typing import Any

import trio

import amqlite
from amqlite.client import Reconnected
from amqlite.config import load_config
from amqlite.errors import ReplyCode
from amqlite.server import BrokerNode


class _Node:
    """A BrokerNode in its own cancel scope: :meth:`stop` is a graceful shutdown
    (clients get 320), :meth:`kill` drops everything at once."""

    def __init__(self, node: BrokerNode, scope: trio.CancelScope) -> None:
        self.node = node
        self.scope = scope

    @classmethod
    async def start(cls, nursery: trio.Nursery, port: int = 0) -> _Node:
        config = load_config(overrides={"server.host": "127.0.0.1", "server.port": port})
        node = BrokerNode(config)
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await node.run(task_status=task_status)

        await nursery.start(run)
        return cls(node, scope)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.node.port}"

    def stop(self) -> None:
        self.node.stop()

    async def kill(self) -> None:
        self.scope.cancel()
        with trio.fail_after(5):
            await self.node.stopped.wait()

    def queue(self, name: str) -> dict[str, Any]:
        (vhost,) = self.node.status()["vhosts"]
        (q,) = [q for q in vhost["queues"] if q["name"] == name]
        return dict(q)


class _Back:
    def __init__(self) -> None:
        self.events: list[Reconnected] = []
        self._event = trio.Event()

    def __call__(self, event: Reconnected) -> None:
        self.events.append(event)
        self._event.set()

    async def wait(self, limit: float = 20.0) -> Reconnected:
        with trio.fail_after(limit):
            await self._event.wait()
        self._event = trio.Event()
        return self.events[-1]


async def _drain(conn: amqlite.Connection, queue: str) -> list[bytes]:
    got = []
    while (d := await conn.get(queue)) is not None:
        got.append(d.body)
        await d.ack()
    return got


async def test_confirmed_publishing_carries_on_across_a_shutdown(nursery: trio.Nursery) -> None:
    a = await _Node.start(nursery)
    b = await _Node.start(nursery)
    n, stop_at = 1500, 500
    back = _Back()
    snapshot: dict[str, Any] = {}
    pending: list[amqlite.PendingConfirm] = []
    conns: list[amqlite.Connection] = []

    def lost(_: object) -> None:  # which publishes had their confirm when A went
        snapshot["confirmed"] = {i for i, p in enumerate(pending) if p.done}
        snapshot["unconfirmed"] = conns[0].unconfirmed

    async with amqlite.connect(
        f"{a.address},{b.address}",
        connect_timeout=2,
        max_in_flight=200,
        on_disconnect=lost,
        on_reconnect=back,
    ) as conn:
        conns.append(conn)
        await conn.declare_queue("jobs", durable=True)
        for i in range(n):
            pending.append(await conn.publish_nowait("", "jobs", b"%d" % i, persistent=True))
            if i == stop_at:
                a.stop()
        with trio.fail_after(30):
            await conn.wait_for_confirms()
        assert all(p.done and p.error is None for p in pending)  # every one confirmed
        event = await back.wait()
        assert str(event.address) == b.address and str(conn.address) == b.address
        assert conn.reconnects == 1
        on_b = {int(body) for body in await _drain(conn, "jobs")}
    # B holds every message A had not confirmed when it went (A took the rest down
    # with it: no persistence across nodes in this test), and nothing else
    unconfirmed_at_cut = set(range(n)) - snapshot["confirmed"]
    assert unconfirmed_at_cut <= on_b
    assert on_b == set(range(min(on_b), n))
    assert event.resent == snapshot["unconfirmed"] > 0


async def test_consumer_of_a_server_named_queue_follows_to_the_backup(
    nursery: trio.Nursery,
) -> None:
    a = await _Node.start(nursery)
    b = await _Node.start(nursery)
    back = _Back()
    async with amqlite.connect(f"{a.address},{b.address}", on_reconnect=back) as conn:
        await conn.declare_exchange("events", "fanout")
        old = (await conn.declare_queue("", exclusive=True, auto_delete=True)).name
        await conn.bind(old, "events")
        consumer = await conn.consume(old, prefetch=10)
        tag = consumer.tag
        await conn.publish("events", "", b"before", confirm=True)
        with trio.fail_after(5):
            first = await consumer.__anext__()
        assert first.body == b"before"
        await a.kill()
        event = await back.wait()
        # amq.gen- names are the server's to give: the queue came back under a new one
        new = event.renamed_queues[old]
        assert new != old and new.startswith("amq.gen-")
        assert consumer.queue == new and consumer.tag == tag and consumer.active
        assert first.stale
        await first.ack()  # a no-op: A is gone, and it must not ack anything on B
        await conn.publish("events", "", b"after", confirm=True)
        with trio.fail_after(5):
            d = await consumer.__anext__()
        assert (d.body, d.consumer_tag, d.queue, d.redelivered) == (b"after", tag, new, False)
        await d.ack()
        await conn.status()
        q = b.queue(new)
        assert (q["messages"], q["unacked"], q["consumers"], q["exclusive"]) == (0, 0, 1, True)


async def test_single_server_restart_on_the_same_port(nursery: trio.Nursery) -> None:
    a = await _Node.start(nursery)
    port = a.node.port
    back = _Back()
    async with amqlite.connect(a.address, reconnect=True, on_reconnect=back) as conn:
        await conn.declare_queue("work")
        consumer = await conn.consume("work")
        await a.kill()
        restarted = await _Node.start(nursery, port)
        event = await back.wait()
        assert event.address.port == port and event.renamed_queues == {}
        assert restarted.queue("work")["consumers"] == 1
        await conn.publish("", "work", b"hello again", confirm=True)
        with trio.fail_after(5):
            d = await consumer.__anext__()
        assert d.body == b"hello again"
        await d.ack()


async def test_unacked_deliveries_come_again_after_the_link_is_cut(
    nursery: trio.Nursery,
) -> None:
    """The node stays up and drops only our connection: what we had not acked comes
    again, ``redelivered``, to the same consumer tag; a stale ack changes nothing."""
    a = await _Node.start(nursery)
    back = _Back()
    async with amqlite.connect(
        a.address, reconnect=True, on_reconnect=back, client_name="victim"
    ) as conn:
        await conn.declare_queue("shared", durable=True)
        for i in range(5):
            await conn.publish("", "shared", b"%d" % i, confirm=True)
        consumer = await conn.consume("shared", prefetch=5)
        tag = consumer.tag
        with trio.fail_after(5):
            d0 = await consumer.__anext__()
            d1 = await consumer.__anext__()
        await d0.ack()
        await conn.status()  # d0's ack is in; d1..d4 are delivered and unacked
        (victim,) = [c for c in a.node.connections if (c.info() or {}).get("client") == "victim"]
        victim.close_from_server(ReplyCode.CONNECTION_FORCED, "kicked")
        await back.wait()
        assert d1.stale
        await d1.ack()  # must not ack whatever has tag 1 on the new link
        got: list[amqlite.Delivery] = []
        with trio.fail_after(5):
            async for d in consumer:
                got.append(d)
                if len(got) == 4:
                    break
        assert [(d.body, d.redelivered, d.consumer_tag) for d in got] == [
            (b"%d" % i, True, tag) for i in range(1, 5)
        ]
        assert got[0].delivery_tag > 5  # tags go on increasing across links
        await conn.status()  # a round trip: any ack would have landed by now
        q = a.queue("shared")
        assert (q["messages"], q["unacked"]) == (0, 4)  # the stale ack acked nothing
        await conn.ack(got[-1].delivery_tag, multiple=True)
        await conn.status()
        q = a.queue("shared")
        assert (q["messages"], q["unacked"]) == (0, 0)
