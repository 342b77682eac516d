"""The transition table against an independent spec: every (state, event) pair,
under every combination of guards, moves to the exact expected state or raises."""

from __future__ import annotations

import itertools

import pytest

from amqlite.ha import ILLEGAL, TRANSITIONS, Branch, Guard, HaEvent, HaState, IllegalTransition
from amqlite.ha import next_state as table_next_state

S, E, G = HaState, HaEvent, Guard
RAISES = "raises"

# The spec, written out independently of amqlite/ha/states.py. A tuple is
# (guard, next state when it holds, next state when it does not).
SPEC: dict[tuple[HaState, HaEvent], object] = {
    (S.PRIMARY, E.PEER_PRIMARY): RAISES,  # two primaries
    (S.PRIMARY, E.PEER_BACKUP): (G.UNWITNESSED, S.ACTIVE, S.PRIMARY),
    (S.PRIMARY, E.PEER_ACTIVE): (G.PEER_CURRENT, S.PASSIVE, S.PRIMARY),
    (S.PRIMARY, E.PEER_PASSIVE): S.PRIMARY,
    (S.PRIMARY, E.CLIENT_REQUEST): (G.UNWITNESSED_SILENCE, S.ACTIVE, S.PRIMARY),
    (S.PRIMARY, E.LEASE_GRANTED): (G.PEER_YIELDS, S.ACTIVE, S.PRIMARY),
    (S.PRIMARY, E.LEASE_REFUSED): S.PRIMARY,
    (S.PRIMARY, E.LEASE_EXPIRED): S.PRIMARY,
    (S.PRIMARY, E.WITNESS_SILENT): S.PRIMARY,
    (S.BACKUP, E.PEER_PRIMARY): S.BACKUP,
    (S.BACKUP, E.PEER_BACKUP): RAISES,  # two backups
    (S.BACKUP, E.PEER_ACTIVE): (G.PEER_CURRENT, S.PASSIVE, S.BACKUP),
    (S.BACKUP, E.PEER_PASSIVE): S.BACKUP,
    (S.BACKUP, E.CLIENT_REQUEST): (G.UNWITNESSED_SILENCE, S.ACTIVE, S.BACKUP),
    (S.BACKUP, E.LEASE_GRANTED): (G.PEER_YIELDS, S.ACTIVE, S.BACKUP),
    (S.BACKUP, E.LEASE_REFUSED): S.BACKUP,
    (S.BACKUP, E.LEASE_EXPIRED): S.BACKUP,
    (S.BACKUP, E.WITNESS_SILENT): S.BACKUP,
    (S.ACTIVE, E.PEER_PRIMARY): S.ACTIVE,
    (S.ACTIVE, E.PEER_BACKUP): S.ACTIVE,
    (S.ACTIVE, E.PEER_ACTIVE): (G.PEER_OUTRANKS, S.PASSIVE, S.ACTIVE),
    (S.ACTIVE, E.PEER_PASSIVE): S.ACTIVE,
    (S.ACTIVE, E.CLIENT_REQUEST): S.ACTIVE,
    (S.ACTIVE, E.LEASE_GRANTED): S.ACTIVE,
    (S.ACTIVE, E.LEASE_REFUSED): (G.LEASE_SUPERSEDED, S.PASSIVE, S.ACTIVE),
    (S.ACTIVE, E.LEASE_EXPIRED): S.ACTIVE,
    (S.ACTIVE, E.WITNESS_SILENT): S.ACTIVE,
    (S.PASSIVE, E.PEER_PRIMARY): (G.UNWITNESSED, S.ACTIVE, S.PASSIVE),
    (S.PASSIVE, E.PEER_BACKUP): (G.UNWITNESSED, S.ACTIVE, S.PASSIVE),
    (S.PASSIVE, E.PEER_ACTIVE): S.PASSIVE,
    (S.PASSIVE, E.PEER_PASSIVE): (G.UNWITNESSED_PRIMARY, S.ACTIVE, S.PASSIVE),
    (S.PASSIVE, E.CLIENT_REQUEST): (G.UNWITNESSED_SILENCE, S.ACTIVE, S.PASSIVE),
    (S.PASSIVE, E.LEASE_GRANTED): (G.PEER_YIELDS, S.ACTIVE, S.PASSIVE),
    (S.PASSIVE, E.LEASE_REFUSED): S.PASSIVE,
    (S.PASSIVE, E.LEASE_EXPIRED): S.PASSIVE,
    (S.PASSIVE, E.WITNESS_SILENT): S.PASSIVE,
}

GUARD_SETS = [
    frozenset(combo)
    for size in range(len(Guard) + 1)
    for combo in itertools.combinations(Guard, size)
]

CASES = [
    pytest.param(
        state,
        event,
        holds,
        id=f"{state.name}-{event.name}-{'+'.join(sorted(g.value for g in holds)) or 'none'}",
    )
    for state, event in itertools.product(HaState, HaEvent)
    for holds in GUARD_SETS
]


def _expected(state: HaState, event: HaEvent, holds: frozenset[Guard]) -> object:
    spec = SPEC[(state, event)]
    if isinstance(spec, tuple):
        guard, then, otherwise = spec
        return then if guard in holds else otherwise
    return spec


def test_spec_covers_the_cross_product() -> None:
    assert set(SPEC) == set(itertools.product(HaState, HaEvent))


@pytest.mark.parametrize(("state", "event", "holds"), CASES)
def test_every_pair_under_every_guard(
    state: HaState, event: HaEvent, holds: frozenset[Guard]
) -> None:
    expected = _expected(state, event, holds)
    if expected == RAISES:
        with pytest.raises(IllegalTransition) as caught:
            table_next_state(state, event, holds)
        assert caught.value.state == state.value
        assert caught.value.event == event.value
        assert caught.value.reason == ILLEGAL[(state, event)]
    else:
        assert table_next_state(state, event, holds) is expected


def test_illegal_pairs_are_exactly_the_missing_ones() -> None:
    missing = set(itertools.product(HaState, HaEvent)) - set(TRANSITIONS)
    assert missing == set(ILLEGAL)
    assert all("configured" in reason for reason in ILLEGAL.values())


def test_illegal_transition_message_names_the_pair_and_the_reason() -> None:
    with pytest.raises(IllegalTransition) as caught:
        table_next_state(S.PRIMARY, E.PEER_PRIMARY)
    text = str(caught.value)
    assert "'primary'" in text
    assert "'peer_primary'" in text
    assert "both nodes are configured as the primary" in text


def test_starting_states_are_never_entered_again() -> None:
    """A node leaves its starting state only for ACTIVE or PASSIVE."""
    for (state, _), outcome in TRANSITIONS.items():
        targets = {outcome.then, outcome.otherwise} if isinstance(outcome, Branch) else {outcome}
        for target in targets:
            assert not target.is_starting or target is state


def test_only_a_newer_master_demotes_an_active_node() -> None:
    """An outranking active peer, or the witness naming the other node's higher
    epoch; losing the lease or the witness alone never demotes."""
    for (state, event), outcome in TRANSITIONS.items():
        if state is not S.ACTIVE:
            continue
        targets = {outcome.then, outcome.otherwise} if isinstance(outcome, Branch) else {outcome}
        if S.PASSIVE in targets:
            assert event in (E.PEER_ACTIVE, E.LEASE_REFUSED)
            assert isinstance(outcome, Branch)
            assert outcome.guard in (G.PEER_OUTRANKS, G.LEASE_SUPERSEDED)


def test_with_a_witness_only_a_granted_lease_promotes() -> None:
    """Every way to ACTIVE from a passive or starting node is either guarded by a
    fact that excludes a witness, or is the witness's grant."""
    unwitnessed = {G.UNWITNESSED, G.UNWITNESSED_SILENCE, G.UNWITNESSED_PRIMARY}
    for (state, event), outcome in TRANSITIONS.items():
        if state is S.ACTIVE:
            continue
        if isinstance(outcome, Branch):
            if outcome.then is S.ACTIVE:
                assert outcome.guard in unwitnessed or event is E.LEASE_GRANTED, (state, event)
            assert outcome.otherwise is not S.ACTIVE
        else:
            assert outcome is not S.ACTIVE, (state, event)
