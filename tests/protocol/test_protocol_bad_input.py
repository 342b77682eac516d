"""Bad input: hard errors (RemoteProtocolError, the connection ends) for frames we
cannot trust, BadRequest (one request fails, decoding carries on) for a well-framed
request with a usable id."""

from __future__ import annotations

import struct
from typing import Any

import cbor2
import pytest

from amqlite.errors import RemoteProtocolError, ReplyCode, is_hard
from amqlite.protocol import Connection, ConnState, Role, codec
from amqlite.protocol import events as ev

from .wire import FULL, client_in, frame, open_pair, raw_frame, server_in

STATUS = frame({"m": "status", "id": 99})


def _hard(conn: Connection, data: bytes) -> RemoteProtocolError:
    conn.receive_data(data)
    with pytest.raises(RemoteProtocolError) as info:
        conn.events()
    assert conn.state is ConnState.ERROR
    # the error is sticky: the connection is finished
    conn.receive_data(STATUS)
    with pytest.raises(RemoteProtocolError) as again:
        conn.next_event()
    assert again.value is info.value
    return info.value


def _bad_request(data: bytes) -> ev.BadRequest:
    """Feed ``data`` then a good request to an OPEN server: one BadRequest, then the
    good request, and the connection stays OPEN."""
    server = server_in(ConnState.OPEN)
    server.receive_data(data + STATUS)
    events = server.events()
    assert len(events) == 2, events
    bad, good = events
    assert isinstance(bad, ev.BadRequest)
    assert good == ev.Status(id=99)
    assert server.state is ConnState.OPEN
    return bad


# --- not our protocol -------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "mentions"),
    [
        (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", "HTTP"),
        (b"POST /api HTTP/1.1\r\n\r\n", "HTTP"),
        (b"HTTP/1.1 200 OK\r\n\r\n", "HTTP"),
        (b"AMQP\x00\x00\x09\x01", "AMQP 0-9-1"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "TLS"),
    ],
    ids=["http-get", "http-post", "http-response", "amqp-091", "tls"],
)
def test_foreign_protocols_are_named(data: bytes, mentions: str) -> None:
    error = _hard(Connection(Role.SERVER), data)
    assert error.code == ReplyCode.FRAME_ERROR
    assert mentions in error.text
    assert "amqlite" in error.text


@pytest.mark.parametrize(
    "data",
    [
        b"\xff" * 16,
        b"\x00\x00\x00\x04\xff\xfe\xfd\xfc",  # a small frame of garbage
        b"\x00\x00\x00\x00",  # an empty frame
        b"\x00\x00\x00\x01\x1c",  # a reserved CBOR additional-info value
    ],
    ids=["ff-bytes", "garbage-frame", "empty-frame", "reserved-cbor"],
)
def test_garbage(data: bytes) -> None:
    for conn in (Connection(Role.SERVER), server_in(ConnState.OPEN), client_in(ConnState.OPEN)):
        assert _hard(conn, data).code == ReplyCode.FRAME_ERROR


def test_huge_length_prefix() -> None:
    error = _hard(server_in(ConnState.OPEN), struct.pack(">I", 0xFFFF_FFF0) + b"\xa0")
    assert error.code == ReplyCode.FRAME_ERROR
    assert "exceeds the maximum" in error.text


def test_truncated_cbor() -> None:
    payload = cbor2.dumps({"m": "status", "id": 1, "pad": "x" * 20})
    error = _hard(server_in(ConnState.OPEN), raw_frame(payload[:-5]))
    assert error.code == ReplyCode.FRAME_ERROR
    assert "malformed CBOR" in error.text


@pytest.mark.parametrize("value", [[1, 2], "status", 7, None, b"\xa1", 1.5], ids=repr)
def test_non_map_cbor(value: Any) -> None:
    error = _hard(server_in(ConnState.OPEN), frame(value))
    assert error.code == ReplyCode.FRAME_ERROR
    assert "one CBOR map" in error.text


@pytest.mark.parametrize(
    "m",
    [{"id": 1}, {"m": 5, "id": 1}, {"m": None, "id": 1}, {"m": b"status", "id": 1}, {}],
    ids=["missing", "int", "null", "bytes", "empty-map"],
)
def test_missing_or_ill_typed_method(m: dict[str, Any]) -> None:
    error = _hard(server_in(ConnState.OPEN), frame(m))
    assert error.code == ReplyCode.SYNTAX_ERROR
    assert "'m' must be text" in error.text


# --- unknown methods ----------------------------------------------------------------


def test_unknown_method_with_an_id_when_open_is_a_bad_request() -> None:
    bad = _bad_request(frame({"m": "queue.frobnicate", "id": 41}))
    assert bad == ev.BadRequest(41, ReplyCode.NOT_IMPLEMENTED, "unknown method 'queue.frobnicate'")
    assert not is_hard(bad.code)


@pytest.mark.parametrize(
    "state", [ConnState.HANDSHAKE, ConnState.AUTHENTICATING], ids=lambda s: s.value
)
def test_unknown_method_before_the_handshake_is_hard(state: ConnState) -> None:
    error = _hard(server_in(state), frame({"m": "queue.frobnicate", "id": 41}))
    assert error.code == ReplyCode.COMMAND_INVALID
    assert "unknown method" in error.text


def test_unknown_method_without_an_id_is_hard() -> None:
    for m in ({"m": "queue.frobnicate"}, {"m": "queue.frobnicate", "id": "41"}):
        assert _hard(server_in(ConnState.OPEN), frame(m)).code == ReplyCode.COMMAND_INVALID


def test_unknown_method_from_the_server_is_hard_for_the_client() -> None:
    error = _hard(client_in(ConnState.OPEN), frame({"m": "surprise", "id": 1, "re": 1}))
    assert error.code == ReplyCode.COMMAND_INVALID


# --- ill-typed fields -------------------------------------------------------------


@pytest.mark.parametrize(
    ("m", "mentions"),
    [
        ({"m": "queue.declare", "id": 5, "durable": "yes"}, "'durable'"),
        ({"m": "queue.declare", "id": 5, "queue": 3}, "'queue'"),
        ({"m": "queue.declare", "id": 5, "arguments": {1: "x"}}, "'arguments'"),
        ({"m": "queue.declare", "id": 5, "arguments": [1]}, "'arguments'"),
        ({"m": "queue.bind", "id": 5, "queue": "q"}, "missing field 'exchange'"),
        ({"m": "consume", "id": 5, "queue": "q", "prefetch": "10"}, "'prefetch'"),
        ({"m": "consume", "id": 5, "queue": "q", "prefetch": True}, "'prefetch'"),
        ({"m": "nack", "id": 5, "dtag": 1.0}, "'dtag'"),
        ({"m": "exchange.declare", "id": 5}, "missing field 'exchange'"),
        ({"m": "publish", "id": 5, "exchange": "", "key": "q", "body": "text"}, "'body'"),
        ({"m": "publish", "id": 5, "exchange": None, "key": "q", "body": b""}, "'exchange'"),
        ({"m": "publish", "id": 5, "exchange": "", "key": 1, "body": b""}, "'key'"),
        (
            {"m": "publish", "id": 5, "exchange": "", "key": "", "body": b"", "confirm": 1},
            "'confirm'",
        ),
        ({"m": "ack", "id": 5, "dtag": "1"}, "'dtag'"),
        ({"m": "ack", "id": 5, "dtag": 1, "multiple": "no"}, "'multiple'"),
    ],
    ids=lambda v: (
        v["m"] + "-" + "-".join(k for k in v if k not in ("m", "id"))
        if isinstance(v, dict)
        else None
    ),
)
def test_ill_typed_fields_with_an_id_are_bad_requests(m: dict[str, Any], mentions: str) -> None:
    bad = _bad_request(frame(m))
    assert bad.id == 5
    assert bad.code == ReplyCode.SYNTAX_ERROR
    assert mentions in bad.text
    assert m["m"] in bad.text


@pytest.mark.parametrize(
    "m",
    [
        {"m": "publish", "exchange": "", "key": "q", "body": b""},  # no id at all
        {"m": "publish", "id": "5", "exchange": "", "key": "q", "body": b""},
        {"m": "publish", "id": 5.0, "exchange": "", "key": "q", "body": b""},
        {"m": "ack", "dtag": 1},
        {"m": "ack", "id": None, "dtag": 1},
        {"m": "queue.declare", "id": True},
    ],
    ids=[
        "publish-no-id",
        "publish-str-id",
        "publish-float-id",
        "ack-no-id",
        "ack-null-id",
        "declare-bool-id",
    ],
)
def test_requests_without_a_usable_id_are_hard(m: dict[str, Any]) -> None:
    error = _hard(server_in(ConnState.OPEN), frame(m))
    assert error.code == ReplyCode.SYNTAX_ERROR
    assert "'id'" in error.text


def test_ill_typed_close_is_hard_even_with_a_stray_id() -> None:
    """Only requests fail softly: a broken close cannot be answered with ``error``."""
    error = _hard(server_in(ConnState.OPEN), frame({"m": "close", "id": 5, "code": "bye"}))
    assert error.code == ReplyCode.SYNTAX_ERROR
    assert "'code'" in error.text


def test_ill_typed_handshake_is_hard() -> None:
    error = _hard(Connection(Role.SERVER), frame({"m": "hello", "id": 1, "vhost": 7}))
    assert error.code == ReplyCode.SYNTAX_ERROR
    assert "'vhost'" in error.text


def test_ill_typed_reply_is_hard_for_the_client() -> None:
    error = _hard(client_in(ConnState.OPEN), frame({"m": "ok", "re": "1"}))
    assert error.code == ReplyCode.SYNTAX_ERROR
    error = _hard(client_in(ConnState.OPEN), frame({"m": "deliver", "ctag": "c", "dtag": -0.5}))
    assert error.code == ReplyCode.SYNTAX_ERROR


# --- order and direction -------------------------------------------------------------


@pytest.mark.parametrize(
    "m",
    [
        {"m": "status", "id": 1},
        {"m": "publish", "id": 1, "exchange": "", "key": "q", "body": b""},
        {"m": "heartbeat"},
        {"m": "close-ok"},
    ],
    ids=lambda m: m["m"],
)
def test_request_before_hello_is_hard(m: dict[str, Any]) -> None:
    error = _hard(Connection(Role.SERVER), frame(m))
    assert error.code == ReplyCode.UNEXPECTED_FRAME
    assert "send 'hello' first" in error.text


def test_second_hello_is_hard() -> None:
    error = _hard(server_in(ConnState.OPEN), frame({"m": "hello", "id": 2}))
    assert error.code == ReplyCode.UNEXPECTED_FRAME
    assert "open" in error.text


@pytest.mark.parametrize(
    "method", ["ok", "deliver", "welcome", "refused", "get-ok", "cancelled", "error"]
)
def test_server_only_method_from_a_client_is_hard(method: str) -> None:
    for state in (ConnState.HANDSHAKE, ConnState.OPEN):
        error = _hard(server_in(state), frame({"m": method, "id": 1, "re": 1}))
        assert error.code == ReplyCode.COMMAND_INVALID
        assert "sent by a server, not by a client" in error.text


@pytest.mark.parametrize("method", ["hello", "publish", "status", "ack", "queue.declare"])
def test_client_only_method_from_a_server_is_hard(method: str) -> None:
    error = _hard(client_in(ConnState.OPEN), frame({"m": method, "id": 1}))
    assert error.code == ReplyCode.COMMAND_INVALID
    assert "sent by a client, not by a server" in error.text


# --- message properties and headers ----------------------------------------------------


def _publish(**extra: Any) -> bytes:
    return frame({"m": "publish", "id": 5, "exchange": "", "key": "q", "body": b"b", **extra})


@pytest.mark.parametrize(
    ("props", "mentions"),
    [
        ({"colour": "red"}, "unknown property 'colour'"),
        ({"priority": "high"}, "'priority' must be int"),
        ({"priority": True}, "'priority' must be int"),
        ({"priority": -1}, "'priority' must not be negative"),
        ({"timestamp": 1.5}, "'timestamp' must be int"),
        ({"expiration": -5}, "'expiration' must not be negative"),
        ({"priority": 256}, "'priority' must be at most 255"),
        ({"timestamp": 2**64}, "'timestamp' must be at most 253402300799999"),
        ({"timestamp": 253_402_300_800_000}, "'timestamp' must be at most"),
        ({"expiration": 2**63}, "'expiration' must be at most"),
        ({"message_id": "m" * 256}, "'message_id' is longer than 255 bytes"),
        ({"content_type": "\u00e9" * 128}, "'content_type' is longer than 255 bytes"),
        ({"expiration": "60000"}, "'expiration' must be int"),
        ({"persistent": 1}, "'persistent' must be bool"),
        ({"message_id": 12}, "'message_id' must be str"),
        ({"reply_to": None}, "'reply_to' must be str"),
        ({"user_id": b"alice"}, "'user_id' must be str"),
        ("persistent", "must be a map"),
        ([["persistent", True]], "must be a map"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_bad_message_properties(props: Any, mentions: str) -> None:
    bad = _bad_request(_publish(props=props))
    assert (bad.id, bad.code) == (5, ReplyCode.SYNTAX_ERROR)
    assert "'props'" in bad.text
    assert mentions in bad.text


@pytest.mark.parametrize(
    ("headers", "mentions"),
    [
        ({"a": [1, 2]}, "value of 'a' must be a scalar"),
        ({"a": {"b": 1}}, "value of 'a' must be a scalar"),
        ({1: "x"}, "keys must be text"),
        ({b"a": "x"}, "keys must be text"),
        ("a=b", "must be a map"),
        ({"k" * 256: 1}, "is longer than 255 bytes"),
        ({"n": 2**64}, "value of 'n' must fit in 64 bits"),
        ({"n": -(2**63) - 1}, "value of 'n' must fit in 64 bits"),
    ],
    ids=["list", "map", "int-key", "bytes-key", "text", "long-key", "int-2**64", "int-below"],
)
def test_bad_headers(headers: Any, mentions: str) -> None:
    bad = _bad_request(_publish(headers=headers))
    assert (bad.id, bad.code) == (5, ReplyCode.SYNTAX_ERROR)
    assert "'headers'" in bad.text
    assert mentions in bad.text


def test_every_valid_property_and_scalar_header_is_accepted() -> None:
    client, server = open_pair()
    publish = FULL[ev.Publish]
    server.receive_data(client.send(publish))
    assert server.events() == [publish]


def test_decoding_carries_on_after_bad_requests() -> None:
    client, server = open_pair()
    data = (
        frame({"m": "nope", "id": 1})
        + client.send(ev.Status(id=2))
        + _publish(props={"colour": "red"})
        + client.send(FULL[ev.Publish])
        + frame({"m": "queue.declare", "id": 3, "durable": 1})
        + client.send(ev.Ack(id=4, dtag=9))
    )
    server.receive_data(data)
    got = server.events()
    assert [type(e) for e in got] == [
        ev.BadRequest, ev.Status, ev.BadRequest, ev.Publish, ev.BadRequest, ev.Ack,
    ]  # fmt: skip
    assert [getattr(e, "id", None) for e in got] == [1, 2, 5, 15, 3, 4]
    assert server.state is ConnState.OPEN
    server.send(ev.Error(re=1, code=got[0].code, text=got[0].text))  # type: ignore[attr-defined]
    assert server.state is ConnState.OPEN


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(cbor2.CBORTag(1, 1700000000), id="datetime-tag"),
        pytest.param({"when": cbor2.CBORTag(1, 1700000000)}, id="nested-datetime-tag"),
        pytest.param({"set": cbor2.CBORTag(258, [1, 2])}, id="set-tag"),
        pytest.param({"deep": [[[[[[[[[[1]]]]]]]]]]}, id="too-deep"),
        pytest.param({1: "int key"}, id="int-key"),
    ],
)
def test_arguments_must_be_plain_data(arguments: object) -> None:
    """Tagged CBOR (datetimes, sets, shared references) never reaches the broker."""
    server = open_pair()[1]
    request = {"m": "queue.declare", "id": 5, "queue": "q", "arguments": arguments}
    server.receive_data(raw_frame(cbor2.dumps(request)))
    event = server.next_event()
    assert isinstance(event, ev.BadRequest)
    assert event.code == ReplyCode.SYNTAX_ERROR
    assert "arguments" in event.text


def test_self_referencing_arguments_are_refused() -> None:
    # {"m": "queue.declare", "id": 5, "arguments": shareable({"self": sharedref(0)})}
    body = (
        b"\xa3"
        + cbor2.dumps("m") + cbor2.dumps("queue.declare")
        + cbor2.dumps("id") + cbor2.dumps(5)
        + cbor2.dumps("arguments") + b"\xd8\x1c\xa1" + cbor2.dumps("self") + b"\xd8\x1d\x00"
    )  # fmt: skip
    server = open_pair()[1]
    server.receive_data(raw_frame(body))
    event = server.next_event()
    assert isinstance(event, ev.BadRequest)
    assert "arguments" in event.text


@pytest.mark.parametrize(
    ("fields", "mentions"),
    [
        ({"key": "r" * 256}, "field 'key' must be text of at most 255 bytes"),
        ({"key": "\u00e9" * 128}, "field 'key' must be text of at most 255 bytes"),
        ({"exchange": "x" * 256}, "field 'exchange' must be text of at most 255 bytes"),
        ({"key": "r" * 256, "confirm": True}, "field 'key' must be text of at most 255 bytes"),
    ],
    ids=["key", "key-utf8", "exchange", "confirmed"],
)
def test_a_name_or_key_longer_than_an_amqp_short_string_is_refused(
    fields: dict[str, Any], mentions: str
) -> None:
    """Routing keys and exchange names are at most 255 bytes, as in AMQP (a longer
    one could not be delivered to an AMQP consumer); 255 itself is taken."""
    bad = _bad_request(_publish(**fields))
    assert (bad.id, bad.code) == (5, ReplyCode.SYNTAX_ERROR)
    assert mentions in bad.text
    server = server_in(ConnState.OPEN)
    server.receive_data(_publish(key="r" * 255, exchange="x" * 255))
    (event,) = server.events()
    assert isinstance(event, ev.Publish)
    assert (event.key, event.exchange) == ("r" * 255, "x" * 255)


def test_a_batch_key_longer_than_an_amqp_short_string_is_refused() -> None:
    rows = [["k", b"1"], ["r" * 256, b"2"]]
    bad = _bad_request(frame({"m": "publish.batch", "id": 5, "exchange": "", "msgs": rows}))
    assert bad.code == ReplyCode.SYNTAX_ERROR
    assert "message 1: key is longer than 255 bytes" in bad.text
    for longest, refused in ((255, False), (256, True)):
        columns = codec.publish_columns(5, "", [["k", b"1"], ["r" * longest, b"2"]])
        server = server_in(ConnState.OPEN)
        server.receive_data(codec.encode(columns))
        (event,) = server.events()
        if refused:
            assert isinstance(event, ev.BadRequest)
            assert "each of 'keys' must be at most 255 bytes" in event.text
        else:
            assert isinstance(event, ev.PublishColumns)
