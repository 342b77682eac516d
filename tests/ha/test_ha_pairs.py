"""Every (state, event) pair through a real machine: each state is reached by real
heartbeats and client requests, then one event fires and the machine must land in
the exact expected state (or raise). Guarded pairs are run once per guard outcome,
and states both roles can hold are run for both roles."""

from __future__ import annotations

import itertools

import pytest

from amqlite.ha import HaConfigError, HaError, HaEvent, HaMachine, HaRole, HaState

from .support import TIMEOUT, B, P, hb, machine

S, E = HaState, HaEvent

# When the machine under test reached its state (the peer was last heard then).
T0 = 10.0
FRESH = T0 + TIMEOUT / 2
SILENT = T0 + TIMEOUT


def machine_in(state: HaState, role: HaRole) -> HaMachine:
    """A machine of ``role`` in ``state``, its peer last heard at ``T0`` (starting
    machines: started at T0, peer never heard)."""
    if state.is_starting:
        assert state is role.starting_state
        return machine(role, now=T0)
    m = machine(role, now=0.0)
    if role is P and state is S.ACTIVE:
        m.on_heartbeat(hb(B), T0)  # the normal start: epoch 1
    elif role is P:
        m.on_heartbeat(hb(B, S.ACTIVE, epoch=2), T0)
    elif state is S.PASSIVE:
        m.on_heartbeat(hb(P, S.ACTIVE, epoch=1), T0)
    else:  # the backup fails over: passive, then the primary goes silent
        m.on_heartbeat(hb(P, S.ACTIVE, epoch=1), T0 - 5)
        assert m.on_client_request(T0 - 5 + TIMEOUT).accepted
        m.on_heartbeat(hb(P, S.PRIMARY, epoch=1), T0)  # it restarts and hears us...
    assert m.state is state
    return m


def fire(m: HaMachine, event: HaEvent, scenario: str) -> None:
    """Fire ``event`` at ``m``; ``scenario`` picks the guard's outcome."""
    peer = m.role.other
    if event is E.CLIENT_REQUEST:
        m.on_client_request(SILENT if scenario == "silent" else FRESH)
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
    m = machine_in(state, role)
    if isinstance(expected, type) and issubclass(expected, HaError):
        before = (m.state, m.epoch)
        with pytest.raises(expected):
            fire(m, event, scenario)
        assert (m.state, m.epoch) == before  # a fatal error changes nothing
    else:
        fire(m, event, scenario)
        assert m.state is expected
