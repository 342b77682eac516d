"""Every (state, event) pair through a real machine: each state is reached by real
heartbeats and client requests, then one event fires and the machine must land in
the exact expected state (or raise). Guarded pairs are run once per guard outcome,
and states both roles can hold are run for both roles."""

from __future__ import annotations

import itertools

import pytest

from amqlite.ha import HaConfigError, HaError, HaEvent, HaMachine, HaRole, HaState, Promise

from .support import TIMEOUT, B, P, asks, grant, hb, machine, refuse

S, E = HaState, HaEvent

# When the machine under test reached its state (the peer was last heard then).
T0 = 10.0
FRESH = T0 + TIMEOUT / 2
SILENT = T0 + TIMEOUT


W = Promise.WITNESS
#: the events only a witnessed pair sees; their rows run with a witness
LEASE_EVENTS = (E.LEASE_GRANTED, E.LEASE_REFUSED, E.LEASE_EXPIRED, E.WITNESS_SILENT)


def machine_in(state: HaState, role: HaRole, promise: Promise = Promise.SERVE) -> HaMachine:
    """A machine of ``role`` in ``state``, its peer last heard at ``T0`` (starting
    machines: started at T0, peer never heard)."""
    if state.is_starting:
        assert state is role.starting_state
        return machine(role, now=T0, promise=promise)
    m = machine(role, now=0.0, promise=promise)
    if role is P and state is S.ACTIVE:
        actions = m.on_heartbeat(hb(B), T0)  # the normal start: epoch 1
        for ask in asks(actions):  # with a witness, once it grants epoch 1
            grant(m, ask, T0)
    elif role is P:
        m.on_heartbeat(hb(B, S.ACTIVE, epoch=2), T0)
    elif state is S.PASSIVE:
        m.on_heartbeat(hb(P, S.ACTIVE, epoch=1), T0)
    else:  # the backup fails over: passive, then the primary goes silent
        m.on_heartbeat(hb(P, S.ACTIVE, epoch=1), T0 - 5)
        decision = m.on_client_request(T0 - 5 + TIMEOUT)
        if promise is W:  # the witness grants the new epoch
            grant(m, asks(decision.actions)[0], T0 - 5 + TIMEOUT)
        else:
            assert decision.accepted
        m.on_heartbeat(hb(P, S.PRIMARY, epoch=1), T0)  # it restarts and hears us...
    assert m.state is state
    return m


def fire(m: HaMachine, event: HaEvent, scenario: str) -> None:
    """Fire ``event`` at ``m``; ``scenario`` picks the guard's outcome."""
    peer = m.role.other
    if event is E.CLIENT_REQUEST:
        m.on_client_request(SILENT if scenario == "silent" else FRESH)
        return
    if event in LEASE_EVENTS:
        fire_witness(m, event, scenario)
        return
    state = {
        E.PEER_PRIMARY: S.PRIMARY,
        E.PEER_BACKUP: S.BACKUP,
        E.PEER_ACTIVE: S.ACTIVE,
        E.PEER_PASSIVE: S.PASSIVE,
    }[event]
    # a starting state names its sender's role; a peer of our own role is a config error
    sender = {S.PRIMARY: P, S.BACKUP: B}.get(state, peer)
    epoch = m.epoch + {"higher": 2, "equal": 0, "lower": -1, "": 0}[scenario]
    m.on_heartbeat(hb(sender, state, epoch=max(epoch, 0), node="peer"), FRESH)


def _ask(m: HaMachine, now: float) -> object:
    """Make ``m`` ask the witness (a renewal when active, else a takeover)."""
    actions = m.tick(now) if m.state is S.ACTIVE else m.on_client_request(now).actions
    found = asks(actions)
    assert len(found) == 1, found
    return found[0]


def fire_witness(m: HaMachine, event: HaEvent, scenario: str) -> None:
    """The witness's events. ``silent`` / ``fresh``: the peer silent or heard again
    (with the epoch already known) when the answer comes; ``superseded`` / ``held``:
    the other node holds the lease in a higher / lower epoch."""
    if event is E.WITNESS_SILENT:
        m.tick(SILENT)  # never heard since start-up (at 0 or T0)
        assert m.status(SILENT)["witness"]["heard"] is False
        return
    ask = _ask(m, SILENT)
    if event is E.LEASE_GRANTED:
        if scenario == "fresh":  # heard again, as we knew it: nothing moves but the guard
            # the heartbeat that leaves each state as it is
            heard = {S.PRIMARY: S.PASSIVE, S.BACKUP: S.PRIMARY, S.PASSIVE: S.ACTIVE}[m.state]
            beat = hb(m.role.other, heard, epoch=m.epoch, node="peer")
            m.on_heartbeat(beat, SILENT)
        grant(m, ask, SILENT)  # type: ignore[arg-type]
    elif event is E.LEASE_REFUSED:
        epoch = m.epoch + (2 if scenario == "superseded" else -1)
        refuse(m, ask, SILENT, "peer", max(epoch, 0))  # type: ignore[arg-type]
    else:  # LEASE_EXPIRED: granted, then a whole ttl without a renewal answered
        grant(m, ask, SILENT)  # type: ignore[arg-type]
        m.tick(SILENT + TIMEOUT)


R = HaConfigError  # a peer of our own role: raised before the table is consulted
ROWS: list[tuple[HaRole, HaState, HaEvent, str, object]] = [
    # a starting primary
    (P, S.PRIMARY, E.PEER_PRIMARY, "", R),
    (P, S.PRIMARY, E.PEER_BACKUP, "", S.ACTIVE),
    (P, S.PRIMARY, E.PEER_ACTIVE, "", S.PASSIVE),
    (P, S.PRIMARY, E.PEER_PASSIVE, "", S.PRIMARY),
    (P, S.PRIMARY, E.CLIENT_REQUEST, "fresh", S.PRIMARY),
    (P, S.PRIMARY, E.CLIENT_REQUEST, "silent", S.ACTIVE),
    # a starting backup
    (B, S.BACKUP, E.PEER_PRIMARY, "", S.BACKUP),
    (B, S.BACKUP, E.PEER_BACKUP, "", R),
    (B, S.BACKUP, E.PEER_ACTIVE, "", S.PASSIVE),
    (B, S.BACKUP, E.PEER_PASSIVE, "", S.BACKUP),
    (B, S.BACKUP, E.CLIENT_REQUEST, "fresh", S.BACKUP),
    (B, S.BACKUP, E.CLIENT_REQUEST, "silent", S.ACTIVE),
    # an active primary
    (P, S.ACTIVE, E.PEER_PRIMARY, "", R),
    (P, S.ACTIVE, E.PEER_BACKUP, "", S.ACTIVE),
    (P, S.ACTIVE, E.PEER_ACTIVE, "higher", S.PASSIVE),
    (P, S.ACTIVE, E.PEER_ACTIVE, "equal", S.ACTIVE),
    (P, S.ACTIVE, E.PEER_ACTIVE, "lower", S.ACTIVE),
    (P, S.ACTIVE, E.PEER_PASSIVE, "", S.ACTIVE),
    (P, S.ACTIVE, E.CLIENT_REQUEST, "fresh", S.ACTIVE),
    (P, S.ACTIVE, E.CLIENT_REQUEST, "silent", S.ACTIVE),
    # an active backup
    (B, S.ACTIVE, E.PEER_PRIMARY, "", S.ACTIVE),
    (B, S.ACTIVE, E.PEER_BACKUP, "", R),
    (B, S.ACTIVE, E.PEER_ACTIVE, "higher", S.PASSIVE),
    (B, S.ACTIVE, E.PEER_ACTIVE, "equal", S.PASSIVE),  # the primary wins
    (B, S.ACTIVE, E.PEER_ACTIVE, "lower", S.ACTIVE),
    (B, S.ACTIVE, E.PEER_PASSIVE, "", S.ACTIVE),
    (B, S.ACTIVE, E.CLIENT_REQUEST, "fresh", S.ACTIVE),
    (B, S.ACTIVE, E.CLIENT_REQUEST, "silent", S.ACTIVE),
    # a passive primary
    (P, S.PASSIVE, E.PEER_PRIMARY, "", R),
    (P, S.PASSIVE, E.PEER_BACKUP, "", S.ACTIVE),
    (P, S.PASSIVE, E.PEER_ACTIVE, "", S.PASSIVE),
    (P, S.PASSIVE, E.PEER_PASSIVE, "", S.ACTIVE),  # dual passive: the primary takes over
    (P, S.PASSIVE, E.CLIENT_REQUEST, "fresh", S.PASSIVE),
    (P, S.PASSIVE, E.CLIENT_REQUEST, "silent", S.ACTIVE),
    # a passive backup
    (B, S.PASSIVE, E.PEER_PRIMARY, "", S.ACTIVE),
    (B, S.PASSIVE, E.PEER_BACKUP, "", R),
    (B, S.PASSIVE, E.PEER_ACTIVE, "", S.PASSIVE),
    (B, S.PASSIVE, E.PEER_PASSIVE, "", S.PASSIVE),
    (B, S.PASSIVE, E.CLIENT_REQUEST, "fresh", S.PASSIVE),
    (B, S.PASSIVE, E.CLIENT_REQUEST, "silent", S.ACTIVE),
    # with a witness: promotions wait for the witness (the node asks it instead)
    (P, S.PRIMARY, E.PEER_BACKUP, "w-", S.PRIMARY),
    (P, S.PASSIVE, E.PEER_BACKUP, "w-", S.PASSIVE),
    (P, S.PASSIVE, E.PEER_PASSIVE, "w-", S.PASSIVE),
    (B, S.PASSIVE, E.PEER_PRIMARY, "w-", S.PASSIVE),
    # with a witness: the lease and the witness's silence
    (P, S.PRIMARY, E.CLIENT_REQUEST, "w-silent", S.PRIMARY),  # asks the witness instead
    (P, S.PRIMARY, E.LEASE_GRANTED, "silent", S.ACTIVE),
    (P, S.PRIMARY, E.LEASE_GRANTED, "fresh", S.ACTIVE),  # heard passive: it yields
    (P, S.PRIMARY, E.LEASE_REFUSED, "superseded", S.PRIMARY),
    (P, S.PRIMARY, E.LEASE_EXPIRED, "", S.ACTIVE),  # granted first: promoted, then expired
    (P, S.PRIMARY, E.WITNESS_SILENT, "", S.PRIMARY),
    (B, S.BACKUP, E.CLIENT_REQUEST, "w-silent", S.BACKUP),
    (B, S.BACKUP, E.LEASE_GRANTED, "silent", S.ACTIVE),
    (B, S.BACKUP, E.LEASE_GRANTED, "fresh", S.ACTIVE),  # heard starting: it yields
    (B, S.BACKUP, E.LEASE_REFUSED, "superseded", S.BACKUP),
    (B, S.BACKUP, E.LEASE_EXPIRED, "", S.ACTIVE),
    (B, S.BACKUP, E.WITNESS_SILENT, "", S.BACKUP),
    (P, S.ACTIVE, E.CLIENT_REQUEST, "w-silent", S.ACTIVE),
    (P, S.ACTIVE, E.LEASE_GRANTED, "silent", S.ACTIVE),
    (P, S.ACTIVE, E.LEASE_REFUSED, "superseded", S.PASSIVE),
    (P, S.ACTIVE, E.LEASE_REFUSED, "held", S.ACTIVE),
    (P, S.ACTIVE, E.LEASE_EXPIRED, "", S.ACTIVE),
    (P, S.ACTIVE, E.WITNESS_SILENT, "", S.ACTIVE),
    (B, S.ACTIVE, E.CLIENT_REQUEST, "w-silent", S.ACTIVE),
    (B, S.ACTIVE, E.LEASE_GRANTED, "silent", S.ACTIVE),
    (B, S.ACTIVE, E.LEASE_REFUSED, "superseded", S.PASSIVE),
    (B, S.ACTIVE, E.LEASE_REFUSED, "held", S.ACTIVE),
    (B, S.ACTIVE, E.LEASE_EXPIRED, "", S.ACTIVE),
    (B, S.ACTIVE, E.WITNESS_SILENT, "", S.ACTIVE),
    (P, S.PASSIVE, E.CLIENT_REQUEST, "w-silent", S.PASSIVE),
    (P, S.PASSIVE, E.LEASE_GRANTED, "silent", S.ACTIVE),
    (P, S.PASSIVE, E.LEASE_GRANTED, "fresh", S.PASSIVE),
    (P, S.PASSIVE, E.LEASE_REFUSED, "superseded", S.PASSIVE),
    (P, S.PASSIVE, E.LEASE_EXPIRED, "", S.ACTIVE),
    (P, S.PASSIVE, E.WITNESS_SILENT, "", S.PASSIVE),
    (B, S.PASSIVE, E.CLIENT_REQUEST, "w-silent", S.PASSIVE),
    (B, S.PASSIVE, E.LEASE_GRANTED, "silent", S.ACTIVE),
    (B, S.PASSIVE, E.LEASE_GRANTED, "fresh", S.PASSIVE),
    (B, S.PASSIVE, E.LEASE_REFUSED, "superseded", S.PASSIVE),
    (B, S.PASSIVE, E.LEASE_EXPIRED, "", S.ACTIVE),
    (B, S.PASSIVE, E.WITNESS_SILENT, "", S.PASSIVE),
]


def test_rows_cover_every_pair_for_every_role_that_can_hold_the_state() -> None:
    covered = {(role, state, event) for role, state, event, _, _ in ROWS}
    wanted = {
        (role, state, event)
        for role, state, event in itertools.product(HaRole, HaState, HaEvent)
        if not state.is_starting or state is role.starting_state
    }
    assert covered == wanted


@pytest.mark.parametrize(
    ("role", "state", "event", "scenario", "expected"),
    [
        pytest.param(*row, id=f"{row[0].value}-{row[1].name}-{row[2].name}-{row[3] or 'any'}")
        for row in ROWS
    ],
)
def test_pair(
    role: HaRole, state: HaState, event: HaEvent, scenario: str, expected: object
) -> None:
    witnessed = event in LEASE_EVENTS or scenario.startswith("w-")
    m = machine_in(state, role, W if witnessed else Promise.SERVE)
    scenario = scenario.removeprefix("w-")
    if isinstance(expected, type) and issubclass(expected, HaError):
        before = (m.state, m.epoch)
        with pytest.raises(expected):
            fire(m, event, scenario)
        assert (m.state, m.epoch) == before  # a fatal error changes nothing
    else:
        fire(m, event, scenario)
        assert m.state is expected
