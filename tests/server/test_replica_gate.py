"""While an HA node replicates, a journaled message is pushed to a consumer (or sent
to a peering remote) only once the passive peer holds it: otherwise a consumer could
see a message that the node taking over does not hold, and see it again unflagged
after a failover. A publish
sent again is confirmed only once its first copy is stored."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pika
import trio
import trio.testing

import amqlite
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode
from amqlite.server.storage import NodeStorage
from tests.http.wsclient import WsClient
from tests.waiting import wait_until

from .rawclient import RawClient
from .test_peering import _link, _link_up, _links, _queue_keys
from .test_storage import addr, config, running


def _first_queue(node: BrokerNode, field: str) -> int:
    """A counter of the node's only queue, from its status."""
    return int(node.broker.status()["vhosts"][0]["queues"][0][field])


def _fake_peer(storage: NodeStorage) -> None:
    """Stand in for the HA sender: every record goes to the peer as its own sync
    (``ReplicaProgress.sent``), which holds nothing until ``replica_progress``."""

    def tee(position: int, frame: bytes, journal_id: int) -> bool:
        storage.replica.sent(position, journal_id)
        return False  # no sender to wake

    storage.tee = tee


async def test_a_push_waits_for_the_passive_peer(tmp_path: Path) -> None:
    async with running(tmp_path) as node:
        storage = node.storage
        assert storage is not None and storage.journal is not None
        async with amqlite.connect(addr(node)) as pub, amqlite.connect(addr(node)) as sub:
            await pub.declare_queue("q", durable=True)
            consumer = await sub.consume("q")
            _fake_peer(storage)  # a peer that has not acked yet
            storage.replica_required(True)
            await pub.publish("", "q", "transient")  # not journaled: not held
            await pub.publish("", "q", "held", persistent=True)
            await pub.publish("", "q", "behind", persistent=False)  # keeps its place
            await wait_until(lambda: _first_queue(node, "unacked") >= 3)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert consumer.buffered == 1  # only "transient"
            storage.replica_progress(storage.journal.appended)  # the peer holds it now
            got = []
            with trio.fail_after(10):
                async for d in consumer:
                    got.append(d.body)
                    await d.ack()
                    if len(got) == 3:
                        break
            assert got == [b"transient", b"held", b"behind"]
            await pub.publish("", "q", "later", persistent=True)  # with no peer: at once
            storage.replica_required(False)
            with trio.fail_after(10):
                d = await consumer.__anext__()
            assert d.body == b"later"


async def test_replication_stopping_releases_held_pushes(tmp_path: Path) -> None:
    async with running(tmp_path) as node:
        storage = node.storage
        assert storage is not None
        async with amqlite.connect(addr(node)) as conn:
            await conn.declare_queue("q", durable=True)
            consumer = await conn.consume("q")
            _fake_peer(storage)
            storage.replica_required(True)
            await conn.publish("", "q", "m", persistent=True)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert consumer.buffered == 0
            storage.tee = None
            storage.replica_required(False)  # the peer went silent: serve without it
            with trio.fail_after(10):
                d = await consumer.__anext__()
            assert d.body == b"m"


async def test_a_publish_sent_again_is_confirmed_after_its_first_copy_is_stored(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as node:
        storage = node.storage
        assert storage is not None and storage.journal is not None
        first = await RawClient.connect(node.port)
        await first.send(ev.Hello(first.next_id(), instance="c1"))
        assert isinstance(await first.receive(), ev.Welcome)
        await first.request(ev.QueueDeclare, queue="q", durable=True)
        _fake_peer(storage)  # the first copy is not replicated yet
        storage.replica_required(True)
        props = {"persistent": True}
        await first.send(ev.Publish(9, "", "q", b"m", props=props, confirm=True))
        await first.aclose()
        again = await RawClient.connect(node.port)
        await again.send(ev.Hello(again.next_id(), instance="c1"))
        assert isinstance(await again.receive(), ev.Welcome)
        await again.send(ev.Publish(9, "", "q", b"m", props=props, confirm=True))
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        host = node.broker.vhost("/")
        assert host is not None and host.publish_keys.duplicates == 1
        with trio.move_on_after(0.2) as no_reply:  # everything is idle: no ok may come
            await again.receive()
        assert no_reply.cancelled_caught, "the ok came before the first copy was stored"
        storage.replica_progress(storage.journal.appended)
        with trio.fail_after(10):
            ok = await again.receive()
        assert isinstance(ok, ev.Ok) and ok.re == 9
        await again.aclose()


async def test_a_stream_reader_waits_for_the_passive_peer(tmp_path: Path) -> None:
    """A reader must not read an offset the node taking over would give to another
    message (it would skip that message after a failover)."""
    async with running(tmp_path) as node:
        storage = node.storage
        assert storage is not None and storage.journal is not None
        async with amqlite.connect(addr(node)) as pub, amqlite.connect(addr(node)) as sub:
            await pub.declare_queue("s", durable=True, arguments={"x-queue-type": "stream"})
            await pub.publish("", "s", "old", confirm=True)
            reader = await sub.consume("s", offset="first", prefetch=10)
            with trio.fail_after(10):
                first = await reader.__anext__()
            assert (first.body, first.offset) == (b"old", 0)
            await first.ack()
            _fake_peer(storage)  # a peer that has not acked yet
            storage.replica_required(True)
            await pub.publish("", "s", "new")  # appended at offset 1, not replicated
            await wait_until(
                lambda: node.broker.status()["vhosts"][0]["queues"][0]["messages"] >= 2
            )
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert reader.buffered == 0
            storage.replica_progress(storage.journal.appended)
            with trio.fail_after(10):
                second = await reader.__anext__()
            assert (second.body, second.offset) == (b"new", 1)


async def test_a_stream_fetch_reads_only_what_the_passive_peer_holds(tmp_path: Path) -> None:
    """``stream.fetch`` too: an offset the passive node lacks is not read yet."""
    async with running(tmp_path) as node:
        storage = node.storage
        assert storage is not None and storage.journal is not None
        async with amqlite.connect(addr(node)) as conn:
            await conn.declare_queue("s", durable=True, arguments={"x-queue-type": "stream"})
            await conn.publish("", "s", "old", confirm=True)
            _fake_peer(storage)  # a peer that has not acked yet
            storage.replica_required(True)
            await conn.publish("", "s", "new")  # appended at offset 1, not replicated
            await wait_until(
                lambda: node.broker.status()["vhosts"][0]["queues"][0]["messages"] >= 2
            )
            batch = await conn.fetch_stream("s", 0)
            assert (batch.body_list(), batch.kept_next) == ([b"old"], 2)
            assert (await conn.fetch_stream("s", 1)).count == 0  # not yet
            storage.replica_progress(storage.journal.appended)
            batch = await conn.fetch_stream("s", 0)
            assert batch.body_list() == [b"old", b"new"]


async def test_a_push_goes_once_the_peer_applied_it_a_confirm_once_it_committed(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as node:
        storage = node.storage
        assert storage is not None and storage.journal is not None
        async with amqlite.connect(addr(node)) as pub, amqlite.connect(addr(node)) as sub:
            await pub.declare_queue("q", durable=True)
            consumer = await sub.consume("q")
            _fake_peer(storage)
            storage.replica_required(True)
            pending = await pub.publish_nowait("", "q", "m", persistent=True)
            # handed to the consumer's session, push held
            await wait_until(lambda: _first_queue(node, "unacked") >= 1)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert consumer.buffered == 0 and not pending.done
            storage.replica_applied(storage.journal.appended)  # ha.synced {applied}
            with trio.fail_after(10):
                d = await consumer.__anext__()
            assert d.body == b"m"
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert not pending.done  # the confirm waits for the peer's commit
            storage.replica_progress(storage.journal.appended)
            with trio.fail_after(10):
                await pending.wait()


async def test_a_groups_first_delivery_waits_until_the_passive_peer_knows_its_owner(
    tmp_path: Path,
) -> None:
    """Even a transient message (not journaled itself) that gives its group to a
    consumer waits for the group.owner record to reach the passive peer: the node
    taking over must know which consumer may be working on the group."""
    async with running(tmp_path) as node:
        storage = node.storage
        assert storage is not None and storage.journal is not None
        async with amqlite.connect(addr(node)) as pub, amqlite.connect(addr(node)) as sub:
            await pub.declare_queue("q", durable=True)
            consumer = await sub.consume("q")
            _fake_peer(storage)  # a peer that has not acked yet
            storage.replica_required(True)
            await pub.publish("", "q", "plain")  # no group: not held
            await pub.publish("", "q", "first", properties={"group_id": "g"})
            await wait_until(lambda: _first_queue(node, "unacked") >= 2)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert consumer.buffered == 1  # only "plain"
            storage.replica_applied(storage.journal.appended)  # the peer holds the record
            with trio.fail_after(10):
                got = [(await consumer.__anext__()).body for _ in range(2)]
            assert got == [b"plain", b"first"]


# --- peering: nothing leaves for a remote before the passive peer holds it ----------


async def _peered(
    tmp_path: Path, nursery: trio.Nursery, dialer_mode: str, dialer_stored: bool
) -> tuple[BrokerNode, BrokerNode]:
    """(a, b): b holds the topic exchange ``x``; a dials it in ``dialer_mode``. b
    has a data dir; a has one too when ``dialer_stored``."""
    b = BrokerNode(config(tmp_path / "b"))
    await nursery.start(b.run)
    async with amqlite.connect(addr(b)) as conn:
        await conn.declare_exchange("x", "topic", durable=True)
    overrides = {} if dialer_stored else {"storage.persist": False}
    a_config = dataclasses.replace(
        config(tmp_path / "a", **overrides), cluster_mta=(_link(b.port, dialer_mode),)
    )
    a = BrokerNode(a_config)
    await nursery.start(a.run)
    await wait_until(lambda: _link_up(a) and _link_up(b), "the link came up")
    return a, b


def _queue_status(node: BrokerNode, name: str) -> dict[str, Any]:
    for queue in node.broker.status()["vhosts"][0]["queues"]:
        if queue["name"] == name:
            return dict(queue)
    raise AssertionError(f"no queue {name!r} on {node.node_id}")


async def test_a_subscriber_gets_a_message_only_once_the_passive_peer_holds_it(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """b is the active node of an HA pair that a subscribes to: a message published
    on b reaches a only once b's passive peer holds it. Else a kill -9 of b could
    leave a holding a message the node taking over lacks, and the publisher's copy
    sent again would reach a a second time under a new peering identity."""
    a, b = await _peered(tmp_path, nursery, "subscribe", dialer_stored=False)
    queue = f"amq.peering.x.{a.node_id}/x"
    async with amqlite.connect(addr(a)) as sub, amqlite.connect(addr(b)) as pub:
        local = (await sub.declare_queue("", exclusive=True)).name
        await sub.bind(local, "x", "k.*")
        consumer = await sub.consume(local)
        await wait_until(lambda: _queue_keys(b, queue) == ["k.*"], "a's binding is on b")
        storage = b.storage
        assert storage is not None and storage.journal is not None
        _fake_peer(storage)  # a passive peer that has not acked yet
        storage.replica_required(True)
        await pub.publish("x", "k.a", "held", persistent=True)
        await wait_until(lambda: _queue_status(b, queue)["unacked"] >= 1, "b's queue took it")
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert consumer.buffered == 0
        assert _links(a)[0]["received"] == 0
        storage.replica_applied(storage.journal.appended)  # the peer holds it now
        with trio.fail_after(10):
            d = await consumer.__anext__()
        assert d.body == b"held"
    a.stop()
    b.stop()


async def test_a_publish_link_sends_a_message_only_once_the_passive_peer_holds_it(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """a is the active node of an HA pair publishing to b: what a's link takes
    (journaled as ``peering.out``) leaves for b only once a's passive peer holds it;
    a passive peer that stops being replicated to releases it."""
    a, b = await _peered(tmp_path, nursery, "publish", dialer_stored=True)
    async with amqlite.connect(addr(a)) as pub, amqlite.connect(addr(b)) as sub:
        remote = (await sub.declare_queue("", exclusive=True)).name
        await sub.bind(remote, "x", "k.*")
        consumer = await sub.consume(remote)
        await wait_until(lambda: _links(a)[0]["interest_size"] == 1, "a heard b's binding")
        storage = a.storage
        assert storage is not None and storage.journal is not None
        _fake_peer(storage)
        storage.replica_required(True)
        await pub.publish("x", "k.a", "held", persistent=True)
        await wait_until(lambda: _links(a)[0]["lag_messages"] >= 1, "a's link took it")
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert consumer.buffered == 0
        assert _links(b)[0]["received"] == 0
        storage.tee = None
        storage.replica_required(False)  # the peer went silent: serve without it
        with trio.fail_after(10):
            d = await consumer.__anext__()
        assert d.body == b"held"
    a.stop()
    b.stop()


# --- a get's reply waits for the passive peer too ------------------------------------


@asynccontextmanager
async def _held_back_message(
    tmp_path: Path, **overrides: Any
) -> AsyncIterator[tuple[BrokerNode, NodeStorage]]:
    """A node (``overrides`` to its config) whose queue ``q`` holds one persistent
    message its passive peer (a fake one, which acks nothing until told) does not
    hold yet."""
    async with running(tmp_path, **overrides) as node:
        storage = node.storage
        assert storage is not None and storage.journal is not None
        async with amqlite.connect(addr(node)) as conn:
            await conn.declare_queue("q", durable=True)
            _fake_peer(storage)
            storage.replica_required(True)
            await conn.publish("", "q", "m", persistent=True)
            await wait_until(lambda: _first_queue(node, "messages") >= 1, "q holds it")
        yield node, storage


async def _check_get_waits(node: BrokerNode, storage: NodeStorage, get: Any) -> None:
    """``get()`` (a get of ``q`` by some protocol) returns the message's body only
    once the passive peer holds it: not while everything idles before."""
    got: list[bytes] = []
    replied = trio.Event()

    async def run_get() -> None:
        got.append(await get())
        replied.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_get)
        await wait_until(
            lambda: _first_queue(node, "unacked") >= 1 or replied.is_set(), "the get took it"
        )
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        with trio.move_on_after(0.2):  # everything is idle: no reply may come
            await replied.wait()
        assert got == [], "the get's reply came before the passive peer held its message"
        assert storage.journal is not None
        storage.replica_applied(storage.journal.appended)  # the peer holds it now
    assert got == [b"m"]


async def test_a_get_returns_a_message_only_once_the_passive_peer_holds_it(
    tmp_path: Path,
) -> None:
    """A get is a consumer too: a message the node taking over lacks, got before a
    kill -9, would be got again, unflagged, when its publisher sends it again."""
    async with (
        _held_back_message(tmp_path) as (node, storage),
        amqlite.connect(addr(node)) as conn,
    ):

        async def get() -> bytes:
            message = await conn.get("q")
            assert message is not None
            return message.body

        await _check_get_waits(node, storage, get)


async def test_an_amqp_basic_get_waits_for_the_passive_peer(tmp_path: Path) -> None:
    async with _held_back_message(tmp_path, **{"amqp.port": 0}) as (node, storage):
        port = node.amqp_port
        assert port is not None

        def basic_get() -> bytes:
            params = pika.ConnectionParameters("127.0.0.1", port)
            connection = pika.BlockingConnection(params)
            try:
                _, _, body = connection.channel().basic_get("q", auto_ack=False)
                assert body is not None
                return bytes(body)
            finally:
                connection.close()

        async def get() -> bytes:
            return await trio.to_thread.run_sync(basic_get)

        await _check_get_waits(node, storage, get)


async def test_an_http_get_of_messages_waits_for_the_passive_peer(tmp_path: Path) -> None:
    async with _held_back_message(tmp_path, **{"http.port": 0}) as (node, storage):
        url = f"http://{node.http_listen}"
        async with httpx.AsyncClient(base_url=url, auth=("guest", "guest"), timeout=10) as http:

            async def get() -> bytes:
                body = {"count": 1, "ackmode": "ack_requeue_false"}
                reply = await http.post("/api/queues/%2F/q/get", json=body)
                assert reply.status_code == 200, reply.text
                return str(reply.json()[0]["payload"]).encode()

            await _check_get_waits(node, storage, get)


async def test_a_browser_get_waits_for_the_passive_peer(tmp_path: Path) -> None:
    async with _held_back_message(tmp_path, **{"http.port": 0}) as (node, storage):
        http = node.http_listen
        assert http is not None
        ws = await WsClient.connect(int(http.rpartition(":")[2]))
        try:
            assert (await ws.hello())["m"] == "welcome"

            async def get() -> bytes:
                await ws.send({"m": "get", "id": 2, "queue": "q"})
                frame = await ws.recv_until("get-ok")
                assert frame is not None, "the channel closed"
                return str(frame["body"]).encode()

            await _check_get_waits(node, storage, get)
        finally:
            await ws.aclose()
