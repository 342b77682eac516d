"""The broker's journal records: what it records, and that replaying them rebuilds
exactly the durable state (docs/storage.md, "What survives a restart").

The strongest check is a state machine: random topology changes, persistent and
transient publishes, consumes, gets, acks, nacks, rejects, expiries, purges,
deletes and session closes against a recording broker; at every step the records
so far, folded by the store and replayed into a fresh broker, must give every
durable queue exactly its live persistent messages (ready or unacked), in enqueue
order, flagged redelivered exactly when they had been handed out; and the records
applied one by one (as a passive HA node does, snapshots included) must give the
durable picture the store's fold gives.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from amqlite.broker import Broker, Message, Session
from amqlite.broker.queue import Queue
from amqlite.errors import AccessRefused
from amqlite.store import StoreState
from amqlite.store.codec import decode_record, encode_record
from amqlite.store.records import (
    ExchangeDeclare,
    ExchangeDelete,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    MessageMarks,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueueUnbind,
    Record,
)
from tests.store.test_records import MINIMAL


def recording_broker() -> tuple[Broker, list[Record]]:
    records: list[Record] = []
    return Broker(record=records.append), records


def persistent(key: str, body: bytes, exchange: str = "", **props: Any) -> Message:
    return Message(exchange, key, body, None, {"persistent": True, **props})


def live(queue: Queue) -> list[tuple[int, bool]]:
    """(journal_id, redelivered) of the journaled messages a queue holds, in journal id order,
    counting unacked deliveries (they come back after a restart)."""
    out = {m.journal_id: red for m, _, red in queue.ready if m.journal_id}
    return sorted(out.items())


def restored(records: list[Record], now: float = 0.0) -> Broker:
    """A fresh broker rebuilt from ``records`` the way a restart does: fold, snapshot,
    replay."""
    state = StoreState.fold(decode_record(encode_record(r)) for r in records)
    broker, _ = recording_broker()
    assert broker.apply(state.snapshot(), now) == 0
    return broker


# --- what is recorded -------------------------------------------------------------------


def test_only_durable_topology_is_recorded() -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_exchange("dx", "topic", durable=True)
    s.declare_exchange("tx", "topic")
    s.declare_queue("dq", durable=True)
    s.declare_queue("tq")
    s.declare_queue("xq", durable=True, exclusive=True)
    s.bind("dq", "dx", "a.#")
    s.bind("tq", "dx", "a.#")
    s.bind("dq", "tx", "a.#")
    s.bind("dq", "amq.fanout")
    s.declare_queue("dq", durable=True)  # equivalent redeclaration: nothing new
    s.bind("dq", "dx", "a.#")
    assert records == [
        ExchangeDeclare(vhost="/", name="dx", type="topic"),
        QueueDeclare(vhost="/", name="dq"),
        QueueBind(vhost="/", queue="dq", exchange="dx", key="a.#"),
        QueueBind(vhost="/", queue="dq", exchange="amq.fanout", key=""),
    ]
    records.clear()
    s.unbind("dq", "dx", "a.#")
    s.delete_queue("dq")
    s.delete_exchange("dx")
    s.delete_exchange("tx")
    assert records == [
        QueueUnbind(vhost="/", queue="dq", exchange="dx", key="a.#"),
        QueueDelete(vhost="/", name="dq"),
        ExchangeDelete(vhost="/", name="dx"),
    ]


def test_persistent_messages_on_durable_queues_are_recorded_with_their_queues() -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_exchange("fan", "fanout", durable=True)
    for q, durable in (("d1", True), ("d2", True), ("t", False)):
        s.declare_queue(q, durable=durable)
        s.bind(q, "fan")
    records.clear()
    s.publish(persistent("", b"p"), now=5.0)
    s.publish(Message("fan", "", b"transient"), now=5.0)
    s.publish(Message("", "d1", b"transient", None, {"persistent": False}), now=5.0)
    s.publish(persistent("t", b"to a transient queue"), now=5.0)
    s.publish(persistent("", b"p2", exchange="fan"), now=5.0)
    assert len(records) == 1
    r = records[0]
    assert isinstance(r, MessageEnqueue)
    assert (r.id, r.queues, r.body, r.exchange) == (1, ("d1", "d2"), b"p2", "fan")
    assert r.props == {"persistent": True}


def test_enqueue_time_is_wall_clock_through_the_offset() -> None:
    broker, records = recording_broker()
    assert broker.recorder is not None
    broker.recorder.wall_offset = 1_700_000_000.0
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    records.clear()
    s.publish(persistent("q", b"x"), now=12.5)
    assert isinstance(records[0], MessageEnqueue)
    assert records[0].enqueued_at == 1_700_000_012.5


def test_delivery_ack_and_reject_are_recorded_once() -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    for i in range(3):
        s.publish(persistent("q", b"%d" % i), now=0)
    records.clear()
    s.consume("q", prefetch=3, now=0)
    d1, d2, d3 = s.take_deliveries()
    assert records == [MessageDelivered(id=i, queue="q") for i in (1, 2, 3)]
    records.clear()
    s.nack(d1.dtag, requeue=True)  # back at the head, redelivered: nothing new
    (again,) = s.take_deliveries()
    assert again.redelivered and records == []
    s.ack(again.dtag)
    s.reject(d2.dtag, requeue=False)
    s.ack(d3.dtag)
    assert records == [MessageAck(id=i, queue="q") for i in (1, 2, 3)]


def test_no_ack_push_is_an_ack_once_the_shell_takes_it() -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    s.publish(persistent("q", b"a"), now=0)
    records.clear()
    other = broker.open_session()
    other.consume("q", no_ack=True, now=0)
    assert records == []  # pushed, not yet taken
    other.close()  # the untaken push is requeued: the journal must still hold it
    assert records == []
    s.consume("q", no_ack=True, now=0)
    assert len(s.take_deliveries()) == 1
    assert records == [MessageAck(id=1, queue="q")]


def test_expiry_overflow_purge_and_dead_letters() -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_exchange("dlx", "fanout", durable=True)
    s.declare_queue("dead", durable=True)
    s.bind("dead", "dlx")
    s.declare_queue(
        "q",
        durable=True,
        arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx", "x-max-length": 2},
    )
    records.clear()
    for i in range(3):
        s.publish(persistent("q", b"%d" % i), now=0)
    # the third publish drops the head (1), whose copy (4) goes to "dead"
    kinds = [(type(r).__name__, getattr(r, "id", None), getattr(r, "queue", None)) for r in records]
    assert kinds == [
        ("MessageEnqueue", 1, None),
        ("MessageEnqueue", 2, None),
        ("MessageEnqueue", 3, None),
        ("MessageAck", 1, "q"),
        ("MessageEnqueue", 4, None),
    ]
    records.clear()
    broker.tick(2.0)  # 2 and 3 expire into "dead"
    assert [(type(r).__name__, getattr(r, "id", None)) for r in records] == [
        ("MessageAck", 2),
        ("MessageAck", 3),
        ("MessageEnqueue", 5),
        ("MessageEnqueue", 6),
    ] or [(type(r).__name__, getattr(r, "id", None)) for r in records] == [
        ("MessageAck", 2),
        ("MessageEnqueue", 5),
        ("MessageAck", 3),
        ("MessageEnqueue", 6),
    ]
    records.clear()
    assert s.purge_queue("dead") == 3
    assert records == [MessageAck(id=i, queue="dead") for i in (4, 5, 6)]


def test_reject_publish_overflow_records_the_refusing_queue_as_left() -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_queue(
        "full", durable=True, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    s.publish(persistent("full", b"x"), now=0)
    state = StoreState.fold(records)
    assert state.message_counts() == {("/", "full"): 0}
    assert state.live_messages == 0


# --- replaying ----------------------------------------------------------------------


def test_restart_rebuilds_topology_and_messages_with_redelivered_flags() -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_exchange("orders", "topic", durable=True)
    s.declare_queue("eu", durable=True, arguments={"x-max-length": 100})
    s.bind("eu", "orders", "eu.*")
    for i in range(5):
        s.publish(persistent("eu.fr", b"%d" % i, exchange="orders"), now=0)
    s.consume("eu", prefetch=2, now=0)
    first, _ = s.take_deliveries()
    s.ack(first.dtag)
    # the ack freed credit for "2": "1" and "2" are unacked at the crash
    back = restored(records)
    b = back.open_session()
    assert b.declare_queue("eu", passive=True).messages == 4
    b.declare_queue("eu", durable=True, arguments={"x-max-length": 100})  # equivalent
    got = []
    while (g := b.get("eu", no_ack=True, now=0)) is not None:
        got.append((g[0].message.body, g[0].redelivered))
    assert got == [(b"1", True), (b"2", True), (b"3", False), (b"4", False)]
    b.declare_queue("other", durable=True)
    b.bind("other", "orders", "eu.*")
    b.publish(persistent("eu.de", b"new", exchange="orders"), now=0)
    assert b.get("eu", now=0) is not None  # the binding survived
    new_ids = [m.journal_id for m, _, _ in back.vhost("/").queues["other"].ready]  # type: ignore[union-attr]
    assert new_ids == [6]  # ids continue above the journal's


def test_ttl_continues_from_the_wall_clock_enqueue_time() -> None:
    broker, records = recording_broker()
    assert broker.recorder is not None
    broker.recorder.wall_offset = 1000.0  # wall = now + 1000
    s = broker.open_session()
    s.declare_queue("q", durable=True, arguments={"x-message-ttl": 10_000})
    s.publish(persistent("q", b"x"), now=0.0)  # enqueued at wall 1000, expires at 1010
    state = StoreState.fold(records)
    back, _ = recording_broker()
    assert back.recorder is not None
    back.recorder.wall_offset = 2000.0 - 50.0  # restarted: wall 2000 is now=50 here
    back.apply(state.snapshot(), 50.0)
    q = back.vhost("/").queues["q"]  # type: ignore[union-attr]
    assert len(q.ready) == 1
    back.tick(50.0)  # wall 2000 is long past 1010
    assert len(q.ready) == 0


def test_snapshot_replaces_what_a_passive_node_had() -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_queue("old", durable=True)
    s.publish(persistent("old", b"x"), now=0)
    passive, _ = recording_broker()
    passive.apply(records, 0)
    assert "old" in passive.vhost("/").queues  # type: ignore[union-attr]
    fresh, fresh_records = recording_broker()
    f = fresh.open_session()
    f.declare_queue("new", durable=True)
    passive.apply(StoreState.fold(fresh_records).snapshot(), 0)
    assert set(passive.vhost("/").queues) == {"new"}  # type: ignore[union-attr]


def test_unknown_vhost_records_are_skipped_and_counted() -> None:
    broker = Broker(vhosts=("/", "other"), record=lambda r: None)
    s = broker.open_session("other")
    records: list[Record] = []
    assert broker.recorder is not None
    broker.recorder.sink = records.append
    s.declare_queue("q", durable=True)
    back = Broker(vhosts=("/",))
    assert back.apply(records, 0) == 1


def test_every_record_type_has_a_replay_handler() -> None:
    broker = Broker()
    assert broker.apply(MINIMAL, 0) == 0  # one record of each type
    elsewhere = [dataclasses.replace(r, vhost="nowhere") for r in MINIMAL if hasattr(r, "vhost")]
    assert broker.apply(elsewhere, 0) == len(elsewhere)


# --- the model -----------------------------------------------------------------------

QUEUES = ("d1", "d2", "t1")  # durable, durable, transient


class ReplayMatches(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.broker, self.records = recording_broker()
        self.admin = self.broker.open_session()
        self.admin.declare_exchange("dlx", "fanout", durable=True)
        self.admin.declare_exchange("ex", "direct", durable=True)
        self.sessions: list[Session] = []
        self.unacked: list[tuple[Session, int]] = []
        self.now = 0.0
        self.n = 0
        for q in QUEUES:
            self._declare(q)

    def _declare(self, q: str) -> None:
        args: dict[str, Any] = {"x-dead-letter-exchange": "dlx", "x-max-length": 6}
        if q == "d2":
            args["x-message-ttl"] = 3000
        self.admin.declare_queue(q, durable=q.startswith("d"), arguments=args)
        self.admin.bind(q, "ex", "k")
        if q == "d1":
            self.admin.bind(q, "dlx")

    def _take(self) -> None:
        for s in self.broker.take_ready():
            for d in s.take_deliveries():
                if d.dtag in s._unacked:
                    self.unacked.append((s, d.dtag))
            s.take_cancellations()

    @rule(
        to=st.sampled_from(("", "ex")),
        q=st.sampled_from(QUEUES),
        is_persistent=st.booleans(),
        expiration=st.sampled_from((None, 1000)),
    )
    def publish(self, to: str, q: str, is_persistent: bool, expiration: int | None) -> None:
        self.n += 1
        props: dict[str, Any] = {"persistent": is_persistent}
        if expiration is not None:
            props["expiration"] = expiration
        self.admin.publish(Message(to, "k" if to else q, b"%d" % self.n, None, props), now=self.now)
        self._take()

    @rule(q=st.sampled_from(QUEUES), prefetch=st.integers(0, 3), no_ack=st.booleans())
    def consume(self, q: str, prefetch: int, no_ack: bool) -> None:
        s = self.broker.open_session()
        self.sessions.append(s)
        if q in self.broker.vhost("/").queues:  # type: ignore[union-attr]
            s.consume(q, prefetch=prefetch, no_ack=no_ack, now=self.now)
        self._take()

    @rule(q=st.sampled_from(QUEUES), no_ack=st.booleans())
    def get(self, q: str, no_ack: bool) -> None:
        if q in self.broker.vhost("/").queues:  # type: ignore[union-attr]
            got = self.admin.get(q, no_ack=no_ack, now=self.now)
            if got is not None and not no_ack:
                self.unacked.append((self.admin, got[0].dtag))

    @precondition(lambda self: self.unacked)
    @rule(i=st.integers(0, 100), how=st.sampled_from(("ack", "requeue", "reject")))
    def settle(self, i: int, how: str) -> None:
        s, dtag = self.unacked.pop(i % len(self.unacked))
        if s._closed or dtag not in s._unacked:
            return
        if how == "ack":
            s.ack(dtag)
        elif how == "requeue":
            s.nack(dtag, requeue=True, now=self.now)
        else:
            s.reject(dtag, requeue=False, now=self.now)
        self._take()

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 100))
    def close(self, i: int) -> None:
        s = self.sessions.pop(i % len(self.sessions))
        s.close(self.now)
        self._take()

    @rule(dt=st.sampled_from((0.5, 2.0)))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.broker.tick(self.now)
        self._take()

    @rule(q=st.sampled_from(QUEUES))
    def purge(self, q: str) -> None:
        if q in self.broker.vhost("/").queues:  # type: ignore[union-attr]
            self.admin.purge_queue(q)

    @rule(q=st.sampled_from(QUEUES))
    def delete_and_redeclare(self, q: str) -> None:
        self.admin.delete_queue(q)
        self._take()
        self._declare(q)

    @rule(q=st.sampled_from(QUEUES), key=st.sampled_from(("k", "j")))
    def toggle_binding(self, q: str, key: str) -> None:
        queue = self.broker.vhost("/").queues[q]  # type: ignore[union-attr]
        if any(e.name == "ex" and e.bindings[i].key == key for e, i in queue.bindings):
            self.admin.unbind(q, "ex", key)
        else:
            self.admin.bind(q, "ex", key)

    @rule(kind=st.sampled_from(("direct", "topic")))
    def redeclare_exchange(self, kind: str) -> None:
        self.admin.delete_exchange("ex")
        self.admin.declare_exchange("ex", kind, durable=True)

    @rule()
    def snapshot(self) -> None:
        """A snapshot in the record stream, as compaction writes and a rejoining HA
        node receives: it replaces what came before."""
        self.records.extend(StoreState.fold(self.records).snapshot())

    @invariant()
    def replay_gives_the_live_persistent_messages(self) -> None:
        back = restored(self.records, self.now)
        queues = self.broker.vhost("/").queues  # type: ignore[union-attr]
        rebuilt = back.vhost("/").queues  # type: ignore[union-attr]
        assert set(rebuilt) == {q for q in queues if q.startswith("d")}
        for name, queue in queues.items():
            if not name.startswith("d"):
                continue
            expect = dict(live(queue))
            for s in [self.admin, *self.sessions]:
                for d in list(s._unacked.values()) + list(s._pending):
                    if d._origin is queue and d.message.journal_id:
                        expect[d.message.journal_id] = True
            assert live(rebuilt[name]) == sorted(expect.items()), name
            bindings = {
                (e.name, b.key) for e, ident in rebuilt[name].bindings for b in [e.bindings[ident]]
            }
            assert bindings == {(e.name, e.bindings[i].key) for e, i in queue.bindings}

    @invariant()
    def replaying_the_records_agrees_with_the_fold(self) -> None:
        """What a passive HA node does (apply each record as it comes, no snapshot)
        gives the durable picture the store's fold gives: one handler per record type
        on each side (``broker/replay.py``, ``store/state.py``)."""
        assert durable_picture(replayed(self.records)) == folded_picture(self.records)


def replayed(records: list[Record]) -> Broker:
    broker, _ = recording_broker()
    assert broker.apply(records, 0) == 0
    return broker


def durable_picture(broker: Broker) -> dict[str, Any]:
    """Durable exchanges, queues, bindings, and per queue its messages' (journal_id,
    redelivered) in order, as a broker holds them."""
    host = broker.vhost("/")
    assert host is not None
    return {
        "exchanges": sorted(
            (e.name, e.kind) for e in host.exchanges.values() if e.durable and e.name
        ),
        "queues": {
            name: [(m.journal_id, red) for m, _, red in queue.ready]
            for name, queue in host.queues.items()
        },
        "bindings": sorted(
            (e.name, name, e.bindings[ident].key)
            for name, queue in host.queues.items()
            for e, ident in queue.bindings
        ),
    }


def folded_picture(records: list[Record]) -> dict[str, Any]:
    """:func:`durable_picture` of :class:`StoreState`'s fold of ``records``."""
    state = StoreState.fold(records)
    predeclared = Broker().vhost("/")
    assert predeclared is not None
    return {
        "exchanges": sorted(
            [(e.name, e.type) for e in state.exchanges()]
            + [(e.name, e.kind) for e in predeclared.exchanges.values() if e.durable and e.name]
        ),
        "queues": {
            q.name: [(m.record.id, m.redelivered) for m in state.messages(q.vhost, q.name)]
            for q in state.queues()
        },
        "bindings": sorted((b.exchange, b.queue, b.key) for b in state.bindings()),
    }


ReplayMatches.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_replay_matches = ReplayMatches.TestCase


class ReplayMatchesGathered(ReplayMatches):
    """The same model with the recorder gathering delivery marks and acks, as a
    standalone node's does (``Recorder.gather_marks``): whenever a commit has just
    flushed them (``commit``), the records give exactly the picture single
    ``message.delivered`` / ``message.ack`` records give, through the fold, the
    snapshot and the replay alike. Between commits the journal may lag behind the
    broker (the commit that would have carried the single records carries the marks)."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes = 0
        recorder = self.broker.recorder
        assert recorder is not None
        recorder.gather_marks(self._wake)
        self.recorder = recorder
        self.singles = 0  # message.delivered / message.ack the recorder made
        records = self.records

        def sink(record: Record) -> None:
            if isinstance(record, MessageDelivered | MessageAck):
                self.singles += 1
            records.append(record)

        recorder.sink = sink

    def _wake(self) -> None:
        self.wakes += 1

    @rule()
    def commit(self) -> None:
        waiting = self.recorder.marks_waiting
        before = len(self.records)
        self.recorder.flush_marks()
        marks = [r for r in self.records[before:] if isinstance(r, MessageMarks)]
        assert bool(marks) == waiting and len(marks) == len(self.records) - before
        for r in marks:  # one per queue; a delivered id acked before the commit is left out
            assert not set(r.delivered) & set(r.acked)
        assert len({r.queue for r in marks}) == len(marks)
        assert self.singles == 0  # (a snapshot writes message.delivered records: not these)

    @precondition(lambda self: not self.recorder.marks_waiting)
    @invariant()
    def replay_gives_the_live_persistent_messages(self) -> None:
        super().replay_gives_the_live_persistent_messages()

    @precondition(lambda self: not self.recorder.marks_waiting)
    @invariant()
    def replaying_the_records_agrees_with_the_fold(self) -> None:
        super().replaying_the_records_agrees_with_the_fold()


ReplayMatchesGathered.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
test_replay_matches_with_gathered_marks = ReplayMatchesGathered.TestCase


def test_gathered_marks_leave_out_the_delivered_mark_of_an_acked_message() -> None:
    records: list[Record] = []

    def sink(record: Record) -> int:
        records.append(record)
        return len(records)

    broker = Broker(record=sink)
    wakes: list[None] = []
    recorder = broker.recorder
    assert recorder is not None
    recorder.gather_marks(lambda: wakes.append(None))
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    s.declare_queue("r", durable=True)
    for i in range(3):
        s.publish(persistent("q", b"%d" % i), now=0)
    s.publish(persistent("r", b"r"), now=0)
    enqueued = [r.id for r in records if isinstance(r, MessageEnqueue)]
    got = [s.get("q", now=0) for _ in range(3)]
    s.get("r", now=0)
    assert len(wakes) == 2  # once per queue with marks waiting, not once per mark
    s.ack(got[0][0].dtag)  # type: ignore[index]
    recorder.start_span()
    written = len(records)
    recorder.flush_marks()  # as the committer does: part of no request
    assert (recorder.span_first, recorder.span_last) == (0, 0)
    marks = {r.queue: r for r in records[written:] if isinstance(r, MessageMarks)}
    assert marks == {
        "q": MessageMarks(queue="q", delivered=(enqueued[1], enqueued[2]), acked=(enqueued[0],)),
        "r": MessageMarks(queue="r", delivered=(enqueued[3],)),
    }
    assert not recorder.marks_waiting
    recorder.flush_marks()
    assert len(records) == written + 2  # nothing more to write
    s.ack(got[1][0].dtag)  # type: ignore[index]
    assert len(wakes) == 3
    position_before = len(records)
    recorder.start_span()
    recorder.flush_marks(span=True)  # tx.commit: the reply vouches for the acks
    assert records[position_before:] == [MessageMarks(queue="q", acked=(enqueued[1],))]
    assert recorder.span_last == len(records)
    back = restored(records)
    assert live(back.vhost("/").queues["q"]) == [(enqueued[2], True)]  # type: ignore[union-attr]


def test_marks_waiting_says_whether_gathered_marks_wait_for_the_flush() -> None:
    broker = Broker(record=lambda record: 0)
    recorder = broker.recorder
    assert recorder is not None
    recorder.gather_marks(lambda: None)
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    for i in range(2):
        s.publish(persistent("q", b"%d" % i), now=0)
    assert not recorder.marks_waiting
    got = s.get("q", now=0)
    assert got is not None
    assert recorder.marks_waiting  # a delivery mark
    recorder.flush_marks()
    assert not recorder.marks_waiting
    s.ack(got[0].dtag)
    assert recorder.marks_waiting  # an ack alone
    recorder.flush_marks()
    assert not recorder.marks_waiting


@pytest.mark.parametrize("count", [0, 1, 50])
def test_restore_counts(count: int) -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    for i in range(count):
        s.publish(persistent("q", b"%d" % i), now=0)
    back = restored(records)
    assert len(back.vhost("/").queues["q"].ready) == count  # type: ignore[union-attr]


class _Identity:
    """What exchange peering attaches to a message (``Message.mesh``)."""

    def mesh_map(self) -> dict[str, Any]:
        return {"id": ["b", 1, 7], "path": [], "hops": 0}


def test_a_message_in_a_peering_queue_keeps_its_peering_identity_across_a_restart() -> None:
    broker, records = recording_broker()
    s = broker.open_session()
    s.declare_exchange("x", "topic", durable=True)
    s.declare_queue("amq.peering.x.a/x", durable=True, reserved=True)
    s.declare_queue("local", durable=True)
    s.bind("amq.peering.x.a/x", "x", "k")
    s.bind("local", "x", "k")
    s.bind("local", "x", "only.here")
    for key in ("k", "only.here"):
        message = persistent(key, b"m", exchange="x")
        message.mesh = _Identity()
        s.publish(message, now=0)
    enqueued = [r for r in records if isinstance(r, MessageEnqueue)]
    assert [r.mesh for r in enqueued] == [_Identity().mesh_map(), {}]  # only in a peering queue
    host = restored(records).vhost("/")
    assert host is not None
    (peered,) = [m for m, _, _ in host.queues["amq.peering.x.a/x"].ready]
    assert peered.mesh == _Identity().mesh_map()
    assert [m.mesh for m, _, _ in host.queues["local"].ready] == [_Identity().mesh_map(), None]


def test_only_the_broker_declares_queues_with_the_amq_prefix() -> None:
    broker, _ = recording_broker()
    s = broker.open_session()
    with pytest.raises(AccessRefused):
        s.declare_queue("amq.peering.x.a/x", durable=True)
