"""Property tests: hostile bytes never crash the decoder, valid events round-trip
exactly, and the handshake accepts a frame iff the state table allows it."""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
from typing import Any, get_args, get_origin

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqlite.client.bulk import StreamBatch
from amqlite.errors import LocalProtocolError, RemoteProtocolError, ReplyCode
from amqlite.protocol import (
    BY_METHOD,
    NEED_DATA,
    PROPERTY_TYPES,
    TRANSITIONS,
    WIRE_EVENTS,
    Connection,
    ConnState,
    Role,
    Sender,
    Trigger,
    codec,
)
from amqlite.protocol import events as ev
from amqlite.protocol.states import trigger_of

from .wire import FULL, FakeMessage, conn_in, frame, open_pair, pair_ready_for, senders

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_REPLY_CODES = {int(c) for c in ReplyCode}


def _drain(conn: Connection) -> tuple[list[ev.Event], RemoteProtocolError | None]:
    """Every event now buffered; stops at NEED_DATA or at the first error."""
    out: list[ev.Event] = []
    while True:
        try:
            event = conn.next_event()
        except RemoteProtocolError as exc:
            return out, exc
        if event is NEED_DATA:
            return out, None
        assert isinstance(event, ev.Event)
        out.append(event)
        if type(event) is ev.EndOfStream:
            return out, None


def _check_error(exc: RemoteProtocolError) -> None:
    assert type(exc) is RemoteProtocolError
    assert exc.code in _REPLY_CODES
    assert isinstance(exc.text, str) and exc.text


def _check_event(event: ev.Event, role: Role) -> None:
    """Only the peer's wire events or the two local pseudo-events come out."""
    if isinstance(event, ev.BadRequest):
        assert role is Role.SERVER
        assert event.code in _REPLY_CODES
        return
    if isinstance(event, ev.EndOfStream):
        return
    assert type(event) in WIRE_EVENTS
    assert type(event).SENDER is not (Sender.CLIENT if role is Role.CLIENT else Sender.SERVER)


def _feed_chunks(conn: Connection, role: Role, chunks: list[bytes], eof: bool) -> None:
    error: RemoteProtocolError | None = None
    for chunk in [*chunks, b""] if eof else chunks:
        conn.receive_data(chunk)
        events, exc = _drain(conn)
        if error is not None:
            # after an error nothing else comes out: the same error, every time
            assert events == [] and exc is error
            continue
        for event in events:
            _check_event(event, role)
        if exc is not None:
            _check_error(exc)
            assert conn.state is ConnState.ERROR
            error = exc
    if error is not None:
        try:
            conn.events()
        except RemoteProtocolError as exc:
            assert exc is error
        else:
            raise AssertionError("events() after an error must raise it again")


# --- (a) arbitrary bytes in arbitrary chunks ---------------------------------------

_valid_frames = st.sampled_from(
    [frame(m) for m in ({"m": "status", "id": 1}, {"m": "heartbeat"}, {"m": "hello", "id": 1})]
)
_byte_soup = st.lists(st.one_of(st.binary(max_size=64), _valid_frames), max_size=12).map(b"".join)


@st.composite
def _chunked(draw: st.DrawFn, data: st.SearchStrategy[bytes]) -> list[bytes]:
    blob = draw(data)
    cuts = sorted(draw(st.lists(st.integers(0, len(blob)), max_size=8)))
    bounds = [0, *cuts, len(blob)]
    return [blob[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@FUZZ
@given(
    chunks=_chunked(st.one_of(st.binary(max_size=200), _byte_soup)),
    state=st.sampled_from([ConnState.HANDSHAKE, ConnState.OPEN]),
    eof=st.booleans(),
)
def test_arbitrary_bytes_to_a_server(chunks: list[bytes], state: ConnState, eof: bool) -> None:
    conn = conn_in(Role.SERVER, state)
    conn.max_frame_size = 1 << 16
    _feed_chunks(conn, Role.SERVER, chunks, eof)


@FEW
@given(chunks=_chunked(st.one_of(st.binary(max_size=200), _byte_soup)), eof=st.booleans())
def test_arbitrary_bytes_to_a_client(chunks: list[bytes], eof: bool) -> None:
    _feed_chunks(conn_in(Role.CLIENT, ConnState.OPEN), Role.CLIENT, chunks, eof)


# --- strategies for well-typed values --------------------------------------------

_finite = st.floats(allow_nan=False, allow_infinity=True)
_text = st.text(max_size=16)
_ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_header_values = st.one_of(st.none(), st.booleans(), _ints, _finite, _text, st.binary(max_size=16))
_headers = st.dictionaries(_text, _header_values, max_size=5)
_prop_values = {
    name: (
        st.integers(0, codec.PROPERTY_MAX.get(name, 2**63 - 1))
        if t is int
        else st.booleans()
        if t is bool
        else _text
    )
    for name, t in PROPERTY_TYPES.items()
}  # fmt: skip
_props = st.fixed_dictionaries({}, optional=_prop_values)
_json_like = st.recursive(
    st.one_of(st.none(), st.booleans(), _ints, _finite, _text, st.binary(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=8,
)


_batch_message = st.one_of(
    st.tuples(_text, st.binary(max_size=32)).map(list),
    st.tuples(
        _text, st.binary(max_size=32), st.one_of(st.none(), _headers), st.one_of(st.none(), _props)
    ).map(list),
)


def _field_strategy(name: str, tp: Any) -> st.SearchStrategy[Any]:
    if name == "msgs":
        return st.lists(_batch_message, min_size=1, max_size=5)
    if name == "extras":
        return st.lists(
            st.tuples(st.integers(0, 5), st.one_of(st.none(), _headers), _props).map(list),
            max_size=3,
        )
    if name == "headers":
        return _headers
    if name == "props":
        return _props
    if tp is str:
        return _text
    if tp is bool:
        return st.booleans()
    if tp is int:
        return _ints
    if tp is float:
        return st.one_of(_finite, _ints)
    if tp is bytes:
        return st.binary(max_size=64)
    if get_origin(tp) is dict:
        return st.dictionaries(_text, _json_like, max_size=4)
    if get_origin(tp) is list:
        return st.lists(_text, max_size=4)
    if get_origin(tp) is types.UnionType:
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        return st.one_of(st.none(), _field_strategy(name, inner))
    raise AssertionError(f"no strategy for {name}: {tp!r}")


# --- (b) arbitrary CBOR maps, framed correctly ----------------------------------------

_METHODS = sorted(BY_METHOD)
_FIELD_NAMES = sorted(
    {f.name for cls in WIRE_EVENTS for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    | set(PROPERTY_TYPES)
)
_cbor_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
)
_cbor_values = st.recursive(
    _cbor_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(_FIELD_NAMES), st.text(max_size=6)), inner,
                        max_size=4),
        st.dictionaries(st.one_of(st.integers(), st.binary(max_size=4)), inner, max_size=2),
    ),
    max_leaves=12,
)  # fmt: skip


@st.composite
def _cbor_frames(draw: st.DrawFn) -> dict[Any, Any]:
    """A map with ``m`` (a real method name, usually), then a few of that method's
    fields (well- or ill-typed) and a few strangers."""
    junk = st.one_of(st.text(max_size=10), _cbor_scalars)
    m = draw(st.sampled_from(_METHODS) if draw(st.integers(0, 4)) else junk)
    cls = BY_METHOD.get(m) if isinstance(m, str) else None
    frame_map: dict[Any, Any] = {"m": m}
    for key in ("id", "re"):  # absent, an integer, or anything at all
        choice = draw(st.integers(0, 2))
        if choice:
            frame_map[key] = draw(st.integers(-5, 2**66) if choice == 1 else _cbor_scalars)
    if cls is not None:
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in ("id", "re") and draw(
                st.integers(0, 7)
            ):  # usually present, usually the right type
                right = _field_strategy(f.name, f.type)
                frame_map[f.name] = draw(right if draw(st.integers(0, 9)) else _cbor_values)
    extra = draw(st.dictionaries(st.sampled_from(_FIELD_NAMES), _cbor_values, max_size=2))
    frame_map.update(extra)
    return frame_map


def _check_cbor_maps(conn: Connection, role: Role, maps: list[dict[str, Any]]) -> None:
    conn.receive_data(b"".join(frame(m) for m in maps))
    events, exc = _drain(conn)
    for event in events:
        _check_event(event, role)
    if exc is not None:
        _check_error(exc)
        assert len(events) < len(maps)
    elif conn.state is ConnState.CLOSED:
        assert len(events) <= len(maps)  # frames after refused/close-ok are dropped
    else:
        assert len(events) == len(maps)
    for event in events:
        if type(event) is ev.BadRequest:
            assert event.code in (ReplyCode.NOT_IMPLEMENTED, ReplyCode.SYNTAX_ERROR)
    if exc is None and conn.state is ConnState.OPEN and role is Role.SERVER:
        # a bad request leaves the connection decoding normally
        conn.receive_data(frame({"m": "status", "id": 4242}))
        assert conn.events() == [ev.Status(id=4242)]


@FUZZ
@given(maps=st.lists(_cbor_frames(), min_size=1, max_size=4))
def test_arbitrary_cbor_maps_to_an_open_server(maps: list[dict[str, Any]]) -> None:
    _check_cbor_maps(conn_in(Role.SERVER, ConnState.OPEN), Role.SERVER, maps)


@FEW
@given(
    maps=st.lists(_cbor_frames(), min_size=1, max_size=3),
    role=st.sampled_from(list(Role)),
    state=st.sampled_from([ConnState.HANDSHAKE, ConnState.AUTHENTICATING, ConnState.OPEN]),
)
def test_arbitrary_cbor_maps_in_any_state(
    maps: list[dict[str, Any]], role: Role, state: ConnState
) -> None:
    _check_cbor_maps(conn_in(role, state), role, maps)


# --- (c) generated valid events round-trip exactly -----------------------------------


_records = st.lists(
    st.builds(FakeMessage, _text, _text, st.binary(max_size=40), _headers, _props), max_size=8
)


@st.composite
def _stream_records(draw: st.DrawFn) -> ev.StreamRecords:
    """A consistent ``stream.records``, as the server builds it."""
    return codec.stream_records(
        draw(st.integers(0, 2**63)),
        draw(st.integers(0, 2**63)),
        draw(_records),
        dropped=draw(st.integers(0, 2**40)),
        kept_first=draw(st.integers(0, 2**40)),
        kept_next=draw(st.integers(0, 2**40)),
    )


@st.composite
def _publish_columns(draw: st.DrawFn) -> ev.PublishColumns:
    """A consistent ``publish.columns``, as the client builds it."""
    return codec.publish_columns(
        draw(st.integers(0, 2**63)),
        draw(_text),
        draw(st.lists(_batch_message, min_size=1, max_size=6)),
        mandatory=draw(st.booleans()),
        persistent=draw(st.booleans()),
    )


def _event_strategy(cls: type[ev.Event]) -> st.SearchStrategy[ev.Event]:
    if cls is ev.StreamRecords:
        return _stream_records()
    if cls is ev.PublishColumns:
        return _publish_columns()
    fields = {
        f.name: _field_strategy(f.name, f.type)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    }
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (1 vs 1.0 vs True differ)."""
    if type(a) is not type(b):
        return isinstance(a, float) and isinstance(b, int) and a == b  # 5.0 sent as float
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


@FUZZ
@given(data=st.data(), cls=st.sampled_from(WIRE_EVENTS))
def test_generated_events_round_trip(data: st.DataObject, cls: type[ev.Event]) -> None:
    event = data.draw(_event_strategy(cls))
    sender = data.draw(st.sampled_from(senders(cls)))
    src, dst = pair_ready_for(cls, sender)
    dst.receive_data(src.send(event))
    (got,) = dst.events()
    assert type(got) is cls
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        original, decoded = getattr(event, f.name), getattr(got, f.name)
        assert _same(decoded, original) or _same(original, decoded), f.name
    assert got == event


@FUZZ
@given(
    ctag=_text,
    dtag=st.integers(0, 2**64 - 1),
    re=_ints,
    remaining=st.integers(0, 2**40),
    redelivered=st.booleans(),
    exchange=_text,
    key=_text,
    body=st.binary(max_size=300),
    headers=_headers,
    props=_props,
    queue=_text,
)
def test_generated_deliveries_round_trip(
    ctag: str,
    dtag: int,
    re: int,
    remaining: int,
    redelivered: bool,
    exchange: str,
    key: str,
    body: bytes,
    headers: dict[str, Any],
    props: dict[str, Any],
    queue: str,
) -> None:
    client, server = open_pair()
    msg = FakeMessage(exchange, key, body, headers, props)
    client.receive_data(
        server.send_deliver(ctag, dtag, redelivered, msg)
        + server.send_get_ok(re, dtag, redelivered, remaining, queue, msg)
    )
    deliver, get_ok = client.events()
    assert deliver == ev.Deliver(ctag, dtag, exchange, key, body, headers, props, redelivered)
    assert get_ok == ev.GetOk(
        re, dtag, exchange, key, body, headers, props, redelivered, remaining, queue
    )


@FUZZ
@given(messages=_records, re=st.integers(0, 2**40), first=st.integers(0, 2**40))
def test_stream_records_carry_every_record_exactly(
    messages: list[FakeMessage], re: int, first: int
) -> None:
    """The columns of a ``stream.records`` read back into the very records."""
    client, server = open_pair()
    reply = codec.stream_records(re, first, messages, dropped=0, kept_first=0, kept_next=0)
    client.receive_data(server.send(reply))
    (got,) = client.events()
    assert isinstance(got, ev.StreamRecords)
    batch = StreamBatch(got)
    expected = [
        (first + i, m.exchange, m.routing_key, m.body, m.headers, m.properties)
        for i, m in enumerate(messages)
    ]
    assert list(batch.rows()) == expected


@FUZZ
@given(
    data=st.data(),
    records=_stream_records(),
    field_name=st.sampled_from(
        ["first", "count", "keys", "key_ends", "exchanges", "exchange_ends", "bodies",
         "body_ends", "extras", "dropped"]
    ),
)  # fmt: skip
def test_damaged_stream_records_fail_cleanly(
    data: st.DataObject, records: ev.StreamRecords, field_name: str
) -> None:
    """One field of a valid ``stream.records`` replaced by anything: the client
    decodes a consistent event or fails the connection with a reply code, never
    crashes, never hands out ends that run outside their values."""
    m = codec.event_to_map(records)
    m[field_name] = data.draw(st.one_of(_cbor_values, st.binary(max_size=40)))
    conn = conn_in(Role.CLIENT, ConnState.OPEN)
    conn.receive_data(frame(m))
    events, exc = _drain(conn)
    if exc is not None:
        _check_error(exc)
        return
    (got,) = events
    assert isinstance(got, ev.StreamRecords)
    batch = StreamBatch(got)
    for name, ends in (
        ("bodies", batch.body_ends), ("keys", batch.key_ends), ("exchanges", batch.exchange_ends)
    ):  # fmt: skip
        assert len(ends) == got.count + 1 and ends[-1] == len(getattr(got, name))
        assert list(ends) == sorted(ends)
    assert len(list(batch.rows())) == got.count


@FUZZ
@given(msgs=st.one_of(st.lists(_batch_message, max_size=4), _cbor_values))
def test_publish_batch_messages_are_checked(msgs: Any) -> None:
    """A server takes a ``publish.batch`` whose messages are all well formed and
    answers any other with a soft 502 for that request."""
    conn = conn_in(Role.SERVER, ConnState.OPEN)
    conn.receive_data(frame({"m": "publish.batch", "id": 5, "exchange": "x", "msgs": msgs}))
    (got,) = conn.events()
    if codec.batch_messages_error(msgs) is None:
        assert got == ev.PublishBatch(5, "x", msgs)
    else:
        assert isinstance(got, ev.BadRequest) and got.code == ReplyCode.SYNTAX_ERROR


# --- (d) the handshake and close, from both sides, in any interleaving -----------------

_KINDS: dict[str, ev.Event] = {
    "hello": ev.Hello(id=1),
    "welcome": ev.Welcome(re=1),
    "refused": ev.Refused(re=1, code=ReplyCode.ACCESS_REFUSED),
    "heartbeat": ev.Heartbeat(),
    "close": ev.Close(),
    "close-ok": ev.CloseOk(),
    "status": ev.Status(id=2),
    "ok": ev.Ok(re=2),
}
_ROLES = (Role.CLIENT, Role.SERVER)
_actions = st.lists(
    st.tuples(
        st.sampled_from(["send", "deliver"]),
        st.sampled_from(_ROLES),
        st.sampled_from(sorted(_KINDS)),
    ),
    max_size=14,
)


@settings(max_examples=300, deadline=None)
@given(actions=_actions)
def test_handshake_interleavings_follow_the_table(actions: list[tuple[str, Role, str]]) -> None:
    """Each side's state is predicted from TRANSITIONS alone; the connections must
    agree with the prediction at every step."""
    conns = {r: Connection(r) for r in _ROLES}
    model = {r: ConnState.HANDSHAKE for r in _ROLES}
    errored = dict.fromkeys(_ROLES, False)
    # bytes in flight towards each role, with the event each frame carries
    in_flight: dict[Role, list[tuple[bytes, ev.Event]]] = {r: [] for r in _ROLES}
    for action, role, kind in actions:
        conn = conns[role]
        if action == "send":
            event = _KINDS[kind]
            own = Sender.CLIENT if role is Role.CLIENT else Sender.SERVER
            legal_sender = type(event).SENDER in (own, Sender.BOTH)
            expected = TRANSITIONS.get((model[role], trigger_of(type(event))))
            if not legal_sender or expected is None:
                try:
                    conn.send(event)
                except LocalProtocolError:
                    pass
                else:
                    raise AssertionError(f"{role.value} sent {kind} in {model[role].value}")
            else:
                peer = Role.SERVER if role is Role.CLIENT else Role.CLIENT
                in_flight[peer].append((conn.send(event), event))
                model[role] = expected
        else:  # deliver the oldest frame in flight to ``role``
            if not in_flight[role]:
                continue
            data, event = in_flight[role].pop(0)
            conn.receive_data(data)
            if errored[role]:
                try:
                    conn.next_event()
                except RemoteProtocolError:
                    pass
                else:
                    raise AssertionError("an errored connection decoded a frame")
                continue
            if model[role] is ConnState.CLOSED:
                assert conn.next_event() is NEED_DATA
                continue
            expected = TRANSITIONS.get((model[role], trigger_of(type(event))))
            if expected is None:
                try:
                    conn.next_event()
                except RemoteProtocolError as exc:
                    assert exc.code == ReplyCode.UNEXPECTED_FRAME
                else:
                    raise AssertionError(f"{role.value} accepted {kind} in {model[role].value}")
                model[role] = TRANSITIONS[(model[role], Trigger.PROTOCOL_ERROR)]
                errored[role] = True
            else:
                assert conn.next_event() == event
                model[role] = expected
        assert conn.state is model[role], (action, role, kind)


def test_full_samples_round_trip_through_the_generic_checker() -> None:
    """The hand-written samples pass the same exact-type comparison."""
    for cls, event in FULL.items():
        src, dst = pair_ready_for(cls, senders(cls)[0])
        dst.receive_data(src.send(event))
        (got,) = dst.events()
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            assert _same(getattr(got, f.name), getattr(event, f.name)), (cls, f.name)


@FUZZ
@given(rows=st.lists(_batch_message, min_size=1, max_size=6))
def test_publish_columns_carry_the_messages_publish_batch_would(rows: list[Any]) -> None:
    """``publish.columns`` is ``publish.batch`` as columns: a server decodes the
    same messages (empty headers or properties as null) from either."""
    conn = conn_in(Role.SERVER, ConnState.OPEN)
    conn.receive_data(codec.encode(codec.publish_columns(7, "x", rows)))
    conn.receive_data(frame({"m": "publish.batch", "id": 7, "exchange": "x", "msgs": rows}))
    columns, batch = conn.events()
    assert isinstance(columns, ev.PublishColumns) and isinstance(batch, ev.PublishBatch)

    def plain(r: list[Any]) -> list[Any]:
        if len(r) == 2 or not (r[2] or r[3]):
            return [r[0], r[1]]
        return [r[0], r[1], r[2] or None, r[3] or None]

    assert codec.batch_rows(columns) == [plain(r) for r in batch.msgs]


@FUZZ
@given(
    data=st.data(),
    columns=_publish_columns(),
    field_name=st.sampled_from(
        ["id", "exchange", "count", "keys", "key_ends", "bodies", "body_ends", "extras"]
    ),
)
def test_damaged_publish_columns_fail_cleanly(
    data: st.DataObject, columns: ev.PublishColumns, field_name: str
) -> None:
    """One field of a valid ``publish.columns`` replaced by anything: the server
    decodes a consistent event or answers a bad request, never crashes, never
    takes ends that run outside their values."""
    m = codec.event_to_map(columns)
    m[field_name] = data.draw(st.one_of(_cbor_values, st.binary(max_size=40)))
    conn = conn_in(Role.SERVER, ConnState.OPEN)
    conn.receive_data(frame(m))
    events, exc = _drain(conn)
    if exc is not None:
        _check_error(exc)
        return
    (got,) = events
    if isinstance(got, ev.BadRequest):
        assert got.code == ReplyCode.SYNTAX_ERROR
        return
    assert isinstance(got, ev.PublishColumns)
    for name, ends in (("keys", got.key_ends), ("bodies", got.body_ends)):
        positions = list(codec.ends_array(ends))
        assert len(positions) == got.count + 1 and positions[-1] == len(getattr(got, name))
        assert positions == sorted(positions)
    assert len(codec.batch_rows(got)) == got.count
