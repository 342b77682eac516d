"""StoreState: the fold rules, and (hypothesis) snapshots that rebuild the same state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.store import (
    ExchangeDeclare,
    ExchangeDelete,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    PeeringOut,
    PeeringOutAck,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    Record,
    SnapshotBegin,
    SnapshotEnd,
    StoreState,
    StreamAppend,
    StreamTrack,
    StreamTruncate,
    decode_record,
    encode_record,
)
from tests.test_sans_io import forbidden_imports

from .support import ack, bodies, delivered, enq, fold, queue

# --- the rules, one by one ---------------------------------------------------------------


def test_messages_keep_enqueue_order_and_their_delivered_flag_per_queue() -> None:
    state = fold(
        [queue("a"), queue("b"), enq(1, "a", "b"), enq(2, "a"), enq(3, "b"), delivered(1, "a")]
    )
    assert [(m.record.id, m.redelivered) for m in state.messages("/", "a")] == [
        (1, True),
        (2, False),
    ]
    assert [(m.record.id, m.redelivered) for m in state.messages("/", "b")] == [
        (1, False),
        (3, False),
    ]
    assert state.message_counts() == {("/", "a"): 2, ("/", "b"): 2}
    assert state.live_messages == 3
    assert state.message_bytes == len(b"m1m2m3")  # a body shared by two queues counts once


def test_ack_removes_from_one_queue_and_the_message_when_none_holds_it() -> None:
    state = fold([queue("a"), queue("b"), enq(1, "a", "b"), ack(1, "a")])
    assert bodies(state, "a") == [] and bodies(state, "b") == [b"m1"]
    state.apply(ack(1, "b"))
    assert state.live_messages == 0 and state.message_bytes == 0


def test_queue_delete_drops_its_messages_and_bindings() -> None:
    state = fold(
        [
            ExchangeDeclare(name="e", type="fanout"),
            queue("a"),
            queue("b"),
            QueueBind(queue="a", exchange="e"),
            QueueBind(queue="b", exchange="e"),
            enq(1, "a", "b"),
            enq(2, "a"),
            QueueDelete(name="a"),
        ]
    )
    assert [q.name for q in state.queues()] == ["b"]
    assert [b.queue for b in state.bindings()] == ["b"]
    assert state.live_journal_ids() == [1]
    assert state.messages("/", "a") == []
    state.apply(queue("a"))  # a new queue of the same name starts empty
    assert state.messages("/", "a") == []


def test_exchange_delete_drops_bindings_from_it_only() -> None:
    state = fold(
        [
            ExchangeDeclare(name="e", type="direct"),
            ExchangeDeclare(name="f", type="direct"),
            queue("a"),
            QueueBind(queue="a", exchange="e", key="k"),
            QueueBind(queue="a", exchange="f", key="k"),
            ExchangeDelete(name="e"),
        ]
    )
    assert [(b.exchange, b.key) for b in state.bindings()] == [("f", "k")]
    assert [e.name for e in state.exchanges()] == ["f"]


def test_purge_empties_a_queue() -> None:
    state = fold([queue("a"), queue("b"), enq(1, "a", "b"), enq(2, "a"), QueuePurge(name="a")])
    assert state.messages("/", "a") == [] and bodies(state, "b") == [b"m1"]


def test_bindings_are_identified_by_exchange_queue_key_and_arguments() -> None:
    args: dict[str, Any] = {"x-match": "all", "n": [1, 2]}
    state = fold(
        [
            ExchangeDeclare(name="h", type="headers"),
            queue("a"),
            QueueBind(queue="a", exchange="h", arguments=args),
            QueueBind(queue="a", exchange="h", arguments=dict(args)),
            QueueBind(queue="a", exchange="h", arguments={"x-match": "all", "n": [1, True]}),
            QueueBind(queue="a", exchange="amq.topic", key="#"),
        ]
    )
    assert len(state.bindings()) == 3
    state.apply(QueueUnbind(queue="a", exchange="h", arguments={"n": [1, 2], "x-match": "all"}))
    assert len(state.bindings()) == 2


def test_the_latest_declaration_wins_and_keeps_the_messages() -> None:
    state = fold([queue("a"), enq(1, "a"), QueueDeclare(name="a", arguments={"x-max-length": 9})])
    assert state.queues()[0].arguments == {"x-max-length": 9}
    assert bodies(state, "a") == [b"m1"]


def test_what_cannot_be_placed_is_ignored() -> None:
    state = fold(
        [
            queue("a"),
            ack(99, "a"),  # unknown message
            delivered(99, "a"),
            enq(5, "nowhere"),  # no known queue: not kept, but the id is used
            QueueBind(queue="nowhere", exchange="amq.direct"),
            QueueBind(queue="a", exchange="not-declared"),
            ExchangeDelete(name="never"),
            QueueDelete(name="never"),
            QueuePurge(name="never"),
            enq(6, "a", "nowhere"),  # kept on the queue that exists
            enq(6, "a"),  # an id already live: ignored
            ack(6, "b"),  # a queue not holding it
        ]
    )
    assert state.bindings() == []
    assert state.live_journal_ids() == [6]
    assert state.messages("/", "a")[0].record.queues == ("a", "nowhere")
    assert state.last_journal_id == 6
    assert state.snapshot()[-2] == enq(6, "a")  # names only the queue that holds it


def test_vhosts_are_separate_namespaces() -> None:
    state = fold([queue("q", "/"), queue("q", "v"), enq(1, "q", vhost="v"), ack(1, "q")])
    assert state.messages("v", "q") == [] and state.messages("/", "q") == []
    state = fold([queue("q", "/"), queue("q", "v"), enq(1, "q", vhost="v")])
    assert state.messages("/", "q") == [] and bodies(state, "q", "v") == [b"m1"]


def test_snapshot_layout() -> None:
    state = fold(
        [
            ExchangeDeclare(name="e", type="topic"),
            queue("a"),
            QueueBind(queue="a", exchange="e", key="#"),
            enq(3, "a"),
            delivered(3, "a"),
        ]
    )
    assert state.snapshot() == [
        SnapshotBegin(last_journal_id=3),
        ExchangeDeclare(name="e", type="topic"),
        queue("a"),
        QueueBind(queue="a", exchange="e", key="#"),
        enq(3, "a"),
        delivered(3, "a"),
        SnapshotEnd(),
    ]


def test_snapshot_begin_resets_and_keeps_the_id_counter() -> None:
    state = fold([queue("a"), enq(7, "a"), SnapshotBegin(last_journal_id=9)])
    assert state.snapshot_open and state.queues() == [] and state.last_journal_id == 9
    state.apply(SnapshotEnd())
    assert not state.snapshot_open
    assert state == fold([SnapshotBegin(last_journal_id=9), SnapshotEnd()])


def test_forget_message() -> None:
    state = fold([queue("a"), queue("b"), enq(1, "a", "b"), enq(2, "a")])
    state.forget_message(1)
    state.forget_message(404)
    assert bodies(state, "a") == [b"m2"] and bodies(state, "b") == []
    assert state.message_bytes == 2


def test_state_and_records_are_sans_io() -> None:
    root = Path(__file__).resolve().parents[2] / "amqlite" / "store"
    for name in ("state.py", "records.py"):
        path = root / name
        assert forbidden_imports(path.read_text(), path) == []


# --- hypothesis: any history ---------------------------------------------------------------

_VHOSTS = ["/", "/", "/", "v"]
_EXCHANGES = ["e1", "e2"]
_BIND_EXCHANGES = ["e1", "e2", "amq.topic"]
_QUEUES = ["q1", "q2", "q3"]
_TARGETS = [("q1",), ("q2",), ("q3",), ("q1", "q2"), ("q3", "none", "q1"), ("none",), ("q2", "q3")]
_KEYS = ["", "k"]
_ARGS: list[dict[str, Any]] = [{}, {"x-match": "all"}, {"x-match": "any", "n": [1, 2]}]


def _pick(options: list[Any], n: int) -> Any:
    return options[n % len(options)]


def _build(kind: str, n: int) -> Record:
    """A record of ``kind`` whose names and ids are picked by the digits of ``n`` (drawing
    plain integers keeps generation fast; hypothesis still shrinks them)."""
    vhost, name, queue = _pick(_VHOSTS, n), _pick(_EXCHANGES, n // 4), _pick(_QUEUES, n // 8)
    journal_id = 1 + (n // 32) % 12
    binding = {
        "vhost": vhost,
        "queue": queue,
        "exchange": _pick(_BIND_EXCHANGES, n // 32),
        "key": _pick(_KEYS, n // 128),
        "arguments": _pick(_ARGS, n // 256),
    }
    match kind:
        case "exchange.declare":
            return ExchangeDeclare(vhost=vhost, name=name, type=_pick(["direct", "topic"], n // 8))
        case "exchange.delete":
            return ExchangeDelete(vhost=vhost, name=name)
        case "queue.declare":
            arguments = _pick([{}, {"x-a": 1}, {"x-queue-type": "stream"}], n // 32)
            return QueueDeclare(vhost=vhost, name=queue, arguments=arguments)
        case "queue.delete":
            return QueueDelete(vhost=vhost, name=queue)
        case "queue.purge":
            return QueuePurge(vhost=vhost, name=queue)
        case "queue.bind":
            return QueueBind(**binding)
        case "queue.unbind":
            return QueueUnbind(**binding)
        case "message.enqueue":
            return MessageEnqueue(
                id=journal_id,
                vhost=vhost,
                queues=_pick(_TARGETS, n // 4),
                exchange="",
                body=bytes([n % 251]) * (n % 3),
            )
        case "message.delivered":
            return MessageDelivered(id=journal_id, queue=queue)
        case "message.ack":
            return MessageAck(id=journal_id, queue=queue)
        case "stream.append":
            return StreamAppend(
                vhost=vhost, queue=queue, offset=n % 97, exchange="x", body=bytes([n % 251])
            )
        case "stream.truncate":
            return StreamTruncate(vhost=vhost, queue=queue, before=n % 101)
        case "stream.track":
            return StreamTrack(vhost=vhost, queue=queue, name=_pick(["a", "b"], n), offset=n % 50)
        case "snapshot.begin":
            return SnapshotBegin(last_journal_id=n % 20)
        case _:
            return SnapshotEnd()


#: Record kinds, repeated by weight.
_KINDS = (
    ["exchange.declare"] * 4
    + ["exchange.delete", "queue.delete", "queue.purge"] * 2
    + ["snapshot.begin", "snapshot.end"]
    + ["queue.declare"] * 6
    + ["queue.bind"] * 6
    + ["queue.unbind"] * 3
    + ["message.enqueue"] * 28
    + ["message.delivered"] * 12
    + ["message.ack"] * 10
    + ["stream.append"] * 12
    + ["stream.truncate"] * 2
    + ["stream.track"] * 2
)
_SETUP_KINDS = ["exchange.declare", "queue.declare", "queue.declare", "queue.bind"]
_N = st.integers(0, 2**12 - 1)
#: Declarations first (so messages have somewhere to go), then anything.
HISTORY = st.builds(
    lambda setup, ops: (
        [_build(_SETUP_KINDS[k], n) for k, n in setup] + [_build(_KINDS[k], n) for k, n in ops]
    ),
    st.lists(st.tuples(st.integers(0, len(_SETUP_KINDS) - 1), _N), min_size=4, max_size=12),
    st.lists(st.tuples(st.integers(0, len(_KINDS) - 1), _N), min_size=20, max_size=80),
)


class ReferenceModel:
    """The fold rules written the slow, obvious way, to check StoreState against."""

    def __init__(self) -> None:
        self.exchanges: dict[tuple[str, str], Record] = {}
        self.queues: dict[tuple[str, str], list[list[Any]]] = {}  # [id, delivered]
        self.bindings: list[tuple[str, str, str, str, Any]] = []
        self.messages: dict[int, MessageEnqueue] = {}
        self.last_journal_id = 0

    def holders(self, journal_id: int) -> list[tuple[str, str]]:
        return [k for k, entries in self.queues.items() if any(e[0] == journal_id for e in entries)]

    def drop(self, key: tuple[str, str], journal_id: int) -> None:
        self.queues[key] = [e for e in self.queues[key] if e[0] != journal_id]
        if not self.holders(journal_id):
            del self.messages[journal_id]

    def apply(self, r: Record) -> None:
        if isinstance(r, ExchangeDeclare):
            self.exchanges[(r.vhost, r.name)] = r
        elif isinstance(r, ExchangeDelete):
            if self.exchanges.pop((r.vhost, r.name), None) is not None:
                self.bindings = [b for b in self.bindings if (b[0], b[1]) != (r.vhost, r.name)]
        elif isinstance(r, QueueDeclare):
            self.queues.setdefault((r.vhost, r.name), [])
        elif isinstance(r, QueueDelete | QueuePurge):
            key = (r.vhost, r.name)
            if key in self.queues:
                for journal_id, _ in list(self.queues[key]):
                    self.drop(key, journal_id)
                if isinstance(r, QueueDelete):
                    del self.queues[key]
                    self.bindings = [b for b in self.bindings if (b[0], b[2]) != key]
        elif isinstance(r, QueueBind):
            ident = (r.vhost, r.exchange, r.queue, r.key, repr(r.arguments))
            known = (r.vhost, r.exchange) in self.exchanges or r.exchange.startswith("amq.")
            if (r.vhost, r.queue) in self.queues and known and ident not in self.bindings:
                self.bindings.append(ident)
        elif isinstance(r, QueueUnbind):
            ident = (r.vhost, r.exchange, r.queue, r.key, repr(r.arguments))
            self.bindings = [b for b in self.bindings if b != ident]
        elif isinstance(r, MessageEnqueue):
            self.last_journal_id = max(self.last_journal_id, r.id)
            targets = [(r.vhost, q) for q in r.queues if (r.vhost, q) in self.queues]
            if r.id not in self.messages and targets:
                self.messages[r.id] = r
                for key in targets:
                    self.queues[key].append([r.id, False])
        elif isinstance(r, MessageDelivered | MessageAck):
            if r.id not in self.messages:
                return
            key = (self.messages[r.id].vhost, r.queue)
            if key not in self.holders(r.id):
                return
            if isinstance(r, MessageAck):
                self.drop(key, r.id)
            else:
                for entry in self.queues[key]:
                    if entry[0] == r.id:
                        entry[1] = True
        elif isinstance(r, SnapshotBegin):
            self.__init__()  # type: ignore[misc]
            self.last_journal_id = r.last_journal_id


def _view(state: StoreState) -> dict[str, Any]:
    queues = {(q.vhost, q.name): state.messages(q.vhost, q.name) for q in state.queues()}
    return {
        "exchanges": {(e.vhost, e.name): e for e in state.exchanges()},
        "queues": {key: [[m.record.id, m.redelivered] for m in ms] for key, ms in queues.items()},
        "bindings": sorted(
            (b.vhost, b.exchange, b.queue, b.key, repr(b.arguments)) for b in state.bindings()
        ),
        "bodies": {m.record.id: m.record.body for ms in queues.values() for m in ms},
        "last_id": state.last_journal_id,
    }


@settings(max_examples=100, deadline=None, database=None)
@given(HISTORY)
def test_fold_matches_the_reference_model(records: list[Record]) -> None:
    model = ReferenceModel()
    for r in records:
        model.apply(r)
    view = _view(fold(records))
    assert view["exchanges"] == model.exchanges
    assert view["queues"] == model.queues
    assert view["bindings"] == sorted(model.bindings)
    assert view["bodies"] == {journal_id: m.body for journal_id, m in model.messages.items()}
    assert view["last_id"] == model.last_journal_id


@settings(max_examples=100, deadline=None, database=None)
@given(HISTORY)
def test_a_snapshot_replays_to_the_same_state(records: list[Record]) -> None:
    state = fold(records)
    snapshot = state.snapshot()
    rebuilt = fold(snapshot)
    assert rebuilt == state
    assert rebuilt.snapshot() == snapshot


@settings(max_examples=100, deadline=None, database=None)
@given(HISTORY, st.integers(0, 100))
def test_snapshot_of_a_prefix_then_the_rest_equals_the_whole_history(
    records: list[Record], split: int
) -> None:
    """What compaction relies on: fold(snapshot(fold(a)) + b) == fold(a + b)."""
    before, after = records[:split], records[split:]
    compacted = fold(before).snapshot()
    assert fold(compacted + after) == fold(before + after)


@settings(max_examples=50, deadline=None, database=None)
@given(HISTORY)
def test_snapshot_records_survive_encoding(records: list[Record]) -> None:
    snapshot = fold(records).snapshot()
    assert [decode_record(encode_record(r)) for r in snapshot] == snapshot


def test_a_snapshot_keeps_first_when_a_truncation_leaves_a_gap() -> None:
    """Found by the property above: appends at offsets 0 and 23, then everything
    below 1 truncated; the snapshot must rebuild the same ``first`` (23)."""
    records = [_build(_SETUP_KINDS[0], 0) for _ in range(4)] + [
        _build(_KINDS[k], n) for k, n in [(0, 0)] * 16 + [(12, 2664), (77, 0), (77, 120), (89, 1)]
    ]
    state = fold(records)
    snapshot = state.snapshot()
    assert fold(snapshot) == state
    assert fold(snapshot).snapshot() == snapshot


def _out(oid: int, link: str = "x") -> PeeringOut:
    return PeeringOut(exchange="x", link=link, id=oid, body=b"%d" % oid)


def test_a_durable_sending_log_keeps_what_no_ack_covers_per_link() -> None:
    state = fold(
        [
            _out(1),
            _out(2, link="y"),
            _out(3),
            _out(4),
            PeeringOutAck(exchange="x", link="x", id=3),  # cumulative, this link only
        ]
    )
    assert {k: list(v) for k, v in state.peering_out.items()} == {
        ("/", "x", "y"): [2],
        ("/", "x", "x"): [4],
    }
    assert state.last_peering_out == 4
    again = fold(state.snapshot())  # compaction keeps the live ones, in order
    assert {k: list(v) for k, v in again.peering_out.items()} == {
        ("/", "x", "y"): [2],
        ("/", "x", "x"): [4],
    }
    gone = fold([_out(1), PeeringOutAck(exchange="x", link="x", id=9)])
    assert gone.peering_out == {} and gone.last_peering_out == 9
