"""Max length (messages and bytes) with both overflow policies."""

from __future__ import annotations

from typing import Any

import pytest

from amqlite.broker import Broker, PublishOutcome, Session

from .support import bodies, drain, publish

# arguments, bodies published, bodies kept (drop-head)
DROP_HEAD_CASES: list[tuple[dict[str, Any], list[bytes], list[bytes]]] = [
    ({"x-max-length": 2}, [b"1", b"2", b"3"], [b"2", b"3"]),
    ({"x-max-length": 1}, [b"1", b"2", b"3"], [b"3"]),
    ({"x-max-length": 0}, [b"1", b"2"], []),
    ({"x-max-length": 5}, [b"1", b"2"], [b"1", b"2"]),
    ({"x-max-length-bytes": 5}, [b"abc", b"de", b"f"], [b"de", b"f"]),
    ({"x-max-length-bytes": 5}, [b"abc", b"de"], [b"abc", b"de"]),
    ({"x-max-length-bytes": 2}, [b"a", b"toolong"], []),
    ({"x-max-length": 3, "x-max-length-bytes": 4}, [b"aa", b"b", b"c", b"d"], [b"b", b"c", b"d"]),
]


@pytest.mark.parametrize(("arguments", "published", "kept"), DROP_HEAD_CASES)
def test_drop_head(
    s: Session, arguments: dict[str, Any], published: list[bytes], kept: list[bytes]
) -> None:
    s.declare_queue("q", arguments=arguments)
    for body in published:
        assert publish(s, "", "q", body) == PublishOutcome.ROUTED
    assert drain(s, "q") == kept


@pytest.mark.parametrize(("arguments", "published", "kept"), DROP_HEAD_CASES)
def test_drop_head_dead_letters_the_dropped(
    s: Session, arguments: dict[str, Any], published: list[bytes], kept: list[bytes]
) -> None:
    s.declare_queue("dead")
    s.declare_queue(
        "q",
        arguments={
            **arguments,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead",
        },
    )
    for body in published:
        publish(s, "", "q", body)
    dropped = [b for b in published if b not in kept]
    got = []
    while (g := s.get("dead", no_ack=True, now=0)) is not None:
        got.append(g[0].message)
    assert [m.body for m in got] == dropped
    assert all(m.headers["x-death-reason"] == "maxlen" for m in got)


REJECT_CASES: list[tuple[dict[str, Any], list[bytes], list[PublishOutcome], list[bytes]]] = [
    (
        {"x-max-length": 2},
        [b"1", b"2", b"3"],
        [PublishOutcome.ROUTED, PublishOutcome.ROUTED, PublishOutcome.REJECTED],
        [b"1", b"2"],
    ),
    ({"x-max-length": 0}, [b"1"], [PublishOutcome.REJECTED], []),
    (
        {"x-max-length-bytes": 4},
        [b"abc", b"de", b"f"],
        [PublishOutcome.ROUTED, PublishOutcome.REJECTED, PublishOutcome.ROUTED],
        [b"abc", b"f"],
    ),
]


@pytest.mark.parametrize(("arguments", "published", "outcomes", "kept"), REJECT_CASES)
def test_reject_publish(
    s: Session,
    arguments: dict[str, Any],
    published: list[bytes],
    outcomes: list[PublishOutcome],
    kept: list[bytes],
) -> None:
    s.declare_queue("q", arguments={**arguments, "x-overflow": "reject-publish"})
    s.declare_queue("other")
    s.bind("q", "amq.fanout")
    s.bind("other", "amq.fanout")
    assert [publish(s, "amq.fanout", "", body) for body in published] == outcomes
    assert drain(s, "q") == kept
    assert drain(s, "other") == published


def test_only_ready_messages_count(s: Session, broker: Broker) -> None:
    s.declare_queue("q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    s.consume("q", prefetch=2, now=0)
    results = [publish(s, "", "q", str(i).encode()) for i in range(4)]
    assert results == [PublishOutcome.ROUTED] * 3 + [PublishOutcome.REJECTED]
    assert bodies(s.take_deliveries()) == [b"0", b"1"]
    assert drain(s, "q") == [b"2"]


def test_a_waiting_consumer_gets_messages_even_at_max_length_zero(s: Session) -> None:
    s.declare_queue("q", arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    s.consume("q", now=0)
    assert publish(s, "", "q", b"m") == PublishOutcome.ROUTED
    assert bodies(s.take_deliveries()) == [b"m"]
