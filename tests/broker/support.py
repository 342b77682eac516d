"""Small helpers shared by the broker tests."""

from __future__ import annotations

from typing import Any

from amqlite.broker import Broker, Delivery, Message, PublishOutcome, Session


def msg(
    exchange: str = "",
    key: str = "",
    body: bytes = b"",
    headers: dict[str, Any] | None = None,
    **properties: Any,
) -> Message:
    return Message(exchange, key, body, headers, properties)


def publish(
    session: Session,
    exchange: str,
    key: str,
    body: bytes = b"",
    headers: dict[str, Any] | None = None,
    now: float = 0.0,
    **properties: Any,
) -> PublishOutcome:
    return session.publish(msg(exchange, key, body, headers, **properties), now=now)


def drain(session: Session, queue: str, now: float = 0.0) -> list[bytes]:
    """Bodies of every message left in ``queue``, taken by no-ack gets."""
    out = []
    while (got := session.get(queue, no_ack=True, now=now)) is not None:
        out.append(got[0].message.body)
    return out


def bodies(deliveries: list[Delivery]) -> list[bytes]:
    return [d.message.body for d in deliveries]


def queue_status(broker: Broker, name: str, vhost: str = "/") -> dict[str, Any]:
    for host in broker.status()["vhosts"]:
        if host["name"] == vhost:
            for q in host["queues"]:
                if q["name"] == name:
                    return dict(q)
    raise KeyError(name)


def exchange_names(broker: Broker, vhost: str = "/") -> set[str]:
    for host in broker.status()["vhosts"]:
        if host["name"] == vhost:
            return {e["name"] for e in host["exchanges"]}
    raise KeyError(vhost)
