"""Routing rules of every exchange type, one table per type."""

from __future__ import annotations

from typing import Any

import pytest

from amqlite.broker import Broker, PublishOutcome, Session, TopicMatcher
from amqlite.broker.topic import CACHE_LIMIT
from amqlite.errors import AccessRefused, NotFound, PreconditionFailed

from .support import drain, publish

ROUTED, UNROUTABLE = PublishOutcome.ROUTED, PublishOutcome.UNROUTABLE


def _declare(s: Session, *queues: str) -> None:
    for q in queues:
        s.declare_queue(q)


def _holding(s: Session, queues: list[str]) -> set[str]:
    """Which of ``queues`` received the (single) message; drains them."""
    return {q for q in queues if drain(s, q)}


# --- direct / default / fanout -----------------------------------------------------

DIRECT_CASES = [
    # bindings (queue, key), published key, queues that get it
    ([("q1", "a")], "a", {"q1"}),
    ([("q1", "a")], "b", set()),
    ([("q1", "a"), ("q2", "a")], "a", {"q1", "q2"}),
    ([("q1", "a"), ("q2", "b")], "b", {"q2"}),
    ([("q1", "")], "", {"q1"}),
    ([("q1", "a.b")], "a.*", set()),
    ([("q1", "A")], "a", set()),
]


@pytest.mark.parametrize(("bindings", "key", "expected"), DIRECT_CASES)
def test_direct_routing(
    s: Session, bindings: list[tuple[str, str]], key: str, expected: set[str]
) -> None:
    _declare(s, "q1", "q2")
    for queue, bkey in bindings:
        s.bind(queue, "amq.direct", bkey)
    outcome = publish(s, "amq.direct", key)
    assert outcome == (ROUTED if expected else UNROUTABLE)
    assert _holding(s, ["q1", "q2"]) == expected


@pytest.mark.parametrize(
    ("key", "expected"), [("q1", {"q1"}), ("q2", {"q2"}), ("nope", set()), ("", set())]
)
def test_default_exchange_routes_by_queue_name(s: Session, key: str, expected: set[str]) -> None:
    _declare(s, "q1", "q2")
    assert publish(s, "", key) == (ROUTED if expected else UNROUTABLE)
    assert _holding(s, ["q1", "q2"]) == expected


@pytest.mark.parametrize("key", ["", "x", "a.b.c"])
def test_fanout_ignores_the_key(s: Session, key: str) -> None:
    _declare(s, "q1", "q2", "q3")
    s.bind("q1", "amq.fanout", "whatever")
    s.bind("q2", "amq.fanout")
    assert publish(s, "amq.fanout", key) == ROUTED
    assert _holding(s, ["q1", "q2", "q3"]) == {"q1", "q2"}


def test_fanout_without_bindings_is_unroutable(s: Session) -> None:
    assert publish(s, "amq.fanout", "k") == UNROUTABLE


# --- topic ---------------------------------------------------------------------------

TOPIC_CASES = [
    ("a.b.c", "a.b.c", True),
    ("a.b", "a.b.c", False),
    ("a.b.c", "a.b", False),
    ("a", "A", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.*.c", "a.b.b.c", False),
    ("*", "", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*.*", ".", True),
    ("a.*.b", "a..b", True),
    ("#", "", True),
    ("#", "a.b.c", True),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.c", "c", True),
    ("#.c", "a.b.c", True),
    ("#.c", "a.c.b", False),
    ("a.#.c", "a.c", True),
    ("a.#.c", "a.b.b.c", True),
    ("a.#.c", "a.b.b", False),
    ("#.#", "", True),
    ("*.#", "", False),
    ("*.#", "a", True),
    ("#.*", "", False),
    ("#.*", "a.b", True),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.#.b.#.c", "a.b.c", True),
    ("a.#.b.#.c", "a.x.b.y.z.c", True),
    ("a.#.b.#.c", "a.c", False),
    ("", "", True),
    ("", "a", False),
    ("a.*", "a.*", True),  # a literal '*' in a key is an ordinary word
    ("a.b", "a.*", False),
    ("a.b", "a.#", False),
]


@pytest.mark.parametrize(("pattern", "key", "matches"), TOPIC_CASES)
def test_topic_routing(s: Session, pattern: str, key: str, matches: bool) -> None:
    s.declare_queue("q")
    s.bind("q", "amq.topic", pattern)
    assert publish(s, "amq.topic", key) == (ROUTED if matches else UNROUTABLE)
    assert drain(s, "q") == ([b""] if matches else [])


def test_topic_cache_follows_bind_and_unbind(s: Session) -> None:
    _declare(s, "q1", "q2")
    s.bind("q1", "amq.topic", "a.*")
    publish(s, "amq.topic", "a.b", b"1")
    s.bind("q2", "amq.topic", "#.b")
    publish(s, "amq.topic", "a.b", b"2")
    s.unbind("q1", "amq.topic", "a.*")
    publish(s, "amq.topic", "a.b", b"3")
    assert drain(s, "q1") == [b"1", b"2"]
    assert drain(s, "q2") == [b"2", b"3"]


def test_topic_matcher_cache_is_bounded_and_stays_right() -> None:
    m: TopicMatcher[str] = TopicMatcher()
    m.add("k.*", "star")
    m.add("k.7", "seven")
    for i in range(CACHE_LIMIT * 2):
        expected = {"star", "seven"} if i == 7 else {"star"}
        assert set(m.match(f"k.{i}")) == expected
    assert len(m._cache) <= CACHE_LIMIT


def test_topic_matcher_counts_repeated_pairs() -> None:
    m: TopicMatcher[str] = TopicMatcher()
    m.add("a.#", "v")
    m.add("a.#", "v")
    assert m.match("a.b") == ("v",)
    assert m.remove("a.#", "v") is True
    assert m.match("a.b") == ("v",)
    assert m.remove("a.#", "v") is True
    assert m.match("a.b") == ()
    assert m.remove("a.#", "v") is False
    assert m.remove("x.y", "v") is False


# --- headers -------------------------------------------------------------------------

HEADERS_CASES: list[tuple[dict[str, Any], dict[str, Any], bool]] = [
    ({}, {}, True),
    ({}, {"a": 1}, True),
    ({"x-match": "any"}, {"a": 1}, False),
    ({"a": 1}, {"a": 1}, True),
    ({"a": 1}, {"a": 2}, False),
    ({"a": 1}, {}, False),
    ({"a": 1}, {"a": 1, "b": 2}, True),
    ({"a": 1}, {"a": True}, False),
    ({"a": 1}, {"a": 1.0}, False),
    ({"a": 1}, {"a": "1"}, False),
    ({"a": 1, "b": 2}, {"a": 1}, False),
    ({"a": 1, "b": 2}, {"a": 1, "b": 2}, True),
    ({"x-match": "all", "a": 1, "b": 2}, {"b": 2, "a": 1}, True),
    ({"x-match": "any", "a": 1, "b": 2}, {"a": 1}, True),
    ({"x-match": "any", "a": 1, "b": 2}, {"b": 2, "c": 3}, True),
    ({"x-match": "any", "a": 1, "b": 2}, {"a": 3, "b": 3}, False),
    ({"a": 1, "x-other": "ignored"}, {"a": 1}, True),
    ({"x-match": "any", "x-a": 1}, {"x-a": 1}, False),
    ({"a": None}, {"a": None}, True),
    ({"a": None}, {}, False),
    ({"a": b"x"}, {"a": b"x"}, True),
    ({"a": "s"}, {"a": "S"}, False),
]


@pytest.mark.parametrize(("arguments", "headers", "matches"), HEADERS_CASES)
def test_headers_routing(
    s: Session, arguments: dict[str, Any], headers: dict[str, Any], matches: bool
) -> None:
    s.declare_queue("q")
    s.bind("q", "amq.headers", "", arguments)
    assert publish(s, "amq.headers", "any-key", headers=headers) == (
        ROUTED if matches else UNROUTABLE
    )
    assert drain(s, "q") == ([b""] if matches else [])


@pytest.mark.parametrize("mode", ["none", "ALL", 1, None, ""])
def test_headers_binding_with_bad_x_match_is_refused(s: Session, mode: Any) -> None:
    s.declare_queue("q")
    with pytest.raises(PreconditionFailed, match="x-match"):
        s.bind("q", "amq.headers", "", {"x-match": mode, "a": 1})


def test_headers_unbind_removes_only_that_binding(s: Session) -> None:
    s.declare_queue("q")
    s.bind("q", "amq.headers", "", {"a": 1})
    s.bind("q", "amq.headers", "", {"b": 2})
    s.unbind("q", "amq.headers", "", {"a": 1})
    publish(s, "amq.headers", "", headers={"a": 1}, body=b"a")
    publish(s, "amq.headers", "", headers={"b": 2}, body=b"b")
    assert drain(s, "q") == [b"b"]


# --- deduplication and errors ----------------------------------------------------------

DEDUP_CASES: list[tuple[str, list[tuple[str, dict[str, Any]]], str, dict[str, Any]]] = [
    ("amq.topic", [("a.*", {}), ("#", {}), ("a.b", {})], "a.b", {}),
    ("amq.direct", [("a", {}), ("a", {"x-any": 1})], "a", {}),
    ("amq.fanout", [("x", {}), ("y", {})], "", {}),
    ("amq.headers", [("", {"h": 1}), ("", {"x-match": "any", "h": 1, "g": 2})], "", {"h": 1}),
]


@pytest.mark.parametrize(("exchange", "bindings", "key", "headers"), DEDUP_CASES)
def test_message_reaches_a_queue_once_through_several_bindings(
    s: Session,
    exchange: str,
    bindings: list[tuple[str, dict[str, Any]]],
    key: str,
    headers: dict[str, Any],
) -> None:
    s.declare_queue("q")
    for bkey, args in bindings:
        s.bind("q", exchange, bkey, args)
    assert publish(s, exchange, key, b"once", headers=headers) == ROUTED
    assert drain(s, "q") == [b"once"]


def test_unbinding_one_of_two_bindings_keeps_routing(s: Session) -> None:
    s.declare_queue("q")
    s.bind("q", "amq.direct", "k", {"n": 1})
    s.bind("q", "amq.direct", "k", {"n": 2})
    s.unbind("q", "amq.direct", "k", {"n": 1})
    assert publish(s, "amq.direct", "k") == ROUTED
    s.unbind("q", "amq.direct", "k", {"n": 2})
    assert publish(s, "amq.direct", "k") == UNROUTABLE


def test_publish_to_missing_exchange_is_not_found(s: Session) -> None:
    with pytest.raises(NotFound, match=r"no exchange 'nope' in vhost '/'"):
        publish(s, "nope", "k")


def test_publish_to_internal_exchange_is_refused(s: Session) -> None:
    s.declare_exchange("inner", "fanout", internal=True)
    with pytest.raises(AccessRefused):
        publish(s, "inner", "k")


@pytest.mark.parametrize("call", ["bind", "unbind"])
def test_default_exchange_cannot_be_bound(s: Session, call: str) -> None:
    s.declare_queue("q")
    with pytest.raises(AccessRefused):
        getattr(s, call)("q", "", "q")


@pytest.mark.parametrize(("queue", "exchange"), [("missing", "amq.direct"), ("q", "missing")])
def test_binding_needs_queue_and_exchange(s: Session, queue: str, exchange: str) -> None:
    s.declare_queue("q")
    with pytest.raises(NotFound):
        s.bind(queue, exchange, "k")


def test_unbinding_what_was_never_bound_is_no_error(s: Session) -> None:
    s.declare_queue("q")
    s.unbind("q", "amq.direct", "never")
    assert publish(s, "amq.direct", "never") == UNROUTABLE


def test_vhosts_are_separate_namespaces(broker: Broker) -> None:
    a = broker.open_session("/")
    b = broker.open_session("other")
    a.declare_queue("q")
    b.declare_queue("q")
    publish(a, "", "q", b"in-root")
    assert drain(b, "q") == []
    assert drain(a, "q") == [b"in-root"]


def test_unknown_vhost_is_not_found(broker: Broker) -> None:
    with pytest.raises(NotFound):
        broker.open_session("nope")
