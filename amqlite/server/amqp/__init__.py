"""The AMQP 0-9-1 listener's shell: one :class:`AmqpServerConnection` per client
connection, one :class:`AmqpChannel` (a broker session) per channel. The
protocol itself is the sans-IO :mod:`amqlite.amqp`; see docs/amqp.md."""

from .channel import AmqpChannel
from .connection import AmqpServerConnection

__all__ = ["AmqpChannel", "AmqpServerConnection"]
