"""Records: every type round-trips through CBOR; ill-typed maps are refused clearly."""

from __future__ import annotations

import dataclasses
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.store import (
    ExchangeDeclare,
    ExchangeDelete,
    GroupOwner,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    MessageMarks,
    PeeringMarks,
    PeeringOut,
    PeeringOutAck,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    Record,
    RecordError,
    SnapshotBegin,
    SnapshotEnd,
    StreamAppend,
    StreamTrack,
    StreamTruncate,
    decode_record,
    encode_record,
)
from amqlite.store.codec import _encode_enqueue, _encode_marks, encode_plain_enqueue
from amqlite.store.records import (
    MAX_JOURNAL_ID,
    RECORD_TYPES,
    new_message_enqueue,
    record_from_map,
    record_to_map,
)
from amqlite.store.segment import frame, frame_record

FULL: list[Record] = [
    ExchangeDeclare(
        vhost="v",
        name="logs",
        type="topic",
        auto_delete=True,
        internal=True,
        arguments={"alternate-exchange": "ae", "nested": {"a": [1, 2.5, None, b"x"]}},
    ),
    ExchangeDelete(vhost="v", name="logs"),
    QueueDeclare(vhost="v", name="jobs", auto_delete=True, arguments={"x-message-ttl": 500}),
    QueueDelete(vhost="v", name="jobs"),
    QueuePurge(vhost="v", name="jobs"),
    QueueBind(vhost="v", queue="jobs", exchange="h", key="k", arguments={"x-match": "any"}),
    QueueUnbind(vhost="v", queue="jobs", exchange="h", key="k", arguments={"x-match": "any"}),
    MessageEnqueue(
        id=2**63 - 1,
        vhost="v",
        queues=("a", "b"),
        exchange="logs",
        routing_key="x.y",
        body=b"\x00\xffbody",
        headers={"h": 1, "s": "t", "f": 1.5, "b": b"", "n": None, "t": True},
        props={"persistent": True, "priority": 3, "message_id": "m-1", "expiration": 10},
        enqueued_at=1_700_000_000.25,
        deaths=(("a", "expired"), ("dlq", "rejected")),
        publish_key="5f0c2a9e1b7d4c63:41",
    ),
    MessageEnqueue(  # no deaths: the hand-written encoder's path, with a publish key
        id=9,
        queues=("a",),
        exchange="logs",
        body=b"b",
        props={"persistent": True},
        enqueued_at=1_700_000_000.5,
        publish_key="5f0c2a9e1b7d4c63:42",
    ),
    MessageEnqueue(  # in a peering queue: the generic path keeps its peering identity
        id=10,
        queues=("amq.peering.x.b/x",),
        exchange="x",
        body=b"p",
        mesh={"id": ["site-b", 7, 41], "path": ["site-c"], "hops": 1},
    ),
    MessageDelivered(id=7, queue="a"),
    MessageAck(id=7, queue="a"),
    MessageMarks(queue="a", delivered=(8, 9), acked=(7, 10)),
    StreamAppend(
        vhost="v",
        queue="events",
        offset=12,
        exchange="logs",
        routing_key="x.y",
        body=b"e",
        headers={"h": 1},
        props={"message_id": "m-2"},
        enqueued_at=1_700_000_001.5,
        publish_key="5f0c2a9e1b7d4c63:43",
    ),
    StreamTruncate(vhost="v", queue="events", before=10),
    StreamTrack(vhost="v", queue="events", name="spark-audit", offset=11),
    PeeringMarks(
        vhost="v",
        exchange="events",
        marks={"version": 1, "marks": [["b", "x", 3, 7]], "seen": [["b", 3, 5, [7]]]},
    ),
    PeeringOut(
        vhost="v",
        exchange="events",
        link="events->b",
        id=3,
        routing_key="k.a",
        body=b"m",
        headers={"p": "a"},
        props={"persistent": True},
        mesh={"id": ["a", 1, 3], "path": ["a"], "hops": 1},
    ),
    PeeringOutAck(vhost="v", exchange="events", link="events->b", id=3),
    GroupOwner(vhost="v", queue="orders", group="customer-42", owner="i:abc/ctag-1"),
    SnapshotBegin(last_journal_id=42),
    SnapshotEnd(),
]

MINIMAL: list[Record] = [
    ExchangeDeclare(name="e", type="direct"),
    ExchangeDelete(name="e"),
    QueueDeclare(name="q"),
    QueueDelete(name="q"),
    QueuePurge(name="q"),
    QueueBind(queue="q", exchange="e"),
    QueueUnbind(queue="q", exchange="e"),
    MessageEnqueue(id=0, queues=("q",), exchange="", body=b""),
    MessageDelivered(id=0, queue="q"),
    MessageAck(id=0, queue="q"),
    MessageMarks(queue="q"),
    StreamAppend(queue="s", offset=0, exchange="", body=b""),
    StreamTruncate(queue="s", before=0),
    StreamTrack(queue="s", name="c", offset=0),
    PeeringMarks(exchange="x"),
    PeeringOut(exchange="x", link="x", id=0, body=b""),
    PeeringOutAck(exchange="x", link="x", id=0),
    GroupOwner(queue="q", group="g"),
    SnapshotBegin(),
    SnapshotEnd(),
]


def test_the_examples_cover_every_record_type() -> None:
    assert {type(r) for r in FULL} == set(RECORD_TYPES)
    assert {type(r) for r in MINIMAL} == set(RECORD_TYPES)


@pytest.mark.parametrize("record", FULL + MINIMAL, ids=lambda r: type(r).TYPE)
def test_round_trip(record: Record) -> None:
    payload = encode_record(record)
    assert decode_record(payload) == record
    assert cbor2.loads(payload)["t"] == type(record).TYPE


def test_defaults_are_left_out_and_short_keys_used() -> None:
    m = record_to_map(MINIMAL[7])
    assert m == {"t": "message.enqueue", "id": 0, "queues": ("q",), "exchange": "", "body": b""}
    m = record_to_map(FULL[7])
    assert {"key", "at"} <= m.keys()
    assert "routing_key" not in m and "enqueued_at" not in m
    assert record_to_map(SnapshotBegin(last_journal_id=3)) == {"t": "snapshot.begin", "last_id": 3}


def test_records_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        QueueDeclare(name="q").name = "other"  # type: ignore[misc]


def _enqueue_map(**changes: Any) -> dict[str, Any]:
    m = {"t": "message.enqueue", "id": 1, "queues": ["q"], "exchange": "", "body": b"x"}
    m.update(changes)
    return {k: v for k, v in m.items() if v is not ...}


BAD_MAPS: list[tuple[Any, str]] = [
    ([1, 2], "a record must be a map"),
    ({"t": "queue.explode", "name": "q"}, "unknown record type 'queue.explode'"),
    ({"name": "q"}, "unknown record type None"),
    ({"t": 5}, "unknown record type 5"),
    ({"t": "queue.declare"}, "queue.declare: missing field 'name'"),
    ({"t": "queue.declare", "name": 3}, "queue.declare: field 'name' must be text"),
    ({"t": "queue.declare", "name": "q", "colour": 1}, "unknown fields ['colour']"),
    ({"t": "queue.declare", "name": "q", "auto_delete": 1}, "'auto_delete' must be a boolean"),
    ({"t": "queue.declare", "name": "q", "arguments": []}, "'arguments' must be a map"),
    ({"t": "queue.declare", "name": "q", "arguments": {1: 2}}, "'arguments' must be a map"),
    (_enqueue_map(id=-1), "'id' must be an integer in [0, 2**63)"),
    (_enqueue_map(id=2**63), "'id' must be an integer in [0, 2**63)"),
    (_enqueue_map(id=True), "'id' must be an integer"),
    (_enqueue_map(queues=[]), "'queues' must be a non-empty list of text"),
    (_enqueue_map(queues=["a", 1]), "'queues' must be a non-empty list of text"),
    (_enqueue_map(queues=["a", "a"]), "'queues' must not name a queue twice"),
    (_enqueue_map(body="text"), "'body' must be bytes"),
    ({"t": "message.marks", "queue": "q", "acked": 3}, "'acked' must be a list of journal ids"),
    ({"t": "message.marks", "queue": "q", "acked": [1, 0]}, "'acked' must be a list of journal"),
    ({"t": "message.marks", "queue": "q", "delivered": [True]}, "'delivered' must be a list"),
    ({"t": "message.marks", "queue": "q", "delivered": [2**63]}, "'delivered' must be a list"),
    (_enqueue_map(headers={"h": [1]}), "'headers' value of 'h' must be a scalar"),
    (_enqueue_map(props={"colour": "red"}), "'props' unknown property 'colour'"),
    (_enqueue_map(props={"priority": "high"}), "'props' property 'priority' must be int"),
    (_enqueue_map(at="now"), "'at' must be a number"),
    (_enqueue_map(deaths=[["q"]]), "'deaths' must be a list of [queue, reason] pairs"),
    (_enqueue_map(deaths=[["q", 1]]), "'deaths' must be a list of [queue, reason] text pairs"),
    (_enqueue_map(exchange=...), "message.enqueue: missing field 'exchange'"),
    (_enqueue_map(pk=41), "'pk' must be text"),
    ({"t": "message.ack", "id": 1}, "message.ack: missing field 'queue'"),
]


@pytest.mark.parametrize(("m", "text"), BAD_MAPS, ids=[t for _, t in BAD_MAPS])
def test_ill_typed_maps_are_refused_with_the_reason(m: Any, text: str) -> None:
    with pytest.raises(RecordError) as info:
        record_from_map(m)
    assert text in info.value.text
    with pytest.raises(RecordError) as info:  # the hand-written decoders too
        decode_record(cbor2.dumps(m))
    assert text in info.value.text


@pytest.mark.parametrize("record", FULL + MINIMAL, ids=lambda r: type(r).TYPE)
def test_the_fast_and_generic_paths_read_each_other(record: Record) -> None:
    generic = cbor2.dumps(record_to_map(record))
    assert decode_record(generic) == record
    assert record_from_map(cbor2.loads(encode_record(record))) == record
    assert cbor2.loads(encode_record(record)) == cbor2.loads(generic)


def test_bad_cbor_is_a_record_error() -> None:
    with pytest.raises(RecordError, match="not a CBOR record"):
        decode_record(b"\xff\xff")
    with pytest.raises(RecordError, match="must be a map"):
        decode_record(cbor2.dumps("text"))
    tagged = cbor2.dumps({"t": "queue.declare", "name": "q", "arguments": {"d": {1, 2}}})
    with pytest.raises(RecordError, match="'arguments' must be a map"):
        decode_record(tagged)


def _minimal_enqueue() -> MessageEnqueue:
    record = MINIMAL[7]
    assert isinstance(record, MessageEnqueue)
    return record


def test_encoding_checks_fields_too() -> None:
    """Nothing is written that recovery would refuse."""
    with pytest.raises(RecordError, match=r"message.enqueue: field 'body' must be bytes"):
        encode_record(dataclasses.replace(_minimal_enqueue(), body="text"))  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="'headers'"):
        bad: dict[str, Any] = {"h": object()}
        encode_record(dataclasses.replace(_minimal_enqueue(), headers=bad))
    with pytest.raises(RecordError, match="'id' must be an integer"):
        encode_record(MessageAck(id=-5, queue="q"))
    with pytest.raises(RecordError, match="not a journal record"):
        encode_record("queue.declare")  # type: ignore[arg-type]


def test_an_integer_time_reads_back_as_a_float() -> None:
    record = decode_record(cbor2.dumps(_enqueue_map(at=12)))
    assert isinstance(record, MessageEnqueue)
    assert record.enqueued_at == 12.0 and type(record.enqueued_at) is float


_text = st.text(max_size=8)
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), _text,
    st.binary(max_size=8),
)  # fmt: skip


@settings(max_examples=150, deadline=None, database=None)
@given(
    journal_id=st.integers(0, 2**63 - 1),
    vhost=_text,
    queues=st.lists(_text, min_size=1, max_size=4, unique=True),
    exchange=_text,
    key=_text,
    body=st.binary(max_size=64),
    headers=st.dictionaries(_text, _scalar, max_size=4),
    priority=st.none() | st.integers(0, 255),
    at=st.floats(0, 4e9),
    deaths=st.lists(st.tuples(_text, _text), max_size=3),
)
def test_message_enqueue_round_trips(
    journal_id: int,
    vhost: str,
    queues: list[str],
    exchange: str,
    key: str,
    body: bytes,
    headers: dict[str, Any],
    priority: int | None,
    at: float,
    deaths: list[tuple[str, str]],
) -> None:
    props: dict[str, Any] = {"persistent": True}
    if priority is not None:
        props["priority"] = priority
    record = MessageEnqueue(
        id=journal_id,
        vhost=vhost,
        queues=tuple(queues),
        exchange=exchange,
        routing_key=key,
        body=body,
        headers=headers,
        props=props,
        enqueued_at=at,
        deaths=tuple(deaths),
    )
    assert decode_record(encode_record(record)) == record
    assert record_from_map(cbor2.loads(encode_record(record))) == record
    assert decode_record(cbor2.dumps(record_to_map(record))) == record


_TEXT = st.text(max_size=8)


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(
        st.integers(0, 2**63 - 1),
        _TEXT,
        st.lists(_TEXT, min_size=1, max_size=3).map(tuple),
        _TEXT,
        _TEXT,
        st.binary(max_size=16),
        st.dictionaries(_TEXT, st.integers() | _TEXT, max_size=3),
        st.sampled_from([{}, {"persistent": True}, {"persistent": True, "priority": 3}]),
        st.floats(allow_nan=False),
        st.lists(st.tuples(_TEXT, _TEXT), max_size=2).map(tuple),
        _TEXT,
        st.sampled_from([{}, {"id": ["b", 1, 7], "path": [], "hops": 0}]),
    )
)
def test_the_fast_enqueue_constructor_makes_the_record_init_makes(values: Any) -> None:
    fast = new_message_enqueue(*values)
    names = [f.name for f in dataclasses.fields(MessageEnqueue)]
    assert fast == MessageEnqueue(**dict(zip(names, values, strict=True)))
    assert all(getattr(fast, n) is v for n, v in zip(names, values, strict=True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.id = 3  # type: ignore[misc]


@settings(max_examples=300, deadline=None, database=None)
@given(
    journal_id=st.integers(0, 2**63 - 1) | st.sampled_from([-1, 2**63, True]),
    vhost=st.sampled_from(["/", "v"]) | _TEXT,
    queues=st.lists(_TEXT, min_size=1, max_size=3).map(tuple)
    | st.sampled_from([(), ("a", "a"), ["q"], ("q", 1)]),
    exchange=st.sampled_from(["", "amq.direct"]) | _TEXT,
    key=st.sampled_from(["", "q"]) | _TEXT,
    body=st.binary(max_size=300) | st.sampled_from(["text", bytearray(b"x")]),
    headers=st.sampled_from([{}, {"h": 1}, None]),
    props=st.sampled_from(
        [{"persistent": True}, {"persistent": 1}, {"persistent": True, "priority": 3}, {}, None]
    ),
    at=st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 12, 0]),
    pk=st.sampled_from(["", "k-1"]) | _TEXT | st.just(7),
    deaths=st.sampled_from([(), (("q", "expired"),)]),
    mesh=st.sampled_from([{}, {"id": ["b", 1, 7], "path": [], "hops": 0}]),
)
def test_the_plain_enqueue_encoder_gives_the_general_bytes(
    journal_id: Any,
    vhost: Any,
    queues: Any,
    exchange: Any,
    key: Any,
    body: Any,
    headers: Any,
    props: Any,
    at: Any,
    pk: Any,
    deaths: Any,
    mesh: Any,
) -> None:
    """``encode_plain_enqueue`` (the usual persistent message, from a template per
    route) gives ``_encode_enqueue``'s bytes whenever it gives any, and gives them
    for every plain record; the journal's frame is the same either way."""
    record = new_message_enqueue(
        journal_id, vhost, queues, exchange, key, body, headers, props, at, deaths, pk, mesh
    )
    plain = encode_plain_enqueue(record)
    general = _encode_enqueue(record)
    if plain is not None:
        assert plain == general
        assert decode_record(plain) == record
    usual = (
        headers == {}
        and props == {"persistent": True}
        and type(props["persistent"]) is bool
        and type(at) is float
        and at != 0.0
        and type(pk) is str
        and not deaths
        and not mesh
    )
    if usual and general is not None:
        assert plain is not None
    try:
        expected = frame(encode_record(record))
    except RecordError:
        with pytest.raises(RecordError):
            frame_record(record)
    else:
        assert frame_record(record) == expected


@settings(max_examples=200, deadline=None, database=None)
@given(
    journal_id=st.integers(0, 2**63 - 1),
    vhost=st.sampled_from(["/", "v"]) | _TEXT,
    queues=st.lists(_TEXT, min_size=1, max_size=3, unique=True).map(tuple),
    exchange=st.sampled_from(["", "amq.direct"]) | _TEXT,
    key=st.sampled_from(["", "q"]) | _TEXT,
    body=st.binary(max_size=300),
    at=st.floats(1.0, 4e9) | st.floats(allow_nan=False).filter(bool),
    pk=st.sampled_from(["", "k-1"]) | _TEXT,
)
def test_the_plain_enqueue_encoder_takes_every_usual_message(
    journal_id: int,
    vhost: str,
    queues: tuple[str, ...],
    exchange: str,
    key: str,
    body: bytes,
    at: float,
    pk: str,
) -> None:
    record = new_message_enqueue(
        journal_id, vhost, queues, exchange, key, body, {}, {"persistent": True}, at, (), pk, {}
    )
    plain = encode_plain_enqueue(record)
    assert plain is not None
    assert plain == _encode_enqueue(record)
    assert decode_record(plain) == record
    assert frame_record(record) == frame(plain)


_ID = (
    st.integers(1, 300)
    | st.integers(255, 257)
    | st.integers(65_000, 66_000)
    | st.integers(2**32 - 3, 2**32 + 3)
    | st.integers(1, MAX_JOURNAL_ID)
)
_IDS = st.lists(_ID | st.sampled_from([0, -1, True, False, 300.0, "300", 2**64]), max_size=6).map(
    tuple
) | st.sampled_from([[300], [], None])


@settings(max_examples=600, deadline=None)
@given(queue=_TEXT | st.sampled_from(["q", 7]), delivered=_IDS, acked=_IDS)
def test_the_marks_encoder_gives_the_general_bytes(queue: Any, delivered: Any, acked: Any) -> None:
    """``_encode_marks`` (ids of one CBOR width, checked and written a record at a
    time) gives the general path's bytes whenever it gives any, and gives them for
    every record of ids of one width."""
    record = MessageMarks(queue=queue, delivered=delivered, acked=acked)
    fast = _encode_marks(record)
    try:
        general: bytes | None = cbor2.dumps(record_to_map(record))
    except RecordError:
        general = None
    if fast is not None:
        assert fast == general
        assert decode_record(fast) == record
    ids = [i for part in (delivered, acked) if part for i in part if type(i) is int]
    usual = (
        type(queue) is str
        and type(delivered) is tuple
        and type(acked) is tuple
        and len(ids) == len(delivered) + len(acked)
        and all(
            all(256 <= i < 65536 for i in part) or all(65536 <= i < 2**32 for i in part)
            for part in (delivered, acked)
        )
    )
    assert (fast is not None) == usual
