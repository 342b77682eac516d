"""Every wire event survives client -> server or server -> client unchanged, and
fields left at their defaults stay off the wire."""

from __future__ import annotations

import dataclasses

import cbor2
import pytest

from amqlite.errors import LocalProtocolError, ReplyCode
from amqlite.protocol import BY_METHOD, NEED_DATA, REPLIES, REQUESTS, WIRE_EVENTS, Role
from amqlite.protocol import events as ev
from amqlite.protocol.codec import encode, event_to_map

from .wire import (
    FULL,
    MINIMAL,
    FakeMessage,
    one_event,
    open_pair,
    pair_ready_for,
    payload_map,
    senders,
)

_CASES = [
    (kind, cls, role)
    for cls in WIRE_EVENTS
    for role in senders(cls)
    for kind in ("full", "minimal")
]


def _defaults(cls: type[ev.Event]) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def test_samples_cover_every_wire_event() -> None:
    assert set(FULL) == set(WIRE_EVENTS) == set(BY_METHOD.values())
    assert len(WIRE_EVENTS) == len(BY_METHOD)  # no two classes share a method name
    assert set(REQUESTS).isdisjoint(REPLIES)


@pytest.mark.parametrize("cls", WIRE_EVENTS, ids=[c.METHOD for c in WIRE_EVENTS])
def test_full_samples_set_every_field(cls: type[ev.Event]) -> None:
    sample = FULL[cls]
    defaults = _defaults(cls)
    for name, default in defaults.items():
        assert getattr(sample, name) != default, f"{cls.__name__}.{name} is at its default"


@pytest.mark.parametrize(
    ("kind", "cls", "sender"),
    _CASES,
    ids=[f"{c.METHOD}-{k}-from-{r.value}" for k, c, r in _CASES],
)
def test_round_trip(kind: str, cls: type[ev.Event], sender: Role) -> None:
    event = (FULL if kind == "full" else MINIMAL)[cls]
    src, dst = pair_ready_for(cls, sender)
    data = src.send(event)
    wire = payload_map(data)
    # every non-default field on the wire, and nothing else
    defaults = _defaults(cls)
    expected_keys = {"m"} | {
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name not in defaults or getattr(event, f.name) != defaults[f.name]
    }
    assert set(wire) == expected_keys
    assert wire["m"] == cls.METHOD
    for key in expected_keys - {"m"}:
        assert wire[key] == getattr(event, key)
    got = one_event(dst, data)
    assert type(got) is cls
    assert got == event
    assert dst.next_event() is NEED_DATA


def test_minimal_samples_really_are_minimal() -> None:
    """Only required fields (and ``m``) for a default-valued event."""
    assert set(event_to_map(MINIMAL[ev.Hello])) == {"m", "id"}
    assert set(event_to_map(MINIMAL[ev.Publish])) == {"m", "id", "exchange", "key", "body"}
    assert set(event_to_map(MINIMAL[ev.Close])) == {"m"}
    assert set(event_to_map(MINIMAL[ev.Error])) == {"m", "re", "code"}
    # defaults that are not falsy still stay off the wire
    assert "requeue" not in event_to_map(ev.Nack(id=1, dtag=2, requeue=True))
    assert event_to_map(ev.Nack(id=1, dtag=2, requeue=False))["requeue"] is False
    assert "code" not in event_to_map(ev.Close(code=200))


def test_error_without_a_usable_id_round_trips() -> None:
    client, server = open_pair()
    event = ev.Error(re=None, code=ReplyCode.NOT_IMPLEMENTED, text="?")
    assert payload_map(server.send(event))["re"] is None
    assert one_event(client, server.send(event)) == event


def test_many_events_in_both_directions_share_one_pair() -> None:
    client, server = open_pair()
    requests = [e for cls, e in FULL.items() if cls in REQUESTS and cls is not ev.Hello]
    data = b"".join(client.send(e) for e in requests)
    assert server.events() == []
    server.receive_data(data)
    assert server.events() == requests
    replies = [
        e for cls, e in FULL.items() if cls in REPLIES and cls not in (ev.Welcome, ev.Refused)
    ]
    client.receive_data(b"".join(server.send(e) for e in replies))
    assert client.events() == replies


# --- the server's fast paths ----------------------------------------------------------


def _full_message() -> FakeMessage:
    return FakeMessage(
        exchange="orders",
        routing_key="eu.fr",
        body=b"\x00" * 300,
        headers={"k": "v", "n": 1, "x": None},
        properties={"message_id": "m1", "persistent": True, "timestamp": 1},
    )


@pytest.mark.parametrize("redelivered", [False, True])
@pytest.mark.parametrize(
    "dtag", [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]
)
def test_send_deliver_decodes_to_deliver(dtag: int, redelivered: bool) -> None:
    client, server = open_pair()
    msg = _full_message()
    got = one_event(client, server.send_deliver("ctag-1", dtag, redelivered, msg))
    assert got == ev.Deliver(
        ctag="ctag-1",
        dtag=dtag,
        exchange="orders",
        key="eu.fr",
        body=msg.body,
        headers=msg.headers,
        props=msg.properties,
        redelivered=redelivered,
    )


@pytest.mark.parametrize("redelivered", [False, True])
@pytest.mark.parametrize("offset", [0, 23, 24, 2**40])
def test_send_deliver_carries_a_stream_offset(offset: int, redelivered: bool) -> None:
    client, server = open_pair()
    msg = _full_message()
    data = server.send_deliver("c", 7, redelivered, msg, offset)
    got = one_event(client, data)
    assert isinstance(got, ev.Deliver)
    assert (got.offset, got.redelivered, got.body) == (offset, redelivered, msg.body)
    slow = encode(
        ev.Deliver("c", 7, msg.exchange, msg.routing_key, msg.body, msg.headers,
                   msg.properties, redelivered, offset=offset)
    )  # fmt: skip
    assert cbor2.loads(data[4:]) == cbor2.loads(slow[4:])


def test_send_deliver_with_a_bare_message() -> None:
    client, server = open_pair()
    data = server.send_deliver("c", 1, False, FakeMessage("", "", b""))
    assert set(payload_map(data)) == {"m", "ctag", "dtag", "exchange", "key", "body"}
    assert one_event(client, data) == ev.Deliver("c", 1, "", "", b"")


def test_send_deliver_caches_the_message_encoding_once() -> None:
    client, server = open_pair()
    msg = _full_message()
    first = server.send_deliver("a", 1, False, msg)
    cached = msg.wire
    assert cached is not None
    second = server.send_deliver("b", 2, True, msg)
    assert msg.wire is cached
    client.receive_data(first + second)
    a, b = client.events()
    assert isinstance(a, ev.Deliver) and isinstance(b, ev.Deliver)
    assert (a.ctag, a.dtag, a.redelivered) == ("a", 1, False)
    assert (b.ctag, b.dtag, b.redelivered) == ("b", 2, True)
    assert a.body == b.body == msg.body
    assert a.headers == b.headers == msg.headers


@pytest.mark.parametrize("redelivered", [False, True])
@pytest.mark.parametrize("re", [0, 7, 300, 2**40, -1, -1000, 2**64, 2**80])
def test_send_get_ok_decodes_to_get_ok(re: int, redelivered: bool) -> None:
    """``re`` echoes the client's id, whatever integer it chose (even negative)."""
    client, server = open_pair()
    msg = _full_message()
    data = server.send_get_ok(re, 5, redelivered, 12, "q1", msg)
    assert one_event(client, data) == ev.GetOk(
        re=re,
        dtag=5,
        exchange="orders",
        key="eu.fr",
        body=msg.body,
        headers=msg.headers,
        props=msg.properties,
        redelivered=redelivered,
        remaining=12,
        queue="q1",
    )
    # the same cached encoding serves a later delivery
    got = one_event(client, server.send_deliver("c", 6, False, msg))
    assert type(got) is ev.Deliver and got.body == msg.body and got.dtag == 6


def test_fast_path_frames_match_the_generic_encoder() -> None:
    msg = _full_message()
    _, server = open_pair()
    fast = server.send_deliver("c", 300, True, msg)
    slow = encode(
        ev.Deliver("c", 300, msg.exchange, msg.routing_key, msg.body, msg.headers,
                   msg.properties, True)
    )  # fmt: skip
    assert payload_map(fast) == payload_map(slow)
    assert cbor2.loads(fast[4:]) == cbor2.loads(slow[4:])


def test_peer_max_frame_size_is_enforced_on_send() -> None:
    client, _ = open_pair()
    client.remote_max_frame_size = 100
    small = client.send(ev.Publish(id=1, exchange="", key="q", body=b"x" * 10))
    assert len(small) < 104
    with pytest.raises(LocalProtocolError) as info:
        client.send(ev.Publish(id=2, exchange="", key="q", body=b"x" * 200))
    assert info.value.code == ReplyCode.CONTENT_TOO_LARGE


@pytest.mark.parametrize(
    "event",
    [ev.BadRequest(id=1, code=540, text="x"), ev.EndOfStream()],
    ids=["BadRequest", "EndOfStream"],
)
def test_local_pseudo_events_cannot_be_sent(event: ev.Event) -> None:
    client, server = open_pair()
    for conn in (client, server):
        with pytest.raises(LocalProtocolError, match="not a wire event"):
            conn.send(event)
