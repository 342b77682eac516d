"""tx.commit-ok promises what the transaction wrote is durable: it waits at the
barrier for the journal span of every publish in it, not only the last one's (a
transient publish after a persistent one writes nothing and names no span)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amqlite.amqp import BasicProperties
from amqlite.amqp import methods as m
from amqlite.amqp.spec import Method
from amqlite.auth import AuthenticatedUser, Permissions
from amqlite.broker import Broker
from amqlite.server.amqp.channel import AmqpChannel
from amqlite.server.dispatch import RequestDispatcher
from amqlite.store.records import MessageEnqueue, MessageMarks


class _Link:
    remote_address = "test"

    def __init__(self) -> None:
        self.sent: list[Method] = []

    def send_method(self, channel: int, method: Method) -> None:
        self.sent.append(method)

    def send_content(self, *args: Any) -> None:
        raise AssertionError("no content expected")

    def send_deliver(self, *args: Any) -> None:
        raise AssertionError("no content expected")

    def confirms_pending(self, channel: AmqpChannel) -> None:
        pass

    def flow(self) -> None:
        pass


class _Storage:
    """The barrier: records what each waiter waits for; releases on demand."""

    replica_upto = None

    def __init__(self) -> None:
        self.waiters: list[tuple[int, int, Any]] = []

    def when_durable(self, first: int, last: int, callback: Any) -> None:
        self.waiters.append((first, last, callback))


def _durable_channel(
    *, gather_marks: bool = False
) -> tuple[list[Any], _Storage, _Link, AmqpChannel]:
    """A channel on a recording broker (each record's position is its index + 1)
    with the durable queue ``durable`` declared and its declare-ok released."""
    records: list[Any] = []

    def sink(record: Any) -> int:
        records.append(record)
        return len(records)

    broker = Broker(record=sink)
    if gather_marks:
        assert broker.recorder is not None
        broker.recorder.gather_marks(lambda: None)
    storage = _Storage()
    node: Any = SimpleNamespace(storage=storage, peering=None)
    session = broker.open_session("/")
    user = AuthenticatedUser("guest", Permissions.full())
    dispatcher = RequestDispatcher(session, user, "/", lambda: {})
    link = _Link()
    channel = AmqpChannel(node, link, 1, session, dispatcher)
    channel.handle(m.QueueDeclare(queue="durable", durable=True), 0.0)
    storage.waiters.pop()[2](None)  # the declaration is durable: declare-ok
    return records, storage, link, channel


def test_commit_ok_waits_for_every_persistent_publish_of_the_transaction() -> None:
    positions, storage, link, channel = _durable_channel()
    channel.handle(m.QueueDeclare(queue="transient"), 0.0)
    channel.handle(m.TxSelect(), 0.0)
    channel.publish(
        m.BasicPublish(routing_key="durable"), BasicProperties(delivery_mode=2), b"p", 0.0
    )
    channel.publish(m.BasicPublish(routing_key="transient"), BasicProperties(), b"t", 0.0)
    written = len(positions)
    channel.handle(m.TxCommit(), 0.0)

    assert len(positions) > written  # the persistent publish was journaled at commit
    assert not any(isinstance(x, m.TxCommitOk) for x in link.sent)  # not before the disk
    ((first, last, release),) = storage.waiters
    assert first <= written + 1 and last >= len(positions)  # every record it wrote
    release(None)
    assert isinstance(link.sent[-1], m.TxCommitOk)


def test_commit_ok_waits_for_the_acks_of_the_transaction_when_marks_are_gathered() -> None:
    """A standalone node gathers acks for its next commit (``Recorder.gather_marks``):
    tx.commit appends them at once, and commit-ok waits for them."""
    records, storage, link, channel = _durable_channel(gather_marks=True)
    session = channel.session
    assert session is not None
    channel.publish(
        m.BasicPublish(routing_key="durable"), BasicProperties(delivery_mode=2), b"p", 0.0
    )
    (enqueued,) = [r for r in records if isinstance(r, MessageEnqueue)]
    got = session.get("durable", now=0.0)
    assert got is not None
    channel.handle(m.TxSelect(), 0.0)
    channel.handle(m.BasicAck(delivery_tag=got[0].dtag), 0.0)
    assert not any(isinstance(r, MessageMarks) for r in records)  # gathered, not written
    channel.handle(m.TxCommit(), 0.0)

    assert records[-1] == MessageMarks(queue="durable", acked=(enqueued.id,))
    assert not any(isinstance(x, m.TxCommitOk) for x in link.sent)
    ((first, last, release),) = storage.waiters
    assert first <= len(records) <= last
    release(None)
    assert isinstance(link.sent[-1], m.TxCommitOk)
