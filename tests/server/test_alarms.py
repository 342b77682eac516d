"""Memory and disk alarms in the server: an injected measurement raises an alarm,
publishing connections are told ``blocked`` and no longer read, consumers on other
connections keep draining, and everything is read and delivered once it clears."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

import amqlite
from amqlite.broker.alarms import Resource
from amqlite.config import load_config
from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode
from amqlite.server.alarms import (
    MEMORY_INTERVAL,
    NEAR_FRACTION,
    NEAR_MEMORY_BYTES,
    NEAR_MEMORY_INTERVAL,
    AlarmService,
)
from amqlite.server.connection import NativeConnection

WATERMARK = 1_000_000  # bytes; the injected measurement is compared with it
LOW, HIGH = 100, 2 * WATERMARK


class Probe:
    """An injected measurement (no gigabytes are allocated)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self, *_: Any) -> int:
        return self.value


class RawClient:
    """One in-memory native connection to ``node``, driven frame by frame."""

    def __init__(self, node: BrokerNode, nursery: trio.Nursery, name: str) -> None:
        self.stream, server_side = trio.testing.memory_stream_pair()
        self.conn = NativeConnection(node, server_side, name, "127.0.0.1")  # type: ignore[arg-type]
        node.connections.add(self.conn)
        nursery.start_soon(self.conn.run)
        self.proto = Connection(Role.CLIENT)
        self.next_id = 1

    async def send(self, event: ev.Event) -> None:
        await self.stream.send_all(self.proto.send(event))

    def rid(self) -> int:
        self.next_id += 1
        return self.next_id

    async def next(self) -> ev.Event:
        while True:
            event = self.proto.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, ev.Event)
                return event
            self.proto.receive_data(await self.stream.receive_some(1 << 20))

    async def open(self) -> None:
        await self.send(ev.Hello(1))
        assert isinstance(await self.next(), ev.Welcome)

    async def call(self, event: ev.Event) -> ev.Event:
        await self.send(event)
        reply = await self.next()
        assert getattr(reply, "re", None) == getattr(event, "id", None), reply
        return reply


def _node(memory: Probe, disk: Probe | None = None, **overrides: Any) -> BrokerNode:
    config = load_config(
        overrides={
            "server.port": 0,
            "storage.persist": False,
            "limits.memory_high_watermark": WATERMARK,
            "limits.disk_free_limit": WATERMARK,
            **overrides,
        }
    )
    return BrokerNode(config, memory_probe=memory, disk_probe=disk)


def _ready(node: BrokerNode, queue: str) -> int:
    (vhost,) = node.broker.status()["vhosts"]
    return int(next(q["messages"] for q in vhost["queues"] if q["name"] == queue))


async def test_a_blocked_publisher_is_not_read_while_a_consumer_drains(
    nursery: trio.Nursery,
) -> None:
    memory = Probe(LOW)
    node = _node(memory)
    publisher = RawClient(node, nursery, "publisher")
    consumer = RawClient(node, nursery, "consumer")
    with trio.fail_after(10):
        await publisher.open()
        await consumer.open()
        await publisher.call(ev.QueueDeclare(publisher.rid(), "q"))
        await publisher.send(ev.Publish(publisher.rid(), "", "q", b"m0"))
        await publisher.call(ev.Status(publisher.rid()))  # m0 was read
        assert _ready(node, "q") == 1

        memory.value = HIGH
        node.alarms.sample_memory()
        assert await publisher.next() == ev.Blocked("low on memory")
        assert publisher.conn.gate.blocked_by is Resource.MEMORY
        assert publisher.conn.link.clock.paused  # its silence is ours: not held against it
        assert node.status()["alarms"] == ["memory"]
        lines = {c["remote"]: c.get("blocked") for c in node.status()["connections"]}
        assert lines == {"publisher": "low on memory", "consumer": None}

        for i in range(1, 21):  # sent, but the server does not read them now
            await publisher.send(ev.Publish(publisher.rid(), "", "q", f"m{i}".encode()))
        await trio.testing.wait_all_tasks_blocked()
        assert _ready(node, "q") == 1

        # the consumer never published: it is read, gets m0, acks it
        assert consumer.conn.gate.blocked_by is None
        await consumer.call(ev.Consume(consumer.rid(), "q", tag="c", prefetch=0))
        first = await consumer.next()
        assert isinstance(first, ev.Deliver) and first.body == b"m0"
        await consumer.send(ev.Ack(consumer.rid(), first.dtag))
        await consumer.call(ev.Status(consumer.rid()))  # its next frame: no blocked

        memory.value = WATERMARK - 1  # inside the band: still raised
        node.alarms.sample_memory()
        await trio.testing.wait_all_tasks_blocked()
        assert publisher.conn.gate.blocked_by is Resource.MEMORY
        assert _ready(node, "q") == 0

        memory.value = LOW
        node.alarms.sample_memory()
        assert await publisher.next() == ev.Unblocked()
        assert not publisher.conn.link.clock.paused
        assert node.status()["alarms"] == []
        bodies = []
        while len(bodies) < 20:
            event = await consumer.next()
            assert isinstance(event, ev.Deliver), event
            bodies.append(event.body)
        assert bodies == [f"m{i}".encode() for i in range(1, 21)]  # every one, in order


async def test_a_publish_during_the_alarm_is_accepted_then_its_connection_blocked(
    nursery: trio.Nursery,
) -> None:
    memory = Probe(HIGH)
    node = _node(memory)
    node.alarms.sample_memory()  # raised before anyone connects
    late = RawClient(node, nursery, "late")
    with trio.fail_after(10):
        await late.open()
        await late.call(ev.QueueDeclare(late.rid(), "q"))  # not a publisher yet: read
        assert late.conn.gate.blocked_by is None
        await late.send(ev.Publish(late.rid(), "", "q", b"first", confirm=True))
        assert isinstance(await late.next(), ev.Ok)  # accepted
        assert await late.next() == ev.Blocked("low on memory")
        assert _ready(node, "q") == 1


async def test_the_disk_alarm_blocks_persistent_publishers_only(nursery: trio.Nursery) -> None:
    disk = Probe(HIGH)
    node = _node(Probe(LOW), disk)
    node.alarms.directory = "."
    transient = RawClient(node, nursery, "transient")
    persistent = RawClient(node, nursery, "persistent")
    with trio.fail_after(10):
        for client in (transient, persistent):
            await client.open()
            await client.call(ev.QueueDeclare(client.rid(), "q"))
        await transient.call(ev.Publish(transient.rid(), "", "q", b"t", confirm=True))
        props = {"persistent": True}
        await persistent.call(ev.Publish(persistent.rid(), "", "q", b"p", {}, props, confirm=True))

        disk.value = WATERMARK - 1  # less free space than the limit
        await node.alarms.sample_disk()
        assert await persistent.next() == ev.Blocked("low on disk")
        assert node.status()["alarms"] == ["disk"]
        # a transient publisher goes on: its next frame is the confirm, not blocked
        await transient.call(ev.Publish(transient.rid(), "", "q", b"t2", confirm=True))
        assert transient.conn.gate.blocked_by is None

        disk.value = HIGH
        await node.alarms.sample_disk()
        assert await persistent.next() == ev.Unblocked()


async def test_the_native_client_is_blocked_and_unblocked_end_to_end(
    nursery: trio.Nursery,
) -> None:
    """Over TCP with the sampler on its timer: the publisher waits while blocked, a
    consumer on its own connection drains, every message arrives."""
    memory = Probe(LOW)
    node = _node(memory)
    port = await nursery.start(node.run)
    blocked, unblocked = trio.Event(), trio.Event()
    with trio.fail_after(20):
        async with (
            amqlite.connect(f"127.0.0.1:{port}") as pub,
            amqlite.connect(f"127.0.0.1:{port}") as sub,
        ):
            pub.on_blocked = lambda reason: blocked.set()
            pub.on_unblocked = unblocked.set
            await pub.declare_queue("q")
            for i in range(100):
                await pub.publish("", "q", f"{i}", confirm=True)
            memory.value = HIGH
            await blocked.wait()
            assert pub.blocked and pub.blocked_reason == "low on memory"
            assert not sub.blocked

            sent = trio.Event()

            async def more() -> None:
                for i in range(100, 200):
                    await pub.publish("", "q", f"{i}")
                sent.set()

            nursery.start_soon(more)
            got: list[int] = []
            consumer = await sub.consume("q", prefetch=50)
            async for delivery in consumer:
                got.append(int(delivery.body))
                await delivery.ack()
                if len(got) == 100:
                    break
            assert not sent.is_set()  # the publisher still waits
            memory.value = LOW
            await unblocked.wait()
            await sent.wait()
            async for delivery in consumer:
                got.append(int(delivery.body))
                await delivery.ack()
                if len(got) == 200:
                    break
            assert got == list(range(200))


async def test_the_sampler_raises_and_clears_on_its_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    memory = Probe(LOW)
    seen: list[frozenset[Resource]] = []
    limits = load_config(overrides={"limits.memory_high_watermark": 0.5}).limits
    service = AlarmService(limits, seen.append, memory=memory, memory_total=2 * WATERMARK)
    assert service.memory_limit == WATERMARK  # half of the memory given
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run, None)
        await trio.sleep(10 * MEMORY_INTERVAL)
        assert seen == []
        memory.value = HIGH
        await trio.sleep(1.5 * MEMORY_INTERVAL)
        assert seen == [frozenset({Resource.MEMORY})]
        memory.value = WATERMARK - 1
        await trio.sleep(10 * MEMORY_INTERVAL)
        assert len(seen) == 1  # inside the band: no flapping
        memory.value = LOW
        await trio.sleep(1.5 * MEMORY_INTERVAL)
        assert seen == [frozenset({Resource.MEMORY}), frozenset()]
        assert service.status()["alarms"] == []
        nursery.cancel_scope.cancel()


async def test_memory_is_sampled_faster_near_the_watermark(
    autojump_clock: trio.testing.MockClock,
) -> None:
    samples: list[float] = []
    value = LOW

    def probe() -> int:
        samples.append(trio.current_time())
        return value

    limits = load_config(overrides={"limits.memory_high_watermark": WATERMARK}).limits
    service = AlarmService(limits, lambda raised: None, memory=probe)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run, None)
        await trio.sleep(1.0)
        far = len(samples)
        assert far <= 1 + 1.0 / MEMORY_INTERVAL + 1
        value = int(NEAR_FRACTION * WATERMARK)  # half way: watch closely
        await trio.sleep(1.0)
        assert len(samples) - far >= 1.0 / NEAR_MEMORY_INTERVAL - 5
        nursery.cancel_scope.cancel()


def test_near_the_watermark_memory_is_also_sampled_by_bytes_read() -> None:
    samples = 0
    value = LOW

    def probe() -> int:
        nonlocal samples
        samples += 1
        return value

    limits = load_config(overrides={"limits.memory_high_watermark": WATERMARK}).limits
    service = AlarmService(limits, lambda raised: None, memory=probe)
    service.sample_memory()
    service.received(10 * NEAR_MEMORY_BYTES)  # far from the mark: the timer's job
    assert samples == 1
    value = int(NEAR_FRACTION * WATERMARK)
    service.sample_memory()
    assert samples == 2
    service.received(NEAR_MEMORY_BYTES - 1)
    assert samples == 2
    service.received(1)  # a flood between two timer samples is measured
    assert samples == 3
    service.received(NEAR_MEMORY_BYTES - 1)
    assert samples == 3  # the count starts again at each sample
    value = LOW
    service.received(1)
    assert samples == 4
    service.received(10 * NEAR_MEMORY_BYTES)  # back under the near mark
    assert samples == 4


async def test_a_blocked_connection_is_not_dropped_for_its_silence(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """We stopped reading it: its heartbeats sit unread, which must not count as
    silence; once unblocked, silence counts again."""
    memory = Probe(LOW)
    node = _node(memory)
    client = RawClient(node, nursery, "publisher")
    await client.send(ev.Hello(1, heartbeat=1.0))
    welcome = await client.next()
    assert isinstance(welcome, ev.Welcome) and welcome.heartbeat == 1.0
    await client.send(ev.Publish(client.rid(), "", "nowhere", b"x"))
    await client.send(ev.Heartbeat())
    memory.value = HIGH
    node.alarms.sample_memory()
    events: list[ev.Event] = []
    while not events or not isinstance(events[-1], ev.Blocked):
        events.append(await client.next())
    await trio.sleep(30)  # 30 heartbeat intervals: the server sends, we do not
    assert not client.conn.link.dead
    memory.value = LOW
    node.alarms.sample_memory()
    while not isinstance(await client.next(), ev.Unblocked):
        pass
    await trio.sleep(5)  # silent for 5 intervals: now that counts
    assert client.conn.link.dead
