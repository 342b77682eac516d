"""The per-link send decision, as a table, and forward mode on live links."""

from __future__ import annotations

from typing import Any

import pytest

from amqlite.peering import BindingKey, Decision, PeeringMode, RemoteInterest, decide

from .sim import Net

D, M = Decision, PeeringMode


def _interest(*keys: str) -> RemoteInterest:
    interest = RemoteInterest("topic")
    interest.replace(BindingKey.of(k) for k in keys)
    return interest


BASE: dict[str, Any] = {
    "sends": True,
    "mode": M.PUBLISH,
    "routed_locally": False,
    "remote_node": "B",
    "path": (),
    "hops": 0,
    "max_hops": 8,
    "interest": _interest("a.*"),
    "routing_key": "a.b",
    "headers": {},
}

CASES = [
    ({}, D.SEND),
    ({"routed_locally": True}, D.SEND),  # publish mode sends either way
    ({"sends": False}, D.RECEIVES_ONLY),
    ({"mode": M.SUBSCRIBE, "sends": False}, D.RECEIVES_ONLY),
    ({"path": ("A", "B")}, D.REMOTE_ON_PATH),
    ({"path": ("A", "C"), "hops": 2}, D.SEND),
    ({"remote_node": None, "path": ("B",)}, D.SEND),  # unknown yet: the receiver checks
    ({"hops": 7}, D.SEND),
    ({"hops": 8}, D.HOPS_EXHAUSTED),
    ({"hops": 1, "max_hops": 1}, D.HOPS_EXHAUSTED),
    ({"mode": M.FORWARD}, D.SEND),
    ({"mode": M.FORWARD, "routed_locally": True}, D.DELIVERED_LOCALLY),
    ({"routing_key": "b.c"}, D.NO_INTEREST),
    ({"interest": _interest()}, D.NO_INTEREST),
    ({"interest": RemoteInterest("topic")}, D.SEND),  # not yet advertised
    # the cheapest rule wins
    ({"sends": False, "path": ("B",)}, D.RECEIVES_ONLY),
    ({"path": ("B",), "hops": 9}, D.REMOTE_ON_PATH),
    ({"hops": 9, "mode": M.FORWARD, "routed_locally": True}, D.HOPS_EXHAUSTED),
    ({"mode": M.FORWARD, "routed_locally": True, "routing_key": "zzz"}, D.DELIVERED_LOCALLY),
]


@pytest.mark.parametrize(("changes", "expected"), CASES)
def test_decision(changes: dict[str, Any], expected: Decision) -> None:
    assert decide(**{**BASE, **changes}) is expected


def test_forward_mode_sends_only_what_no_local_queue_took() -> None:
    net = Net(2)
    a, b = net.node("A", exchange_type="direct"), net.node("B", exchange_type="direct")
    a.dial(b, PeeringMode.FORWARD)
    a.bind("local", "served-here")
    b.bind("remote", "served-here")
    b.bind("remote", "served-there")
    net.run()
    a.publish("served-here", b"1")
    a.publish("served-there", b"2")
    a.publish("served-nowhere", b"3")
    net.run()
    assert a.drain("local") == [b"1"]
    assert b.drain("remote") == [b"2"]
    stats = a.link("A->B").stats(net.now)
    assert stats["forwarded"] == 1
    assert stats["skipped"] == {"delivered-locally": 1, "no-interest": 1}
    # the service moves: A's queue goes, B now serves what A served
    a.unbind("local", "served-here")
    net.run()
    a.publish("served-here", b"4")
    net.run()
    assert b.drain("remote") == [b"2", b"4"]


def test_subscribe_mode_brings_remote_messages_here() -> None:
    net = Net(4)
    a, b = net.node("A"), net.node("B")
    a.dial(b, PeeringMode.SUBSCRIBE)
    a.bind("mine", "news.*")
    a.bind("mine2", "news.*")
    net.run()
    b.publish("news.sport", b"1")
    b.publish("weather.today", b"2")
    a.publish("news.local", b"3")  # a subscribe link does not send A's messages
    net.run()
    assert a.drain("mine") == [b"3", b"1"] and a.drain("mine2") == [b"3", b"1"]
    assert b.link("A/A->B").stats(net.now)["forwarded"] == 1
