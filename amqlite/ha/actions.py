"""What the HA machine asks its shell to do, and its answer to a client.

Actions are returned in the order the shell must apply them. In particular a
promotion returns ``PersistEpoch`` before ``BecameActive``: the shell makes the
epoch durable before it serves a client in the new term, and a demotion returns
``CloseClients`` first.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..errors import ReplyCode
from .heartbeat import Heartbeat
from .states import HaEvent, HaState
from .witness import LeaseRequest


@dataclass(frozen=True, slots=True)
class SendHeartbeat:
    """Send this heartbeat to the peer now (whatever we think of the peer)."""

    heartbeat: Heartbeat


@dataclass(frozen=True, slots=True)
class PersistEpoch:
    """Write ``epoch`` to the data dir (durably) before applying the next action; a
    restarted node is constructed with it."""

    epoch: int


@dataclass(frozen=True, slots=True)
class BecameActive:
    """This node is now master: accept clients, replicate to the peer."""

    previous: HaState
    event: HaEvent
    epoch: int


@dataclass(frozen=True, slots=True)
class BecamePassive:
    """This node is now slave: refuse new clients, follow the active peer."""

    previous: HaState
    event: HaEvent
    epoch: int
    peer_id: str


@dataclass(frozen=True, slots=True)
class CloseClients:
    """Fenced: close every client connection (they reconnect to the active peer)."""

    reason: str


@dataclass(frozen=True, slots=True)
class RefusedHeartbeat:
    """A heartbeat not from our peer (another vhost, our own node id): log ``text``.
    The machine's state did not change and the peer was not counted as heard."""

    text: str
    heartbeat: Heartbeat


@dataclass(frozen=True, slots=True)
class PeerSilent:
    """Nothing heard from the peer for a whole failover timeout (reported once per
    silence). ``peer_id`` and ``last_heard`` are None when it was never heard."""

    peer_id: str | None
    last_heard: float | None
    since: float


@dataclass(frozen=True, slots=True)
class PeerHeard:
    """The peer is heard for the first time, or again after a ``PeerSilent``."""

    peer_id: str
    state: HaState
    epoch: int


@dataclass(frozen=True, slots=True)
class AskWitness:
    """Send this lease request to the witness now (a renewal by the master, or a
    passive or starting node asking to take over in a new epoch)."""

    request: LeaseRequest


@dataclass(frozen=True, slots=True)
class LeaseExpired:
    """Our lease of ``epoch`` ran out: confirms that leaned on it stop."""

    epoch: int


@dataclass(frozen=True, slots=True)
class WitnessSilent:
    """No answer from the witness for a whole failover timeout (reported once per
    silence; ``last_heard`` None: never heard)."""

    last_heard: float | None
    since: float


@dataclass(frozen=True, slots=True)
class WitnessHeard:
    """The witness answered, for the first time or after a ``WitnessSilent``."""

    holder: str | None
    epoch: int


Action = (
    SendHeartbeat
    | PersistEpoch
    | BecameActive
    | BecamePassive
    | CloseClients
    | RefusedHeartbeat
    | PeerSilent
    | PeerHeard
    | AskWitness
    | LeaseExpired
    | WitnessSilent
    | WitnessHeard
)


class Verdict(Enum):
    ACCEPT = "accept"  # serve the client
    REFUSE = "refuse"  # passive: refuse with NOT_ACTIVE, the client tries the next address
    HOLD = "hold"  # starting, or asking the witness: wait, ask again by ``retry_at``


@dataclass(frozen=True, slots=True)
class ClientDecision:
    """The answer to a client asking for service, and the actions the request caused
    (a promotion); apply the actions before answering the client."""

    verdict: Verdict
    text: str
    actions: tuple[Action, ...] = ()
    retry_at: float | None = None  # HOLD only: when asking again may be accepted

    @property
    def accepted(self) -> bool:
        return self.verdict is Verdict.ACCEPT

    @property
    def code(self) -> int | None:
        """The reply code to refuse with (also for a hold that the shell gives up on)."""
        return None if self.accepted else int(ReplyCode.NOT_ACTIVE)
