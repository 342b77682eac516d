"""What an :class:`~amqlite.amqp.connection.AmqpConnection` hands out after
``receive_data``: small frozen dataclasses named after what happened."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .properties import BasicProperties
from .spec import Method


class Role(Enum):
    """Which end of the connection this object plays."""

    CLIENT = "client"
    SERVER = "server"


class Event:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ProtocolHeaderReceived(Event):
    """The client opened with the AMQP 0-9-1 protocol header (server side)."""


@dataclass(frozen=True, slots=True)
class MethodReceived(Event):
    """A method without content, on ``channel`` (0 = the connection)."""

    channel: int
    method: Method


@dataclass(frozen=True, slots=True)
class ContentReceived(Event):
    """A whole message: its method (basic.publish, deliver, return or get-ok),
    properties and body, assembled from its frames."""

    channel: int
    method: Method
    properties: BasicProperties
    body: bytes


@dataclass(frozen=True, slots=True)
class HeartbeatReceived(Event):
    """A heartbeat frame (any frame shows the other end is alive; this one says
    nothing else)."""
