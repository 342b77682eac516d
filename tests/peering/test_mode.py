"""Parsing what the configuration says: modes, overflow policies, address lists."""

from __future__ import annotations

import pytest

from amqlite.errors import ConfigError
from amqlite.peering import (
    Address,
    AddressRing,
    OverflowPolicy,
    PeeringMode,
    parse_addresses,
    parse_mode,
    parse_overflow,
)

M = PeeringMode


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        (1, M.SUBSCRIBE),
        (2, M.PUBLISH),
        (3, M.FORWARD),
        ("1", M.SUBSCRIBE),
        ("2", M.PUBLISH),
        (" 3 ", M.FORWARD),
        ("subscribe", M.SUBSCRIBE),
        ("Publish", M.PUBLISH),
        ("FORWARD", M.FORWARD),
        (M.PUBLISH, M.PUBLISH),
    ],
)
def test_modes(value: object, mode: PeeringMode) -> None:
    assert parse_mode(value) is mode


@pytest.mark.parametrize("value", [0, 4, -1, True, 2.0, "", "sub", "pub lish", None, [1]])
def test_bad_modes_name_the_key(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mode(value, "cluster_mta[0].mode")
    assert info.value.key == "cluster_mta[0].mode"
    assert "subscribe" in info.value.reason and repr(value) in info.value.reason


def test_mode_numbers_are_openamqs() -> None:
    assert [m.value for m in M] == [1, 2, 3]
    assert [m.label for m in M] == ["subscribe", "publish", "forward"]
    assert [m.dialer_sends for m in M] == [False, True, True]


@pytest.mark.parametrize(
    ("value", "policy"),
    [
        ("block", OverflowPolicy.BLOCK),
        ("spill", OverflowPolicy.SPILL),
        ("drop-oldest", OverflowPolicy.DROP_OLDEST),
        ("drop_oldest", OverflowPolicy.DROP_OLDEST),
        (" Spill ", OverflowPolicy.SPILL),
    ],
)
def test_overflow_policies(value: str, policy: OverflowPolicy) -> None:
    assert parse_overflow(value) is policy


@pytest.mark.parametrize("value", ["", "drop", "reject", 1, None])
def test_bad_overflow(value: object) -> None:
    with pytest.raises(ConfigError, match="overflow"):
        parse_overflow(value)


def test_address_lists() -> None:
    assert parse_addresses("primary:5555,backup:6666") == (
        Address("primary", 5555),
        Address("backup", 6666),
    )
    assert parse_addresses(["[::1]:5555", " h:1 "]) == (Address("::1", 5555), Address("h", 1))
    assert str(Address("::1", 5555)) == "[::1]:5555"


@pytest.mark.parametrize(
    "text", ["", ",", "host", "host:", ":5555", "host:0", "host:65536", "host:x", "::1:5", "[::1]5"]
)
def test_bad_addresses(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_addresses(text, "cluster_mta[0].host")
    assert info.value.key == "cluster_mta[0].host"


def test_address_ring_moves_on_and_wraps() -> None:
    ring = AddressRing(parse_addresses("p:1,b:2"))
    assert ring.current == Address("p", 1)
    assert ring.advance() == Address("b", 2)
    assert ring.advance() == Address("p", 1)
    with pytest.raises(ValueError):
        AddressRing([])
