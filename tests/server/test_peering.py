"""The peering shell (amqlite/server/peering/) between two in-process brokers on
127.0.0.1, port 0: each mode's positive and negative case, interest, binding
mirroring, the acceptor's refusals, and the figures under ``links``."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pika
import pytest
import trio
import trio.testing

import amqlite
from amqlite.client import Connection
from amqlite.config import PeeringConfig, load_config
from amqlite.peering import OverflowPolicy, PeeringMode, parse_addresses
from amqlite.server import BrokerNode
from tests.faultproxy import FaultProxy
from tests.waiting import wait_until

DEADLINE = 10.0


def _config(**links: Any) -> Any:
    return load_config(
        overrides={"server.host": "127.0.0.1", "server.port": 0, "storage.persist": False}
    )


def _link(port: int, mode: str, name: str = "x", **extra: Any) -> PeeringConfig:
    return PeeringConfig(
        name=name,
        host=parse_addresses(f"127.0.0.1:{port}"),
        mode=PeeringMode[mode.upper()],
        login="guest",
        password="guest",
        **extra,
    )


async def _start(nursery: trio.Nursery, *links: PeeringConfig) -> BrokerNode:
    node = BrokerNode(dataclasses.replace(_config(), cluster_mta=links))
    await nursery.start(node.run)
    return node


def _addr(node: BrokerNode) -> str:
    return f"127.0.0.1:{node.port}"


async def wait_for(
    predicate: Callable[[], bool | Awaitable[bool]], what: str, every: float = 0.01
) -> None:
    """Wait for ``predicate`` (checked every ``every`` seconds), within DEADLINE."""
    await wait_until(predicate, what, deadline=DEADLINE, every=every)


def _links(node: BrokerNode) -> list[dict[str, Any]]:
    assert node.peering is not None
    return node.peering.status()


def _link_up(node: BrokerNode) -> bool:
    links = _links(node)
    return bool(links) and all(item["state"] == "up" for item in links)


def _remote_interest(node: BrokerNode, size: int) -> Callable[[], bool]:
    return lambda: bool(_links(node)) and _links(node)[0]["interest_size"] == size


def _peering_queue(dialer: BrokerNode, name: str = "x") -> str:
    """The queue a subscribe link of ``dialer`` has on the remote."""
    return f"amq.peering.x.{dialer.node_id}/{name}"


def _queue_keys(node: BrokerNode, queue: str) -> list[str]:
    host = node.broker.vhost("/")
    assert host is not None
    q = host.queues.get(queue)
    assert q is not None, f"no queue {queue!r} on {node.node_id}"
    return sorted(exchange.bindings[ident].key for exchange, ident in q.bindings)


@pytest.fixture
async def pair(nursery: trio.Nursery) -> AsyncIterator[Callable[[str], Awaitable[Any]]]:
    """``await pair(mode)`` -> (a, b): a dials b's exchange ``x`` (topic) in ``mode``."""

    async def make(mode: str, **extra: Any) -> tuple[BrokerNode, BrokerNode]:
        b = await _start(nursery)
        async with amqlite.connect(_addr(b)) as conn:
            await conn.declare_exchange("x", "topic", durable=True)
        a = await _start(nursery, _link(b.port, mode, **extra))
        await wait_for(lambda: _link_up(a) and _link_up(b), "the link came up")
        return a, b

    yield make


async def _queue(conn: Connection, key: str) -> tuple[str, Any]:
    q = (await conn.declare_queue("", exclusive=True)).name
    await conn.bind(q, "x", key)
    return q, await conn.consume(q, no_ack=True)


async def _take(consumer: Any, n: int) -> list[bytes]:
    got: list[bytes] = []
    with trio.fail_after(DEADLINE):
        async for d in consumer:
            got.append(d.body)
            if len(got) == n:
                return got
    return got  # pragma: no cover


async def test_publish_mode_sends_what_the_remote_wants(pair: Any) -> None:
    a, b = await pair("publish")
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        _, remote = await _queue(cb, "orders.*")
        await wait_for(_remote_interest(a, 1), "a heard b's interest")
        for i in range(50):
            await ca.publish("x", "orders.new", b"m%d" % i)
            await ca.publish("x", "stock.low", b"unwanted")  # nobody bound on b
        assert await _take(remote, 50) == [b"m%d" % i for i in range(50)]
        await wait_for(lambda: _links(a)[0]["lag_messages"] == 0, "everything acknowledged")
        link = _links(a)[0]
        assert (link["mode"], link["role"], link["state"]) == ("publish", "dialer", "up")
        assert link["forwarded"] == 50
        assert link["skipped"] == {"no-interest": 50}
        assert link["remote_node"] == b.node_id
        assert link["remote_address"] == _addr(b)
        accepted = _links(b)[0]
        assert accepted["role"] == "acceptor"
        assert accepted["received"] == 50
        assert accepted["interest_size"] == 1


async def test_a_read_of_forwarded_publishes_reaches_the_link_in_few_runs(pair: Any) -> None:
    """On a sending site (no queue bound here) the reader of a client's read of
    plain publishes goes on past FRAMES_PER_TURN frames while those publishes wait
    in the exchange's run (``RequestDispatcher.runs_waiting``), up to
    MAX_FRAMES_PER_TURN, so the flusher offers them to the link in runs larger
    than a turn's first batch; every message arrives once, in order (checked to
    fail without the reader going on: runs of 64 and 128)."""
    from amqlite.protocol import NEED_DATA, Role
    from amqlite.protocol import Connection as Proto
    from amqlite.protocol import events as ev
    from amqlite.server.connection import FRAMES_PER_TURN, MAX_FRAMES_PER_TURN, NativeConnection

    a, b = await pair("publish")
    async with amqlite.connect(_addr(b)) as cb:
        _, remote = await _queue(cb, "k")
        await wait_for(_remote_interest(a, 1), "a heard b's interest")
        assert a.peering is not None
        px = a.peering.hooks["/"]["x"].px
        sizes: list[int] = []
        offer = px.published_plain_run

        def recorded(keys: list[str], bodies: list[bytes], *, now: float) -> Any:
            sizes.append(len(bodies))
            return offer(keys, bodies, now=now)

        px.published_plain_run = recorded  # type: ignore[method-assign]
        client_side, server_side = trio.testing.memory_stream_pair()
        conn = NativeConnection(a, server_side, "memory:1", "127.0.0.1")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            proto = Proto(Role.CLIENT)
            await client_side.send_all(proto.send(ev.Hello(1)))
            while (welcome := proto.next_event()) is NEED_DATA:
                proto.receive_data(await client_side.receive_some(65536))
            assert isinstance(welcome, ev.Welcome)
            n = 4 * MAX_FRAMES_PER_TURN
            bodies = [b"m%d" % i for i in range(n)]
            await client_side.send_all(
                b"".join(
                    proto.send(ev.Publish(10 + i, "x", "k", body)) for i, body in enumerate(bodies)
                )
            )
            assert await _take(remote, n) == bodies
            await client_side.aclose()
    assert sum(sizes) == n
    assert max(sizes) >= MAX_FRAMES_PER_TURN > FRAMES_PER_TURN, sizes


async def test_publish_mode_never_sends_remote_messages_back(pair: Any) -> None:
    a, b = await pair("publish")
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        _, local = await _queue(ca, "#")
        _, remote = await _queue(cb, "#")
        await wait_for(_remote_interest(a, 1), "a heard b's interest")
        await cb.publish("x", "k", b"from-b")  # publish mode: b -> a is not a direction
        await ca.publish("x", "k", b"from-a")
        assert await _take(remote, 2) == [b"from-b", b"from-a"]
        assert await _take(local, 1) == [b"from-a"]
        with trio.move_on_after(0.3):
            extra = await _take(local, 1)
            raise AssertionError(f"a received {extra} from b in publish mode")


async def test_subscribe_mode_mirrors_bindings_and_pulls_matching_messages(pair: Any) -> None:
    a, b = await pair("subscribe")
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        q1, local = await _queue(ca, "news.#")
        q2 = (await ca.declare_queue("", exclusive=True)).name
        await ca.bind(q2, "x", "news.#")  # same key: one remote entry, counted twice
        await wait_for(_remote_interest(b, 1), "b holds a's one distinct binding")
        for i in range(20):
            await cb.publish("x", "news.sport", b"n%d" % i)
            await cb.publish("x", "weather.today", b"no")
        assert await _take(local, 20) == [b"n%d" % i for i in range(20)]
        end = _links(b)[0]
        assert (end["forwarded"], end["queue"]) == (20, _peering_queue(a))
        assert _queue_keys(b, _peering_queue(a)) == ["news.#"]  # a real binding on b
        await ca.unbind(q1, "x", "news.#")
        assert _links(b)[0]["interest_size"] == 1  # q2 still binds it
        await ca.delete_queue(q2)
        await wait_for(_remote_interest(b, 0), "the last local binding removed the remote one")
        assert _queue_keys(b, _peering_queue(a)) == []
        await cb.publish("x", "news.sport", b"late", confirm=True)
        assert _links(b)[0]["accepted"] == 20  # the peering queue did not take it


async def test_forward_mode_delivers_locally_or_remotely_never_both(pair: Any) -> None:
    a, b = await pair("forward")
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        _, local = await _queue(ca, "svc.local")
        _, remote = await _queue(cb, "svc.*")
        await wait_for(_remote_interest(a, 1), "a heard b's interest")
        await ca.publish("x", "svc.local", b"here")
        await ca.publish("x", "svc.remote", b"there")
        assert await _take(local, 1) == [b"here"]
        assert await _take(remote, 1) == [b"there"]
        await wait_for(lambda: _links(a)[0]["lag_messages"] == 0, "acknowledged")
        assert _links(a)[0]["forwarded"] == 1
        assert _links(a)[0]["skipped"] == {"delivered-locally": 1}


async def test_forward_mode_returns_a_mandatory_publish_only_when_no_site_routes_it(
    pair: Any,
) -> None:
    a, b = await pair("forward")
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        _, remote = await _queue(cb, "svc.*")
        await wait_for(_remote_interest(a, 1), "a heard b's interest")
        # no queue on a, one on b: routed there, so neither returned nor lost
        await ca.publish("x", "svc.billing", b"there", mandatory=True, confirm=True)
        assert await _take(remote, 1) == [b"there"]
        with pytest.raises(amqlite.PublishReturned):  # no queue on either site
            await ca.publish("x", "nobody.home", b"back", mandatory=True, confirm=True)
        assert _links(a)[0]["forwarded"] == 1


async def test_interest_costs_one_copy_per_broker(pair: Any) -> None:
    a, b = await pair("publish")
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        consumers = [await _queue(cb, "k") for _ in range(10)]
        await wait_for(_remote_interest(a, 1), "ten identical bindings are one entry")
        await ca.publish("x", "k", b"once")
        for _, consumer in consumers:
            assert await _take(consumer, 1) == [b"once"]
        assert _links(a)[0]["forwarded"] == 1
        assert _links(b)[0]["received"] == 1


async def test_an_exchange_deleted_and_declared_again_keeps_its_peering(pair: Any) -> None:
    a, b = await pair("publish")
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        await _queue(cb, "k.*")
        await wait_for(_remote_interest(a, 1), "a heard b's interest")
        await cb.delete_exchange("x")  # its binding goes: the remote hears it
        await wait_for(_remote_interest(a, 0), "a heard the binding go")
        await cb.declare_exchange("x", "topic", durable=True)
        _, remote = await _queue(cb, "k.*")
        await wait_for(_remote_interest(a, 1), "b's new exchange is still peered")
        await ca.delete_exchange("x")  # the sending side too
        await ca.declare_exchange("x", "topic", durable=True)
        _, local = await _queue(ca, "k.*")
        await ca.publish("x", "k.1", b"after")
        assert await _take(remote, 1) == [b"after"]
        assert await _take(local, 1) == [b"after"]
        assert _links(b)[0]["interest_size"] == 1


async def test_a_wrong_password_keeps_the_link_in_backoff(nursery: trio.Nursery) -> None:
    b = await _start(nursery)
    link = dataclasses.replace(_link(b.port, "publish"), password="wrong")
    a = await _start(nursery, link)
    await wait_for(lambda: _links(a)[0]["reconnects"] >= 2, "it retried")
    item = _links(a)[0]
    assert item["state"] in ("backoff", "connecting")
    assert "403" in item["last_error"]
    assert _links(b) == []


async def test_a_missing_remote_exchange_is_refused(nursery: trio.Nursery) -> None:
    b = await _start(nursery)  # no exchange "x" there
    a = await _start(nursery, _link(b.port, "publish"))
    await wait_for(lambda: _links(a)[0]["reconnects"] >= 1, "it was refused")
    assert "no exchange 'x'" in _links(a)[0]["last_error"]


async def test_block_policy_nacks_a_confirmed_publish_when_the_link_is_full(
    nursery: trio.Nursery,
) -> None:
    b = await _start(nursery)
    async with amqlite.connect(_addr(b)) as cb:
        await cb.declare_exchange("x", "topic", durable=True)
        await cb.declare_queue("wants-k")
        await cb.bind("wants-k", "x", "k")
    link = _link(b.port, "publish", buffer_bytes=4096, overflow=OverflowPolicy.BLOCK)
    a = await _start(nursery, link)
    await wait_for(_remote_interest(a, 1), "up, and a knows what b wants")
    b.stop()  # the link goes down: what a publishes waits in its log
    await wait_for(lambda: _links(a)[0]["state"] != "up", "down")
    async with amqlite.connect(_addr(a)) as ca:
        with pytest.raises(amqlite.errors.PublishNacked):
            for _ in range(100):
                await ca.publish("x", "k", b"x" * 500, confirm=True)
    assert _links(a)[0]["buffered_bytes"] <= 4096


async def test_status_lists_links(pair: Any) -> None:
    a, _ = await pair("subscribe")
    async with amqlite.connect(_addr(a)) as ca:
        status = await ca.status()
    (item,) = status["links"]
    for key in (
        "exchange",
        "mode",
        "state",
        "remote_address",
        "remote_node",
        "lag_seconds",
        "in_flight",
        "buffered_bytes",
        "forwarded",
        "duplicates_dropped",
        "loops_dropped",
        "interest_size",
    ):
        assert key in item, key
    assert (item["exchange"], item["mode"]) == ("x", "subscribe")


async def _start_persistent(
    nursery: trio.Nursery, port: int = 0, *links: PeeringConfig, amqp: bool = False
) -> Any:
    overrides: dict[str, Any] = {"server.host": "127.0.0.1", "server.port": port}
    if amqp:
        overrides["amqp.port"] = 0
    config = load_config(overrides=overrides)
    node = BrokerNode(dataclasses.replace(config, cluster_mta=links))
    await nursery.start(node.run)
    return node


async def _remote_with_queue(nursery: trio.Nursery) -> Any:
    """A persistent remote with exchange ``x`` and the durable queue ``q`` bound
    with ``k``."""
    b = await _start_persistent(nursery)
    async with amqlite.connect(_addr(b)) as cb:
        await cb.declare_exchange("x", "topic", durable=True)
        await cb.declare_queue("q", durable=True)
        await cb.bind("q", "x", "k")
    return b


@pytest.mark.parametrize("policy", ["drop-oldest", "spill", "block"])
async def test_overflow_policies_while_the_remote_is_away(
    nursery: trio.Nursery, policy: str
) -> None:
    """With b down, a's link holds at most ``buffer_bytes``; when b returns (a new
    process on the same port and data dir), spill and block deliver everything in
    order, drop-oldest the newest messages in order."""
    b = await _remote_with_queue(nursery)
    port = b.port
    cap = 8192
    overflow = OverflowPolicy(policy)
    a = await _start_persistent(
        nursery, 0, _link(port, "publish", buffer_bytes=cap, overflow=overflow)
    )
    await wait_for(_remote_interest(a, 1), "a knows what b wants")
    b.stop()
    await b.stopped.wait()
    await wait_for(lambda: _links(a)[0]["state"] != "up", "the link is down")
    n = 100
    async with amqlite.connect(_addr(a)) as ca:
        for i in range(n):
            await ca.publish("x", "k", b"%03d" % i + b"." * 500)
        await ca.publish("x", "k", b"end" + b"." * 500, confirm=policy != "block")
    n += 1
    link = _links(a)[0]
    assert link["buffered_bytes"] <= cap
    assert link["accepted"] + link["held"] == n
    if policy == "drop-oldest":
        assert link["overflow_dropped"] > 0
    elif policy == "spill":
        assert link["spilled"] > 0 and link["spilled_bytes"] > 0
    else:
        assert link["overflow_blocked"] > 0 and link["held"] > 0
    b2 = await _start_persistent(nursery, port)
    await wait_for(lambda: _links(a)[0]["lag_messages"] == 0, "a's link caught up")
    await wait_for(lambda: _links(a)[0]["held"] == 0, "a's held messages went out")
    await wait_for(lambda: _links(a)[0]["lag_messages"] == 0, "and were acknowledged")
    async with amqlite.connect(_addr(b2)) as cb:
        got = []
        consumer = await cb.consume("q", no_ack=True)
        with trio.fail_after(DEADLINE):
            async for d in consumer:
                got.append(d.body[:3])
                if got[-1] == b"end":
                    break
    expected = [b"%03d" % i for i in range(n - 1)] + [b"end"]
    if policy == "drop-oldest":
        dropped = _links(a)[0]["overflow_dropped"]
        assert got == expected[dropped:]
    else:
        assert got == expected


@pytest.mark.parametrize("protocol", ["native", "amqp"])
async def test_a_full_block_link_holds_its_unconfirmed_publisher_back(
    nursery: trio.Nursery, protocol: str
) -> None:
    """With the remote away, a ``block`` link's buffer fills; the connection that
    publishes to it (native, or pika over AMQP 0-9-1) is then not read (``flow`` in
    its status line): TCP pushes back on the publisher, and the broker holds at most
    one read of its messages for the link, not all of them. Once the remote is
    back, every message arrives once, in order, and the publisher is read again (a
    confirmed publish once they arrived goes through; one while the link is full
    would be nacked, 506)."""
    b = await _remote_with_queue(nursery)
    port = b.port
    link = _link(port, "publish", buffer_bytes=128 * 1024, overflow=OverflowPolicy.BLOCK)
    a = await _start_persistent(nursery, 0, link, amqp=True)
    await wait_for(_remote_interest(a, 1), "a knows what b wants")
    b.stop()
    await b.stopped.wait()
    await wait_for(lambda: _links(a)[0]["state"] != "up", "the link is down")

    def flowing() -> list[bool]:
        return [bool(c.get("flow")) for c in a.status()["connections"]]

    n, pad = 4000, b"." * 500
    bodies = [b"%05d" % i + pad for i in range(n)]
    arrived, published = trio.Event(), trio.Event()

    async def native() -> None:
        async with amqlite.connect(_addr(a)) as ca:
            for body in bodies:
                await ca.publish("x", "k", body)
            await arrived.wait()
            await ca.publish("x", "k", b"end", confirm=True)  # read again
        published.set()

    def with_pika() -> None:
        conn = pika.BlockingConnection(
            pika.ConnectionParameters(host="127.0.0.1", port=a.amqp_port, socket_timeout=10)
        )
        try:
            ch = conn.channel()
            for body in bodies:
                ch.basic_publish("x", "k", body)
            trio.from_thread.run(arrived.wait)
            ch.confirm_delivery()
            ch.basic_publish("x", "k", b"end")  # read again (confirmed)
        finally:
            conn.close()

    async def amqp() -> None:
        await trio.to_thread.run_sync(with_pika)
        published.set()

    nursery.start_soon(native if protocol == "native" else amqp)
    await wait_for(lambda: any(flowing()), "the publisher is held back")
    status = _links(a)[0]
    assert status["accepted"] + status["held"] < n / 2, status  # the rest waits unread
    b2 = await _start_persistent(nursery, port)
    got: list[bytes] = []
    async with amqlite.connect(_addr(b2)) as cb:
        consumer = await cb.consume("q", no_ack=True)
        with trio.fail_after(DEADLINE):
            async for d in consumer:
                got.append(d.body)
                if len(got) == n:
                    arrived.set()
                if len(got) == n + 1:
                    break
            await published.wait()
    assert got == [*bodies, b"end"]


@pytest.fixture
def jump_clock() -> trio.testing.MockClock:
    """Virtual time that jumps ahead once every task has waited 20 ms of real time
    (the real sockets of the brokers and the proxy get to move first)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


async def test_a_silent_remote_is_dropped_after_three_heartbeats_and_rejoined(
    nursery: trio.Nursery, jump_clock: trio.testing.MockClock
) -> None:
    from tests.faultproxy import FaultProxy

    b = await _start(nursery)
    async with amqlite.connect(_addr(b)) as cb:
        await cb.declare_exchange("x", "topic", durable=True)
    proxy = FaultProxy(("127.0.0.1", b.port))
    await nursery.start(proxy.run)
    link = dataclasses.replace(_link(b.port, "publish"), host=parse_addresses(proxy.address))
    a = await _start(nursery, link)
    await wait_for(lambda: _link_up(a) and _link_up(b), "up")
    proxy.partition()  # nothing passes either way, nothing is reset
    silent_at = trio.current_time()
    await wait_for(lambda: _links(a)[0]["state"] != "up", "a gave up on b", 0.1)
    took = trio.current_time() - silent_at
    assert 2.0 <= took <= 4.5, took  # 3 heartbeats of 1 s after the last one heard
    assert "remote silent" in _links(a)[0]["last_error"]
    await wait_for(lambda: _links(b)[0]["state"] == "waiting", "b gave up on a too", 0.1)
    proxy.heal(drop=True)
    healed_at = trio.current_time()
    await wait_for(lambda: _link_up(a) and _link_up(b), "up again", 0.1)
    assert trio.current_time() - healed_at <= 5.5  # the backoff is capped at 5 s
    assert _links(a)[0]["reconnects"] >= 1


async def test_a_peer_link_connection_carries_peering_frames_only(node: BrokerNode) -> None:
    from amqlite.protocol import events as ev

    from .rawclient import RawClient

    client = await RawClient.connect(node.port)
    await client.send(ev.Hello(client.next_id(), role="peer-link"))
    assert isinstance(await client.receive(), ev.Welcome)
    reply = await client.request(ev.QueueDeclare, queue="q")
    assert isinstance(reply, ev.Error) and reply.code == 530
    assert "peering link" in reply.text
    # the first peering map must be a hello for an exchange that exists here
    await client.send(ev.PeerMessage({"type": "peer.heartbeat"}))
    refused = await client.receive_until(ev.PeerMessage)
    assert isinstance(refused, ev.PeerMessage)
    assert refused.msg["type"] == "peer.refused" and refused.msg["code"] == 404
    assert isinstance(await client.receive_until(ev.Close), ev.Close)
    await client.aclose()


async def test_an_unknown_hello_role_is_refused(node: BrokerNode) -> None:
    from amqlite.protocol import events as ev

    from .rawclient import RawClient

    client = await RawClient.connect(node.port)
    await client.send(ev.Hello(client.next_id(), role="peer"))
    refused = await client.receive()
    assert isinstance(refused, ev.Refused)
    assert "peer-link" in refused.text
    await client.aclose()


async def test_a_dialer_of_an_older_peering_version_is_refused_clearly(node: BrokerNode) -> None:
    """Version 1 had no ``peer.forwards``: its dialer gets a ``peer.refused`` that
    says why, and the connection is closed."""
    from amqlite.protocol import events as ev

    from .rawclient import RawClient

    async with amqlite.connect(_addr(node)) as conn:
        await conn.declare_exchange("x", "topic", durable=True)
    raw = await RawClient.connect(node.port)
    await raw.send(ev.Hello(raw.next_id(), role="peer-link"))
    assert isinstance(await raw.receive(), ev.Welcome)
    hello = {
        "type": "peer.hello", "version": 1, "node": "old", "link": "l", "vhost": "/",
        "exchange": "x", "exchange_type": "topic", "mode": 2, "epoch": 1,
        "resume": None, "heartbeat": 0.0,
    }  # fmt: skip
    await raw.send(ev.PeerMessage(hello))
    refused = await raw.receive()
    assert isinstance(refused, ev.PeerMessage) and refused.msg["type"] == "peer.refused"
    assert "unsupported version 1 (we speak 3)" in refused.msg["text"]
    closed = await raw.receive()
    assert isinstance(closed, ev.Close) and "unsupported version 1" in closed.text
    await raw.aclose()


async def test_the_link_logs_in_like_a_client_and_needs_rights_on_the_exchange(
    nursery: trio.Nursery,
) -> None:
    from amqlite.auth import hash_password
    from amqlite.config import UserConfig, VhostPermissions

    def user(name: str, write: str) -> UserConfig:
        grant = VhostPermissions(vhost="/", configure=".*", write=write, read=".*")
        secret = hash_password("pw", salt=b"0123456789abcdef", n=2**4)
        return UserConfig(name=name, password_hash=secret, permissions=(grant,), tags=("peering",))

    config = dataclasses.replace(_config(), users=(user("admin", ".*"), user("reader", "^$")))
    b = BrokerNode(config)
    await nursery.start(b.run)
    async with amqlite.connect(_addr(b), login="admin", password="pw") as cb:
        await cb.declare_exchange("x", "topic", durable=True)
    refused = dataclasses.replace(_link(b.port, "publish"), login="reader", password="pw")
    a = await _start(nursery, refused)
    await wait_for(lambda: _links(a)[0]["reconnects"] >= 1, "refused")
    assert "user 'reader' may not write and read exchange 'x'" in _links(a)[0]["last_error"]
    allowed = dataclasses.replace(_link(b.port, "publish"), login="admin", password="pw")
    a2 = await _start(nursery, allowed)
    await wait_for(lambda: _link_up(a2), "the admin's link is up")


async def test_a_forward_with_malformed_properties_is_dropped_not_stored(node: BrokerNode) -> None:
    """A raw dialer: hello, then two forwards, the first with a property the protocol
    forbids. Only the second is published; both are acknowledged, so the link
    moves on, and the node keeps serving."""
    from amqlite.peering.wire import VERSION
    from amqlite.protocol import events as ev

    from .rawclient import RawClient

    async with amqlite.connect(_addr(node)) as conn:
        await conn.declare_exchange("x", "topic", durable=True)
        q, consumer = await _queue(conn, "#")
        raw = await RawClient.connect(node.port)
        await raw.send(ev.Hello(raw.next_id(), role="peer-link"))
        assert isinstance(await raw.receive(), ev.Welcome)
        hello = {
            "type": "peer.hello", "version": VERSION, "node": "fake", "link": "l", "vhost": "/",
            "exchange": "x", "exchange_type": "topic", "mode": 2, "epoch": 1,
            "resume": None, "heartbeat": 0.0,
        }  # fmt: skip

        def forward(seq: int, props: dict[str, Any]) -> dict[str, Any]:
            return {
                "type": "peer.forward", "seq": seq, "id": ["fake", 1, seq], "path": ["fake"],
                "hops": 1, "exchange": "x", "routing_key": "k", "headers": {},
                "properties": props, "body": b"m%d" % seq,
            }  # fmt: skip

        await raw.send(ev.PeerMessage(hello))
        await raw.send(ev.PeerMessage(forward(1, {"persistent": "yes"})))
        await raw.send(ev.PeerMessage(forward(2, {"priority": 1})))
        assert await _take(consumer, 1) == [b"m2"]
        with trio.fail_after(DEADLINE):
            while True:
                event = await raw.receive()
                assert isinstance(event, ev.PeerMessage), event
                maps = event.msg["msgs"] if event.msg["type"] == "peer.batch" else [event.msg]
                if any(m["type"] == "peer.ack" and m["seq"] == 2 for m in maps):
                    break
        assert _links(node)[0]["received"] == 2
        await raw.aclose()
        status = await conn.status()
        (queue,) = [x for v in status["vhosts"] for x in v["queues"] if x["name"] == q]
        assert queue["consumers"] == 1


async def test_an_acceptor_end_whose_dialer_stays_away_is_retired(
    nursery: trio.Nursery, jump_clock: trio.testing.MockClock
) -> None:
    from tests.faultproxy import FaultProxy

    b = await _start(nursery)
    assert b.peering is not None
    b.peering.acceptor_retention = 5.0
    async with amqlite.connect(_addr(b)) as cb:
        await cb.declare_exchange("x", "topic", durable=True)
    proxy = FaultProxy(("127.0.0.1", b.port))
    await nursery.start(proxy.run)
    link = dataclasses.replace(_link(b.port, "publish"), host=parse_addresses(proxy.address))
    a = await _start(nursery, link)
    await wait_for(lambda: _link_up(a) and _link_up(b), "up")
    proxy.partition(refuse_new=True)
    proxy.cut()
    await wait_for(lambda: _links(b)[0]["state"] == "waiting", "b waits for a", 0.1)
    waiting_at = trio.current_time()
    await wait_for(lambda: not _links(b), "b retired it", 1.0)
    assert trio.current_time() - waiting_at >= 5.0
    proxy.heal()
    await wait_for(lambda: _link_up(a) and _link_up(b), "a new acceptor end", 0.1)


async def _subscribed_pair(
    nursery: trio.Nursery, **extra: Any
) -> tuple[BrokerNode, BrokerNode, FaultProxy]:
    """b, and a subscribed to b's exchange ``x`` through a proxy (to cut the link)."""
    b = await _start(nursery)
    async with amqlite.connect(_addr(b)) as cb:
        await cb.declare_exchange("x", "topic", durable=True)
    proxy = FaultProxy(("127.0.0.1", b.port))
    await nursery.start(proxy.run)
    link = dataclasses.replace(
        _link(b.port, "subscribe", **extra), host=parse_addresses(proxy.address)
    )
    a = await _start(nursery, link)
    await wait_for(lambda: _link_up(a) and _link_up(b), "up")
    return a, b, proxy


async def test_a_subscriber_binding_deleted_by_hand_on_the_remote_comes_back(
    nursery: trio.Nursery,
) -> None:
    a, b, _ = await _subscribed_pair(nursery)
    assert b.peering is not None
    b.peering.check_queue_bindings_every(0.2)
    queue = _peering_queue(a)
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        _, local = await _queue(ca, "news.*")
        await wait_for(lambda: _queue_keys(b, queue) == ["news.*"], "mirrored on b")
        await cb.unbind(queue, "x", "news.*")  # by hand, as an operator might
        assert _queue_keys(b, queue) == []
        await wait_for(lambda: _queue_keys(b, queue) == ["news.*"], "the check put it back")
        await cb.publish("x", "news.one", b"after")
        assert await _take(local, 1) == [b"after"]


async def test_a_subscriber_queue_deleted_by_hand_is_declared_again(
    nursery: trio.Nursery,
) -> None:
    a, b, _ = await _subscribed_pair(nursery)
    queue = _peering_queue(a)
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        _, local = await _queue(ca, "news.*")
        await wait_for(lambda: _queue_keys(b, queue) == ["news.*"], "mirrored on b")
        await cb.delete_queue(queue)
        await wait_for(lambda: _queue_keys(b, queue) == ["news.*"], "declared and bound again")
        await cb.publish("x", "news.one", b"again")
        assert await _take(local, 1) == [b"again"]


async def test_what_is_published_while_the_subscriber_is_away_waits_in_its_queue(
    nursery: trio.Nursery,
) -> None:
    a, b, proxy = await _subscribed_pair(nursery)
    queue = _peering_queue(a)
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        _, local = await _queue(ca, "news.*")
        await wait_for(lambda: _queue_keys(b, queue) == ["news.*"], "mirrored on b")
        proxy.partition(refuse_new=True)
        proxy.cut()
        await wait_for(lambda: _links(b)[0]["state"] == "waiting", "b waits for a")
        for i in range(3000):  # more than the link takes from the queue at once
            await cb.publish("x", "news.one", b"m%d" % i)
        await cb.publish("x", "news.one", b"sync", confirm=True)
        end = _links(b)[0]
        assert end["queued"] > 0 and end["lag_messages"] == 3001
        proxy.heal()
        got = await _take(local, 3001)
        assert got == [b"m%d" % i for i in range(3000)] + [b"sync"]
        await wait_for(lambda: _links(b)[0]["lag_messages"] == 0, "all acknowledged")


async def test_a_subscriber_queue_is_deleted_when_its_lease_runs_out(
    nursery: trio.Nursery, jump_clock: trio.testing.MockClock
) -> None:
    a, b, proxy = await _subscribed_pair(nursery, lease=5.0)
    queue = _peering_queue(a)
    async with amqlite.connect(_addr(a)) as ca:
        await _queue(ca, "news.*")
        await wait_for(lambda: _queue_keys(b, queue) == ["news.*"], "mirrored on b", 0.1)
    proxy.partition(refuse_new=True)
    proxy.cut()
    await wait_for(lambda: _links(b)[0]["state"] == "waiting", "b waits for a", 0.1)
    away_at = trio.current_time()
    host = b.broker.vhost("/")
    assert host is not None
    await wait_for(lambda: queue not in host.queues, "the lease ran out", 1.0)
    assert trio.current_time() - away_at >= 5.0
    assert not _links(b)


# --- the sending-log epoch (amqlite/server/peering/durability.py) ---------------------


async def test_an_epoch_is_on_disk_before_it_is_handed_out_and_grows_across_restarts(
    tmp_path: Path,
) -> None:
    from amqlite.server.peering.durability import EPOCH_FILE, EpochCounter

    on_disk = lambda: int((tmp_path / EPOCH_FILE).read_text())  # noqa: E731
    taken: list[int] = []
    for run in range(3):  # three runs of a node, each activating twice
        counter = EpochCounter()
        await counter.open(str(tmp_path))
        for _ in range(2):
            value = counter.take()
            assert value is not None and on_disk() >= value
            taken.append(value)
            await counter.reserve()  # the next activation's, written ahead
            assert on_disk() == value + 1
        if run == 1:
            await EpochCounter().open(str(tmp_path))  # a run that never activated
    assert taken == sorted(set(taken))  # never used twice, even after a restart


async def test_an_epoch_the_disk_refused_is_not_handed_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from amqlite.server.peering import durability

    counter = durability.EpochCounter()
    await counter.open(str(tmp_path))
    first = counter.take()
    assert first is not None

    def disk_full(path: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durability, "write_durably", disk_full)
    with pytest.raises(OSError):
        await counter.reserve()
    assert counter.take() is None
    monkeypatch.undo()
    await counter.reserve()
    assert counter.take() == first + 1


class _HaMember:
    """What PeeringService uses of a node: here an HA pair member, passive at first,
    with a data dir and no journal (no links configured: nothing dials)."""

    def __init__(self, directory: Path) -> None:
        from types import SimpleNamespace

        from amqlite.broker import Broker

        self.config = _config()
        self.node_id = "n"
        self.state = "passive"
        self.broker = Broker(node_id="n")
        self.storage = SimpleNamespace(directory=str(directory), journal=None, appended=0)
        self.ha = SimpleNamespace(machine=SimpleNamespace(epoch=3))

    def pump(self) -> None:
        pass


async def test_an_ha_promotion_starts_peering_at_once_and_waits_only_for_an_epoch_not_on_disk(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    nursery: trio.Nursery,
    jump_clock: trio.testing.MockClock,
) -> None:
    from amqlite.server.peering import PeeringService, durability

    node = _HaMember(tmp_path)
    service = PeeringService(node, ())  # type: ignore[arg-type]
    await nursery.start(service.run)
    epoch_file = tmp_path / durability.EPOCH_FILE

    def promote() -> None:
        node.state = "active"
        service.ha_state_changed()

    def demote() -> None:
        node.state = "passive"
        service.ha_state_changed()
        assert not service.active

    assert not service.active and epoch_file.read_text() == "1\n"  # reserved at start
    promote()  # at once: the client whose request promoted it publishes next
    assert service.active and service.epoch == (3 << 32) + 1
    await wait_for(lambda: epoch_file.read_text() == "2\n", "the next one written ahead")
    demote()

    def disk_full(path: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durability, "write_durably", disk_full)
    promote()  # 2 was on disk; writing 3 ahead fails
    assert service.active and service.epoch == (3 << 32) + 2
    demote()
    promote()  # 3 is not on disk: no peering until it is
    assert not service.active
    monkeypatch.undo()
    await wait_for(lambda: service.active, "active once 3 is on disk", 0.1)
    assert service.epoch == (3 << 32) + 3 and int(epoch_file.read_text()) >= 3


def _remote_filter(node: BrokerNode, selector: str | None) -> Callable[[], bool]:
    return lambda: bool(_links(node)) and _links(node)[0]["filter"] == selector


async def test_subscribe_mode_sends_only_what_a_local_selector_wants(pair: Any) -> None:
    """The subscriber's consumers' selectors are the remote's filter: what none of them
    selects does not cross; a consumer without a selector (or a bound queue without
    a consumer) lets everything cross again."""
    a, b = await pair("subscribe")
    async with amqlite.connect(_addr(a)) as ca, amqlite.connect(_addr(b)) as cb:
        eu = (await ca.declare_queue("", exclusive=True)).name
        us = (await ca.declare_queue("", exclusive=True)).name
        for q in (eu, us):
            await ca.bind(q, "x", "orders.#")
        await wait_for(_remote_filter(b, None), "bound queues without consumers: no filter")
        eu_c = await ca.consume(eu, no_ack=True, selector="region = 'eu'")
        us_c = await ca.consume(us, no_ack=True, selector="region = 'us' AND amount > 10")
        both = "(region = 'eu') OR (region = 'us' AND amount > 10)"
        await wait_for(_remote_filter(b, both), "b filters with a's two selectors")
        assert _links(a)[0]["filter"] == both
        sent = {"eu": 0, "us": 0}
        for i in range(60):
            region = ("eu", "us", "asia")[i % 3]
            amount = i % 20
            await cb.publish("x", "orders.new", b"%d" % i, headers={"region": region,
                                                                    "amount": amount})  # fmt: skip
            if region == "eu":
                sent["eu"] += 1
            elif region == "us" and amount > 10:
                sent["us"] += 1
        got_eu = await _take(eu_c, sent["eu"])
        got_us = await _take(us_c, sent["us"])
        assert len(got_eu) == 20 and len(got_us) == sent["us"] > 0
        crossed = sent["eu"] + sent["us"]
        await wait_for(lambda: _links(b)[0]["filtered"] == 60 - crossed, "b counted the rest")
        end = _links(b)[0]
        assert end["forwarded"] == crossed  # only what a selector wanted crossed
        assert _links(a)[0]["received"] == crossed
        # both queues bind orders.#: each keeps what the other one's consumer selected
        # (the filter is one per link), and nothing else crossed
        host = a.broker.vhost("/")
        assert host is not None
        assert (host.queues[eu].count(), host.queues[us].count()) == (sent["us"], sent["eu"])
        for q in (eu, us):
            await ca.purge_queue(q)
        # a consumer without a selector wants everything: everything crosses again
        plain = await ca.consume(eu, no_ack=True)
        await wait_for(_remote_filter(b, None), "no filter once a consumer selects everything")
        await cb.publish("x", "orders.new", b"asia", headers={"region": "asia"})
        assert await _take(plain, 1) == [b"asia"]
        await plain.cancel()
        await wait_for(_remote_filter(b, both), "the filter is back once it went")
