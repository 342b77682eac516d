"""``x-expires``: a queue unused (no consumer, no get, no redeclaration) for that
many milliseconds is deleted, messages and all, as RabbitMQ does. The broker has no
clock: time passes in ``Broker.tick``, and unused time is measured between ticks."""

from __future__ import annotations

import pytest

from amqlite.broker import Broker, Session
from amqlite.errors import NotFound, PreconditionFailed

from .support import publish, queue_status


def _exists(broker: Broker, name: str) -> bool:
    try:
        queue_status(broker, name)
    except KeyError:
        return False
    return True


def _declare(s: Session, name: str = "q", ms: int = 1000, **kw: object) -> None:
    s.declare_queue(name, arguments={"x-expires": ms}, **kw)  # type: ignore[arg-type]


def test_an_unused_queue_is_deleted_with_its_messages(broker: Broker, s: Session) -> None:
    _declare(s)
    publish(s, "", "q", b"m")
    broker.tick(10.0)  # the clock starts at the first tick
    broker.tick(10.9)
    assert _exists(broker, "q")
    broker.tick(11.0)
    assert not _exists(broker, "q")
    with pytest.raises(NotFound):
        s.declare_queue("q", passive=True)


def test_a_consumer_keeps_it_and_its_departure_restarts_the_clock(
    broker: Broker, s: Session
) -> None:
    _declare(s)
    broker.tick(0.0)
    tag = s.consume("q", now=0.5)
    broker.tick(5.0)
    broker.tick(9.0)
    assert _exists(broker, "q")
    s.cancel(tag)
    broker.tick(9.5)  # first tick without a consumer: the last use was at 9.0
    assert _exists(broker, "q")
    broker.tick(10.0)
    assert not _exists(broker, "q")


@pytest.mark.parametrize("use", ["get", "redeclare"])
def test_a_get_or_a_redeclaration_is_a_use(broker: Broker, s: Session, use: str) -> None:
    _declare(s)
    broker.tick(0.0)
    broker.tick(0.8)
    if use == "get":
        s.get("q", now=0.8)
    else:
        _declare(s)
    broker.tick(1.2)  # restarts here
    broker.tick(2.1)
    assert _exists(broker, "q")
    broker.tick(2.2)
    assert not _exists(broker, "q")


def test_a_passive_declaration_is_not_a_use(broker: Broker, s: Session) -> None:
    _declare(s)
    broker.tick(0.0)
    s.declare_queue("q", passive=True)
    broker.tick(1.0)
    assert not _exists(broker, "q")


def test_a_node_that_does_not_serve_keeps_its_queues(broker: Broker, s: Session) -> None:
    _declare(s)
    broker.tick(0.0, expire_queues=False)
    broker.tick(100.0, expire_queues=False)
    assert _exists(broker, "q")
    broker.tick(100.5)  # it became master: the clock starts now
    broker.tick(101.4)
    assert _exists(broker, "q")
    broker.tick(101.5)
    assert not _exists(broker, "q")


@pytest.mark.parametrize("value", [0, -1, "1000", 1.5])
def test_bad_values_are_refused(s: Session, value: object) -> None:
    with pytest.raises(PreconditionFailed, match="x-expires"):
        s.declare_queue("q", arguments={"x-expires": value})


def test_a_different_value_on_redeclaration_is_inequivalent(s: Session) -> None:
    _declare(s, ms=1000)
    with pytest.raises(PreconditionFailed, match="x-expires"):
        _declare(s, ms=2000)


def test_streams_do_not_take_it(s: Session) -> None:
    with pytest.raises(PreconditionFailed, match="x-expires"):
        s.declare_queue("st", durable=True, arguments={"x-queue-type": "stream", "x-expires": 1000})


def test_a_durable_queue_deleted_by_expiry_stays_deleted_after_a_restart() -> None:
    from amqlite.store.records import QueueDelete

    from .test_recording import persistent, recording_broker, restored

    broker, records = recording_broker()
    s = broker.open_session()
    _declare(s, "d", durable=True)
    s.publish(persistent("d", b"m"), now=0)
    assert _exists(restored(records), "d")
    broker.tick(0.0)
    broker.tick(1.0)
    assert QueueDelete(vhost="/", name="d") in records
    assert not _exists(restored(records), "d")
