"""A request that promises durability names the journal span its reply depends on
(``Session.journal_span``, docs/CONTRACTS.md "Broker core"): the shell's one
barrier releases the reply once the journal holds the span's last position."""

from __future__ import annotations

from amqlite.broker import ALL_APPENDED, Broker, Message, PublishOutcome, Session
from amqlite.store import StoreState
from amqlite.store.records import MessageEnqueue, Record


class Journal:
    """A sink that numbers records from 1, as the node's journal does."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def __call__(self, record: Record) -> int:
        self.records.append(record)
        return len(self.records)


def persistent(body: bytes = b"m", key: str = "") -> Message:
    message = Message("", "q", body, None, {"persistent": True})
    message.publish_key = key
    return message


def journaled() -> tuple[Broker, Session, Journal]:
    journal = Journal()
    broker = Broker(record=journal)
    session = broker.open_session()
    return broker, session, journal


def test_a_durable_declaration_names_its_record() -> None:
    _, s, journal = journaled()
    s.declare_queue("q", durable=True)
    assert s.journal_span == (1, 1)
    s.bind("q", "amq.direct", "k")
    assert s.journal_span == (2, 2) == (len(journal.records), len(journal.records))


def test_a_transient_declaration_depends_on_nothing() -> None:
    _, s, _ = journaled()
    s.declare_queue("q", durable=True)
    s.declare_queue("t")
    assert s.journal_span == (0, 0)


def test_a_persistent_publish_names_its_enqueue_and_a_transient_one_nothing() -> None:
    _, s, journal = journaled()
    s.declare_queue("q", durable=True)
    assert s.publish(persistent(), now=0) is PublishOutcome.ROUTED
    first, last = s.journal_span
    assert isinstance(journal.records[first - 1], MessageEnqueue)
    assert first == last == len(journal.records)
    s.publish(Message("", "q", b"t", None, {}), now=0)
    assert s.journal_span == (0, 0)


def test_the_span_covers_the_first_deliveries_a_publish_makes() -> None:
    _, s, journal = journaled()
    s.declare_queue("q", durable=True)
    s.consume("q", prefetch=10, now=0)
    s.publish(persistent(), now=0)
    first, last = s.journal_span
    assert first < last == len(journal.records)  # enqueue, then message.delivered


def test_a_publish_sent_again_names_its_first_copy() -> None:
    _, s, journal = journaled()
    s.declare_queue("q", durable=True)
    s.publish(persistent(key="i:1"), now=0)
    first_copy = s.journal_span
    s.publish(persistent(key="i:2"), now=0)  # later records
    again = s.publish(persistent(key="i:1"), now=0)
    assert again is PublishOutcome.DUPLICATE
    assert s.journal_span == first_copy
    assert len(journal.records) == 3  # queue, two messages: no second copy


def test_a_key_learned_from_replayed_records_waits_for_everything_appended() -> None:
    _, s, journal = journaled()
    s.declare_queue("q", durable=True)
    s.publish(persistent(key="i:1"), now=0)
    state = StoreState()
    for record in journal.records:
        state.apply(record)
    follower = Broker(record=Journal())
    follower.apply(state.snapshot(), now=0)  # as after a restart or on a passive node
    fs = follower.open_session()
    assert fs.publish(persistent(key="i:1"), now=0) is PublishOutcome.DUPLICATE
    assert fs.journal_span == (ALL_APPENDED, ALL_APPENDED)


def test_without_a_journal_nothing_is_waited_for() -> None:
    s = Broker().open_session()
    s.declare_queue("q", durable=True)
    s.publish(persistent(key="i:1"), now=0)
    assert s.journal_span == (0, 0)
