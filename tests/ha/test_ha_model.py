"""Two HA machines on a simulated clock and a bad link, driven by hypothesis.

The link drops, delays, duplicates and reorders heartbeats; nodes crash and
restart (a restarted node keeps the epoch it persisted); clients ask either node
for service. Checked:

- safety, at every simulated instant (after every delivery, tick and client
  request): the nodes that would accept a client operation (ACTIVE, i.e. not yet
  fenced) never include two with the same epoch; stronger, no epoch is ever minted
  twice, and every promotion persisted its epoch before it became active;
- liveness: once the link is healthy for long enough, a node is up and a client
  asks (primary first, then backup), exactly one node is ACTIVE, and it stays so.
"""

from __future__ import annotations

import heapq
import random

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from amqlite.ha import (
    Action,
    BecameActive,
    BecamePassive,
    CloseClients,
    HaMachine,
    HaRole,
    HaState,
    Heartbeat,
    PersistEpoch,
    SendHeartbeat,
)

from .support import TIMEOUT, B, P, machine

ROLES = st.sampled_from([P, B])
HEALTHY_DELAY = 0.02


class HaPair(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.persisted = {P: 0, B: 0}
        self.nodes: dict[HaRole, HaMachine | None] = {P: machine(P), B: machine(B)}
        self.link: list[tuple[float, int, HaRole, Heartbeat]] = []  # (due, seq, to, beat)
        self.seq = 0
        self.rng = random.Random(0)
        self.loss = {P: 0.0, B: 0.0}  # by receiver: the link may fail one way only
        self.max_delay, self.dup = HEALTHY_DELAY, 0.0
        self.minted: set[int] = set()

    # --- the simulated world ---------------------------------------------------------

    def _up(self) -> dict[HaRole, HaMachine]:
        return {role: m for role, m in self.nodes.items() if m is not None}

    def _apply(self, role: HaRole, actions: list[Action] | tuple[Action, ...]) -> None:
        m = self.nodes[role]
        assert m is not None
        for i, action in enumerate(actions):
            if isinstance(action, PersistEpoch):
                assert action.epoch > self.persisted[role], "an epoch went backwards"
                self.persisted[role] = action.epoch
            elif isinstance(action, BecameActive):
                assert self.persisted[role] == action.epoch, "active before persisting"
                assert action.epoch not in self.minted, f"epoch {action.epoch} minted twice"
                self.minted.add(action.epoch)
                event(f"promoted on {action.event.value} from {action.previous.value}")
            elif isinstance(action, CloseClients):
                assert isinstance(actions[-1], BecamePassive), "fenced but not demoted"
                assert not any(isinstance(a, PersistEpoch | BecamePassive) for a in actions[:i])
                event("fenced")
            elif isinstance(action, SendHeartbeat):
                self._send(role.other, action.heartbeat)
        assert m.epoch == self.persisted[role]
        self._check_safety()

    def _send(self, to: HaRole, beat: Heartbeat) -> None:
        if self.rng.random() < self.loss[to]:
            return
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            self.seq += 1
            due = self.now + self.rng.uniform(0.0, self.max_delay)
            heapq.heappush(self.link, (due, self.seq, to, beat))

    def _run_until(self, until: float) -> None:
        while True:
            due = [float("inf"), *(m.next_deadline() for m in self._up().values())]
            if self.link:
                due.append(self.link[0][0])
            step = min(due)
            if step > until:
                break
            self.now = max(self.now, step)
            while self.link and self.link[0][0] <= self.now:
                _, _, to, beat = heapq.heappop(self.link)
                receiver = self.nodes[to]
                if receiver is not None:  # a down node loses what reaches it
                    self._apply(to, receiver.on_heartbeat(beat, self.now))
            for role, m in self._up().items():
                if m.next_deadline() <= self.now:
                    self._apply(role, m.tick(self.now))
        self.now = max(self.now, until)

    def _check_safety(self) -> None:
        accepting = [m for m in self._up().values() if m.accepting_clients]
        epochs = [m.epoch for m in accepting]
        assert len(epochs) == len(set(epochs)), f"two active nodes in epoch {epochs}"
        if len(accepting) == 2:
            event("two active nodes, different epochs")
        for m in accepting:
            assert m.state is HaState.ACTIVE

    def _client(self, role: HaRole) -> bool:
        m = self.nodes[role]
        if m is None:
            return False
        decision = m.on_client_request(self.now)
        self._apply(role, decision.actions)
        assert decision.accepted == m.accepting_clients
        return decision.accepted

    def _settle(self) -> None:
        """Heal the link, wait out what is still in flight, then let a client ask
        (primary first, then backup) every 100 ms: exactly one node ends ACTIVE."""
        self.loss = {P: 0.0, B: 0.0}
        self.max_delay, self.dup = HEALTHY_DELAY, 0.0
        settled = max([self.now, *(due for due, *_ in self.link)]) + 3 * TIMEOUT
        master: HaRole | None = None
        while self.now < settled + 2.0:
            self._run_until(self.now + 0.1)
            if not self._client(P):
                self._client(B)
            if self.now >= settled:
                up = self._up()
                active = [r for r, m in up.items() if m.state is HaState.ACTIVE]
                assert len(active) == 1, {r.value: m.state for r, m in up.items()}
                assert master in (None, active[0]), "the master changed on a healthy link"
                master = active[0]
                if len(up) == 2:
                    assert up[master.other].state is HaState.PASSIVE

    # --- rules -----------------------------------------------------------------------

    @rule(dt=st.sampled_from([0.05, 0.2, 0.5, 1.0, 1.5, 3.0]))
    def advance(self, dt: float) -> None:
        self._run_until(self.now + dt)

    @rule(
        loss=st.sampled_from([0.0, 0.3, 0.7]),
        max_delay=st.sampled_from([0.0, HEALTHY_DELAY, 0.3, 1.5]),
        dup=st.sampled_from([0.0, 0.2]),
        seed=st.integers(0, 2**16),
    )
    def set_link(self, loss: float, max_delay: float, dup: float, seed: int) -> None:
        self.loss = {P: loss, B: loss}
        self.max_delay, self.dup = max_delay, dup
        self.rng = random.Random(seed)

    @rule(towards=st.sampled_from([P, B, None]))
    def cut_link(self, towards: HaRole | None) -> None:
        """Lose everything sent towards one node (a one-way cut), or both ways."""
        for role in (P, B):
            if towards in (None, role):
                self.loss[role] = 1.0

    @rule(towards=st.sampled_from([P, B, None]))
    def cut_and_ask_both(self, towards: HaRole | None) -> None:
        """A likely split brain: cut the link, wait out the failover timeout, and let
        clients ask both nodes."""
        self.cut_link(towards)
        self._run_until(self.now + 1.5 * TIMEOUT)
        self._client(P)
        self._client(B)

    @rule(role=ROLES)
    def crash(self, role: HaRole) -> None:
        self.nodes[role] = None

    @rule(role=ROLES)
    def restart(self, role: HaRole) -> None:
        """Start the node again (crashing it first if it is up) with its epoch."""
        self.nodes[role] = machine(role, now=self.now, epoch=self.persisted[role])
        self._check_safety()

    @rule(role=ROLES)
    def client_request(self, role: HaRole) -> None:
        self._client(role)

    @precondition(lambda self: any(m is not None for m in self.nodes.values()))
    @rule()
    def heal_and_settle(self) -> None:
        """Liveness needs a node up: with both down nobody can serve."""
        self._settle()

    @invariant()
    def safe(self) -> None:
        self._check_safety()


HaPair.TestCase.settings = settings(
    max_examples=75,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestHaPair = HaPair.TestCase
