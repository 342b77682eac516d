"""Every per-message fast path of :class:`Connection` agrees with its general path.

- ``send_publish`` / ``send_ack`` / ``send_ok`` write the very bytes
  ``send(Publish(...))`` / ``send(Ack(...))`` / ``send(Ok(...))`` write (and
  ``send_oks`` what ``send(Ok(...))`` writes for each id, joined); the
  remembered encodings of one-entry ``headers`` and ``props`` maps are what
  ``cbor2.dumps`` writes; ``append_plain_publish`` appends what ``send_publish``
  returns, or nothing where it would raise or change state;
- a client decodes ``deliver`` frames and bare ``ok`` frames (the latter from their
  bytes, without cbor2) to the events the checked decoder gives, and leaves every
  frame it does not recognise to it;
- ``events()`` returns what ``next_event()`` returns one by one, however the bytes
  arrive, and a batch never spans a state change.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from amqlite.errors import LocalProtocolError, RemoteProtocolError
from amqlite.protocol import (
    NEED_DATA,
    PROPERTY_TYPES,
    Connection,
    ConnState,
    DeliverRun,
    OkRun,
    PublishRun,
    Role,
    codec,
)
from amqlite.protocol import events as ev

from .wire import FakeMessage, client_in, frame, open_pair, raw_frame, server_in

CHECKS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TEXT = st.text(max_size=12)
UINTS = st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1))
HEADERS = st.dictionaries(
    TEXT,
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=False),
        TEXT,
        st.binary(max_size=8),
    ),
    max_size=4,
)
PROPS = st.fixed_dictionaries(
    {},
    optional={
        name: st.integers(0, codec.PROPERTY_MAX.get(name, 2**63 - 1))
        if t is int
        else st.booleans()
        if t is bool
        else TEXT
        for name, t in PROPERTY_TYPES.items()
    },
)


def _general(role: Role, payload: bytes) -> ev.Event:
    """The checked decoder's event for one frame's payload (no fast path)."""
    m = cbor2.loads(payload)
    return codec.event_from_map(ev.BY_METHOD[m["m"]], m)


def _payloads(data: bytes) -> list[bytes]:
    out = []
    while data:
        n = int.from_bytes(data[:4], "big")
        out.append(data[4 : 4 + n])
        data = data[4 + n :]
    return out


# --- the client's encoders ------------------------------------------------------------


@CHECKS
@given(
    rid=st.one_of(UINTS, st.integers(2**64, 2**70)),
    exchange=TEXT,
    key=TEXT,
    body=st.binary(max_size=600),
    headers=HEADERS,
    props=PROPS,
    mandatory=st.booleans(),
    confirm=st.booleans(),
)
def test_send_publish_writes_what_send_writes(
    rid: int,
    exchange: str,
    key: str,
    body: bytes,
    headers: dict[str, Any],
    props: dict[str, Any],
    mandatory: bool,
    confirm: bool,
) -> None:
    fast, general = client_in(ConnState.OPEN), client_in(ConnState.OPEN)
    event = ev.Publish(rid, exchange, key, body, headers, props, mandatory, confirm)
    data = fast.send_publish(rid, exchange, key, body, headers, props, mandatory, confirm)
    assert data == general.send(event)
    server = server_in(ConnState.OPEN)
    server.receive_data(data)
    assert server.events() == [event]


PROPS_VALUES = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=70),
)
PROPS_MAPS = st.dictionaries(
    st.sampled_from([*PROPERTY_TYPES, "x"]), PROPS_VALUES, min_size=0, max_size=2
)


@CHECKS
@given(
    rids=st.lists(st.one_of(UINTS, st.integers(0x10000, 2**32 - 1)), min_size=1, max_size=6),
    exchange=TEXT,
    key=TEXT,
    body=st.binary(max_size=300),
    maps=st.lists(PROPS_MAPS, min_size=1, max_size=6),
    limit=st.one_of(st.none(), st.integers(0, 500)),
    remote=st.one_of(st.none(), st.integers(0, 500)),
    state=st.sampled_from(ConnState),
)
def test_append_props_publish_appends_what_send_publish_returns(
    rids: list[int],
    exchange: str,
    key: str,
    body: bytes,
    maps: list[dict[str, Any]],
    limit: int | None,
    remote: int | None,
    state: ConnState,
) -> None:
    """A grouped publish appended to a buffer: ``send_publish``'s frame with the
    same props, after what the buffer held, whenever the map is valid (check_props);
    nothing (and False) for an invalid map, in any state but OPEN or over either
    limit. Maps one after another, so a remembered pair is looked up by later ones
    (``True`` after ``1``, equal as dict keys, must not find its bytes); every
    valid one-entry map with a short value is taken (the fast path is used)."""
    fast, general = client_in(state), client_in(state)
    fast.remote_max_frame_size = general.remote_max_frame_size = remote
    cap = 1 << 30 if limit is None else limit
    for i, rid in enumerate(rids):
        props = maps[i % len(maps)]
        out = bytearray(b"x")
        appended = fast.append_props_publish(out, rid, exchange, key, body, props, cap)
        valid = bool(props) and codec.check_props(props) is None
        data = None
        if valid:
            with contextlib.suppress(LocalProtocolError):
                data = general.send_publish(rid, exchange, key, body, None, props)
        fits = data is not None and state is ConnState.OPEN and len(data) - 4 <= cap
        if appended:
            assert fits
            assert out == b"x" + data
            server = server_in(ConnState.OPEN)
            server.receive_data(bytes(out[1:]))
            assert server.events() == [
                ev.Publish(rid, exchange, key, body, {}, props, False, False)
            ]
        else:
            assert out == b"x"
            short = all(
                type(v) is not str or len(v) <= codec._PAIR_CACHE_TEXT for v in props.values()
            )
            assert not (fits and len(props) == 1 and short)
        assert fast.state is state


def test_append_props_publish_reads_a_changed_map_afresh() -> None:
    """The same dict, changed between two publishes, gives each time the frame of
    what it holds then (the remembered pairs are keyed by value, not identity)."""
    fast = client_in(ConnState.OPEN)
    props: dict[str, Any] = {"group_id": "a"}
    for value in ("a", "b", "a"):
        props["group_id"] = value
        out = bytearray()
        assert fast.append_props_publish(out, 1, "", "q", b"m", props, 1 << 20)
        assert bytes(out) == codec.encode_publish(1, "", "q", b"m", None, props, False, False)
    props["priority"] = -1  # invalid: nothing appended
    del props["group_id"]
    out = bytearray()
    assert not fast.append_props_publish(out, 1, "", "q", b"m", props, 1 << 20)
    assert out == bytearray()


@CHECKS
@given(
    rids=st.lists(
        st.one_of(UINTS, st.integers(0x10000, 2**32 - 1), st.integers(2**64, 2**70)),
        min_size=1,
        max_size=4,
    ),
    exchange=TEXT,
    key=TEXT,
    bodies=st.lists(st.binary(max_size=600), min_size=1, max_size=3),
    limit=st.one_of(st.none(), st.integers(0, 700)),
    remote=st.one_of(st.none(), st.integers(0, 700)),
    prefix=st.binary(max_size=8),
    state=st.sampled_from(ConnState),
)
def test_append_plain_publish_appends_what_send_publish_returns(
    rids: list[int],
    exchange: str,
    key: str,
    bodies: list[bytes],
    limit: int | None,
    remote: int | None,
    prefix: bytes,
    state: ConnState,
) -> None:
    """The client's plain publish appended to a buffer: ``send_publish``'s frame for
    each id in turn, after what the buffer held; nothing at all (and False) when
    ``send_publish`` would raise or change state (not OPEN, over either limit).
    Bodies of several sizes on one route: the remembered route and body head is
    the body size's."""
    fast, general = client_in(state), client_in(state)
    fast.remote_max_frame_size = general.remote_max_frame_size = remote
    cap = 1 << 30 if limit is None else limit
    for i, rid in enumerate(rids):
        body = bodies[i % len(bodies)]
        out = bytearray(prefix)
        appended = fast.append_plain_publish(out, rid, exchange, key, body, cap)
        try:
            data = general.send_publish(rid, exchange, key, body)
        except LocalProtocolError:
            data = None
        if data is not None and state is ConnState.OPEN and len(data) - 4 <= cap:
            assert appended
            assert out == prefix + data
        else:
            assert not appended
            assert out == prefix
        assert fast.state is state
        if state is ConnState.OPEN:
            server = server_in(ConnState.OPEN)
            server.receive_data(bytes(out[len(prefix) :]))
            got = server.events()
            if appended:
                assert got == [ev.Publish(rid, exchange, key, body, {}, {}, False, False)]


@CHECKS
@given(
    rids=st.lists(
        st.one_of(UINTS, st.integers(0x10000, 2**32 - 1), st.integers(2**64, 2**70)),
        min_size=1,
        max_size=4,
    ),
    exchange=TEXT,
    key=TEXT,
    bodies=st.lists(st.binary(max_size=600), min_size=1, max_size=3),
    persistent=st.lists(st.booleans(), min_size=1, max_size=3),
    limit=st.one_of(st.none(), st.integers(0, 700)),
    remote=st.one_of(st.none(), st.integers(0, 700)),
    state=st.sampled_from(ConnState),
)
@example(  # the usual id (32 bits) over the limit by a byte, then within it
    rids=[70_000, 70_001],
    exchange="",
    key="q",
    bodies=[b"x" * 101, b"x" * 100],
    persistent=[True],
    limit=len(
        codec.encode_publish(70_000, "", "q", b"x" * 100, None, {"persistent": True}, False, True)
    )
    - 4,
    remote=None,
    state=ConnState.OPEN,
)
def test_encode_confirm_publish_is_what_send_publish_returns(
    rids: list[int],
    exchange: str,
    key: str,
    bodies: list[bytes],
    persistent: list[bool],
    limit: int | None,
    remote: int | None,
    state: ConnState,
) -> None:
    """The client's confirmed publish (persistent or not, no headers or other
    properties): ``send_publish``'s frame for each id in turn; None when
    ``send_publish`` would raise or change state (not OPEN, over either limit). The
    server reads it as that publish."""
    fast, general = client_in(state), client_in(state)
    fast.remote_max_frame_size = general.remote_max_frame_size = remote
    cap = 1 << 30 if limit is None else limit
    for i, rid in enumerate(rids):
        body = bodies[i % len(bodies)]
        p = persistent[i % len(persistent)]
        props = {"persistent": True} if p else None
        got = fast.encode_confirm_publish(rid, exchange, key, body, p, cap)
        try:
            data = general.send_publish(rid, exchange, key, body, None, props, False, True)
        except LocalProtocolError:
            data = None
        if data is not None and state is ConnState.OPEN and len(data) - 4 <= cap:
            assert got == data
            server = server_in(ConnState.OPEN)
            server.receive_data(got)
            assert server.events() == [
                ev.Publish(rid, exchange, key, body, {}, props or {}, False, True)
            ]
        else:
            assert got is None
        assert fast.state is state


@CHECKS
@given(
    m=st.fixed_dictionaries(
        {"m": st.just("publish"), "id": UINTS, "exchange": TEXT, "body": st.binary(max_size=8)},
        optional={
            "key": TEXT,
            "headers": HEADERS,
            "props": PROPS,
            "mandatory": st.booleans(),
            "confirm": st.booleans(),
        },
    )
)
def test_publish_maps_decode_every_field_they_carry(m: dict[str, Any]) -> None:
    """The publish decoder's shortcuts (nothing optional; props alone; props and
    confirm) never drop a field, whichever optional ones (the key too) a map carries."""
    assert codec.decode_publish(m) == ev.Publish(
        m["id"],
        m["exchange"],
        m.get("key", ""),
        m["body"],
        m.get("headers", {}),
        m.get("props", {}),
        m.get("mandatory", False),
        m.get("confirm", False),
    )


SMALL_MAPS = st.dictionaries(
    st.one_of(TEXT, st.sampled_from(["k", "group_id"]), st.integers(0, 2), st.booleans()),
    st.one_of(
        st.integers(-3, 3),
        st.integers(2**63, 2**70),
        st.booleans(),
        st.sampled_from([0.0, 1.0, -1.0]),
        st.text(max_size=80),
        st.sampled_from(["g1", "1", ""]),
        st.binary(max_size=4),
        st.none(),
    ),
    min_size=1,
    max_size=2,
)


@CHECKS
@given(maps=st.lists(SMALL_MAPS, min_size=1, max_size=8))
def test_map_pairs_are_what_cbor_writes(maps: list[dict[Any, Any]]) -> None:
    # the one-entry cache must never hand one map's bytes to another that compares
    # equal as a key (1, True, 1.0), whatever came before
    for m in maps + maps[::-1]:
        for key in (codec._K_HEADERS, codec._K_PROPS):
            assert codec._map_pair(key, m) == key + cbor2.dumps(m)


def test_map_pairs_tell_equal_keys_of_other_types_apart() -> None:
    for m in ({"k": 1}, {"k": True}, {"k": 1.0}, {1: "a"}, {True: "a"}, {"k": 1}):
        assert codec._map_pair(codec._K_PROPS, m) == codec._K_PROPS + cbor2.dumps(m)


@CHECKS
@given(rid=UINTS, dtag=UINTS, multiple=st.booleans())
def test_send_ack_writes_what_send_writes(rid: int, dtag: int, multiple: bool) -> None:
    fast, general = client_in(ConnState.OPEN), client_in(ConnState.OPEN)
    assert fast.send_ack(rid, dtag, multiple) == general.send(ev.Ack(rid, dtag, multiple))


@CHECKS
@given(re=st.one_of(UINTS, st.integers(-(2**64), -1), st.integers(2**64, 2**70)))
def test_send_ok_writes_what_send_writes(re: int) -> None:
    # the server's per-confirm frame by hand (ids outside 0..2**64-1 take send's path)
    fast, general = server_in(ConnState.OPEN), server_in(ConnState.OPEN)
    data = fast.send_ok(re)
    assert data == general.send(ev.Ok(re))
    assert fast.state is general.state is ConnState.OPEN
    if 0 <= re < 2**64:
        assert data == codec.encode_bare_ok(re)
        assert codec.read_bare_ok(data, 4, len(data)) == ev.Ok(re)


@CHECKS
@given(res=st.lists(st.one_of(UINTS, st.integers(-(2**64), -1), st.integers(2**64, 2**70))))
def test_send_oks_writes_what_send_writes_for_each(res: list[int]) -> None:
    # the confirms one commit releases for a connection, joined
    fast, general = server_in(ConnState.OPEN), server_in(ConnState.OPEN)
    assert fast.send_oks(res) == b"".join(general.send(ev.Ok(re)) for re in res)
    assert fast.state is general.state is ConnState.OPEN


@pytest.mark.parametrize("state", [ConnState.AUTHENTICATING, ConnState.CLOSED])
def test_send_oks_checks_the_state_as_send_does(state: ConnState) -> None:
    fast, general = server_in(state), server_in(state)
    with pytest.raises(LocalProtocolError) as general_error:
        general.send(ev.Ok(1))
    with pytest.raises(LocalProtocolError) as fast_error:
        fast.send_oks([1, 2])
    assert str(fast_error.value) == str(general_error.value)


@pytest.mark.parametrize("state", [ConnState.AUTHENTICATING, ConnState.CLOSED])
def test_send_ok_checks_the_state_as_send_does(state: ConnState) -> None:
    fast, general = server_in(state), server_in(state)
    with pytest.raises(LocalProtocolError) as general_error:
        general.send(ev.Ok(1))
    with pytest.raises(LocalProtocolError) as fast_error:
        fast.send_ok(1)
    assert str(fast_error.value) == str(general_error.value)


# --- the client's decoders ------------------------------------------------------------


@CHECKS
@given(
    ctag=TEXT,
    dtag=UINTS,
    redelivered=st.booleans(),
    exchange=TEXT,
    key=TEXT,
    body=st.binary(max_size=300),
    headers=st.one_of(st.just({}), HEADERS),
    props=st.one_of(st.just({}), PROPS),
    offset=st.one_of(st.none(), UINTS),
)
def test_deliveries_decode_as_the_checked_decoder_reads_them(
    ctag: str,
    dtag: int,
    redelivered: bool,
    exchange: str,
    key: str,
    body: bytes,
    headers: dict[str, Any],
    props: dict[str, Any],
    offset: int | None,
) -> None:
    """The server's hand-built frame and the general encoder's, through the
    client's fast decoder, give the checked decoder's event."""
    server = server_in(ConnState.OPEN)
    msg = FakeMessage(exchange, key, body, headers, props)
    event = ev.Deliver(ctag, dtag, exchange, key, body, headers, props, redelivered, "", offset)
    data = server.send_deliver(ctag, dtag, redelivered, msg, offset) + server.send(event)
    client = client_in(ConnState.OPEN)
    client.receive_data(data)
    got = client.events()
    assert got == [_general(Role.CLIENT, p) for p in _payloads(data)] == [event, event]


#: props the byte readers take (a grouped message's), or none at all
SMALL_PROPS = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"group_id": st.text(max_size=5)}),  # under 24 bytes
    st.fixed_dictionaries({"priority": st.integers(0, 255), "group_id": st.text(max_size=5)}),
)


@CHECKS
@given(
    rid=UINTS,
    exchange=TEXT,
    key=TEXT,
    body=st.binary(max_size=300),
    cut=st.integers(0, 400),
    flip=st.tuples(st.integers(0, 400), st.integers(0, 255)),
    extra=st.binary(min_size=1, max_size=3),
    persistent=st.booleans(),
    small=SMALL_PROPS,
)
def test_the_plain_publish_reader_agrees_with_cbor_or_declines(
    rid: int,
    exchange: str,
    key: str,
    body: bytes,
    cut: int,
    flip: tuple[int, int],
    extra: bytes,
    persistent: bool,
    small: dict[str, Any],
) -> None:
    """A server reads a plain publish (or a confirmed persistent one) from its bytes
    (codec.read_plain_publish): the client's frame gives the checked decoder's
    event; the same frame cut short, with a byte changed or with bytes after it
    gives that event too or is left to the other paths (which may refuse it); a
    frame inside a larger buffer reads the same."""
    props = {**small, "persistent": True} if persistent else small
    payload = codec.encode_publish(rid, exchange, key, body, None, props, False, persistent)[4:]
    expected_event = ev.Publish(rid, exchange, key, body, {}, props, False, persistent)
    assert codec.read_plain_publish(payload, 0, len(payload)) == expected_event
    wrapped = bytearray(b"\xff\x00" + payload + extra)
    assert codec.read_plain_publish(wrapped, 2, 2 + len(payload)) == expected_event
    at, value = flip
    changed = bytearray(payload)
    if at < len(changed):
        changed[at] = value
    for variant in (payload[:cut], payload + extra, bytes(changed)):
        read = codec.read_plain_publish(variant, 0, len(variant))
        try:
            expected: ev.Event | None = _general(Role.SERVER, variant)
        except Exception:
            expected = None
        if read is not None:
            assert read == expected
            assert type(read.body) is bytes


@CHECKS
@given(
    ctag=TEXT,
    dtag=UINTS,
    exchange=TEXT,
    key=TEXT,
    body=st.binary(max_size=300),
    cut=st.integers(0, 400),
    flip=st.tuples(st.integers(0, 400), st.integers(0, 255)),
    extra=st.binary(min_size=1, max_size=3),
    persistent=st.booleans(),
    small=SMALL_PROPS,
)
def test_the_plain_deliver_reader_agrees_with_cbor_or_declines(
    ctag: str,
    dtag: int,
    exchange: str,
    key: str,
    body: bytes,
    cut: int,
    flip: tuple[int, int],
    extra: bytes,
    persistent: bool,
    small: dict[str, Any],
) -> None:
    """A client reads a plain delivery's map from its bytes
    (codec.read_plain_deliver): the server's frame gives what ``cbor2.loads``
    gives; the frame cut short, with a byte changed or with bytes after it gives
    that too or is left to the other paths."""
    msg = FakeMessage(
        exchange, key, body, properties={**small, "persistent": True} if persistent else small
    )
    payload = codec.encode_deliver(ctag, dtag, False, msg)[4:]
    expected_map = cbor2.loads(payload)
    assert codec.read_plain_deliver(payload, 0, len(payload)) == expected_map
    wrapped = bytearray(b"\xff\x00" + payload + extra)
    read = codec.read_plain_deliver(wrapped, 2, 2 + len(payload))
    assert read == expected_map
    assert read is not None and type(read["body"]) is bytes
    assert list(read) == list(expected_map)  # the same keys in the same order
    at, value = flip
    changed = bytearray(payload)
    if at < len(changed):
        changed[at] = value
    for variant in (payload[:cut], payload + extra, bytes(changed)):
        got = codec.read_plain_deliver(variant, 0, len(variant))
        if got is not None:
            assert got == cbor2.loads(variant)
            assert type(got["body"]) is bytes


@CHECKS
@given(
    props=st.dictionaries(
        st.sampled_from([*PROPERTY_TYPES, "x", "\u00e9"]),
        st.one_of(
            st.text(max_size=30), st.integers(-5, 2**64), st.booleans(), st.binary(max_size=3)
        ),
        max_size=5,
    ),
    flip=st.tuples(st.integers(0, 80), st.integers(0, 255)),
    cut=st.integers(0, 80),
    extra=st.binary(min_size=1, max_size=3),
)
def test_the_props_reader_agrees_with_the_checked_decoder_or_declines(
    props: dict[str, Any], flip: tuple[int, int], cut: int, extra: bytes
) -> None:
    """codec.read_props reads a small props map as ``cbor2.loads`` does and only when
    check_props accepts it; cut, changed, extended or with its keys in any order
    (the dict's order is hypothesis's) it agrees or declines; it never hands out
    the map it remembers."""
    enc = cbor2.dumps(props)
    at, value = flip
    changed = bytearray(enc)
    if at < len(changed):
        changed[at] = value
    for variant in (enc, enc[:cut], enc + extra, bytes(changed)):
        wrapped = b"\x00" + variant + b"\xff"
        got = codec.read_props(wrapped, 1, 1 + len(variant))
        if got is None:
            continue
        expected = cbor2.loads(variant)
        assert got == expected and list(got) == list(expected)
        assert codec.check_props(expected) is None
        got["mutated"] = 1  # a caller's change is not seen by the next read
        assert codec.read_props(wrapped, 1, 1 + len(variant)) == expected
    small = all(
        len(k.encode()) < 24
        and (
            type(v) is bool
            or (type(v) is int and v >= 0)
            or (type(v) is str and len(v.encode()) < 24)
        )
        for k, v in props.items()
    )
    if small and 1 <= len(props) <= 4 and len(enc) <= 64 and codec.check_props(props) is None:
        assert codec.read_props(enc, 0, len(enc)) == props


@CHECKS
@given(
    exchange=TEXT,
    key=TEXT,
    body=st.binary(max_size=40),
    small=st.one_of(
        SMALL_PROPS,
        st.fixed_dictionaries({"priority": st.integers(0, 23), "group_id": st.text(max_size=5)}),
    ),
    wide=st.booleans(),
    headers=st.one_of(st.just({}), st.just({"h": 1})),
    redelivered=st.booleans(),
)
def test_a_delivery_of_shared_props_is_what_a_fresh_copy_gives(
    exchange: str,
    key: str,
    body: bytes,
    small: dict[str, Any],
    wide: bool,
    headers: dict[str, Any],
    redelivered: bool,
) -> None:
    """A broker's publish reader hands out one shared props map per encoding, and a
    delivery of a message carrying it splices the encoding it was read from (found
    by the map's identity, codec._PROPS_PAIRS): the frame is the one a fresh, equal
    map gives (_map_pair, cbor2), also when the publish spelled an integer wider
    than it needs (then nothing is spliced) and with headers beside the props."""
    payload = codec.encode_publish(1, exchange, key, body, None, small or None, False, False)[4:]
    priority = small.get("priority")
    if wide and priority is not None and priority < 24:
        # the same publish with the priority's integer in three bytes instead of one
        name = cbor2.dumps("priority")
        payload = payload.replace(name + bytes([priority]), name + b"\x19\x00" + bytes([priority]))
    read = codec.read_plain_publish(payload, 0, len(payload))
    assert read is not None and read.props == small
    if small:
        again = codec.read_plain_publish(bytearray(payload), 0, len(payload))
        assert again is not None and again.props is read.props  # one map per encoding
    shared = FakeMessage(exchange, key, body, dict(headers), read.props)
    fresh = FakeMessage(exchange, key, body, dict(headers), dict(small))
    frame = codec.encode_deliver("c", 7, redelivered, shared)
    assert frame == codec.encode_deliver("c", 7, redelivered, fresh)
    assert cbor2.loads(frame[4:]).get("props", {}) == small


@dataclasses.dataclass
class FakeDelivery:
    """What ``append_deliveries`` reads of a broker delivery (codec.WireDelivery)."""

    ctag: str
    dtag: int
    redelivered: bool
    message: FakeMessage
    offset: int | None = None


@CHECKS
@given(
    deliveries=st.lists(
        st.tuples(
            st.sampled_from(["", "c", "ctag-é", "x" * 30]),
            st.one_of(
                st.integers(0, 300),
                st.integers(0, 2**64 - 1),
                st.sampled_from([0xFF, 0x100, 0xFFFF, 0x10000, 0xFFFFFFFF, 0x100000000]),
            ),
            st.booleans(),
            st.sampled_from(["", "amq.fanout"]),
            st.sampled_from(["", "q", "k" * 40]),
            st.binary(max_size=300),
            st.one_of(st.just({}), st.just({"h": 1})),
            SMALL_PROPS,
            st.one_of(st.none(), UINTS),
        ),
        max_size=8,
    ),
    shared=st.booleans(),
)
def test_appended_deliveries_are_the_frames_send_deliver_writes(
    deliveries: list[tuple[Any, ...]], shared: bool
) -> None:
    """``Connection.append_deliveries`` (codec.append_deliveries: one call a batch,
    the consumer tag's encoded start remembered from the delivery before, the
    frame's pieces appended one by one) writes exactly the frames ``send_deliver``
    writes one by one, for first deliveries and redeliveries, stream offsets, any
    tag width, tags and map sizes changing from one delivery to the next, and a
    message delivered more than once (its cached encoding)."""
    batch = []
    one = FakeMessage("", "q", b"one")
    for ctag, dtag, redelivered, exchange, key, body, headers, props, offset in deliveries:
        msg = one if shared else FakeMessage(exchange, key, body, dict(headers), dict(props))
        batch.append(FakeDelivery(ctag, dtag, redelivered, msg, offset))
    server = server_in(ConnState.OPEN)
    expected = b"".join(
        server.send_deliver(d.ctag, d.dtag, d.redelivered, d.message, d.offset) for d in batch
    )
    for m in {id(d.message): d.message for d in batch}.values():
        m.wire = None  # encoded again below, from nothing
    out = bytearray(b"before")
    server.append_deliveries(out, batch)
    assert out == b"before" + expected
    again = bytearray()
    server.append_deliveries(again, batch)  # the messages' cached encodings now
    assert again == expected


def test_appending_deliveries_is_checked_as_send_deliver_is() -> None:
    client = client_in(ConnState.OPEN)
    delivery = FakeDelivery("c", 1, False, FakeMessage("", "q", b"x"))
    out = bytearray()
    with pytest.raises(LocalProtocolError):
        client.append_deliveries(out, [delivery])
    assert out == b""


#: props of a run of grouped frames: the same few maps, as a groups publisher sends
RUN_PROPS = st.sampled_from(
    [
        {"group_id": "g1"},
        {"group_id": "g1"},
        {"group_id": "g22"},
        {"persistent": True},
        {"priority": 3},
        {"group_id": "g1", "priority": 255},
        {"group_id": "x" * 23},
    ]
)


@CHECKS
@given(
    frames=st.lists(
        st.tuples(
            st.one_of(UINTS, st.sampled_from([23, 24, 0xFF, 0x100, 0xFFFF, 0x10000, 2**32])),
            st.sampled_from([("", "q"), ("", "q"), ("ex", "k"), ("", "")]),
            st.one_of(st.binary(max_size=30), st.binary(min_size=250, max_size=300)),
            RUN_PROPS,
        ),
        min_size=1,
        max_size=12,
    ),
    cut=st.integers(1, 70),
    flip=st.tuples(st.integers(-70, 60), st.integers(0, 255)),
)
def test_a_run_of_grouped_publishes_reads_as_the_checked_decoder_reads_it(
    frames: list[tuple[int, tuple[str, str], bytes, dict[str, Any]]],
    cut: int,
    flip: tuple[int, int],
) -> None:
    """A groups publisher's frames (a props map alone) repeat the route and the
    props maps of frames before: those take read_plain_publish's first branch too
    (the props found by their encoding). Each frame of a run, and each cut short
    (from either end) or with a byte changed, reads as the checked decoder reads it
    or is left to the other paths."""
    for rid, (exchange, key), body, props in frames:
        payload = codec.encode_publish(rid, exchange, key, body, None, props, False, False)[4:]
        expected = ev.Publish(rid, exchange, key, body, {}, props, False, False)
        assert codec.read_plain_publish(payload, 0, len(payload)) == expected
        at, value = flip
        changed = bytearray(payload)
        if -len(changed) <= at < len(changed):
            changed[at] = value
        for variant in (payload[:cut], payload[:-cut], bytes(changed), payload + b"\x00"):
            assert codec.read_plain_publish(payload, 0, len(payload)) == expected  # the route
            read = codec.read_plain_publish(variant, 0, len(variant))
            try:
                general: ev.Event | None = _general(Role.SERVER, variant)
            except Exception:
                general = None
            if read is not None:
                assert read == general
                assert type(read.body) is bytes


@CHECKS
@given(
    frames=st.lists(
        st.tuples(
            st.sampled_from(["c", "c", "other", ""]),
            st.one_of(UINTS, st.sampled_from([23, 24, 0xFF, 0x100, 0xFFFF, 0x10000, 2**32])),
            st.sampled_from([("", "q"), ("", "q"), ("ex", "k"), ("", "")]),
            st.one_of(st.binary(max_size=30), st.binary(min_size=250, max_size=300)),
            RUN_PROPS,
        ),
        min_size=1,
        max_size=12,
    ),
    cut=st.integers(1, 70),
    flip=st.tuples(st.integers(-70, 60), st.integers(0, 255)),
)
def test_a_run_of_grouped_deliveries_reads_as_cbor_reads_it(
    frames: list[tuple[str, int, tuple[str, str], bytes, dict[str, Any]]],
    cut: int,
    flip: tuple[int, int],
) -> None:
    """A consumer's grouped deliveries (a props map last) repeat the tag, the route
    and the props of frames before: those take read_plain_deliver's first branch
    too. Each frame of a run, and each cut short (from either end) or with a byte
    changed, reads as ``cbor2.loads`` reads it (the same keys in the same order, a
    props map of the reader's own) or is left to the other paths."""
    for ctag, dtag, (exchange, key), body, props in frames:
        msg = FakeMessage(exchange, key, body, properties=props)
        payload = codec.encode_deliver(ctag, dtag, False, msg)[4:]
        expected = cbor2.loads(payload)
        at, value = flip
        changed = bytearray(payload)
        if -len(changed) <= at < len(changed):
            changed[at] = value
        first = codec.read_plain_deliver(payload, 0, len(payload))
        assert first == expected and list(first) == list(expected)
        for variant in (payload[:cut], payload[:-cut], bytes(changed), payload + b"\x00"):
            read = codec.read_plain_deliver(payload, 0, len(payload))  # the tag and route
            assert read == expected and list(read) == list(expected)
            assert read["props"] is not first["props"]  # each reader's map its own
            got = codec.read_plain_deliver(variant, 0, len(variant))
            if got is not None:
                assert got == cbor2.loads(variant)
                assert list(got) == list(cbor2.loads(variant))
                assert type(got["body"]) is bytes


@CHECKS
@given(
    frames=st.lists(
        st.tuples(
            st.one_of(UINTS, st.sampled_from([23, 24, 0xFF, 0x100, 0xFFFF, 0x10000, 2**32])),
            st.sampled_from([("", "q"), ("", "q"), ("ex", "k"), ("", "")]),
            st.one_of(st.binary(max_size=30), st.binary(min_size=250, max_size=300)),
        ),
        min_size=1,
        max_size=12,
    ),
    cut=st.integers(0, 60),
    flip=st.tuples(st.integers(0, 60), st.integers(0, 255)),
)
def test_a_run_of_publishes_on_one_route_reads_as_the_checked_decoder_reads_it(
    frames: list[tuple[int, tuple[str, str], bytes]], cut: int, flip: tuple[int, int]
) -> None:
    """A publisher's frames usually repeat the route of the frame before: those take
    read_plain_publish's first branch (the whole frame in one go). Each frame of a
    run, and each cut short or with a byte changed right after one on its route,
    reads as the checked decoder reads it or is left to the other paths."""
    for rid, (exchange, key), body in frames:
        payload = codec.encode_publish(rid, exchange, key, body, None, None, False, False)[4:]
        expected = ev.Publish(rid, exchange, key, body, {}, {}, False, False)
        assert codec.read_plain_publish(payload, 0, len(payload)) == expected
        at, value = flip
        changed = bytearray(payload)
        if at < len(changed):
            changed[at] = value
        for variant in (payload[:cut], bytes(changed), payload + b"\x00"):
            assert codec.read_plain_publish(payload, 0, len(payload)) == expected  # the route
            read = codec.read_plain_publish(variant, 0, len(variant))
            try:
                general: ev.Event | None = _general(Role.SERVER, variant)
            except Exception:
                general = None
            if read is not None:
                assert read == general
                assert type(read.body) is bytes


@CHECKS
@given(
    frames=st.lists(
        st.tuples(
            st.sampled_from(["c", "c", "other", ""]),
            st.one_of(UINTS, st.sampled_from([23, 24, 0xFF, 0x100, 0xFFFF, 0x10000, 2**32])),
            st.sampled_from([("", "q"), ("", "q"), ("ex", "k"), ("", "")]),
            st.one_of(st.binary(max_size=30), st.binary(min_size=250, max_size=300)),
        ),
        min_size=1,
        max_size=12,
    ),
    cut=st.integers(0, 60),
    flip=st.tuples(st.integers(0, 60), st.integers(0, 255)),
)
def test_a_run_of_deliveries_to_one_consumer_reads_as_cbor_reads_it(
    frames: list[tuple[str, int, tuple[str, str], bytes]], cut: int, flip: tuple[int, int]
) -> None:
    """A consumer's deliveries usually repeat the consumer tag and the route of the
    frame before: those take read_plain_deliver's first branch (the whole frame in
    one go). Each frame of a run, and each cut short, with a byte changed or with a
    byte after it right after one on its tag and route, reads as ``cbor2.loads``
    reads it (the same keys in the same order) or is left to the other paths."""
    for ctag, dtag, (exchange, key), body in frames:
        payload = codec.encode_deliver(ctag, dtag, False, FakeMessage(exchange, key, body))[4:]
        expected = cbor2.loads(payload)
        at, value = flip
        changed = bytearray(payload)
        if at < len(changed):
            changed[at] = value
        for variant in (payload[:cut], bytes(changed), payload + b"\x00", payload):
            read = codec.read_plain_deliver(payload, 0, len(payload))  # the tag and route
            assert read == expected and list(read) == list(expected)
            got = codec.read_plain_deliver(variant, 0, len(variant))
            if got is not None:
                assert got == cbor2.loads(variant)
                assert list(got) == list(cbor2.loads(variant))
                assert type(got["body"]) is bytes


def test_deliveries_with_more_fields_are_not_read_as_plain() -> None:
    for msg, redelivered, offset in (
        (FakeMessage("", "q", b"x", headers={"h": 1}), False, None),
        (FakeMessage("", "q", b"x", properties={"persistent": True}), True, None),
        (FakeMessage("", "q", b"x", properties={"content_type": "t" * 30}), False, None),
        (
            FakeMessage("", "q", b"x", headers={"h": 1}, properties={"persistent": True}),
            False,
            None,
        ),
        (FakeMessage("", "q", b"x"), True, None),
        (FakeMessage("", "q", b"x"), False, 5),
    ):
        payload = codec.encode_deliver("c", 1, redelivered, msg, offset)[4:]
        assert codec.read_plain_deliver(payload, 0, len(payload)) is None


RUN_HEADERS = st.one_of(
    st.sampled_from([{"k": 0}, {"k": 3}, {"k": 3}, {"k": "x"}, {"k": True}, {"a": 1, "b": "y"}]),
    st.dictionaries(st.text(max_size=30), st.one_of(UINTS, TEXT, st.booleans()), max_size=5),
    HEADERS,
)


@CHECKS
@given(
    frames=st.lists(
        st.tuples(
            st.one_of(UINTS, st.sampled_from([23, 24, 0xFF, 0x100, 0xFFFF, 0x10000, 2**32])),
            st.sampled_from([("", "q"), ("", "q"), ("ex", "k"), ("", "")]),
            st.one_of(st.binary(max_size=30), st.binary(min_size=250, max_size=300)),
            RUN_HEADERS,
        ),
        min_size=1,
        max_size=12,
    ),
    cut=st.integers(1, 70),
    flip=st.tuples(st.integers(-70, 60), st.integers(0, 255)),
)
def test_a_run_of_selected_publishes_reads_as_the_checked_decoder_reads_it(
    frames: list[tuple[int, tuple[str, str], bytes, dict[str, Any]]],
    cut: int,
    flip: tuple[int, int],
) -> None:
    """A selectors publisher's frames (a headers map alone) take read_plain_publish's
    fast branches (the headers found by their encoding, _HEADERS_READ): each frame
    of a run, and each cut short (from either end), with a byte changed or with a
    byte after it, reads as the checked decoder reads it or is left to the other
    paths; a small map of short text, unsigned or boolean values is read."""
    for rid, (exchange, key), body, headers in frames:
        payload = codec.encode_publish(rid, exchange, key, body, headers, None, False, False)[4:]
        expected = ev.Publish(rid, exchange, key, body, headers, {}, False, False)
        assert _general(Role.SERVER, payload) == expected
        read = codec.read_plain_publish(payload, 0, len(payload))
        assert read is None or read == expected
        if headers in ({"k": 0}, {"k": 3}, {"k": "x"}, {"k": True}, {"a": 1, "b": "y"}):
            assert read == expected  # the case the fast branches are for
        if read is not None:  # (True == 1: the types too)
            assert [type(v) for v in read.headers.values()] == [type(v) for v in headers.values()]
        at, value = flip
        changed = bytearray(payload)
        if -len(changed) <= at < len(changed):
            changed[at] = value
        for variant in (payload[:cut], payload[:-cut], bytes(changed), payload + b"\x00"):
            read = codec.read_plain_publish(variant, 0, len(variant))
            try:
                general: ev.Event | None = _general(Role.SERVER, variant)
            except Exception:
                general = None
            if read is not None:
                assert read == general
                assert type(read.body) is bytes
                assert type(read.headers) is dict
                assert isinstance(general, ev.Publish)
                assert list(map(type, read.headers.values())) == list(
                    map(type, general.headers.values())
                )


def test_publishes_with_options_are_not_read_as_plain() -> None:
    for options in (
        {"headers": {"h": -1}},
        {"headers": {"h": 1}, "confirm": True},
        {"props": {"persistent": True}, "mandatory": True, "confirm": True},
        {"props": {"content_type": "t" * 30}},
        {"headers": {"h": 1}, "props": {"persistent": True}, "confirm": True},
        {"mandatory": True},
        {"confirm": True},
    ):
        payload = codec.encode_publish(
            7,
            "",
            "q",
            b"x",
            options.get("headers"),  # type: ignore[arg-type]
            options.get("props"),  # type: ignore[arg-type]
            "mandatory" in options,
            "confirm" in options,
        )[4:]
        assert codec.read_plain_publish(payload, 0, len(payload)) is None
    reordered = cbor2.dumps({"m": "publish", "exchange": "", "id": 1, "key": "q", "body": b""})
    assert codec.read_plain_publish(reordered, 0, len(reordered)) is None


_OK_PREFIX = cbor2.dumps({"m": "ok", "re": 0})[:-1]


@CHECKS
@given(
    re=st.one_of(UINTS, st.integers(-(2**70), 2**70)),
    info=st.one_of(st.none(), st.dictionaries(TEXT, st.integers(), max_size=2)),
)
def test_oks_decode_as_the_checked_decoder_reads_them(re: int, info: dict | None) -> None:
    server = server_in(ConnState.OPEN)
    data = server.send(ev.Ok(re) if info is None else ev.Ok(re, info))
    data += frame({"re": re, "m": "ok"})  # another key order: not the bytes fast path
    client = client_in(ConnState.OPEN)
    client.receive_data(data)
    got = client.events()
    assert got == [_general(Role.CLIENT, p) for p in _payloads(data)]
    assert got == [ev.Ok(re, info or {}), ev.Ok(re)]


@CHECKS
@given(tail=st.binary(max_size=12))
def test_the_bare_ok_reader_agrees_with_cbor_or_declines(tail: bytes) -> None:
    """Any bytes after the bare-ok prefix: the byte reader gives the checked
    decoder's event, or leaves the frame to the other paths (which may refuse it)."""
    payload = _OK_PREFIX + tail
    read = codec.read_bare_ok(payload, 0, len(payload))
    try:
        expected: ev.Event | None = _general(Role.CLIENT, payload)
    except Exception:
        expected = None
    if read is not None:
        assert read == expected
    client = client_in(ConnState.OPEN)
    client.receive_data(raw_frame(payload))
    try:
        got = client.events()
    except RemoteProtocolError:
        assert expected is None
    else:
        if expected is not None:
            assert got == [expected]


def test_unusual_deliveries_take_the_checked_path() -> None:
    base = {"m": "deliver", "ctag": "c", "dtag": 1, "exchange": "", "key": "s", "body": b"b"}
    client = client_in(ConnState.OPEN)
    # a key a newer server may add is ignored, an offset is kept
    client.receive_data(frame({**base, "offset": 5, "x-future": [1, 2]}) + frame(base))
    first, second = client.events()
    assert isinstance(first, ev.Deliver) and (first.offset, first.body) == (5, b"b")
    assert second == ev.Deliver("c", 1, "", "s", b"b")
    # six keys, not the usual six
    client.receive_data(frame({**{k: v for k, v in base.items() if k != "key"}, "queue": "q"}))
    with pytest.raises(RemoteProtocolError, match="'key' must be text"):
        client.events()


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("ctag", 1, "'ctag'"), ("offset", "5", "offset"), ("headers", [1], "headers")],
)
def test_ill_typed_deliveries_are_protocol_errors(field: str, value: Any, match: str) -> None:
    base = {"m": "deliver", "ctag": "c", "dtag": 1, "exchange": "", "key": "s", "body": b""}
    client = client_in(ConnState.OPEN)
    client.receive_data(frame({**base, field: value}))
    with pytest.raises(RemoteProtocolError, match=match):
        client.events()


def test_fast_paths_run_only_while_open() -> None:
    """Before the welcome a deliver or an ok is refused by the state table."""
    server = server_in(ConnState.OPEN)
    for data in (server.send(ev.Ok(5)), server.send(ev.Deliver("c", 1, "", "k", b""))):
        client = client_in(ConnState.AUTHENTICATING)
        client.receive_data(data)
        with pytest.raises(RemoteProtocolError, match="not allowed while the connection"):
            client.events()


def test_decoded_events_share_their_empty_maps() -> None:
    """The fast paths' one saving beyond the splitter: no new empty dicts."""
    client, server = open_pair()
    msg = FakeMessage("", "k", b"")
    client.receive_data(server.send_deliver("c", 1, False, msg) + server.send(ev.Ok(9)))
    deliver, ok = client.events()
    assert isinstance(deliver, ev.Deliver) and isinstance(ok, ev.Ok)
    assert deliver.headers is deliver.props is ok.info is codec.EMPTY == {}


# --- events() is next_event() in a loop -----------------------------------------------


def _stream() -> bytes:
    server = server_in(ConnState.OPEN)
    msg = FakeMessage("amq.topic", "a.b", b"plain")
    return b"".join(
        [
            server.send_deliver("c1", 1, False, msg),
            server.send_deliver("c1", 300, True, FakeMessage("", "q", b"x" * 1000, {"h": 1})),
            server.send(ev.Ok(re=5)),
            server.send(ev.Ok(re=6, info={"tag": "c1"})),
            server.send(ev.Heartbeat()),
            server.send(ev.Error(re=7, code=404, text="no")),
            server.send(ev.Deliver("c2", 301, "", "q", b"b", {}, {"priority": 1}, False, "q")),
            server.send_deliver("c1", 302, False, msg, offset=17),
            server.send(ev.Close(320, "bye")),
            server.send(ev.Heartbeat()),
        ]
    )


def _one_by_one(conn: Connection) -> list[ev.Event]:
    out = []
    while (event := conn.next_event()) is not NEED_DATA:
        assert isinstance(event, ev.Event)
        out.append(event)
    return out


@CHECKS
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=1500), max_size=20),
    limit=st.integers(1, 5),
)
def test_any_chunking_and_batching_gives_the_same_events(cuts: list[int], limit: int) -> None:
    data = _stream()
    whole = client_in(ConnState.OPEN)
    whole.receive_data(data)
    expected = _one_by_one(whole)
    assert len(expected) == 10
    batched = client_in(ConnState.OPEN)
    got: list[ev.Event] = []
    pos = 0
    for c in [*cuts, len(data)]:
        if data[pos : pos + c]:  # (b"" would mean the end of the stream)
            batched.receive_data(data[pos : pos + c])
        pos += c
        while batch := batched.events(limit):
            assert len(batch) <= limit
            got += batch
    assert got == expected


def test_a_batch_ends_at_a_state_change() -> None:
    """A server answers hello before the requests behind it are checked (they
    would be refused before the welcome)."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.send(ev.Hello(1)) + frame({"m": "status", "id": 2}))
    assert server.events() == [ev.Hello(1)]
    server.send(ev.Welcome(1))
    assert server.events() == [ev.Status(2)]


def test_an_error_behind_a_batch_comes_with_the_next_call() -> None:
    client, server = open_pair()
    server.receive_data(client.send(ev.Status(1)) + frame(["not", "a", "map"]))
    assert server.events() == [ev.Status(1)]
    with pytest.raises(RemoteProtocolError) as first:
        server.events()
    with pytest.raises(RemoteProtocolError) as again:
        server.next_event()
    assert again.value is first.value


def test_end_of_stream() -> None:
    client = client_in(ConnState.OPEN)
    data = server_in(ConnState.OPEN).send(ev.Ok(1))
    client.receive_data(data[:-1])
    assert client.events() == []
    client.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="ended inside a frame"):
        client.events()
    clean = client_in(ConnState.OPEN)
    clean.receive_data(data)
    clean.receive_data(b"")
    assert clean.events() == [ev.Ok(1), ev.EndOfStream()]


def test_an_oversized_frame_is_refused_before_any_fast_path() -> None:
    client = client_in(ConnState.OPEN)
    client.max_frame_size = 100
    client.receive_data((1000).to_bytes(4, "big") + b"\xa0")
    with pytest.raises(RemoteProtocolError, match="exceeds the maximum"):
        client.events()


@pytest.mark.parametrize("piece", [1000, 10_000, 100_000])
def test_a_large_frame_over_many_chunks(piece: int) -> None:
    """The receive buffer gathers a long frame in place and small ones as bytes."""
    server = server_in(ConnState.OPEN)
    big = FakeMessage("", "k", bytes(range(256)) * 600)
    data = b"".join(
        [
            server.send(ev.Ok(1)),
            server.send_deliver("c", 1, False, big),
            server.send(ev.Ok(2)),
            server.send_deliver("c", 2, False, FakeMessage("", "k", b"small")),
        ]
    )
    client = client_in(ConnState.OPEN)
    got: list[ev.Event] = []
    for pos in range(0, len(data), piece):
        client.receive_data(
            bytearray(data[pos : pos + piece]) if pos % 2 else data[pos : pos + piece]
        )
        got += client.events()
    assert got == [
        ev.Ok(1),
        ev.Deliver("c", 1, "", "k", big.body),
        ev.Ok(2),
        ev.Deliver("c", 2, "", "k", b"small"),
    ]


# --- a client reading deliveries as maps ----------------------------------------------

_DELIVER_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 2**64), TEXT, st.binary(max_size=6), st.just([])
)


def _as_event(item: ev.Event | dict[str, Any]) -> ev.Event:
    """A deliver map handed on as it is, read as the checked decoder reads it."""
    if type(item) is dict:
        return codec.event_from_map(ev.Deliver, item)
    assert isinstance(item, ev.Event)
    return item


@CHECKS
@given(
    frames=st.lists(
        st.one_of(
            # the usual six keys, each with any type: the inline test keeps or leaves it
            st.fixed_dictionaries(
                {
                    "m": st.just("deliver"),
                    "ctag": st.one_of(TEXT, _DELIVER_VALUES),
                    "dtag": st.one_of(UINTS, _DELIVER_VALUES),
                    "exchange": st.one_of(TEXT, _DELIVER_VALUES),
                    "key": st.one_of(TEXT, _DELIVER_VALUES),
                    "body": st.one_of(st.binary(max_size=20), _DELIVER_VALUES),
                }
            ),
            # a deliver with more (headers, props, an offset, ...) or a key missing
            st.fixed_dictionaries(
                {"m": st.just("deliver"), "ctag": TEXT, "dtag": UINTS},
                optional={
                    "exchange": TEXT,
                    "key": TEXT,
                    "body": st.binary(max_size=20),
                    "headers": HEADERS,
                    "props": st.one_of(PROPS, _DELIVER_VALUES, st.just({"colour": "red"})),
                    "offset": UINTS,
                    "redelivered": st.booleans(),
                },
            ),
            # the usual six and props, valid or not
            st.fixed_dictionaries(
                {
                    "m": st.just("deliver"),
                    "ctag": TEXT,
                    "dtag": UINTS,
                    "exchange": TEXT,
                    "key": TEXT,
                    "body": st.binary(max_size=20),
                    "props": st.one_of(
                        PROPS,
                        _DELIVER_VALUES,
                        st.just({"priority": -1}),
                        st.just({"group_id": 7}),
                    ),
                }
            ),
            st.builds(lambda re: {"m": "ok", "re": re}, UINTS),
        ),
        max_size=6,
    )
)
def test_deliver_maps_agree_with_the_events_they_stand_for(frames: list[dict[str, Any]]) -> None:
    """``events_with_deliver_maps`` hands a deliver map on only when it is in the
    usual shape and the checked decoder reads it; everything else, errors too, is
    what ``events()`` gives."""
    data = b"".join(frame(m) for m in frames)
    general, maps = client_in(ConnState.OPEN), client_in(ConnState.OPEN)
    if data:  # b"" would mark the end of the stream
        general.receive_data(data)
        maps.receive_data(data)
    try:
        expected: list[ev.Event] | None = feed_all(general)
    except RemoteProtocolError as exc:
        expected, error = None, exc.code
    try:
        got: list[ev.Event | dict[str, Any]] = []
        while batch := maps.events_with_deliver_maps():
            got.extend(batch)
            if isinstance(batch[-1], ev.EndOfStream):
                break  # every later call returns it again
    except RemoteProtocolError as exc:
        assert expected is None and exc.code == error
    else:
        assert expected is not None
        assert [_as_event(item) for item in got] == expected
        for item, m in zip(got, frames, strict=False):  # one event a frame, in order
            if type(item) is dict:
                assert item is not m and item == m  # the frame's own map
                assert set(m) - {"props"} == {"m", "ctag", "dtag", "exchange", "key", "body"}


def feed_all(conn: Connection) -> list[ev.Event]:
    out: list[ev.Event] = []
    while batch := conn.events():
        out.extend(batch)
        if isinstance(batch[-1], ev.EndOfStream):
            break  # every later call returns it again
    return out


def test_a_server_never_gets_deliver_maps() -> None:
    """The map path is the client's: on a server the call is ``events()``."""
    server = server_in(ConnState.OPEN)
    server.receive_data(frame({"m": "ack", "id": 1, "dtag": 3}))
    assert server.events_with_deliver_maps() == [ev.Ack(1, 3, False)]


# --- a publisher's runs (Connection.events_with_publish_runs) -------------------------

_RUN_ROUTES = [("", "q"), ("", "q"), ("ex", "k"), ("", "")]
_RUN_IDS = st.one_of(
    st.integers(0, 30), st.sampled_from([23, 24, 0xFF, 0xFFFF, 0x10000, 2**32 - 1, 2**32])
)


@CHECKS
@given(
    rid=_RUN_IDS,
    route=st.sampled_from(_RUN_ROUTES),
    body=st.one_of(st.binary(max_size=30), st.binary(min_size=250, max_size=300)),
    asked=st.tuples(st.sampled_from([0, 0, 1, -1]), st.sampled_from(_RUN_ROUTES)),
    cut=st.integers(0, 60),
    flip=st.tuples(st.integers(0, 60), st.integers(0, 255)),
)
def test_the_run_reader_reads_a_plain_publish_as_the_publish_reader_or_declines(
    rid: int,
    route: tuple[str, str],
    body: bytes,
    asked: tuple[int, tuple[str, str]],
    cut: int,
    flip: tuple[int, int],
) -> None:
    """read_run_publish gives a frame's body only when read_plain_publish reads it as
    the plain publish with the asked id on the asked route; and it does take the
    client's frame of that publish (ids of 8, 16 or 32 bits, bodies under 64 KiB)."""
    (exchange, key), (shift, asked_route) = route, asked
    payload = codec.encode_publish(rid, exchange, key, body, None, None, False, False)[4:]
    # the encoded route of the asked names, as the publish reader remembers it
    probe = codec.encode_publish(0, *asked_route, b"", None, None, False, False)[4:]
    assert codec.read_plain_publish(probe, 0, len(probe)) is not None
    encoded, names = codec.last_route()
    assert names == asked_route
    want = rid + shift
    changed = bytearray(payload)
    if flip[0] < len(changed):
        changed[flip[0]] = flip[1]
    for variant in (payload, payload[:cut], bytes(changed), payload + b"\x00"):
        got = codec.read_run_publish(variant, 0, len(variant), want, encoded)
        plain = codec.read_plain_publish(variant, 0, len(variant))
        if got is not None:
            assert type(got) is bytes
            assert plain == ev.Publish(want, *asked_route, got, {}, {}, False, False)
        if (
            variant is payload
            and shift == 0
            and asked_route == route
            and (rid < 24 or 256 <= rid < 2**32)
        ):
            assert got == body  # the usual frame is taken
        codec.read_plain_publish(probe, 0, len(probe))  # the asked route again


def _publisher_stream(draws: list[tuple[int, int, bool]]) -> bytes:
    """Frames a client could send a broker: plain publishes (ids mostly one after the
    other, two routes), publishes with options, acks, a heartbeat, a bad frame."""
    client = client_in(ConnState.OPEN)
    out = []
    rid = 70_000
    for kind, step, other_route in draws:
        rid += step
        exchange, key = ("ex", "k") if other_route else ("", "q")
        if kind <= 5:
            out.append(
                codec.encode_publish(rid, exchange, key, b"m%d" % rid, None, None, False, False)
            )
        elif kind == 6:
            out.append(client.send(ev.Publish(rid, exchange, key, b"c", confirm=True)))
        elif kind == 7:
            out.append(client.send(ev.Publish(rid, exchange, key, b"p", props={"priority": 2})))
        elif kind == 8:
            out.append(client.send(ev.Publish(rid, exchange, key, b"h", mandatory=True)))
        elif kind == 9:
            out.append(client.send(ev.Ack(rid, 3, True)))
        elif kind == 10:
            out.append(client.send(ev.Heartbeat()))
        else:
            out.append(raw_frame(cbor2.dumps({"m": "publish", "id": rid, "exchange": 1})))
    return b"".join(out)


@CHECKS
@given(
    draws=st.lists(
        st.tuples(st.integers(0, 11), st.sampled_from([1, 1, 1, 0, 2]), st.booleans()),
        max_size=30,
    ),
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12),
    limit=st.integers(1, 9),
)
def test_publish_runs_expand_to_the_events(
    draws: list[tuple[int, int, bool]], cuts: list[int], limit: int
) -> None:
    """events_with_publish_runs, its runs expanded, gives what events() gives for the
    same bytes however they arrive and whatever the limit; each batch reads at most
    ``limit`` frames and says how many; an error comes after the events before it,
    as from events()."""
    data = _publisher_stream(draws)
    whole = server_in(ConnState.OPEN)
    if data:  # (b"" would mean the end of the stream)
        whole.receive_data(data)
    expected: list[Any] = []
    with contextlib.suppress(RemoteProtocolError):
        while batch := whole.events():
            expected += batch
    runs = server_in(ConnState.OPEN)
    got: list[Any] = []
    pos = 0
    with contextlib.suppress(RemoteProtocolError):
        for c in [*cuts, len(data)]:
            if data[pos : pos + c]:
                runs.receive_data(data[pos : pos + c])
            pos += c
            while True:
                batch, frames = runs.events_with_publish_runs(limit)
                if not batch:
                    break
                assert frames <= limit
                expanded: list[Any] = []
                for e in batch:
                    if type(e) is PublishRun:
                        assert e.bodies
                        expanded += e.publishes()
                    else:
                        expanded.append(e)
                assert frames == len(expanded)
                got += expanded
    assert got == expected


@CHECKS
@given(
    messages=st.lists(
        st.tuples(
            st.sampled_from([("", "q"), ("", "q"), ("ex", "k"), ("", ""), ("ex", "q")]),
            st.sampled_from([0, 1, 23, 24, 100, 100, 255, 256, 70_000]),
            st.one_of(st.just({}), HEADERS),
            st.one_of(st.just({}), PROPS),
        ),
        max_size=12,
    )
)
def test_message_pairs_are_their_pieces_whatever_came_before(
    messages: list[tuple[tuple[str, str], int, dict[str, Any], dict[str, Any]]],
) -> None:
    """_message_pairs reuses the start of the message before's pairs when the route
    and body size are the same: the pairs are still the route's prefix, the body's
    head and the body, then the headers and props pairs, for any sequence."""
    for (exchange, key), size, headers, props in messages:
        body = bytes([size % 251]) * size
        msg = FakeMessage(exchange, key, body, headers, props)
        expected = codec._route_prefix(exchange, key) + codec.bytes_head(size) + body
        if headers:
            expected += codec._map_pair(codec._K_HEADERS, headers)
        if props:
            expected += codec._map_pair(codec._K_PROPS, props)
        assert codec._message_pairs(msg) == expected
        assert msg.wire == expected


# --- a consumer's runs (Connection.events_with_deliver_runs) --------------------------

_DELIVER_TAGS = [3, 23, 24, 200, 255, 256, 70_000, 70_001, 2**32 - 1, 2**32, 2**40]


def _deliver_frame(
    ctag: str, dtag: int, route: tuple[str, str], size: int, props: dict[str, Any] | None = None
) -> bytes:
    m = {
        "m": "deliver",
        "ctag": ctag,
        "dtag": dtag,
        "exchange": route[0],
        "key": route[1],
        "body": bytes([dtag % 251]) * size,
    }
    if props is not None:
        m["props"] = props
    return frame(m)


#: properties a run of deliveries may carry (kinds 14-17 of _consumer_stream): a
#: persistent message's; one of the same size that is not (read_deliver_run's
#: one-compare path must not take it for the first); a grouped message's; a map
#: the props reader declines (its value is a list)
_RUN_PROPS: list[dict[str, Any]] = [
    {"persistent": True},
    {"persistent": False},
    {"group_id": "g"},
    {"group_id": "g", "x": [1]},
]


#: (consumer tag, route): mostly the first; the next two differ from it in one of
#: them only, at the same size; the last in both
_DELIVER_TO = [
    ("ctag-1", ("", "q0")),
    ("ctag-1", ("e", "q")),
    ("ctag-2", ("", "q0")),
    ("c", ("ex", "k")),
]


def _consumer_stream(draws: list[tuple[int, int, int, int, int]]) -> bytes:
    """Frames a broker could send a client: plain deliveries (tags of every width,
    some written wider than they need, consumer tags and routes of one size and of
    others, bodies of every length head, a byte after the map), a grouped, a
    persistent, a redelivered one, one with headers, a bare ok, a heartbeat, a bad
    frame."""
    out = []
    for kind, tag_at, size, which, step in draws:
        dtag = _DELIVER_TAGS[tag_at] + step
        ctag, route = _DELIVER_TO[which]
        plain = {"m": "deliver", "ctag": ctag, "dtag": dtag, "exchange": route[0]}
        if kind <= 4:
            out.append(_deliver_frame(ctag, dtag, route, size))
        elif kind == 5:  # a byte after the map
            out.append(raw_frame(_deliver_frame(ctag, dtag, route, size)[4:] + b"\x00"))
        elif kind == 6 and dtag < 2**32:  # a tag written in 32 bits whatever its size
            head = cbor2.dumps({"m": "deliver", "ctag": ctag, "dtag": 0})[:-1]
            rest = cbor2.dumps({"exchange": route[0], "key": route[1], "body": b"w" * size})
            payload = b"\xa6" + head[1:] + b"\x1a" + dtag.to_bytes(4, "big") + rest[1:]
            out.append(raw_frame(payload))
        elif kind == 7:
            props = {"group_id": "g"}
            out.append(frame({**plain, "key": route[1], "body": b"g", "props": props}))
        elif kind == 8:
            props = {"persistent": True}
            out.append(frame({**plain, "key": route[1], "body": b"p", "props": props}))
        elif kind == 9:
            out.append(frame({**plain, "redelivered": True, "key": route[1], "body": b"r"}))
        elif kind == 10:
            out.append(frame({**plain, "key": route[1], "body": b"h", "headers": {"a": 1}}))
        elif kind == 11:
            out.append(frame({"m": "ok", "re": dtag}))
        elif kind == 12:
            out.append(frame({"m": "heartbeat"}))
        elif 14 <= kind <= 17:  # a delivery with properties, of the usual size (runs)
            out.append(_deliver_frame(ctag, dtag, route, size, _RUN_PROPS[kind - 14]))
        elif kind == 18 and dtag < 2**32:  # a bare ok whose id is written in 32 bits
            out.append(
                raw_frame(
                    cbor2.dumps({"m": "ok", "re": 0})[:-1] + b"\x1a" + dtag.to_bytes(4, "big")
                )
            )
        elif kind == 19:  # an ok with info (no bare ok)
            out.append(frame({"m": "ok", "re": dtag, "info": {"tag": "t"}}))
        elif kind == 20:  # a bare ok, a byte after the map
            out.append(raw_frame(cbor2.dumps({"m": "ok", "re": dtag}) + b"\x00"))
        elif kind >= 18:  # (18 with a tag past 32 bits) a bare ok
            out.append(frame({"m": "ok", "re": dtag}))
        else:
            out.append(raw_frame(cbor2.dumps({"m": "deliver", "ctag": 1})))
    return b"".join(out)


@CHECKS
@given(
    draws=st.lists(
        st.tuples(
            st.sampled_from(
                [0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
                + [14] * 5
                + [15, 16, 16, 17]
                + [11] * 8  # bare oks in a row: a publisher's confirms
                + [18, 18, 19, 20]
            ),
            st.sampled_from([6, 6, 6, 6, *range(len(_DELIVER_TAGS))]),
            st.sampled_from([0, 1, 23, 24, 100, 100, 100, 255, 256, 70_000]),
            st.sampled_from([0, 0, 0, 0, 0, 1, 2, 3]),
            st.integers(0, 3),
        ),
        max_size=30,
    ),
    cuts=st.lists(st.integers(min_value=1, max_value=3000), max_size=8),
    limit=st.sampled_from([1, 2, 3, 7, 64, 2**62]),
)
@example(draws=[(0, 6, 100, 0, 0), (5, 6, 100, 0, 1), (0, 6, 100, 0, 2)], cuts=[], limit=64)
@example(draws=[(0, 6, 100, 0, 0), (0, 6, 100, 1, 1), (0, 6, 100, 2, 2)], cuts=[], limit=64)
@example(draws=[(0, 6, 100, 0, 0), (0, 6, 100, 0, 1), (0, 6, 100, 1, 2)], cuts=[], limit=64)
@example(draws=[(0, 6, 100, 0, 0), (6, 3, 100, 0, 1), (0, 5, 256, 0, 2)], cuts=[], limit=64)
@example(  # persistent deliveries, then one of the same size that is not persistent
    draws=[(14, 6, 100, 0, 0), (14, 6, 100, 0, 1), (14, 6, 100, 0, 2), (15, 6, 100, 0, 3)],
    cuts=[],
    limit=64,
)
@example(  # a plain delivery, then persistent ones, then grouped ones, then plain
    draws=[
        (0, 6, 100, 0, 0),
        (14, 6, 100, 0, 1),
        (14, 6, 100, 0, 2),
        (16, 6, 100, 0, 3),
        (16, 6, 100, 0, 3),
        (0, 6, 100, 0, 0),
        (0, 6, 100, 0, 1),
    ],
    cuts=[],
    limit=64,
)
@example(  # confirms (bare oks of 18 bytes: 32-bit ids), the read cut inside the third
    draws=[(11, 6, 0, 0, 0), (11, 6, 0, 0, 1), (11, 6, 0, 0, 2), (11, 6, 0, 0, 3)],
    cuts=[18 * 2 + 16],
    limit=64,
)
def test_deliver_runs_expand_to_the_deliver_maps(
    draws: list[tuple[int, int, int, int, int]], cuts: list[int], limit: int
) -> None:
    """events_with_deliver_runs, its runs expanded, gives what events_with_deliver_maps
    gives for the same bytes however they arrive and whatever the limit; a run holds
    two deliveries or more, each batch reads at most ``limit`` frames; an error comes
    after the events before it, as from events_with_deliver_maps."""
    data = _consumer_stream(draws)
    whole = client_in(ConnState.OPEN)
    if data:  # (b"" would mean the end of the stream)
        whole.receive_data(data)
    expected: list[Any] = []
    with contextlib.suppress(RemoteProtocolError):
        while batch := whole.events_with_deliver_maps():
            expected += batch
    runs = client_in(ConnState.OPEN)
    got: list[Any] = []
    pos = 0
    with contextlib.suppress(RemoteProtocolError):
        for c in [*cuts, len(data)]:
            if data[pos : pos + c]:
                runs.receive_data(data[pos : pos + c])
            pos += c
            while batch := runs.events_with_deliver_runs(limit):
                expanded: list[Any] = []
                for e in batch:
                    if type(e) is DeliverRun:
                        assert len(e.dtags) >= 2
                        expanded += e.maps()
                    elif type(e) is OkRun:
                        assert len(e.res) >= 2
                        expanded += e.events()
                    else:
                        expanded.append(e)
                assert len(expanded) <= limit
                got += expanded
    assert got == expected


def test_a_run_of_plain_deliveries_is_read_in_one_go() -> None:
    """The bench's stream (one consumer, one route, tags one after the other) is one
    run however long."""
    data = b"".join(_deliver_frame("ctag-1", 70_000 + i, ("", "q0"), 100) for i in range(500))
    conn = client_in(ConnState.OPEN)
    conn.receive_data(data)
    (run,) = conn.events_with_deliver_runs()
    assert type(run) is DeliverRun
    assert run.dtags == list(range(70_000, 70_500)) and run.bodies[0] == bytes([70_000 % 251]) * 100
    assert (run.ctag, run.exchange, run.key) == ("ctag-1", "", "q0")


def test_a_run_of_confirms_is_read_in_one_go() -> None:
    """The confirms a commit releases (bare oks, ids past 16 bits and below) are one
    run, whatever the width of each id."""
    ids = [5, 300, 70_000, *range(70_001, 70_500), 2**40]
    conn = client_in(ConnState.OPEN)
    conn.receive_data(b"".join(frame({"m": "ok", "re": r}) for r in ids))
    (run,) = conn.events_with_deliver_runs()
    assert type(run) is OkRun and run.res == ids


def test_a_run_of_persistent_deliveries_is_read_in_one_go() -> None:
    """The persistent bench's stream (the same, each with ``{"persistent": true}``) is
    one run too, whose maps carry the properties, each its own copy."""
    props = {"persistent": True}
    data = b"".join(
        _deliver_frame("ctag-1", 70_000 + i, ("", "q0"), 100, props) for i in range(500)
    )
    conn = client_in(ConnState.OPEN)
    conn.receive_data(data)
    (run,) = conn.events_with_deliver_runs()
    assert type(run) is DeliverRun
    assert run.dtags == list(range(70_000, 70_500)) and run.props == props
    maps = run.maps()
    assert maps[0]["props"] == props and maps[0]["props"] is not maps[1]["props"]


def test_a_frame_of_the_usual_size_with_a_narrower_tag_is_not_read_as_the_usual_one() -> None:
    """read_deliver_run's one-compare path takes a frame only when its tag takes 32
    bits: a frame of the same size whose 16-bit tag is followed by two stray bytes
    and then the usual route and body head is what events_with_deliver_maps makes
    of it (an error here), not a delivery."""
    usual = [_deliver_frame("ctag-1", 70_000 + i, ("", "q0"), 100) for i in range(2)]
    odd = bytearray(usual[1])
    at = odd.index(b"\x1a" + (70_001).to_bytes(4, "big"))
    odd[at : at + 5] = b"\x19\x01\x02\x00\x00"  # same size: the tag then two stray bytes
    data = b"".join([*usual, bytes(odd), usual[0]])
    got: list[Any] = [[], []]
    for i, read in enumerate(("events_with_deliver_maps", "events_with_deliver_runs")):
        conn = client_in(ConnState.OPEN)
        conn.receive_data(data)
        with contextlib.suppress(RemoteProtocolError):
            while batch := getattr(conn, read)():
                for e in batch:
                    got[i] += e.maps() if type(e) is DeliverRun else [e]
    assert got[0] == got[1] and len(got[0]) == 2
