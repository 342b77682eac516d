"""Exchange peering (OpenAMQ's ``cluster_mta``), sans-IO: the decisions and the link
state, no sockets, no clock, no logging. A trio shell in ``amqlite/server`` drives it
and applies the actions it returns; see docs/peering.md ("Shell integration").
"""

from .actions import (
    Acked,
    Action,
    Blocked,
    BufferAvailable,
    Connect,
    Deliver,
    DeliverRun,
    Disconnect,
    Persist,
    Send,
    StateChanged,
)
from .addresses import Address, AddressRing, parse_address, parse_addresses
from .backoff import Backoff
from .errors import LinkStateError, PeeringProtocolError
from .exchange import PeeredExchange
from .forwarding import Decision, decide
from .inbound import HighWaterMarks, SeenMessages
from .interest import BindingKey, BindingMirror, RemoteInterest
from .link import PeeringLink
from .mode import OverflowPolicy, PeeringMode, parse_mode, parse_overflow
from .outbound import Entry, MemorySpill, OutboundLog, SpillStore
from .settings import ExchangeContext, LinkRole, LinkSettings
from .states import TRANSITIONS, LinkEvent, LinkState, next_state
from .wire import (
    Ack,
    Envelope,
    Filter,
    Forward,
    Forwards,
    Heartbeat,
    Hello,
    Interest,
    MeshId,
    MeshStamp,
    PeeringMessage,
    PlainRun,
    Refused,
    ResyncRequest,
    from_map,
)

__all__ = [
    "TRANSITIONS",
    "Ack",
    "Acked",
    "Action",
    "Address",
    "AddressRing",
    "Backoff",
    "BindingKey",
    "BindingMirror",
    "Blocked",
    "BufferAvailable",
    "Connect",
    "Decision",
    "Deliver",
    "DeliverRun",
    "Disconnect",
    "Entry",
    "Envelope",
    "ExchangeContext",
    "Filter",
    "Forward",
    "Forwards",
    "Heartbeat",
    "Hello",
    "HighWaterMarks",
    "Interest",
    "LinkEvent",
    "LinkRole",
    "LinkSettings",
    "LinkState",
    "LinkStateError",
    "MemorySpill",
    "MeshId",
    "MeshStamp",
    "OutboundLog",
    "OverflowPolicy",
    "PeeredExchange",
    "PeeringLink",
    "PeeringMessage",
    "PeeringMode",
    "PeeringProtocolError",
    "Persist",
    "PlainRun",
    "Refused",
    "RemoteInterest",
    "ResyncRequest",
    "SeenMessages",
    "Send",
    "SpillStore",
    "StateChanged",
    "decide",
    "from_map",
    "next_state",
    "parse_address",
    "parse_addresses",
    "parse_mode",
    "parse_overflow",
]
