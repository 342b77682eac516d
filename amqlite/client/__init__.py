"""amqlite's trio client.

::

    async with amqlite.connect("127.0.0.1:5555,127.0.0.1:6666") as conn:
        await conn.declare_queue("jobs", durable=True)
        await conn.publish("", "jobs", b"hello", confirm=True)
        async for d in await conn.consume("jobs"):
            await d.ack()

Given two addresses the connection fails over by itself: see ``docs/client.md``.
Stream queues are read with ``conn.consume(q, offset="first")`` (each delivery has
an ``offset``), and positions kept with ``store_offset`` / ``query_offset``.
"""

from .addresses import Address, parse_addresses
from .connection import Connection
from .consumer import Consumer
from .delivery import Delivery, QueueInfo
from .link import Disconnected, Reconnected
from .opening import connect, connect_stream
from .policy import ReconnectPolicy
from .publisher import PendingConfirm
from .streams import StreamOffset

__all__ = [
    "Address",
    "Connection",
    "Consumer",
    "Delivery",
    "Disconnected",
    "PendingConfirm",
    "QueueInfo",
    "ReconnectPolicy",
    "Reconnected",
    "StreamOffset",
    "connect",
    "connect_stream",
    "parse_addresses",
]
