"""Heartbeats travel as plain maps: a round trip keeps them, CBOR carries them, and
a malformed map is refused with an error naming the problem."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest

from amqlite.errors import ReplyCode
from amqlite.ha import HaEvent, HaRole, HaState, Heartbeat, HeartbeatError

from .support import hb

GOOD: dict[str, Any] = {"node": "b", "role": "backup", "state": "active", "epoch": 4, "vhost": "/"}


@pytest.mark.parametrize("role", list(HaRole))
@pytest.mark.parametrize("state", list(HaState))
def test_round_trip_through_a_map_and_cbor(role: HaRole, state: HaState) -> None:
    if state.is_starting and state is not role.starting_state:
        return
    beat = hb(role, state, epoch=7, vhost="/prod")
    data = beat.to_map()
    assert Heartbeat.from_map(data) == beat
    assert Heartbeat.from_map(cbor2.loads(cbor2.dumps(data))) == beat
    assert data == {
        "node": beat.node_id,
        "role": role.value,
        "state": state.value,
        "epoch": 7,
        "vhost": "/prod",
    }


def test_the_event_a_heartbeat_fires_is_the_senders_state() -> None:
    assert hb(HaRole.PRIMARY).event is HaEvent.PEER_PRIMARY
    assert hb(HaRole.BACKUP).event is HaEvent.PEER_BACKUP
    assert hb(HaRole.BACKUP, HaState.ACTIVE).event is HaEvent.PEER_ACTIVE
    assert hb(HaRole.PRIMARY, HaState.PASSIVE).event is HaEvent.PEER_PASSIVE


def test_unknown_keys_are_ignored() -> None:
    assert Heartbeat.from_map({**GOOD, "future": [1, 2]}) == Heartbeat.from_map(GOOD)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (["not", "a", "map"], "must be a map, got list"),
        (None, "must be a map, got NoneType"),
        ({}, "missing field(s): node, role, state, epoch, vhost"),
        ({k: v for k, v in GOOD.items() if k != "epoch"}, "missing field(s): epoch"),
        ({**GOOD, "node": 7}, "field 'node' must be text, got 7"),
        ({**GOOD, "node": ""}, "node id must be non-empty text"),
        ({**GOOD, "vhost": b"/"}, "field 'vhost' must be text"),
        ({**GOOD, "vhost": ""}, "vhost must be non-empty text"),
        (
            {**GOOD, "role": "master"},
            "field 'role' must be one of 'primary', 'backup', got 'master'",
        ),
        ({**GOOD, "role": ["x"]}, "field 'role' must be one of"),
        ({**GOOD, "state": "ACTIVE"}, "field 'state' must be one of 'primary', 'backup', 'active'"),
        ({**GOOD, "epoch": -1}, "epoch must be a non-negative integer, got -1"),
        ({**GOOD, "epoch": 1.5}, "epoch must be a non-negative integer, got 1.5"),
        ({**GOOD, "epoch": True}, "epoch must be a non-negative integer, got True"),
        ({**GOOD, "epoch": "4"}, "epoch must be a non-negative integer, got '4'"),
        ({**GOOD, "state": "primary"}, "says state 'primary' but role 'backup'"),
    ],
)
def test_malformed_maps_are_refused_with_a_clear_error(data: object, words: str) -> None:
    with pytest.raises(HeartbeatError) as caught:
        Heartbeat.from_map(data)
    assert words in str(caught.value)
    assert caught.value.code == ReplyCode.SYNTAX_ERROR
