"""A confirmed publish sent again on a new connection with the same ``hello.instance``
and ``id`` (what a reconnecting client does) is confirmed and routed once."""

from __future__ import annotations

from pathlib import Path

import trio

from amqlite.protocol import events as ev

from .rawclient import RawClient
from .test_storage import running


async def opened(port: int, instance: str) -> RawClient:
    client = await RawClient.connect(port)
    await client.send(ev.Hello(client.next_id(), instance=instance))
    assert isinstance(await client.receive(), ev.Welcome)
    return client


async def publish(client: RawClient, rid: int, body: bytes) -> ev.Event:
    await client.send(ev.Publish(rid, "", "q", body, props={"persistent": True}, confirm=True))
    while True:
        event = await client.receive()
        if getattr(event, "re", None) == rid or isinstance(event, ev.EndOfStream):
            return event


async def count(client: RawClient) -> int:
    reply = await client.request(ev.QueueDeclare, queue="q", passive=True)
    assert isinstance(reply, ev.Ok), reply
    return int(reply.info["messages"])


async def test_the_same_instance_and_id_is_routed_once(tmp_path: Path) -> None:
    async with running(tmp_path) as node:
        first = await opened(node.port, "5f0c2a9e1b7d4c63")
        assert isinstance(await first.request(ev.QueueDeclare, queue="q", durable=True), ev.Ok)
        assert isinstance(await publish(first, 100, b"once"), ev.Ok)
        await first.aclose()  # the link breaks: the client cannot know the ok was sent

        again = await opened(node.port, "5f0c2a9e1b7d4c63")
        assert isinstance(await publish(again, 100, b"once"), ev.Ok)  # confirmed again
        assert isinstance(await publish(again, 101, b"next"), ev.Ok)
        other = await opened(node.port, "another-client")  # same id, other client
        assert isinstance(await publish(other, 100, b"theirs"), ev.Ok)
        assert await count(other) == 3
        host = node.broker.vhost("/")
        assert host is not None and host.publish_keys.duplicates == 1
        for c in (again, other):
            await c.aclose()


async def test_a_client_without_an_instance_is_not_deduplicated(tmp_path: Path) -> None:
    async with running(tmp_path) as node:
        client = await opened(node.port, "")
        await client.request(ev.QueueDeclare, queue="q")
        for _ in range(2):
            assert isinstance(await publish(client, 50, b"same id"), ev.Ok)
        assert await count(client) == 2
        await client.aclose()


async def test_an_overlong_instance_is_refused(tmp_path: Path) -> None:
    async with running(tmp_path) as node:
        client = await RawClient.connect(node.port)
        await client.send(ev.Hello(client.next_id(), instance="x" * 65))
        refused = await client.receive()
        assert isinstance(refused, ev.Refused), refused
        assert "instance" in refused.text
        with trio.fail_after(5):
            await client.aclose()
