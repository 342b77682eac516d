"""A publisher's reader and the turns it gives the other connections: deliveries
spread over many consumer connections go out in few, larger writes (the reader's
turn goes on while each consumer connection holds little to send), and one
consumer connection still gets a write every FRAMES_PER_TURN frames."""

from __future__ import annotations

import trio
import trio.testing

from amqlite.config import load_config
from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode
from amqlite.server.connection import FRAMES_PER_TURN, NativeConnection

CONSUMERS = 10
MESSAGES = 16 * FRAMES_PER_TURN  # two turns of MAX_FRAMES_PER_TURN


class CountingStream(trio.abc.Stream):
    """The server's side of a memory stream, counting its writes."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.writes = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


class RawClient:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.proto = Connection(Role.CLIENT)

    async def send(self, *events: ev.Event) -> None:
        await self.stream.send_all(b"".join(self.proto.send(e) for e in events))

    async def next(self) -> ev.Event:
        while True:
            event = self.proto.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, ev.Event)
                if isinstance(event, ev.Heartbeat):
                    continue
                return event
            self.proto.receive_data(await self.stream.receive_some(1 << 20))

    async def request(self, event: ev.Event) -> ev.Event:
        await self.send(event)
        return await self.next()


async def _connect(node: BrokerNode, nursery: trio.Nursery) -> tuple[RawClient, CountingStream]:
    client_side, server_side = trio.testing.memory_stream_pair()
    counted = CountingStream(server_side)
    conn = NativeConnection(node, counted, "memory:1", "127.0.0.1")
    nursery.start_soon(conn.run)
    client = RawClient(client_side)
    assert isinstance(await client.request(ev.Hello(1)), ev.Welcome)
    return client, counted


async def _writes_per_consumer(consumers: int, grouped: bool, nursery: trio.Nursery) -> float:
    """Publish MESSAGES in one write to one queue with ``consumers`` consumers; the
    server's writes per consumer connection until each has its share."""
    node = BrokerNode(load_config(overrides={"server.port": 0}))
    publisher, _ = await _connect(node, nursery)
    assert isinstance(await publisher.request(ev.QueueDeclare(2, "q")), ev.Ok)
    clients = []
    for i in range(consumers):
        client, counted = await _connect(node, nursery)
        assert isinstance(await client.request(ev.Consume(2, "q", tag=f"c{i}", no_ack=True)), ev.Ok)
        clients.append((client, counted))
    before = [counted.writes for _, counted in clients]
    props = [{"group_id": f"g{g}"} if grouped else {} for g in range(100)]
    await publisher.send(
        *(ev.Publish(10 + i, "", "q", b"x" * 100, props=props[i % 100]) for i in range(MESSAGES))
    )
    got = 0
    with trio.fail_after(30):
        while got < MESSAGES:
            for client, _ in clients:
                with trio.move_on_after(0.01):
                    while True:
                        assert isinstance(await client.next(), ev.Deliver)
                        got += 1
    writes = sum(counted.writes - b for (_, counted), b in zip(clients, before, strict=True))
    return writes / consumers


async def test_deliveries_spread_over_ten_consumers_go_out_in_few_writes(
    nursery: trio.Nursery,
) -> None:
    # 1024 grouped messages, about 100 for each of ten consumers: turns of
    # FRAMES_PER_TURN frames give each consumer about six deliveries a turn, and its
    # writer (which gathers one more turn) five writes of about twenty; turns that
    # go on while each consumer holds little give it two writes of about fifty
    per_consumer = await _writes_per_consumer(CONSUMERS, True, nursery)
    assert per_consumer <= 3, per_consumer


async def test_one_consumer_still_gets_a_write_every_turn(nursery: trio.Nursery) -> None:
    # one consumer: 64 deliveries hold more than TURN_BYTES, so the reader gives the
    # writer its turn every FRAMES_PER_TURN frames; the writer sends what a turn or
    # two made (six writes of the 1024 here), not everything at the end
    writes = await _writes_per_consumer(1, False, nursery)
    assert writes >= MESSAGES / (4 * FRAMES_PER_TURN), writes
