"""Settings of a link end, and what the link ends of one exchange share."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .addresses import Address
from .inbound import HighWaterMarks, SeenMessages
from .interest import BindingMirror
from .mode import OverflowPolicy, PeeringMode


class LinkRole(Enum):
    DIALER = "dialer"
    ACCEPTOR = "acceptor"


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """One link end's settings (a ``[[cluster_mta]]`` entry, parsed and validated)."""

    name: str
    mode: PeeringMode = PeeringMode.PUBLISH
    addresses: tuple[Address, ...] = ()
    buffer_bytes: int = 16 * 1024 * 1024
    overflow: OverflowPolicy = OverflowPolicy.BLOCK
    max_in_flight: int = 1024  # sent and not yet acknowledged
    heartbeat: float = 1.0  # seconds; 0 disables; each end uses the smaller nonzero one
    heartbeat_misses: int = 3
    connect_timeout: float = 5.0  # connect and handshake
    resync_interval: float = 30.0  # interest digest check
    ack_every: int = 64  # ack at once after this many settled messages...
    ack_delay: float = 0.02  # ...or this long after the first unacknowledged one
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    #: subscribe mode: how long the remote keeps this subscriber's peering queue
    #: after the link went away (told to the remote in the hello)
    lease: float = 24 * 3600.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a link needs a name")
        positive = ("buffer_bytes", "max_in_flight", "heartbeat_misses", "ack_every")
        for attr in positive:
            if getattr(self, attr) < 1:
                raise ValueError(f"{attr} must be at least 1, got {getattr(self, attr)}")
        for attr in ("heartbeat", "ack_delay"):
            if getattr(self, attr) < 0:
                raise ValueError(f"{attr} must not be negative, got {getattr(self, attr)}")
        for attr in (
            "connect_timeout",
            "resync_interval",
            "backoff_initial",
            "backoff_max",
            "lease",
        ):
            if getattr(self, attr) <= 0:
                raise ValueError(f"{attr} must be positive, got {getattr(self, attr)}")


@dataclass(slots=True)
class ExchangeContext:
    """What every link end of one local exchange shares (owned by
    :class:`~amqlite.peering.exchange.PeeredExchange`)."""

    node_id: str
    epoch: int
    vhost: str
    exchange: str
    exchange_type: str
    max_hops: int
    mirror: BindingMirror
    marks: HighWaterMarks
    seen: SeenMessages
