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
from .epochs import next_epoch
from .errors import HaConfigError, HaError
from .heartbeat import Heartbeat
from .states import Guard, HaEvent, HaRole, HaState, next_state
from .witness import LeaseAnswer, LeaseRequest, Promise

#: lease requests whose answer we still wait for, at most (older ones are dropped)
_MAX_PENDING = 32
_PEER_OR_CLIENT = frozenset(
    {
        HaEvent.PEER_PRIMARY,
        HaEvent.PEER_BACKUP,
        HaEvent.PEER_ACTIVE,
        HaEvent.PEER_PASSIVE,
        HaEvent.CLIENT_REQUEST,
    }
)

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

    ``promise`` (docs/ha.md, "What a confirm promises") says when an active node may
    confirm a persistent message that its peer does not hold
    (:meth:`may_confirm_alone`): ``SERVE`` always, ``HOLD`` never, ``WITNESS`` only
    under a lease the witness granted it for confirming alone. With a witness, a
    passive or starting node whose peer is silent asks the witness for the lease of
    a new epoch (``AskWitness``) and takes over only when it is granted
    (:meth:`on_lease`); the master renews its lease every heartbeat interval.
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
        promise: Promise = Promise.SERVE,
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
        if not isinstance(promise, Promise):
            raise HaError(f"promise must be a Promise, got {promise!r}")
        self._promise = promise
        # --- the witness (promise WITNESS only) ---
        self._witness_last_heard: float | None = None
        self._witness_silence_reported = False
        self._lease_request = 0  # the id of the request the lease in force answered
        self._lease_until = 0.0  # on our clock: the request's send time + its ttl
        self._lease_epoch = 0
        self._lease_alone = False  # the lease lets us confirm without the peer
        self._lease_expiry_reported = True  # nothing held yet
        self._pending: dict[int, tuple[float, LeaseRequest]] = {}
        self._next_request_id = 1
        self._next_ask_at = now  # renewals (active) and takeover asks are paced
        self._alone = True  # the shell: confirms do not wait for the peer (no replica)

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
    def promise(self) -> Promise:
        return self._promise

    @property
    def witnessed(self) -> bool:
        return self._promise is Promise.WITNESS

    def lease_held(self, now: float) -> bool:
        """Whether we hold the witness's lease for our current epoch (active only)."""
        return (
            self._state is HaState.ACTIVE
            and self._lease_epoch == self._epoch
            and now < self._lease_until
        )

    def may_confirm_alone(self, now: float) -> bool:
        """Whether this node may confirm a persistent message its peer does not hold
        (no passive node is replicated to): always under ``SERVE``, never under
        ``HOLD``, under ``WITNESS`` only while it holds a lease granted for
        confirming alone (the witness then refuses the peer any takeover)."""
        if self._promise is Promise.SERVE:
            return True
        if self._promise is Promise.HOLD:
            return False
        return self._lease_alone and self.lease_held(now)

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
        if self.witnessed:
            if self._state is HaState.ACTIVE:
                deadline = min(deadline, self._next_ask_at)
            if not self._lease_expiry_reported:
                deadline = min(deadline, self._lease_until)
            if not self._witness_silence_reported:
                deadline = min(deadline, self.witness_expires_at)
        return deadline

    @property
    def witness_expires_at(self) -> float:
        """When the witness counts as silent if it answers nothing more."""
        heard = self._witness_last_heard
        return (self._started_at if heard is None else heard) + self._timeout

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
        if self.witnessed:
            actions += self._tick_witness(now)
        return actions

    def _tick_witness(self, now: float) -> list[Action]:
        actions: list[Action] = []
        if not self._lease_expiry_reported and now >= self._lease_until:
            self._lease_expiry_reported = True
            self._lease_alone = False
            actions.append(LeaseExpired(self._lease_epoch))
            actions += self._fire(HaEvent.LEASE_EXPIRED, now, None)
        if not self._witness_silence_reported and now >= self.witness_expires_at:
            self._witness_silence_reported = True
            actions.append(WitnessSilent(self._witness_last_heard, self.witness_expires_at))
            actions += self._fire(HaEvent.WITNESS_SILENT, now, None)
        if self._state is HaState.ACTIVE and now >= self._next_ask_at:
            actions.append(self._ask(now, self._epoch, self._alone))
        return actions

    def _ask(self, now: float, epoch: int, alone: bool) -> AskWitness:
        request = LeaseRequest(self._next_request_id, self._node_id, epoch, self._timeout, alone)
        self._next_request_id += 1
        self._pending[request.id] = (now, request)
        if len(self._pending) > _MAX_PENDING:  # the witness is not answering: forget
            del self._pending[min(self._pending)]
        # a master renews every heartbeat interval; a node that wants to take over
        # asks four times as often (it waits for the old lease to run out)
        pace = self._interval if self._state is HaState.ACTIVE else self._interval / 4
        self._next_ask_at = now + pace
        return AskWitness(request)

    def _takeover_epoch(self) -> int:
        """The epoch a promotion would mint now."""
        return next_epoch(self._role, max(self._epoch, self._highest_heard))

    def set_alone(self, alone: bool, now: float) -> list[Action]:
        """The shell says whether our confirms now go without the peer holding them
        (no passive node replicated to, or not yet caught up). An active node with a
        witness asks at once for a lease that says so: confirms alone need one."""
        if alone == self._alone:
            return []
        self._alone = alone
        if not alone:
            self._lease_alone = False  # stop confirming alone before the witness hears
        if self.witnessed and self._state is HaState.ACTIVE:
            return [self._ask(now, self._epoch, alone)]
        return []

    def on_lease(self, answer: LeaseAnswer, now: float) -> list[Action]:
        """The witness answered a lease request (one we did not send, or already
        overtaken by a later answer, changes nothing but that the witness is heard)."""
        actions: list[Action] = []
        if self._witness_last_heard is None or self._witness_silence_reported:
            actions.append(WitnessHeard(answer.holder, answer.epoch))
        self._witness_last_heard = now
        self._witness_silence_reported = False
        pending = self._pending.pop(answer.re, None)
        if pending is None or not self.witnessed:
            return actions
        sent_at, request = pending
        if answer.granted:
            if request.id < self._lease_request:
                return actions  # overtaken: a later request's answer is in force
            renewal = self._state is HaState.ACTIVE and request.epoch == self._epoch
            takeover = self._state is not HaState.ACTIVE and request.epoch == self._takeover_epoch()
            if not renewal and not takeover:
                return actions
            self._lease_request = request.id
            self._lease_until = sent_at + request.ttl
            self._lease_epoch = request.epoch
            self._lease_alone = request.alone and request.alone == self._alone
            self._lease_expiry_reported = False
            actions += self._fire(HaEvent.LEASE_GRANTED, now, None, promote_to=request.epoch)
            return actions
        self._highest_heard = max(self._highest_heard, answer.epoch)
        actions += self._fire(HaEvent.LEASE_REFUSED, now, None, answer=answer)
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
        very request), refuse (PASSIVE with a live peer) or hold (starting, or, with a
        witness, waiting for its answer while the peer is silent)."""
        fired = self._fire(HaEvent.CLIENT_REQUEST, now, None)
        if self._state is HaState.ACTIVE:
            return ClientDecision(Verdict.ACCEPT, f"active in epoch {self._epoch}", tuple(fired))
        if self.witnessed and self.peer_silent(now):
            # the peer is silent: take over only if the witness grants a new epoch
            # (_fire asked it, at most four times per heartbeat interval)
            text = (
                f"node {self._node_id!r} is {self._state.value} and its peer is silent: "
                "asking the witness for the lease of a new epoch"
            )
            retry = now + self._interval / 4
            return ClientDecision(Verdict.HOLD, text, tuple(fired), retry_at=retry)
        actions = tuple(fired)
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
        status: dict[str, Any] = {
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
            "promise": self._promise.value,
            "confirms_alone": self.may_confirm_alone(now),
        }
        if self.witnessed:
            witness_heard = self._witness_last_heard
            status["witness"] = {
                "heard": witness_heard is not None and not self._witness_silence_reported,
                "last_answer_age": None if witness_heard is None else max(0.0, now - witness_heard),
                "lease_held": self.lease_held(now),
                "lease_epoch": self._lease_epoch,
                "lease_alone": self._lease_alone,
                "lease_left": max(0.0, self._lease_until - now),
            }
        return status

    # --- the one place the state changes ----------------------------------------------

    def _holds(
        self, now: float, hb: Heartbeat | None, answer: LeaseAnswer | None
    ) -> frozenset[Guard]:
        holds = set()
        silent = self.peer_silent(now)
        if not self.witnessed:
            holds.add(Guard.UNWITNESSED)
            if silent:
                holds.add(Guard.UNWITNESSED_SILENCE)
            if self._role is HaRole.PRIMARY:
                holds.add(Guard.UNWITNESSED_PRIMARY)
        peer_state = self.peer_state
        if silent or (peer_state is not None and peer_state is not HaState.ACTIVE):
            holds.add(Guard.PEER_YIELDS)
        if hb is not None and (
            hb.epoch > self._epoch or (hb.epoch == self._epoch and hb.role is HaRole.PRIMARY)
        ):
            holds.add(Guard.PEER_OUTRANKS)
        if not self.witnessed or (hb is not None and hb.epoch >= self._epoch):
            holds.add(Guard.PEER_CURRENT)
        if (
            answer is not None
            and answer.holder not in (None, self._node_id)
            and answer.epoch > self._epoch
        ):
            holds.add(Guard.LEASE_SUPERSEDED)
        return frozenset(holds)

    def _wants_witness(self, event: HaEvent, now: float, holds: frozenset[Guard]) -> bool:
        """With a witness, a passive or starting node asks it for a new epoch where
        a pair without one would promote it, and also when it has been starting for
        two failover timeouts and hears a peer that is not active (the witness
        refused the peer: we may be the node it waits for, the one that confirmed
        alone last). Two: the lease we held before restarting runs out within one,
        and the peer, which asks at once, should win a plain restart."""
        if event not in _PEER_OR_CLIENT or self._state is HaState.ACTIVE:
            return False
        unwitnessed = holds | {Guard.UNWITNESSED}
        if self.peer_silent(now):
            unwitnessed |= {Guard.UNWITNESSED_SILENCE}
        if self._role is HaRole.PRIMARY:
            unwitnessed |= {Guard.UNWITNESSED_PRIMARY}
        if next_state(self._state, event, frozenset(unwitnessed)) is HaState.ACTIVE:
            return True
        return (
            self._state.is_starting
            and event is not HaEvent.CLIENT_REQUEST
            and Guard.PEER_YIELDS in holds
            and now - self._started_at >= 2 * self._timeout
        )

    def _fire(
        self,
        event: HaEvent,
        now: float,
        hb: Heartbeat | None,
        *,
        answer: LeaseAnswer | None = None,
        promote_to: int | None = None,
    ) -> list[Action]:
        old = self._state
        holds = self._holds(now, hb, answer)
        new = next_state(old, event, holds)
        actions: list[Action] = []
        if (
            self.witnessed
            and new is not HaState.ACTIVE
            and now >= self._next_ask_at
            and self._wants_witness(event, now, holds)
        ):
            # not "alone": only a master that confirms without its peer says so
            actions.append(self._ask(now, self._takeover_epoch(), False))
        if new is HaState.ACTIVE and old is not HaState.ACTIVE:
            minted = self._takeover_epoch()
            assert promote_to is None or promote_to == minted  # on_lease checked it
            self._epoch = minted
            actions.append(PersistEpoch(self._epoch))
            self._state = new
            self._alone = False  # until the shell says otherwise (set_alone)
            if promote_to is None:
                self._next_ask_at = now  # with a witness: ask for the lease at once
            actions.append(BecameActive(old, event, self._epoch))
            return actions
        peer_id = hb.node_id if hb is not None else None
        if new is HaState.PASSIVE and old is HaState.ACTIVE:
            if hb is not None:  # an outranking active peer
                reason = self._fence_reason(hb)
            else:  # the witness granted the other node a higher epoch
                assert answer is not None and answer.holder is not None
                peer_id = answer.holder
                reason = (
                    f"fenced: the witness granted node {answer.holder!r} epoch "
                    f"{answer.epoch} > {self._epoch}; this node is now passive"
                )
            actions.append(CloseClients(reason))
            self._lease_until = 0.0
            self._lease_alone = False
            self._lease_expiry_reported = True
        self._state = new
        if new is not HaState.ACTIVE and self._highest_heard > self._epoch:
            self._epoch = self._highest_heard
            actions.append(PersistEpoch(self._epoch))
        if new is HaState.PASSIVE and old is not HaState.PASSIVE:
            assert peer_id is not None  # a heartbeat or the witness names the master
            actions.append(BecamePassive(old, event, self._epoch, peer_id))
        return actions

    def _fence_reason(self, hb: Heartbeat) -> str:
        if hb.epoch > self._epoch:
            why = f"a higher epoch ({hb.epoch} > {self._epoch})"
        else:
            why = f"the same epoch ({hb.epoch}) and it is the primary"
        return f"fenced: peer {hb.node_id!r} is active with {why}; this node is now passive"
