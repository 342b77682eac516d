"""Helpers for the HA tests: machines of each role, hand-made heartbeats, and a
perfect link that lets two machines hear each other."""

from __future__ import annotations

from amqlite.ha import (
    Action,
    AskWitness,
    HaMachine,
    HaRole,
    HaState,
    Heartbeat,
    LeaseAnswer,
    Promise,
)

P, B = HaRole.PRIMARY, HaRole.BACKUP
NODE = {P: "p", B: "b"}
TIMEOUT = 1.0
INTERVAL = 0.2


def machine(
    role: HaRole,
    now: float = 0.0,
    epoch: int = 0,
    vhost: str = "/",
    promise: Promise = Promise.SERVE,
) -> HaMachine:
    return HaMachine(
        role,
        NODE[role],
        vhost,
        now=now,
        epoch=epoch,
        heartbeat=INTERVAL,
        failover_timeout=TIMEOUT,
        promise=promise,
    )


def asks(actions: list[Action] | tuple[Action, ...]) -> list[AskWitness]:
    return [a for a in actions if isinstance(a, AskWitness)]


def grant(m: HaMachine, ask: AskWitness, now: float) -> list[Action]:
    """The witness grants ``ask`` (the lease now stands as asked)."""
    req = ask.request
    return m.on_lease(LeaseAnswer(req.id, True, req.node, req.epoch, req.alone), now)


def refuse(
    m: HaMachine, ask: AskWitness, now: float, holder: str, epoch: int, stale: bool = False
) -> list[Action]:
    """The witness refuses ``ask``: ``holder`` holds the lease in ``epoch``."""
    return m.on_lease(LeaseAnswer(ask.request.id, False, holder, epoch, stale, "held"), now)


def hb(
    role: HaRole,
    state: HaState | None = None,
    epoch: int = 0,
    vhost: str = "/",
    node: str | None = None,
) -> Heartbeat:
    """A heartbeat from a node of ``role`` (by default starting)."""
    return Heartbeat(
        node_id=NODE[role] if node is None else node,
        role=role,
        state=role.starting_state if state is None else state,
        epoch=epoch,
        vhost=vhost,
    )


def hear(receiver: HaMachine, sender: HaMachine, now: float) -> list[Action]:
    """``receiver`` hears ``sender``'s current heartbeat at ``now``."""
    return receiver.on_heartbeat(sender.heartbeat(), now)


def exchange(a: HaMachine, b: HaMachine, now: float, rounds: int = 3) -> None:
    """Heartbeats both ways, a few times (a healthy link)."""
    for _ in range(rounds):
        hear(a, b, now)
        hear(b, a, now)
