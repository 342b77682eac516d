"""AMQP clients and an HA pair of real broker processes (issue 14, item 4).

The passive node answers ``connection.open`` with ``connection.close`` 320
CONNECTION_FORCED: pika's list of parameters and kombu's failover URLs take it as
"try the next address" (kombu/py-amqp would stop at 530, which they count as
irrecoverable). A ``kill -9`` of the active node under a confirming pika publisher
loses no confirmed message.
"""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import kombu
import pika
import pika.channel
import pika.frame
import pytest
from pika.adapters.select_connection import IOLoop
from yarl import URL

from ..ports import fixed_port
from .conftest import WAIT, AmqpServer, start_amqp_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@dataclass
class AmqpPair:
    primary: AmqpServer
    backup: AmqpServer

    @property
    def nodes(self) -> tuple[AmqpServer, AmqpServer]:
        return self.primary, self.backup

    def kill(self, node: AmqpServer) -> None:
        node.proc.kill()
        node.proc.wait(WAIT)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[AmqpPair]:
    """A primary and a backup, each with its own AMQP port, primary active."""
    ports = {"primary": fixed_port(), "backup": fixed_port()}
    config = tmp_path / "pair.toml"
    config.write_text(
        "[cluster]\n"
        f'primary_peer = "127.0.0.1:{ports["primary"]}"\n'
        f'backup_peer = "127.0.0.1:{ports["backup"]}"\n'
        "heartbeat_ms = 100\nfailover_timeout_ms = 600\n"
    )
    started: list[AmqpServer] = []
    try:
        for side in ("primary", "backup"):
            flags = ("--config", str(config), f"--is_{side}", "1")
            started.append(start_amqp_server(tmp_path / side, *flags, port=ports[side]))
        amqp_pair = AmqpPair(*started)
        amqp_pair.primary.wait_for_log("ha_became_active", timeout=20)
        amqp_pair.backup.wait_for_log("ha_became_passive", timeout=20)
        # the active node replicates to the passive one: confirms wait for both
        amqp_pair.primary.wait_for_log("ha_replication_started", timeout=20)
        yield amqp_pair
    finally:
        for node in started:
            node.stop()
    for node in started:
        crashes = [r for r in node.records if "crashed" in str(r.get("event"))]
        assert not crashes, crashes


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _kombu_url(*nodes: AmqpServer) -> str:
    return ";".join(f"amqp://guest:guest@127.0.0.1:{n.amqp_port}//" for n in nodes)


# --- (a) pika: a list of ConnectionParameters -----------------------------------------


def test_the_passive_node_refuses_pika_with_320(pair: AmqpPair) -> None:
    since = len(pair.backup.records)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as caught:
        pair.backup.connect(connection_attempts=1)
    # pika reports any close during the handshake as a "probable access denial";
    # the code and text inside are ours
    assert "(320)" in str(caught.value)
    assert "CONNECTION_FORCED" in str(caught.value)
    assert "not the active node of its HA pair" in str(caught.value)
    pair.backup.wait_for_log("amqp_connection_refused_not_active", since=since)


def test_pika_given_both_nodes_passive_first_reaches_the_active_one(pair: AmqpPair) -> None:
    since = {n.amqp_port: len(n.records) for n in pair.nodes}
    q = _name("pika-pair")
    params = [pair.backup.parameters(), pair.primary.parameters()]
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.queue_declare(q, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"hello", pika.BasicProperties(delivery_mode=2))
        method, _, body = ch.basic_get(q, auto_ack=True)
        assert method is not None and body == b"hello"
        ch.queue_delete(q)
    pair.backup.wait_for_log(
        "amqp_connection_refused_not_active", since=since[pair.backup.amqp_port]
    )
    pair.primary.wait_for_log("amqp_connection_opened", since=since[pair.primary.amqp_port])
    assert not any(
        r.get("event") == "amqp_connection_opened"
        for r in pair.backup.records[since[pair.backup.amqp_port] :]
    )


# --- (b) kombu: failover URLs -----------------------------------------------------------


def test_kombu_failover_urls_passive_first_reach_the_active_one(pair: AmqpPair) -> None:
    q = _name("kombu-pair")
    with kombu.Connection(_kombu_url(pair.backup, pair.primary)) as conn:
        conn.ensure_connection(max_retries=3, interval_start=0, interval_step=0.1)
        assert f":{pair.primary.amqp_port}/" in conn.as_uri()
        queue = conn.SimpleQueue(q)
        queue.put({"n": 1})
        message = queue.get(block=True, timeout=WAIT)
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()
        conn.default_channel.queue_delete(q)
    # default_channel connects by itself, moving on the same way
    with kombu.Connection(_kombu_url(pair.backup, pair.primary)) as conn:
        conn.default_channel.queue_declare(q, auto_delete=True)
        assert f":{pair.primary.amqp_port}/" in conn.as_uri()


# --- (c) kill -9 of the active node under a confirming pika publisher -----------------


@dataclass
class ConfirmingPublisher:
    """An asynchronous pika publisher (SelectConnection) with publisher confirms.

    It keeps ``window`` publishes unconfirmed, reconnects through the list of nodes
    when its connection dies and publishes again every message not yet confirmed
    (a nack too). ``on_sent(n)`` runs after the n-th publish (counting from 1).
    """

    params: list[pika.ConnectionParameters]
    queue: str
    total: int
    on_sent: Callable[[int], None]
    window: int = 50
    deadline_s: float = 60.0
    pending: list[int] = field(default_factory=list)
    unconfirmed: dict[int, int] = field(default_factory=dict)  # delivery tag -> id
    confirmed: set[int] = field(default_factory=set)
    republished: set[int] = field(default_factory=set)
    nacked: set[int] = field(default_factory=set)
    connections: list[int] = field(default_factory=list)  # the port of each
    failed_attempts: int = 0
    sent: int = 0
    error: str | None = None

    def run(self) -> None:
        self.pending = list(range(self.total))
        self.ioloop = IOLoop()
        self.channel: pika.channel.Channel | None = None
        self.tag = 0
        self.ioloop.call_later(self.deadline_s, self._timeout)
        self._connect()
        self.ioloop.start()
        self.ioloop.close()

    def _timeout(self) -> None:
        self.error = f"not all confirmed within {self.deadline_s}s"
        self.ioloop.stop()

    def _connect(self) -> None:
        pika.SelectConnection.create_connection(
            self.params, self._on_connection, custom_ioloop=self.ioloop
        )

    def _on_connection(self, conn_or_exc: Any) -> None:
        if isinstance(conn_or_exc, BaseException):
            # every node refused or was unreachable: the passive one holds a client
            # for the failover timeout, so this is rare; try the list again
            self.failed_attempts += 1
            self.ioloop.call_later(0.05, self._connect)
            return
        self.conn: pika.SelectConnection = conn_or_exc
        conn = self.conn
        self.connections.append(conn.params.port)
        conn.add_on_close_callback(self._on_closed)
        conn.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel: pika.channel.Channel) -> None:
        channel.confirm_delivery(self._on_confirm, callback=lambda _: self._declare(channel))

    def _declare(self, channel: pika.channel.Channel) -> None:
        channel.queue_declare(self.queue, durable=True, callback=lambda _: self._ready(channel))

    def _ready(self, channel: pika.channel.Channel) -> None:
        self.channel, self.tag = channel, 0
        self._pump()

    def _pump(self) -> None:
        channel = self.channel
        while channel is not None and self.pending and len(self.unconfirmed) < self.window:
            n = self.pending.pop(0)
            self.tag += 1
            self.unconfirmed[self.tag] = n
            channel.basic_publish(
                "",
                self.queue,
                str(n).encode(),
                pika.BasicProperties(delivery_mode=2, message_id=str(n)),
            )
            self.sent += 1
            self.on_sent(self.sent)
            channel = self.channel  # on_sent may have killed the node

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        method = frame.method
        tags = (
            [t for t in self.unconfirmed if t <= method.delivery_tag]
            if method.multiple
            else [method.delivery_tag]
        )
        ack = isinstance(method, pika.spec.Basic.Ack)
        for tag in tags:
            n = self.unconfirmed.pop(tag)
            if ack:
                self.confirmed.add(n)
            else:
                self.nacked.add(n)
                self.republished.add(n)
                self.pending.insert(0, n)
        if len(self.confirmed) == self.total:
            self.channel = None
            self.conn.close()  # then _on_closed stops the loop
            return
        self._pump()

    def _on_closed(self, _conn: pika.SelectConnection, reason: Exception) -> None:
        self.channel = None
        if len(self.confirmed) == self.total:
            self.ioloop.stop()
            return
        # whatever was not confirmed may or may not be on the new active node:
        # publish it again, first
        again = list(self.unconfirmed.values())
        self.unconfirmed.clear()
        self.republished.update(again)
        self.pending[:0] = again
        self._connect()


def test_kill_9_of_the_active_node_loses_no_confirmed_pika_publish(pair: AmqpPair) -> None:
    total, kill_at = 1500, random.randrange(200, 800)
    q = _name("orders")
    killer = threading.Thread(target=pair.kill, args=(pair.primary,))

    def on_sent(n: int) -> None:
        if n == kill_at:
            # from another thread, so the node dies while publishes and confirms
            # are on the wire, not between two of the publisher's steps
            killer.start()

    publisher = ConfirmingPublisher(
        [pair.primary.parameters(), pair.backup.parameters()], q, total, on_sent
    )
    publisher.run()
    assert publisher.error is None, publisher.error
    killer.join(WAIT)
    assert pair.primary.proc.returncode is not None, "the active node was never killed"
    assert publisher.confirmed == set(range(total))
    # it started on the primary and moved to the old backup
    assert publisher.connections[0] == pair.primary.amqp_port
    assert publisher.connections[1:] == [pair.backup.amqp_port]
    assert publisher.republished, "the kill left nothing unconfirmed: not mid-stream"
    pair.backup.wait_for_log("ha_became_active")

    consumed: Counter[int] = Counter()
    with pika.BlockingConnection([pair.primary.parameters(), pair.backup.parameters()]) as conn:
        ch = conn.channel()
        while True:
            method, props, body = ch.basic_get(q, auto_ack=False)
            if method is None:
                break
            n = int(body)
            assert props.message_id == str(n)
            assert props.delivery_mode == 2
            consumed[n] += 1
            ch.basic_ack(method.delivery_tag)
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        ch.queue_delete(q)
    lost = publisher.confirmed - set(consumed)
    assert not lost, f"{len(lost)} confirmed messages lost: {sorted(lost)[:20]}"
    dupes = {n for n, c in consumed.items() if c > 1}
    # a message is there twice only if its first publish was not confirmed (the
    # confirm died with the node) and the publisher sent it again
    assert dupes <= publisher.republished, sorted(dupes - publisher.republished)
    assert all(c <= 2 for c in consumed.values())
    print(
        f"\nkill at publish {kill_at}: {len(publisher.republished)} unconfirmed "
        f"republished, {len(dupes)} of them stored twice, {len(publisher.nacked)} "
        f"nacked, {publisher.failed_attempts} failed connection attempts"
    )


# --- (d) aio-pika: connect_robust takes one URL ---------------------------------------


def failover_connection_class(*urls: str) -> type[aio_pika.RobustConnection]:
    """A RobustConnection that tries ``urls`` in turn, one per connection attempt.

    aio-pika reconnects to the one URL it was given, and aiormq connects to the
    first address that accepts TCP, which a passive node does. This subclass sets
    the URL before each attempt: RobustConnection begins every attempt by resetting
    ``transport`` to None (aio-pika 10.2), so the setter picks the next URL there.
    """

    class FailoverRobustConnection(aio_pika.RobustConnection):
        _urls = tuple(URL(u) for u in urls)
        _attempts = -1  # counting from the first attempt, after __init__

        @property  # type: ignore[override]
        def transport(self) -> Any:
            return self.__dict__.get("_transport")

        @transport.setter
        def transport(self, value: Any) -> None:
            if value is None and self._attempts >= 0:
                self.url = self._urls[self._attempts % len(self._urls)]
                self._attempts += 1
            self.__dict__["_transport"] = value

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._attempts = 0

    return FailoverRobustConnection


def test_aio_pika_robust_connection_follows_the_pair_through_a_kill_9(pair: AmqpPair) -> None:
    urls = [f"amqp://guest:guest@127.0.0.1:{n.amqp_port}/" for n in (pair.backup, pair.primary)]
    q = _name("aio-pair")

    async def main() -> tuple[list[int], int]:
        connection = await asyncio.wait_for(
            aio_pika.connect_robust(
                urls[0],
                connection_class=failover_connection_class(*urls),
                fail_fast=False,  # else the passive node's refusal ends connect_robust
                reconnect_interval=0.1,
            ),
            WAIT,
        )
        assert connection.url.port == pair.primary.amqp_port
        # the first attempt went to the passive node, which refused it
        pair.backup.wait_for_log("amqp_connection_refused_not_active")
        reconnected = asyncio.Event()
        connection.reconnect_callbacks.add(lambda *_: reconnected.set())
        async with connection:
            channel = await connection.channel()  # publisher confirms by default
            queue = await channel.declare_queue(q, durable=True)

            async def publish(numbers: range) -> None:
                for n in numbers:
                    await channel.default_exchange.publish(
                        aio_pika.Message(
                            str(n).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                        ),
                        routing_key=q,
                    )

            await asyncio.wait_for(publish(range(20)), WAIT)
            await asyncio.to_thread(pair.kill, pair.primary)
            await asyncio.wait_for(reconnected.wait(), WAIT)
            # the robust channel is back, its queue declared again on the new master
            await asyncio.wait_for(publish(range(20, 40)), WAIT)
            got: list[int] = []
            async with queue.iterator() as messages:
                async for message in messages:
                    got.append(int(message.body))
                    await message.ack()
                    if len(got) == 40:
                        break
            await queue.delete()
            return got, connection.url.port or 0

    got, port = asyncio.run(asyncio.wait_for(main(), 4 * WAIT))
    assert sorted(got) == list(range(40))
    assert port == pair.backup.amqp_port


# --- Celery: broker_url lists both nodes -------------------------------------------


def test_a_celery_worker_given_both_nodes_runs_tasks_and_follows_a_kill_9(
    pair: AmqpPair, tmp_path: Path
) -> None:
    from .test_celery import celery_worker

    since = len(pair.backup.records)
    (tmp_path / "w").mkdir()
    with celery_worker(_kombu_url(pair.backup, pair.primary), tmp_path / "w") as (tasks, worker):
        pair.backup.wait_for_log("amqp_connection_refused_not_active", since=since)
        assert tasks.add.delay(1, 2).get(timeout=WAIT) == 3
        pair.kill(pair.primary)
        # the worker and this client reconnect through the list to the new master
        assert tasks.add.delay(3, 4).get(timeout=3 * WAIT) == 7
    assert "Connection to broker lost" in "".join(worker.lines)
