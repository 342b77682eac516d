"""amqlite: a message broker in Python on trio, and its client.

The public API is what this module exports; everything else may change.
"""

from amqlite.client import Connection, Consumer, Delivery, PendingConfirm, QueueInfo, connect
from amqlite.errors import (
    AccessRefused,
    AmqliteError,
    BrokerError,
    ConfigError,
    ConnectionClosed,
    ConnectionRefused,
    LocalProtocolError,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    ProtocolError,
    PublishNacked,
    PublishReturned,
    RemoteProtocolError,
    ReplyCode,
    ResourceLocked,
)

__version__ = "0.1.0"

__all__ = [
    "AccessRefused",
    "AmqliteError",
    "BrokerError",
    "ConfigError",
    "Connection",
    "ConnectionClosed",
    "ConnectionRefused",
    "Consumer",
    "Delivery",
    "LocalProtocolError",
    "NotAllowed",
    "NotFound",
    "PendingConfirm",
    "PreconditionFailed",
    "ProtocolError",
    "PublishNacked",
    "PublishReturned",
    "QueueInfo",
    "RemoteProtocolError",
    "ReplyCode",
    "ResourceLocked",
    "__version__",
    "connect",
]
