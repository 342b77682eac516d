"""``fetch_stream`` and ``publish_many`` through the client, against the real broker
served in-process: records by offset range in columns, retention gaps, reading
changes nothing, the byte budget; batched publishes confirmed or refused one by
one, and the journal's group commit."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import amqlite
from amqlite.client.bulk import StreamRangeDropped
from amqlite.config import load_config
from amqlite.errors import NotFound, PreconditionFailed, PublishNacked, PublishReturned
from amqlite.protocol.codec import RECORDS_OVERHEAD, records_size
from amqlite.server import BrokerNode

STREAM = {"x-queue-type": "stream"}


def _address(node: BrokerNode) -> str:
    return f"127.0.0.1:{node.port}"


async def test_fetch_returns_the_stored_records_in_order(node: BrokerNode) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await conn.declare_queue("s", durable=True, arguments=STREAM)
        await conn.publish("", "s", b"plain", confirm=True)
        await conn.publish(
            "", "s", "é".encode(), headers={"h": 1, "b": b"x"},
            properties={"message_id": "m1", "timestamp": 7}, confirm=True,
        )  # fmt: skip
        await conn.declare_exchange("ex", "fanout")
        await conn.bind("s", "ex")
        await conn.publish("ex", "clé", b"", confirm=True)
        status_before = await conn.status()
        batch = await conn.fetch_stream("s", 0)
        assert (batch.first, batch.count, batch.next, batch.dropped) == (0, 3, 3, 0)
        assert list(batch.rows()) == [
            (0, "", "s", b"plain", {}, {}),
            (1, "", "s", "é".encode(), {"h": 1, "b": b"x"}, {"message_id": "m1", "timestamp": 7}),
            (2, "ex", "clé", b"", {}, {}),
        ]
        assert (batch.kept_first, batch.kept_next) == (0, 3)
        part = await conn.fetch_stream("s", 1, 2)
        assert [r[0] for r in part.rows()] == [1]
        empty = await conn.fetch_stream("s", 3)
        assert (empty.first, empty.count) == (3, 0)
        # nothing changed: no consumer, no credit, no stored offset
        queues = {q["name"]: q for v in (await conn.status())["vhosts"] for q in v["queues"]}
        before = {q["name"]: q for v in status_before["vhosts"] for q in v["queues"]}
        assert queues["s"] == before["s"]


async def test_fetch_budget_and_errors(node: BrokerNode) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await conn.declare_queue("s", durable=True, arguments=STREAM)
        for i in range(50):
            await conn.publish("", "s", bytes(100) + b"%d" % i, confirm=True)
        batch = await conn.fetch_stream("s", 0, max_bytes=1000)
        assert 1 <= batch.count < 50
        offsets = []
        at = 0
        while True:
            b = await conn.fetch_stream("s", at, max_bytes=1000)
            if not b.count:
                break
            offsets += [r[0] for r in b.rows()]
            assert [r[3] for r in b.rows()] == [bytes(100) + b"%d" % o for o in range(at, b.next)]
            at = b.next
        assert offsets == list(range(50))
        one = await conn.fetch_stream("s", 7, max_bytes=1)
        assert one.count == 1  # at least one record, whatever the budget
        await conn.declare_queue("h", durable=True, arguments=STREAM)
        for i in range(40):  # headers larger than the server's estimate of them
            await conn.publish("", "h", b"", headers={"k": "é" * 200, "n": i}, confirm=True)
        at = 0
        while (b := await conn.fetch_stream("h", at, max_bytes=2000)).count:
            assert b.count == 1 or records_size(b.records) <= 2000 + RECORDS_OVERHEAD
            assert [r[4]["n"] for r in b.rows()] == list(range(at, b.next))
            at = b.next
        assert at == 40
        await conn.declare_queue("classic")
        with pytest.raises(PreconditionFailed):
            await conn.fetch_stream("classic", 0)
        with pytest.raises(NotFound):
            await conn.fetch_stream("nope", 0)
        with pytest.raises(PreconditionFailed):
            await conn.fetch_stream("s", 5, 3)


async def test_fetch_says_what_retention_dropped(node: BrokerNode) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await conn.declare_queue("s", durable=True, arguments={**STREAM, "x-max-length": 5})
        for i in range(12):
            await conn.publish("", "s", b"%d" % i, confirm=True)
        batch = await conn.fetch_stream("s", 2)
        assert (batch.first, batch.dropped, batch.count) == (7, 5, 5)
        gone = await conn.fetch_stream("s", 0, 4)
        assert (gone.count, gone.dropped) == (0, 4)
        with pytest.raises(StreamRangeDropped, match="offsets 2 to 6 were removed"):
            await conn.fetch_stream("s", 2, strict=True)
        whole = await conn.fetch_stream("s", 7, strict=True)
        assert [r[3] for r in whole.rows()] == [b"%d" % i for i in range(7, 12)]


async def test_publish_many_confirms_each_and_refuses_each(node: BrokerNode) -> None:
    async with amqlite.connect(_address(node)) as conn:
        await conn.declare_queue("q")
        small = {"x-max-length": 2, "x-overflow": "reject-publish"}
        await conn.declare_queue("small", arguments=small)
        msgs = [("q", b"%d" % i) for i in range(20_000)]
        done = await conn.publish_many("", msgs)
        assert done.count == 20_000 and done.refused == []
        info = await conn.declare_queue("q", passive=True)
        assert info.messages == 20_000
        got = [await conn.get("q", no_ack=True) for _ in range(3)]
        assert [d.body for d in got if d] == [b"0", b"1", b"2"]
        mixed = [("q", b"a"), ("nowhere", b"b"), ("small", b"1"), ("small", b"2"), ("small", b"3")]
        result = await conn.publish_many("", mixed, mandatory=True, raise_refused=False)
        kinds = [(i, type(e)) for i, e in result.refused]
        assert kinds == [(1, PublishReturned), (4, PublishNacked)]
        with pytest.raises(PublishReturned, match="message 1 of the batch"):
            await conn.publish_many("", [("q", b"x"), ("nowhere", b"y")], mandatory=True)
        with_headers = [("q", b"h", {"k": "v"}, {"message_id": "id-1"})]
        await conn.publish_many("", with_headers)
        info = await conn.declare_queue("q", passive=True)
        assert info.messages == 20_000 - 3 + 1 + 1 + 1
        await conn.purge_queue("q")
        await conn.publish_many("", with_headers)
        d = await conn.get("q", no_ack=True)
        assert d is not None and d.headers == {"k": "v"}
        assert d.properties.get("message_id") == "id-1"


async def test_publish_many_persistent_survives_a_restart(tmp_path: Path) -> None:
    config = load_config(
        overrides={"server.host": "127.0.0.1", "server.port": 0, "server.data_dir": str(tmp_path)}
    )
    async with trio.open_nursery() as nursery:
        node = BrokerNode(config)
        await nursery.start(node.run)
        async with amqlite.connect(_address(node)) as conn:
            await conn.declare_queue("durable", durable=True)
            await conn.declare_queue("s", durable=True, arguments=STREAM)
            await conn.publish_many("", [("durable", b"%d" % i) for i in range(3000)],
                                    persistent=True)  # fmt: skip
            await conn.publish_many("", [("s", b"%d" % i) for i in range(3000)])
        node.stop()
        await node.stopped.wait()
        node = BrokerNode(config)
        await nursery.start(node.run)
        async with amqlite.connect(_address(node)) as conn:
            info = await conn.declare_queue("durable", durable=True, passive=True)
            assert info.messages == 3000
            at, bodies = 0, []
            while (b := await conn.fetch_stream("s", at)).count:
                bodies += b.body_list()
                at = b.next
            assert bodies == [b"%d" % i for i in range(3000)]
        node.stop()
