"""One node of an HA pair, sans-IO: heartbeats and client requests in, actions out.

The shell owns the clock, the peer link and the data dir. It calls :meth:`tick` by
:meth:`HaMachine.next_deadline`, hands every heartbeat it receives to
:meth:`on_heartbeat`, asks :meth:`on_client_request` when a client says hello, and
applies the returned actions in order. States change only through the table in
:mod:`amqlite.ha.states`; this module computes the guards and the side effects
(epochs, actions) of each transition.
"""

from __future__ import annotations

from typing import Any

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
from .epochs import next_epoch
from .errors import HaConfigError, HaError
from .heartbeat import Heartbeat
from .states import Guard, HaEvent, HaRole, HaState, next_state

DEFAULT_HEARTBEAT = 0.2
DEFAULT_FAILOVER_TIMEOUT = 1.0


class HaMachine:
    """The Binary Star state machine of one node, with epoch fencing.

    Guarantees: heartbeats are due every ``heartbeat`` seconds whatever the state;
    a starting node accepts no client until it has heard its peer or the peer has
    been silent for ``failover_timeout``; a passive node takes over on a client
    request only when its peer has been silent for ``failover_timeout``; every
    promotion mints a new, higher epoch (see :mod:`amqlite.ha.epochs`) and reports
    it with ``PersistEpoch`` before ``BecameActive``; an active node that hears an
    active peer that outranks it demotes itself and closes its clients.
    """

    def __init__(
        self,
        role: HaRole,
        node_id: str,
        vhost: str,
        *,
        now: float,
        epoch: int = 0,
        heartbeat: float = DEFAULT_HEARTBEAT,
        failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT,
    ) -> None:
        if not isinstance(role, HaRole):
            raise HaError(f"role must be HaRole.PRIMARY or HaRole.BACKUP, got {role!r}")
        if not isinstance(node_id, str) or not node_id:
            raise HaError(f"node id must be non-empty text, got {node_id!r}")
        if not isinstance(vhost, str) or not vhost:
            raise HaError(f"vhost must be non-empty text, got {vhost!r}")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise HaError(f"epoch must be a non-negative integer, got {epoch!r}")
        if not heartbeat > 0:
            raise HaError(f"heartbeat interval must be positive, got {heartbeat!r}")
        if not failover_timeout > heartbeat:
            raise HaError(
                f"failover timeout ({failover_timeout!r} s) must be longer than the "
                f"heartbeat interval ({heartbeat!r} s)"
            )
        self._role = role
        self._node_id = node_id
        self._vhost = vhost
        self._interval = float(heartbeat)
        self._timeout = float(failover_timeout)
        self._state = role.starting_state
        self._epoch = epoch  # the term while active; else the highest epoch held or heard
        self._highest_heard = epoch
        self._started_at = now
        self._peer: Heartbeat | None = None
        self._peer_last_heard: float | None = None
        self._silence_reported = False
        self._next_heartbeat_at = now

    # --- what the node is -------------------------------------------------------------

    @property
    def role(self) -> HaRole:
        return self._role

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def vhost(self) -> str:
        return self._vhost

    @property
    def state(self) -> HaState:
        return self._state

    @property
    def epoch(self) -> int:
        """The epoch to persist: the term while ACTIVE, else the highest held or heard."""
        return self._epoch

    @property
    def heartbeat_interval(self) -> float:
        return self._interval

    @property
    def failover_timeout(self) -> float:
        return self._timeout

    @property
    def accepting_clients(self) -> bool:
        """True while ACTIVE: client operations may be served. A fenced node has
        already left ACTIVE (and returned ``CloseClients``)."""
        return self._state is HaState.ACTIVE

    # --- what the node knows of its peer ----------------------------------------------

    @property
    def peer_state(self) -> HaState | None:
        """The state in the last heartbeat heard (None if none was)."""
        return None if self._peer is None else self._peer.state

    @property
    def peer_id(self) -> str | None:
        return None if self._peer is None else self._peer.node_id

    @property
    def peer_epoch(self) -> int | None:
        return None if self._peer is None else self._peer.epoch

    @property
    def peer_last_heard(self) -> float | None:
        return self._peer_last_heard

    @property
    def peer_expires_at(self) -> float:
        """When the peer counts as silent if nothing more is heard: a failover timeout
        after the last heartbeat heard, or after start-up if none was."""
        heard = self._peer_last_heard
        return (self._started_at if heard is None else heard) + self._timeout

    def peer_silent(self, now: float) -> bool:
        return now >= self.peer_expires_at

    def peer_alive(self, now: float) -> bool:
        return self._peer_last_heard is not None and not self.peer_silent(now)

    # --- time -------------------------------------------------------------------------

    def heartbeat(self) -> Heartbeat:
        """Our heartbeat as of now."""
        return Heartbeat(
            node_id=self._node_id,
            role=self._role,
            state=self._state,
            epoch=self._epoch,
            vhost=self._vhost,
        )

    def next_deadline(self) -> float:
        """The instant by which the shell must call :meth:`tick` next."""
        deadline = self._next_heartbeat_at
        if not self._silence_reported:
            deadline = min(deadline, self.peer_expires_at)
        return deadline

    def tick(self, now: float) -> list[Action]:
        """Report the peer silent (once) and send the heartbeat when due. Sending is
        unconditional: a node heartbeats whatever it thinks of its peer."""
        actions: list[Action] = []
        if not self._silence_reported and self.peer_silent(now):
            self._silence_reported = True
            actions.append(PeerSilent(self.peer_id, self._peer_last_heard, self.peer_expires_at))
        if now >= self._next_heartbeat_at:
            actions.append(SendHeartbeat(self.heartbeat()))
            self._next_heartbeat_at += self._interval
            if self._next_heartbeat_at <= now:  # the shell was late: do not burst
                self._next_heartbeat_at = now + self._interval
        return actions

    # --- events -----------------------------------------------------------------------

    def on_heartbeat(self, hb: Heartbeat, now: float) -> list[Action]:
        """Hear the peer. A heartbeat from another vhost or from ourselves is refused
        (an action, nothing else changes); one from a node of our own role raises
        :class:`HaConfigError`; an illegal pair raises ``IllegalTransition``."""
        if hb.node_id == self._node_id:
            text = (
                f"refused a heartbeat carrying our own node id {hb.node_id!r}: "
                "the peer address points back at this node"
            )
            return [RefusedHeartbeat(text, hb)]
        if hb.vhost != self._vhost:
            text = (
                f"refused a heartbeat from node {hb.node_id!r}: it serves vhost {hb.vhost!r} "
                f"but this pair serves {self._vhost!r}; both nodes must name the same vhost"
            )
            return [RefusedHeartbeat(text, hb)]
        if hb.role is self._role:
            raise HaConfigError(
                f"peer node {hb.node_id!r} is also configured as the {hb.role.value}: "
                "one node of the pair must be the primary and the other the backup"
            )
        actions: list[Action] = []
        if self._peer is None or self._silence_reported:
            actions.append(PeerHeard(hb.node_id, hb.state, hb.epoch))
        self._peer = hb
        self._peer_last_heard = now
        self._silence_reported = False
        self._highest_heard = max(self._highest_heard, hb.epoch)
        actions += self._fire(hb.event, now, hb)
        return actions

    def on_client_request(self, now: float) -> ClientDecision:
        """A client asks for service: accept (ACTIVE, possibly just promoted by this
        very request), refuse (PASSIVE with a live peer) or hold (starting)."""
        actions = tuple(self._fire(HaEvent.CLIENT_REQUEST, now, None))
        if self._state is HaState.ACTIVE:
            return ClientDecision(Verdict.ACCEPT, f"active in epoch {self._epoch}", actions)
        if self._state is HaState.PASSIVE:
            text = f"node {self._node_id!r} is passive; the active node is {self.peer_id!r}"
            return ClientDecision(Verdict.REFUSE, text, actions)
        text = (
            f"node {self._node_id!r} is starting and has not yet decided which node is "
            "active: waiting to hear its peer"
        )
        return ClientDecision(Verdict.HOLD, text, actions, retry_at=self.peer_expires_at)

    # --- status -----------------------------------------------------------------------

    def status(self, now: float) -> dict[str, Any]:
        """Plain data for ``amqlite status`` (states as lowercase words)."""
        heard = self._peer_last_heard
        peer_state = self.peer_state
        return {
            "node_id": self._node_id,
            "role": self._role.value,
            "state": self._state.value,
            "epoch": self._epoch,
            "accepting_clients": self.accepting_clients,
            "peer_id": self.peer_id,
            "peer_state": None if peer_state is None else peer_state.value,
            "peer_epoch": self.peer_epoch,
            "peer_alive": self.peer_alive(now),
            "last_heartbeat_age": None if heard is None else max(0.0, now - heard),
        }

    # --- the one place the state changes ----------------------------------------------

    def _holds(self, now: float, hb: Heartbeat | None) -> frozenset[Guard]:
        holds = set()
        if self.peer_silent(now):
            holds.add(Guard.PEER_SILENT)
        if hb is not None and (
            hb.epoch > self._epoch or (hb.epoch == self._epoch and hb.role is HaRole.PRIMARY)
        ):
            holds.add(Guard.PEER_OUTRANKS)
        if self._role is HaRole.PRIMARY:
            holds.add(Guard.IS_PRIMARY)
        return frozenset(holds)

    def _fire(self, event: HaEvent, now: float, hb: Heartbeat | None) -> list[Action]:
        old = self._state
        new = next_state(old, event, self._holds(now, hb))
        actions: list[Action] = []
        if new is HaState.ACTIVE and old is not HaState.ACTIVE:
            self._epoch = next_epoch(self._role, max(self._epoch, self._highest_heard))
            actions.append(PersistEpoch(self._epoch))
            self._state = new
            actions.append(BecameActive(old, event, self._epoch))
            return actions
        if new is HaState.PASSIVE and old is HaState.ACTIVE:
            assert hb is not None  # only an outranking active peer demotes
            actions.append(CloseClients(self._fence_reason(hb)))
        self._state = new
        if new is not HaState.ACTIVE and self._highest_heard > self._epoch:
            self._epoch = self._highest_heard
            actions.append(PersistEpoch(self._epoch))
        if new is HaState.PASSIVE and old is not HaState.PASSIVE:
            assert hb is not None  # only a heartbeat makes a node passive
            actions.append(BecamePassive(old, event, self._epoch, hb.node_id))
        return actions

    def _fence_reason(self, hb: Heartbeat) -> str:
        if hb.epoch > self._epoch:
            why = f"a higher epoch ({hb.epoch} > {self._epoch})"
        else:
            why = f"the same epoch ({hb.epoch}) and it is the primary"
        return f"fenced: peer {hb.node_id!r} is active with {why}; this node is now passive"
