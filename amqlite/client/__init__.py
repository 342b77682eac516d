"""amqlite's trio client.

::

    async with amqlite.connect("127.0.0.1:5555,127.0.0.1:6666") as conn:
        await conn.declare_queue("jobs", durable=True)
        await conn.publish("", "jobs", b"hello", confirm=True)
        async for d in await conn.consume("jobs"):
            await d.ack()
"""

from .addresses import Address, parse_addresses
from .connection import Connection
from .consumer import Consumer
from .delivery import Delivery, QueueInfo
from .opening import connect, connect_stream
from .publisher import PendingConfirm

__all__ = [
    "Address",
    "Connection",
    "Consumer",
    "Delivery",
    "PendingConfirm",
    "QueueInfo",
    "connect",
    "connect_stream",
    "parse_addresses",
]
