"""kombu (py-amqp underneath) and aio-pika (pamqp underneath) against the broker."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal

import aio_pika
import kombu
import pytest

from .conftest import WAIT, AmqpServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _kombu(server: AmqpServer) -> kombu.Connection:
    return kombu.Connection(f"amqp://guest:guest@127.0.0.1:{server.amqp_port}//")


def test_kombu_simple_queue_round_trip(server: AmqpServer) -> None:
    name = _name("simple")
    with _kombu(server) as connection:
        queue = connection.SimpleQueue(name)
        queue.put({"hello": "world", "n": [1, 2]}, headers={"h": "v"})
        message = queue.get(block=True, timeout=WAIT)
        assert message.payload == {"hello": "world", "n": [1, 2]}
        assert message.headers == {"h": "v"}
        assert message.content_type == "application/json"
        message.ack()
        assert queue.qsize() == 0
        queue.clear()
        queue.close()
        connection.default_channel.queue_delete(name)


def test_kombu_producer_consumer(server: AmqpServer) -> None:
    exchange = kombu.Exchange(_name("tasks"), type="topic", durable=True)
    queue = kombu.Queue(_name("work"), exchange, routing_key="task.#", durable=True)
    received: list[tuple[object, str]] = []
    with _kombu(server) as connection:
        producer = kombu.Producer(connection, exchange=exchange)
        producer.publish(
            {"task": 1},
            routing_key="task.add",
            declare=[queue],
            serializer="json",
            delivery_mode=2,
            retry=False,
        )
        producer.publish(b"raw", routing_key="task.raw", content_type="application/data")

        def on_message(body: object, message: kombu.Message) -> None:
            received.append((body, message.delivery_info["routing_key"]))
            message.ack()

        with kombu.Consumer(connection, [queue], callbacks=[on_message], prefetch_count=1):
            while len(received) < 2:
                connection.drain_events(timeout=WAIT)
        assert received == [({"task": 1}, "task.add"), (b"raw", "task.raw")]
        queue(connection.default_channel).delete()
        exchange(connection.default_channel).delete()


def test_aio_pika_robust_confirms_and_iterator(server: AmqpServer) -> None:
    name = _name("aio")

    async def main() -> list[tuple[bytes, dict[str, object], bool]]:
        connection = await aio_pika.connect_robust(
            f"amqp://guest:guest@127.0.0.1:{server.amqp_port}/", timeout=WAIT
        )
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=2)
            queue = await channel.declare_queue(name, durable=True)
            headers = {"float": 0.25, "decimal": Decimal("1.5"), "nested": {"l": [1.5, "x"]}}
            for i in range(5):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(
                        b"a%d" % i,
                        headers=headers,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        message_id=str(i),
                    ),
                    routing_key=name,
                )
                assert confirmation is not None
            got = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        got.append((message.body, dict(message.headers), message.redelivered))
                    if len(got) == 5:
                        break
            await queue.delete()
            return got

    got = asyncio.run(asyncio.wait_for(main(), 2 * WAIT))
    assert [body for body, _, _ in got] == [b"a%d" % i for i in range(5)]
    for _, headers, redelivered in got:
        assert headers == {"float": 0.25, "decimal": Decimal("1.5"), "nested": {"l": [1.5, "x"]}}
        assert redelivered is False


def test_aio_pika_mandatory_return_and_nack(server: AmqpServer) -> None:
    async def main() -> None:
        connection = await aio_pika.connect(
            f"amqp://guest:guest@127.0.0.1:{server.amqp_port}/", timeout=WAIT
        )
        async with connection:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            with pytest.raises(aio_pika.exceptions.DeliveryError) as caught:
                await channel.default_exchange.publish(
                    aio_pika.Message(b"x"), routing_key=_name("none"), mandatory=True
                )
            assert caught.value.message is not None
            queue = await channel.declare_queue(
                exclusive=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
            )
            await channel.default_exchange.publish(aio_pika.Message(b"1"), routing_key=queue.name)
            with pytest.raises(aio_pika.exceptions.DeliveryError):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"2"), routing_key=queue.name
                )

    asyncio.run(asyncio.wait_for(main(), 2 * WAIT))
