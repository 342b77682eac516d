"""The HA pair (Binary Star with epoch fencing), sans-IO.

:class:`HaMachine` is one node; its transitions are the table in
:mod:`amqlite.ha.states`. See ``docs/ha.md`` for the rules and the diagram.
"""

from .actions import (
    Action,
    BecameActive,
    BecamePassive,
    ClientDecision,
    CloseClients,
    PeerHeard,
    PeerSilent,
    PersistEpoch,
    RefusedHeartbeat,
    SendHeartbeat,
    Verdict,
)
from .epochs import minted_by, next_epoch
from .errors import HaConfigError, HaError, HeartbeatError, IllegalTransition
from .heartbeat import Heartbeat
from .machine import DEFAULT_FAILOVER_TIMEOUT, DEFAULT_HEARTBEAT, HaMachine
from .states import ILLEGAL, TRANSITIONS, Branch, Guard, HaEvent, HaRole, HaState, next_state

__all__ = [
    "DEFAULT_FAILOVER_TIMEOUT",
    "DEFAULT_HEARTBEAT",
    "ILLEGAL",
    "TRANSITIONS",
    "Action",
    "BecameActive",
    "BecamePassive",
    "Branch",
    "ClientDecision",
    "CloseClients",
    "Guard",
    "HaConfigError",
    "HaError",
    "HaEvent",
    "HaMachine",
    "HaRole",
    "HaState",
    "Heartbeat",
    "HeartbeatError",
    "IllegalTransition",
    "PeerHeard",
    "PeerSilent",
    "PersistEpoch",
    "RefusedHeartbeat",
    "SendHeartbeat",
    "Verdict",
    "minted_by",
    "next_epoch",
    "next_state",
]
