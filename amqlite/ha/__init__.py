"""The HA pair (Binary Star with epoch fencing), sans-IO.

:class:`HaMachine` is one node; its transitions are the table in
:mod:`amqlite.ha.states`. :class:`Replicator` (active node) and :class:`Follower`
(passive node) replicate the journal (:mod:`amqlite.ha.replication`);
:class:`ReplicaProgress` is what the passive node holds, for the active node's
replies and pushes; :class:`WitnessLedger` is the optional witness's lease
(:mod:`amqlite.ha.witness`). See ``docs/ha.md`` for the rules and the diagram.
"""

from .actions import (
    Action,
    AskWitness,
    BecameActive,
    BecamePassive,
    ClientDecision,
    CloseClients,
    LeaseExpired,
    PeerHeard,
    PeerSilent,
    PersistEpoch,
    RefusedHeartbeat,
    SendHeartbeat,
    Verdict,
    WitnessHeard,
    WitnessSilent,
)
from .epochs import minted_by, next_epoch
from .errors import HaConfigError, HaError, HeartbeatError, IllegalTransition
from .heartbeat import Heartbeat
from .machine import DEFAULT_FAILOVER_TIMEOUT, DEFAULT_HEARTBEAT, HaMachine
from .progress import ReplicaProgress
from .replication import (
    FOLLOWED_LINKS,
    SYNC_CHUNK,
    SYNC_WINDOW,
    AckAfterCommit,
    ApplySync,
    Follower,
    FollowerAction,
    ReplicaApplied,
    ReplicaSynced,
    ReplicationStarted,
    ReplicationStopped,
    Replicator,
    ReplicatorAction,
    SendSync,
    SendSynced,
    replication_wanted,
)
from .states import ILLEGAL, TRANSITIONS, Branch, Guard, HaEvent, HaRole, HaState, next_state
from .witness import (
    FrameReader,
    Lease,
    LeaseAnswer,
    LeaseRequest,
    Promise,
    WitnessLedger,
    WitnessProtocolError,
)

__all__ = [
    "DEFAULT_FAILOVER_TIMEOUT",
    "DEFAULT_HEARTBEAT",
    "FOLLOWED_LINKS",
    "ILLEGAL",
    "SYNC_CHUNK",
    "SYNC_WINDOW",
    "TRANSITIONS",
    "AckAfterCommit",
    "Action",
    "ApplySync",
    "AskWitness",
    "BecameActive",
    "BecamePassive",
    "Branch",
    "ClientDecision",
    "CloseClients",
    "Follower",
    "FollowerAction",
    "FrameReader",
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
    "Lease",
    "LeaseAnswer",
    "LeaseExpired",
    "LeaseRequest",
    "PeerHeard",
    "PeerSilent",
    "PersistEpoch",
    "Promise",
    "RefusedHeartbeat",
    "ReplicaApplied",
    "ReplicaProgress",
    "ReplicaSynced",
    "ReplicationStarted",
    "ReplicationStopped",
    "Replicator",
    "ReplicatorAction",
    "SendHeartbeat",
    "SendSync",
    "SendSynced",
    "Verdict",
    "WitnessHeard",
    "WitnessLedger",
    "WitnessProtocolError",
    "WitnessSilent",
    "minted_by",
    "next_epoch",
    "next_state",
    "replication_wanted",
]
