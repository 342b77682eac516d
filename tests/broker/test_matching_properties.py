"""Topic and headers matching against small independent reference models."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker, PublishOutcome, TopicMatcher

from .support import drain, publish

# --- topic -----------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return text.split(".") if text else []


def reference_topic_match(pattern: list[str], key: list[str]) -> bool:
    """Plain recursion over the AMQP definition."""
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(reference_topic_match(rest, key[i:]) for i in range(len(key) + 1))
    if not key:
        return False
    return (head == "*" or head == key[0]) and reference_topic_match(rest, key[1:])


key_words = st.lists(st.sampled_from(["a", "b", "c", "", "*"]), max_size=6)
pattern_words = st.lists(st.sampled_from(["a", "b", "c", "", "*", "#"]), max_size=6)
keys = key_words.map(".".join)
patterns = pattern_words.map(".".join)


@settings(max_examples=200)
@given(patterns=st.lists(patterns, max_size=8), probes=st.lists(keys, max_size=10))
def test_topic_matcher_agrees_with_reference(patterns: list[str], probes: list[str]) -> None:
    m: TopicMatcher[int] = TopicMatcher()
    for value, pattern in enumerate(patterns):
        m.add(pattern, value)
    for key in probes:
        expected = {
            v for v, p in enumerate(patterns) if reference_topic_match(_words(p), _words(key))
        }
        found = m.match(key)
        assert len(found) == len(set(found))
        assert set(found) == expected


ops = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "match"]), patterns, keys, st.integers(0, 2)),
    max_size=40,
)


@settings(max_examples=150)
@given(ops=ops)
def test_topic_matcher_add_remove_match_sequences(ops: list[tuple[str, str, str, int]]) -> None:
    """Interleaved adds, removes and (cached) matches answer as the model does."""
    m: TopicMatcher[int] = TopicMatcher()
    model: Counter[tuple[str, int]] = Counter()
    for op, pattern, key, value in ops:
        if op == "add":
            m.add(pattern, value)
            model[(pattern, value)] += 1
        elif op == "remove":
            assert m.remove(pattern, value) == (model[(pattern, value)] > 0)
            if model[(pattern, value)] > 0:
                model[(pattern, value)] -= 1
        expected = {
            v
            for (p, v), n in model.items()
            if n > 0 and reference_topic_match(_words(p), _words(key))
        }
        assert set(m.match(key)) == expected


@settings(max_examples=150)
@given(bound=st.lists(patterns, min_size=1, max_size=5), key=keys)
def test_topic_exchange_routes_as_the_reference(bound: list[str], key: str) -> None:
    s = Broker().open_session()
    for i, pattern in enumerate(bound):
        s.declare_queue(f"q{i}")
        s.bind(f"q{i}", "amq.topic", pattern)
    outcome = publish(s, "amq.topic", key, b"m")
    got = {i for i in range(len(bound)) if drain(s, f"q{i}") == [b"m"]}
    expected = {i for i, p in enumerate(bound) if reference_topic_match(_words(p), _words(key))}
    assert got == expected
    assert outcome == (PublishOutcome.ROUTED if expected else PublishOutcome.UNROUTABLE)


# --- headers ---------------------------------------------------------------------------

scalars = st.sampled_from([0, 1, True, False, "1", "a", None, 1.0, b"1"])
header_names = st.sampled_from(["a", "b", "c", "x-y"])
headers_maps = st.dictionaries(header_names, scalars, max_size=4)
binding_args = st.tuples(
    st.sampled_from([None, "all", "any"]), st.dictionaries(header_names, scalars, max_size=4)
).map(lambda t: t[1] if t[0] is None else {**t[1], "x-match": t[0]})


def reference_headers_match(arguments: dict[str, Any], headers: dict[str, Any]) -> bool:
    """Counts the pairs that match and compares with what the mode asks for."""
    pairs = [(k, v) for k, v in arguments.items() if k[:2] != "x-"]
    hits = 0
    for k, v in pairs:
        if k in headers and repr(headers[k]) == repr(v):
            hits += 1
    if arguments.get("x-match", "all") == "any":
        return hits >= 1
    return hits == len(pairs)


@settings(max_examples=200)
@given(bindings=st.lists(binding_args, min_size=1, max_size=4), headers=headers_maps)
def test_headers_exchange_routes_as_the_reference(
    bindings: list[dict[str, Any]], headers: dict[str, Any]
) -> None:
    s = Broker().open_session()
    for i, arguments in enumerate(bindings):
        s.declare_queue(f"q{i}")
        s.bind(f"q{i}", "amq.headers", "", arguments)
    publish(s, "amq.headers", "", b"m", headers=headers)
    got = {i for i in range(len(bindings)) if drain(s, f"q{i}") == [b"m"]}
    expected = {i for i, a in enumerate(bindings) if reference_headers_match(a, headers)}
    assert got == expected
