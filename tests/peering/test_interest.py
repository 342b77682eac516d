"""Interest: the reference-counted binding mirror, the remote's matcher per exchange
type, and the filter it puts on what a link sends."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.peering import (
    BindingKey,
    BindingMirror,
    Interest,
    LinkState,
    PeeringMode,
    PeeringProtocolError,
    RemoteInterest,
    ResyncRequest,
    Send,
)

from .sim import Net

QUEUES = ["q1", "q2", "q3"]
KEYS = ["a", "a.*", "#", "b.c"]
ARGS: list[dict[str, Any] | None] = [None, {"x-match": "any", "h": 1}, {"x-match": "any", "h": 1.0}]

binding = st.tuples(st.sampled_from(QUEUES), st.sampled_from(KEYS), st.sampled_from(ARGS))
ops = st.lists(st.tuples(st.booleans(), binding), max_size=60)


def _model_keys(bound: Any) -> set[BindingKey]:
    return {BindingKey.of(key, args) for _, key, args in bound}


def _hashable(b: tuple[str, str, dict[str, Any] | None]) -> tuple[str, str, Any]:
    q, k, a = b
    return q, k, tuple(sorted((n, type(v).__name__, v) for n, v in (a or {}).items()))


@given(ops)
def test_mirror_holds_one_entry_per_distinct_binding(steps: list[tuple[bool, Any]]) -> None:
    """Add/remove in any order (duplicates, removals of absent bindings): the mirror
    equals the distinct (key, arguments) of the bindings present, and the deltas it
    reports rebuild exactly that set."""
    mirror = BindingMirror()
    present: dict[tuple[str, str, Any], tuple[str, str, Any]] = {}
    remote: set[BindingKey] = set()
    for add, b in steps:
        q, k, a = b
        if add:
            delta = mirror.add(q, k, a)
            present[_hashable(b)] = b
            if delta is not None:
                assert delta not in remote
                remote.add(delta)
        else:
            delta = mirror.remove(q, k, a)
            present.pop(_hashable(b), None)
            if delta is not None:
                remote.remove(delta)
        expected = _model_keys(present.values())
        assert mirror.keys() == expected == remote
        assert len(mirror) == mirror.digest.count == len(expected)
    fresh = BindingMirror()
    for q, k, a in present.values():
        fresh.add(q, k, a)
    assert fresh.digest.hex == mirror.digest.hex  # order-independent


def test_refcount_and_queue_deletion() -> None:
    m = BindingMirror()
    assert m.add("q1", "a") == BindingKey.of("a")
    assert m.add("q1", "a") is None  # the same binding twice
    assert m.add("q2", "a") is None
    assert m.refcount("a") == 2
    assert m.add("q2", "b") == BindingKey.of("b")
    assert m.remove("q1", "a") is None
    assert m.remove("q1", "a") is None
    assert m.remove_queue("q2") == [BindingKey.of("a"), BindingKey.of("b")]
    assert len(m) == 0 and m.digest.count == 0 and m.digest.hex == "0" * 16


# --- matching per exchange type ----------------------------------------------------------


def _interest(kind: str, *bindings: tuple[str, dict[str, Any] | None]) -> RemoteInterest:
    interest = RemoteInterest(kind)
    interest.replace(BindingKey.of(k, a) for k, a in bindings)
    return interest


MATCH_CASES = [
    ("direct", [("a", None)], "a", {}, True),
    ("direct", [("a", None)], "b", {}, False),
    ("direct", [], "a", {}, False),
    ("fanout", [("", None)], "anything", {}, True),
    ("fanout", [], "anything", {}, False),
    ("topic", [("a.*", None)], "a.b", {}, True),
    ("topic", [("a.*", None)], "a.b.c", {}, False),
    ("topic", [("a.#", None)], "a", {}, True),
    ("topic", [("#", None)], "", {}, True),
    ("topic", [("*.c", None), ("x", None)], "b.c", {}, True),
    ("headers", [("", {"x-match": "all", "h": 1, "g": "x"})], "", {"h": 1, "g": "x"}, True),
    ("headers", [("", {"x-match": "all", "h": 1, "g": "x"})], "", {"h": 1}, False),
    ("headers", [("", {"x-match": "any", "h": 1, "g": "x"})], "", {"g": "x"}, True),
    ("headers", [("", {"x-match": "any", "h": 1})], "", {"h": 1.0}, False),
    (
        "headers",
        [("", {"x-match": "any", "h": 1}), ("", {"x-match": "any", "h": 1.0})],
        "",
        {"h": 1.0},
        True,
    ),
    ("headers", [], "", {"h": 1}, False),
]


@pytest.mark.parametrize(("kind", "bindings", "key", "headers", "expected"), MATCH_CASES)
def test_remote_interest_matches_like_the_broker(
    kind: str, bindings: list[Any], key: str, headers: dict[str, Any], expected: bool
) -> None:
    assert _interest(kind, *bindings).matches(key, headers) is expected


def test_unknown_interest_matches_everything_until_the_first_advertisement() -> None:
    interest = RemoteInterest("topic")
    assert interest.matches("anything", {})
    interest.replace([])
    assert not interest.matches("anything", {})


def test_deltas_and_bad_advertisements() -> None:
    interest = _interest("topic", ("a.*", None))
    interest.add(BindingKey.of("b"))
    interest.remove(BindingKey.of("a.*"))
    interest.remove(BindingKey.of("never"))
    assert interest.keys() == {BindingKey.of("b")}
    assert not interest.matches("a.x", {}) and interest.matches("b", {})
    with pytest.raises(PeeringProtocolError, match="x-match"):
        _interest("headers", ("", {"x-match": "some"}))
    with pytest.raises(ValueError):
        RemoteInterest("x-consistent-hash")


# --- the filter on a live link ---------------------------------------------------------


def _pair(kind: str = "topic") -> tuple[Net, Any, Any]:
    net = Net(3)
    a, b = net.node("A", exchange_type=kind), net.node("B", exchange_type=kind)
    a.dial(b, PeeringMode.PUBLISH)
    net.run()
    assert net.all_up()
    return net, a, b


def test_no_interest_no_messages() -> None:
    net, a, _ = _pair()
    frames = net.frames
    for i in range(20):
        a.publish("a.b", b"%d" % i)
    net.run()
    link = a.link("A->B")
    assert net.frames == frames
    assert link.stats(net.now)["accepted"] == 0
    assert link.stats(net.now)["skipped"] == {"no-interest": 20}


def test_ten_identical_remote_bindings_one_copy() -> None:
    net, a, b = _pair()
    for i in range(10):
        b.bind(f"q{i}", "a.*")
    b.bind("q-other", "#")
    net.run()
    assert a.link("A->B").stats(net.now)["interest_size"] == 2
    a.publish("a.b", b"m")
    net.run()
    assert a.link("A->B").stats(net.now)["forwarded"] == 1
    assert b.link("A/A->B").stats(net.now)["received"] == 1
    for i in range(10):
        assert b.drain(f"q{i}") == [b"m"]
    assert b.drain("q-other") == [b"m"]


def test_interest_follows_binds_and_unbinds() -> None:
    net, a, b = _pair("direct")
    b.bind("q", "k1")
    net.run()
    a.publish("k1", b"1")
    a.publish("k2", b"2")
    b.bind("q", "k2")
    net.run()
    a.publish("k2", b"3")
    b.unbind("q", "k1")
    net.run()
    a.publish("k1", b"4")
    net.run()
    assert b.drain("q") == [b"1", b"3"]


@settings(max_examples=40, deadline=None)
@given(ops)
def test_subscribe_mirrors_local_bindings_on_the_remote(steps: list[tuple[bool, Any]]) -> None:
    """Subscribe mode: whatever the order of binds and unbinds (some while the link
    is down), the remote end's interest is the set of distinct local (key, args)."""
    net = Net(5)
    a, b = net.node("A", exchange_type="headers"), net.node("B", exchange_type="headers")
    link = a.dial(b, PeeringMode.SUBSCRIBE)
    net.run()
    bound: dict[Any, Any] = {}
    for i, (add, bnd) in enumerate(steps):
        q, k, args = bnd
        if add:
            if _hashable(bnd) not in bound:
                a.bind(q, k, args)
                bound[_hashable(bnd)] = bnd
        elif _hashable(bnd) in bound:
            a.unbind(q, k, args)
            del bound[_hashable(bnd)]
        if i % 7 == 3:
            net.cut_all()  # re-synced on reconnect
        if i % 2:
            net.run()
    net.run()
    assert link.state is LinkState.UP
    remote = b.link("A/A->B")
    assert remote.interest is not None
    assert remote.interest.keys() == _model_keys(bound.values()) == a.px.ctx.mirror.keys()


def test_digest_drift_asks_for_a_resync() -> None:
    net, a, b = _pair()
    b.bind("q", "a.*")
    net.run()
    sender = a.link("A->B")
    assert sender.interest is not None
    sender.interest.remove(BindingKey.of("a.*"))  # drift: a lost delta
    digest = b.px.ctx.mirror.digest
    actions = sender.receive(Interest(False, (), (), digest.count, digest.hex), net.now)
    assert [a.message for a in actions if isinstance(a, Send)] == [ResyncRequest()]
    net.apply(a, actions)
    net.run()
    assert sender.interest.keys() == {BindingKey.of("a.*")}
    assert sender.stats(net.now)["resyncs"] == 1


def test_periodic_check_repairs_drift() -> None:
    net = Net(9)
    a, b = net.node("A"), net.node("B")
    b.dial(a, PeeringMode.SUBSCRIBE, resync_interval=10.0)
    net.run(horizon=1.0)
    b.bind("q", "k")  # B subscribes: B advertises, A's end sends
    net.run(horizon=1.0)
    sender = a.link("B/B->A")
    assert sender.interest is not None and sender.interest.keys() == {BindingKey.of("k")}
    sender.interest.replace([])  # drift
    net.run(horizon=11.0)  # the receiver's periodic digest triggers a resync
    assert sender.interest.keys() == {BindingKey.of("k")}
