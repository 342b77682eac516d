"""The peering messages: to_map/from_map round trips (through CBOR) and clear errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import cbor2
import pytest

from amqlite.peering import (
    Ack,
    BindingKey,
    Envelope,
    Filter,
    Forward,
    Forwards,
    Heartbeat,
    Hello,
    Interest,
    MeshId,
    PeeringMode,
    PeeringProtocolError,
    Refused,
    ResyncRequest,
    from_map,
)
from amqlite.peering.wire import PeeringMessage

ENV = Envelope(
    MeshId("A", 3, 17),
    "a.b",
    b"\x00body",
    {"h": 1, "s": "x", "f": 1.5, "n": None, "b": True},
    {"message_id": "m-1", "persistent": True, "priority": 4},
    "x",
    ("A", "B"),
    2,
)

PLAIN = [Envelope(MeshId("A", 2, 7 + i), "k", b"m%d" % i, {}, {}, "x", ("A",), 1) for i in range(2)]
SAMPLES: list[PeeringMessage] = [
    Hello("A", "l", "/", "x", "topic", PeeringMode.SUBSCRIBE, 5, (4, 99), heartbeat=0.5),
    Hello("A", "l", "/v", "x", "headers", PeeringMode.FORWARD, 0),
    Hello("A", "l", "/", "x", "topic", PeeringMode.SUBSCRIBE, 0, lease=60.0, buffer_bytes=4096),
    Refused(406, "exchange mismatch"),
    Interest(
        True,
        (BindingKey.of("a.*"), BindingKey.of("", {"x-match": "any", "k": [1, {"n": 2}]})),
        (),
        2,
        "00000000000000ff",
    ),
    Interest(False, (BindingKey.of("b"),), (BindingKey.of("c"),), 1, "0123456789abcdef"),
    ResyncRequest(),
    Filter("region = 'eu'"),
    Filter(None),
    Forward(1, ENV),
    Forward(12, Envelope(MeshId("N", 0, 0), "", b"", exchange="x")),
    Forwards(3, [ENV]),
    Forwards(
        9,
        [ENV, Envelope(MeshId("B", 0, 1), "", b"", {}, {}, "x", ("A", "B"), 2)],
    ),
    Forwards(5, PLAIN),  # the compact form: one origin, seqs in a row, no maps
    Forwards(5, [PLAIN[0], dataclasses.replace(PLAIN[1], routing_key="j")]),  # (keys: a list)
    Forwards(5, [PLAIN[1], PLAIN[0]]),  # (seqs not in a row: rows)
    Ack(5, 0),
    Ack(5, 123456789),
    Heartbeat(),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip_through_cbor(message: PeeringMessage) -> None:
    m = message.to_map()
    assert m["type"] == message.TYPE
    assert from_map(cbor2.loads(cbor2.dumps(m))) == message


def test_binding_arguments_survive_the_trip() -> None:
    key = BindingKey.of("", {"x-match": "any", "k": [1, {"n": 2}], "z": b"\x01"})
    assert key.arguments_map() == {"x-match": "any", "k": [1, {"n": 2}], "z": b"\x01"}
    assert BindingKey.of("", key.arguments_map()) == key
    assert BindingKey.of("k", {"a": 1, "b": 2}) == BindingKey.of("k", {"b": 2, "a": 1})
    assert BindingKey.of("k", {"a": 1}) != BindingKey.of("k", {"a": 1.0})
    assert BindingKey.of("k", {"a": 1}) != BindingKey.of("k", {"a": True})


def _hello(**changes: Any) -> dict[str, Any]:
    m = SAMPLES[0].to_map()
    m.update(changes)
    return m


def _forward(**changes: Any) -> dict[str, Any]:
    m = Forward(1, ENV).to_map()
    m.update(changes)
    return m


def _forwards(**changes: Any) -> dict[str, Any]:
    return {**Forwards(4, [ENV]).to_map(), **changes}


def _compact(**changes: Any) -> dict[str, Any]:
    return {**Forwards(4, PLAIN).to_map(), **changes}


def _without(m: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k != key}


BAD: list[tuple[object, str]] = [
    ([], "must be a map"),
    ({}, "unknown peering message type None"),
    ({"type": "peer.nope"}, "unknown peering message type 'peer.nope'"),
    (_hello(version=1), "unsupported version 1 (we speak 3)"),  # before peer.forwards
    (_hello(version=2), "unsupported version 2 (we speak 3)"),  # before its compact form
    (_hello(version=4), "unsupported version 4 (we speak 3)"),
    (_hello(mode=4), "'mode' must be 1, 2 or 3"),
    (_hello(mode="1"), "'mode' must be 1, 2 or 3"),
    (_hello(node=""), "'node' must be a non-empty string"),
    (_without(_hello(), "link"), "peer.hello: missing 'link'"),
    (_hello(exchange_type="x-delayed"), "'exchange_type' must be one of"),
    (_hello(epoch=-1), "'epoch' must be an integer >= 0"),
    (_hello(epoch=True), "'epoch' must be an integer >= 0"),
    (_hello(resume=[1]), "'resume' must be null or [epoch, seq]"),
    (_hello(heartbeat="1"), "'heartbeat' must be a number"),
    (_hello(lease=0), "'lease' must be null or a number of seconds > 0"),
    (_hello(lease="1d"), "'lease' must be null or a number of seconds > 0"),
    (_hello(buffer_bytes=0), "'buffer_bytes' must be null or an integer >= 1"),
    (_hello(buffer_bytes=1.5), "'buffer_bytes' must be null or an integer >= 1"),
    (_forward(seq=0), "peer.forward: 'seq' must be an integer >= 1"),
    (_forward(id=["A", 1]), "'id' must be [origin node, origin epoch, origin seq]"),
    (_forward(id=["", 1, 2]), "'id' must be"),
    (_forward(path="A"), "'path' must be a list of node ids"),
    (_forward(path=["A", ""]), "'path' must be a list of node ids"),
    (_forward(hops=-1), "'hops' must be an integer >= 0"),
    (_forward(body="text"), "'body' must be bytes"),
    (_forward(headers={1: 2}), "'headers' must be a map with string keys"),
    (_without(_forward(), "routing_key"), "peer.forward: missing 'routing_key'"),
    (_forwards(seq=0), "peer.forwards: 'seq' must be an integer >= 1"),
    (_forwards(path=[""]), "peer.forwards: 'path' must be a list of node ids"),
    (_forwards(hops=-1), "peer.forwards: 'hops' must be an integer >= 0"),
    (_forwards(msgs=[]), "peer.forwards: 'msgs' must be a non-empty list"),
    (_forwards(msgs=[["A", 1, 2, "k", {}, {}]]), "peer.forwards: 'msgs' must be"),
    (_forwards(msgs=[["A", 1, 2, "k", {1: 2}, {}, b""]]), "peer.forwards: 'msgs' must be"),
    (_forwards(msgs=[["", 1, 2, "k", {}, {}, b""]]), "peer.forwards: 'msgs' must be"),
    (_forwards(msgs=[["A", 1, 2, "k", {}, {}, "text"]]), "peer.forwards: 'msgs' must be"),
    (_compact(origin=["A", 1]), "peer.forwards: 'origin' must be [node, epoch, first origin"),
    (_compact(origin=["", 1, 2]), "peer.forwards: 'origin' must be"),
    (_compact(origin=["A", -1, 2]), "peer.forwards: 'origin' must be"),
    (_compact(bodies=[]), "peer.forwards: 'bodies' must be a non-empty list of byte strings"),
    (_compact(bodies=[b"", "text"]), "peer.forwards: 'bodies' must be"),
    (_compact(keys=["k"]), "peer.forwards: 'keys' must be a string, or a list of one string"),
    (_compact(keys=["k", 1]), "peer.forwards: 'keys' must be a string, or a list of one"),
    (_compact(keys=["k", b"j"]), "peer.forwards: 'keys' must be a string, or a list of one"),
    (_compact(bodies=[b"", bytearray(b"x")]), "peer.forwards: 'bodies' must be"),
    (_without(_compact(), "keys"), "peer.forwards: missing 'keys'"),
    (_without(_compact(), "bodies"), "peer.forwards: missing 'msgs'"),
    ({"type": "peer.ack", "epoch": 1}, "peer.ack: missing 'seq'"),
    ({"type": "peer.ack", "epoch": 1, "seq": 1.0}, "'seq' must be an integer"),
    (
        {
            "type": "peer.interest",
            "full": True,
            "add": [],
            "remove": [["a", {}]],
            "count": 0,
            "digest": "0" * 16,
        },
        "a full advertisement removes nothing",
    ),
    (
        {"type": "peer.interest", "full": False, "add": [["a"]], "count": 0, "digest": "0" * 16},
        "'add' must be a list of [key, {arguments}] pairs",
    ),
    (
        {"type": "peer.interest", "full": False, "add": [], "count": 0, "digest": "xyz"},
        "'digest' must be 16 lowercase hex digits",
    ),
    ({"type": "peer.interest", "full": 1, "count": 0, "digest": "0" * 16}, "'full' must be true"),
    ({"type": "peer.refused", "code": 406}, "peer.refused: missing 'text'"),
]


@pytest.mark.parametrize(("m", "message"), BAD)
def test_bad_maps_name_the_problem(m: object, message: str) -> None:
    with pytest.raises(PeeringProtocolError) as info:
        from_map(m)
    assert message in info.value.text


def test_unknown_keys_are_ignored() -> None:
    m = Ack(1, 2).to_map()
    m["future"] = "field"
    assert from_map(m) == Ack(1, 2)


def test_envelope_onward_and_size() -> None:
    onward = ENV.onward("C")
    assert onward.path == ("A", "B", "C") and onward.hops == 3
    assert onward.mesh_id == ENV.mesh_id and onward.body == ENV.body
    assert ENV.size() > len(ENV.body)
    big = Envelope(MeshId("A", 1, 1), "k", b"x" * 10_000)
    assert 10_000 < big.size() < 10_200


def test_a_filter_is_text_or_null() -> None:
    with pytest.raises(PeeringProtocolError, match="'selector' must be text or null"):
        from_map({"type": "peer.filter", "selector": 5})
