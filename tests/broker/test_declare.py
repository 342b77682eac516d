"""Declaring, redeclaring, passively checking and deleting exchanges and queues."""

from __future__ import annotations

from typing import Any

import pytest

from amqlite.broker import Broker, Session
from amqlite.errors import (
    AccessRefused,
    BrokerError,
    NotFound,
    PreconditionFailed,
    ReplyCode,
)

from .support import drain, exchange_names, publish, queue_status

PREDECLARED = ["amq.direct", "amq.fanout", "amq.topic", "amq.headers"]

# --- exchanges -----------------------------------------------------------------------


def test_predeclared_exchanges(broker: Broker) -> None:
    [root, _] = broker.status()["vhosts"]
    by_name = {e["name"]: e for e in root["exchanges"]}
    assert set(by_name) == {"", *PREDECLARED}
    assert [by_name[n]["type"] for n in PREDECLARED] == ["direct", "fanout", "topic", "headers"]
    assert all(by_name[n]["durable"] for n in PREDECLARED)


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic", "headers"])
def test_declare_each_type(s: Session, broker: Broker, kind: str) -> None:
    s.declare_exchange("x", kind)
    assert "x" in exchange_names(broker)
    s.declare_exchange("x", kind, passive=True)


def test_unknown_exchange_type_is_command_invalid(s: Session) -> None:
    with pytest.raises(BrokerError) as err:
        s.declare_exchange("x", "x-consistent-hash")
    assert err.value.code == ReplyCode.COMMAND_INVALID


@pytest.mark.parametrize(
    ("name", "kind", "error"),
    [
        ("", "direct", AccessRefused),
        ("amq.mine", "direct", AccessRefused),
        ("amq.direct", "fanout", PreconditionFailed),
        ("amq.topic", "direct", PreconditionFailed),
    ],
)
def test_reserved_exchange_declarations(
    s: Session, name: str, kind: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        s.declare_exchange(name, kind, durable=True)


@pytest.mark.parametrize("name", PREDECLARED)
def test_predeclared_exchange_redeclared_alike_is_ok(s: Session, name: str) -> None:
    kind = name.removeprefix("amq.")
    s.declare_exchange(name, kind, durable=True)


EXCHANGE_REDECLARE: list[tuple[dict[str, Any], str]] = [
    ({"type": "fanout"}, "type"),
    ({"durable": False}, "durable"),
    ({"auto_delete": True}, "auto_delete"),
    ({"internal": True}, "internal"),
    ({"arguments": {"alternate-exchange": "ae"}}, "alternate-exchange"),
]


@pytest.mark.parametrize(("change", "named"), EXCHANGE_REDECLARE)
def test_exchange_redeclare_with_a_difference_fails(
    s: Session, change: dict[str, Any], named: str
) -> None:
    original: dict[str, Any] = {"type": "direct", "durable": True, "auto_delete": False}
    s.declare_exchange("x", **original)
    with pytest.raises(PreconditionFailed, match=f"inequivalent arg '{named}'"):
        s.declare_exchange("x", **{**original, **change})


def test_exchange_redeclare_alike_is_ok(s: Session) -> None:
    s.declare_exchange("x", "topic", durable=True, arguments={"a": 1})
    s.declare_exchange("x", "topic", durable=True, arguments={"a": 1})


def test_passive_exchange_declare_of_missing_is_not_found(s: Session) -> None:
    with pytest.raises(NotFound, match="no exchange 'x' in vhost '/'"):
        s.declare_exchange("x", "direct", passive=True)


def test_passive_exchange_declare_does_not_create(s: Session, broker: Broker) -> None:
    with pytest.raises(NotFound):
        s.declare_exchange("x", "direct", passive=True)
    assert "x" not in exchange_names(broker)


@pytest.mark.parametrize("name", ["", *PREDECLARED])
def test_predeclared_exchanges_cannot_be_deleted(s: Session, name: str) -> None:
    with pytest.raises(AccessRefused):
        s.delete_exchange(name)


def test_delete_exchange_removes_its_bindings(s: Session, broker: Broker) -> None:
    s.declare_exchange("x", "fanout")
    s.declare_queue("q")
    s.bind("q", "x")
    s.delete_exchange("x")
    assert "x" not in exchange_names(broker)
    s.declare_exchange("x", "fanout")
    assert publish(s, "x", "").value == "unroutable"


def test_delete_exchange_if_unused(s: Session, broker: Broker) -> None:
    s.declare_exchange("x", "fanout")
    s.declare_queue("q")
    s.bind("q", "x")
    with pytest.raises(PreconditionFailed):
        s.delete_exchange("x", if_unused=True)
    s.unbind("q", "x")
    s.delete_exchange("x", if_unused=True)
    assert "x" not in exchange_names(broker)


def test_deleting_a_missing_exchange_is_no_error(s: Session) -> None:
    s.delete_exchange("never-declared")


@pytest.mark.parametrize("remove", ["unbind", "delete_queue"])
def test_auto_delete_exchange_goes_with_its_last_binding(
    s: Session, broker: Broker, remove: str
) -> None:
    s.declare_exchange("x", "direct", auto_delete=True)
    s.declare_queue("q1")
    s.declare_queue("q2")
    s.bind("q1", "x", "k")
    s.bind("q2", "x", "k")
    s.unbind("q1", "x", "k")
    assert "x" in exchange_names(broker)
    if remove == "unbind":
        s.unbind("q2", "x", "k")
    else:
        s.delete_queue("q2")
    assert "x" not in exchange_names(broker)


def test_auto_delete_exchange_without_bindings_stays(s: Session, broker: Broker) -> None:
    s.declare_exchange("x", "direct", auto_delete=True)
    assert "x" in exchange_names(broker)


# --- queues --------------------------------------------------------------------------


def test_declare_queue_reports_counts(s: Session, t: Session) -> None:
    info = s.declare_queue("q")
    assert (info.name, info.messages, info.consumers) == ("q", 0, 0)
    publish(s, "", "q")
    publish(s, "", "q")
    t.consume("q", prefetch=1, now=0)
    info = s.declare_queue("q", passive=True)
    assert (info.messages, info.consumers) == (1, 1)


def test_server_generated_queue_names(s: Session, broker: Broker) -> None:
    names = [s.declare_queue().name for _ in range(50)]
    assert all(n.startswith("amq.gen-") for n in names)
    assert len(set(names)) == 50
    again = Broker(node_id="node-test").open_session()
    assert [again.declare_queue().name for _ in range(3)] == names[:3]


def test_generated_queue_can_be_redeclared_by_name(s: Session) -> None:
    name = s.declare_queue(exclusive=True).name
    assert s.declare_queue(name, exclusive=True).name == name


def test_client_queue_names_may_not_start_with_amq(s: Session) -> None:
    with pytest.raises(AccessRefused):
        s.declare_queue("amq.mine")


def test_passive_queue_declare(s: Session) -> None:
    with pytest.raises(NotFound, match="no queue 'q' in vhost '/'"):
        s.declare_queue("q", passive=True)
    s.declare_queue("q", durable=True)
    assert s.declare_queue("q", passive=True).name == "q"


QUEUE_REDECLARE: list[tuple[dict[str, Any], str]] = [
    ({"durable": False}, "durable"),
    ({"auto_delete": True}, "auto_delete"),
    ({"exclusive": True}, "exclusive"),
    ({"arguments": {"x-message-ttl": 1000}}, "x-message-ttl"),
    ({"arguments": {"x-max-length": 5, "x-message-ttl": 10}}, "x-max-length"),
    ({"arguments": {"x-message-ttl": 10, "x-overflow": "reject-publish"}}, "x-overflow"),
    ({"arguments": {}}, "x-message-ttl"),
]


@pytest.mark.parametrize(("change", "named"), QUEUE_REDECLARE)
def test_queue_redeclare_with_a_difference_fails(
    s: Session, change: dict[str, Any], named: str
) -> None:
    original: dict[str, Any] = {"durable": True, "arguments": {"x-message-ttl": 10}}
    s.declare_queue("q", **original)
    with pytest.raises(PreconditionFailed, match=f"inequivalent arg '{named}'"):
        s.declare_queue("q", **{**original, **change})


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-message-ttl": 10},
        {"x-message-ttl": 10, "x-overflow": "drop-head"},
        {"x-message-ttl": 10, "x-queue-type": "classic"},
        {"x-message-ttl": 10, "x-unknown": "ignored"},
    ],
)
def test_queue_redeclare_alike_is_ok(s: Session, arguments: dict[str, Any]) -> None:
    s.declare_queue("q", arguments={"x-message-ttl": 10})
    s.declare_queue("q", arguments=arguments)


BAD_ARGUMENTS: list[tuple[str, Any]] = [
    ("x-message-ttl", -1),
    ("x-message-ttl", "10"),
    ("x-message-ttl", 1.5),
    ("x-message-ttl", True),
    ("x-max-length", -1),
    ("x-max-length", "many"),
    ("x-max-length-bytes", -5),
    ("x-max-length-bytes", 2.0),
    ("x-overflow", "reject-publish-dlx"),
    ("x-overflow", 1),
    ("x-dead-letter-exchange", 5),
    ("x-queue-type", "quorum"),
    ("x-queue-type", 1),
]


@pytest.mark.parametrize(("name", "value"), BAD_ARGUMENTS)
def test_bad_queue_argument_is_refused_by_name(s: Session, name: str, value: Any) -> None:
    with pytest.raises(PreconditionFailed, match=f"'{name}'"):
        s.declare_queue("q", arguments={name: value})
    with pytest.raises(NotFound):
        s.declare_queue("q", passive=True)


def test_dead_letter_routing_key_needs_an_exchange(s: Session) -> None:
    with pytest.raises(PreconditionFailed, match="x-dead-letter-routing-key"):
        s.declare_queue("q", arguments={"x-dead-letter-routing-key": "k"})


@pytest.mark.parametrize(
    ("options", "arguments", "match"),
    [
        ({"durable": False}, {}, "must be durable"),
        ({"exclusive": True}, {}, "must be durable"),
        ({"auto_delete": True}, {}, "must be durable"),
        ({}, {"x-message-ttl": 5}, "stream queues do not take it"),
        ({}, {"x-dead-letter-exchange": "d"}, "stream queues do not take it"),
        ({}, {"x-overflow": "reject-publish"}, "only drop their head"),
        ({}, {"x-max-age": "7 days"}, "x-max-age"),
        ({}, {"x-max-age": "0D"}, "x-max-age"),
        ({}, {"x-queue-type": "quorum"}, "x-queue-type"),
    ],
)
def test_stream_queue_rules(
    s: Session, options: dict[str, Any], arguments: dict[str, Any], match: str
) -> None:
    with pytest.raises(PreconditionFailed, match=match):
        s.declare_queue(
            "q",
            **{"durable": True, **options},
            arguments={"x-queue-type": "stream", **arguments},
        )


def test_max_age_is_for_streams_only(s: Session) -> None:
    with pytest.raises(PreconditionFailed, match="only stream queues"):
        s.declare_queue("q", arguments={"x-max-age": "1D"})


def test_unknown_queue_arguments_are_kept(s: Session, broker: Broker) -> None:
    s.declare_queue("q", arguments={"x-priority-someday": 3, "note": "hi"})
    assert queue_status(broker, "q")["arguments"] == {"x-priority-someday": 3, "note": "hi"}


def test_delete_queue_returns_dropped_count_and_unbinds(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    s.bind("q", "amq.fanout")
    for _ in range(3):
        publish(s, "amq.fanout", "")
    assert s.delete_queue("q") == 3
    with pytest.raises(NotFound):
        s.declare_queue("q", passive=True)
    assert publish(s, "amq.fanout", "").value == "unroutable"
    s.declare_queue("q")
    assert drain(s, "q") == []


def test_deleting_a_missing_queue_is_no_error(s: Session) -> None:
    assert s.delete_queue("never") == 0


def test_delete_queue_if_unused_and_if_empty(s: Session, t: Session) -> None:
    s.declare_queue("q")
    tag = t.consume("q", now=0)
    with pytest.raises(PreconditionFailed, match="in use"):
        s.delete_queue("q", if_unused=True)
    t.cancel(tag)
    publish(s, "", "q")
    with pytest.raises(PreconditionFailed, match="not empty"):
        s.delete_queue("q", if_empty=True)
    assert s.delete_queue("q", if_unused=True) == 1


def test_purge_drops_ready_messages_only(s: Session, broker: Broker) -> None:
    s.declare_queue("q")
    for _ in range(3):
        publish(s, "", "q")
    got = s.get("q", now=0)
    assert got is not None
    assert s.purge_queue("q") == 2
    status = queue_status(broker, "q")
    assert (status["messages"], status["unacked"]) == (0, 1)
    s.ack(got[0].dtag)
    with pytest.raises(NotFound):
        s.purge_queue("nope")
