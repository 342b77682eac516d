"""The client's frame reader agrees with the sans-IO protocol connection."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqlite.client.framing import FrameReader
from amqlite.errors import RemoteProtocolError
from amqlite.protocol import Connection, ConnState, Role, codec
from amqlite.protocol import events as ev


class _Msg:
    def __init__(self, body: bytes, headers: dict | None = None) -> None:
        self.exchange = "amq.topic"
        self.routing_key = "a.b"
        self.body = body
        self.headers = headers or {}
        self.properties: dict = {}
        self.wire = None


def _open_reader() -> tuple[FrameReader, Connection]:
    proto = Connection(Role.CLIENT)
    proto._state = ConnState.OPEN  # handshake done
    return FrameReader(proto), proto


def _server() -> Connection:
    s = Connection(Role.SERVER)
    s._state = ConnState.OPEN
    return s


def _stream() -> bytes:
    server = _server()
    return b"".join(
        [
            codec.encode_deliver("c1", 1, False, _Msg(b"plain")),
            codec.encode_deliver("c1", 300, True, _Msg(b"x" * 1000, {"h": 1})),
            server.send(ev.Ok(re=5)),
            server.send(ev.Ok(re=6, info={"tag": "c1"})),
            server.send(ev.Heartbeat()),
            server.send(ev.Error(re=7, code=404, text="no")),
            server.send(ev.Deliver("c2", 301, "", "q", b"b", {}, {"priority": 1}, False, "q")),
        ]
    )


def _normalise(items: list) -> list:
    out = []
    for it in items:
        if isinstance(it, int):  # a bare ok, by its id
            out.append(ev.Ok(it))
        elif isinstance(it, dict):
            out.append(
                (
                    "deliver",
                    it["ctag"],
                    it["dtag"],
                    it["exchange"],
                    it["key"],
                    it["body"],
                    it.get("headers") or {},
                    it.get("props") or {},
                    it.get("redelivered", False),
                )
            )
        elif isinstance(it, ev.Deliver):
            out.append(
                (
                    "deliver",
                    it.ctag,
                    it.dtag,
                    it.exchange,
                    it.key,
                    it.body,
                    it.headers,
                    it.props,
                    it.redelivered,
                )
            )
        else:
            out.append(it)
    return out


def test_fast_path_matches_the_protocol_connection() -> None:
    data = _stream()
    reader, _ = _open_reader()
    proto = Connection(Role.CLIENT)
    proto._state = ConnState.OPEN
    proto.receive_data(data)
    assert _normalise(reader.feed(data)) == _normalise(proto.events())


@given(st.lists(st.integers(min_value=1, max_value=2000), max_size=20))
def test_any_chunking_gives_the_same_items(cuts: list[int]) -> None:
    data = _stream()
    reader, _ = _open_reader()
    whole = _normalise(FrameReader(_open_reader()[1]).feed(data))
    items: list = []
    pos = 0
    for c in cuts:
        if data[pos : pos + c]:
            items += reader.feed(data[pos : pos + c])
        pos += c
    if data[pos:]:
        items += reader.feed(data[pos:])
    assert _normalise(items) == whole


def test_ill_typed_deliver_goes_to_the_protocol_which_raises() -> None:
    import cbor2

    bad = cbor2.dumps(
        {"m": "deliver", "ctag": 1, "dtag": 1, "exchange": "", "key": "", "body": b""}
    )
    reader, _ = _open_reader()
    with pytest.raises(RemoteProtocolError):
        reader.feed(len(bad).to_bytes(4, "big") + bad)


def test_end_of_stream_inside_a_frame_is_a_protocol_error() -> None:
    data = codec.encode_deliver("c1", 1, False, _Msg(b"plain"))
    reader, _ = _open_reader()
    assert reader.feed(data[:-3]) == []
    with pytest.raises(RemoteProtocolError, match="ended inside a frame"):
        reader.feed(b"")


def test_clean_end_of_stream() -> None:
    reader, _ = _open_reader()
    assert reader.feed(b"") == [ev.EndOfStream()]


def test_oversized_frame_is_refused() -> None:
    reader, proto = _open_reader()
    proto.max_frame_size = 100
    with pytest.raises(RemoteProtocolError, match="exceeds the maximum"):
        reader.feed((1000).to_bytes(4, "big") + b"\xa0")


def _frame(m: dict) -> bytes:
    import cbor2

    payload = cbor2.dumps(m)
    return len(payload).to_bytes(4, "big") + payload


def test_a_stream_deliver_takes_the_fast_path_with_its_offset() -> None:
    data = codec.encode_deliver("c1", 3, False, _Msg(b"x"), offset=17)
    data += codec.encode_deliver("c1", 4, True, _Msg(b"y", {"h": 1}), offset=18)
    reader, _ = _open_reader()
    first, second = reader.feed(data)
    assert isinstance(first, dict) and (first["offset"], first["body"]) == (17, b"x")
    assert isinstance(second, dict) and (second["offset"], second["redelivered"]) == (18, True)


def test_a_deliver_with_an_unknown_key_is_not_refused() -> None:
    """A key a newer server may add goes through the codec, which ignores it."""
    m = {"m": "deliver", "ctag": "c", "dtag": 1, "exchange": "", "key": "s", "body": b"b"}
    reader, _ = _open_reader()
    (e,) = reader.feed(_frame({**m, "offset": 5, "x-future": [1, 2]}))
    assert isinstance(e, ev.Deliver) and (e.offset, e.body) == (5, b"b")
    (e,) = reader.feed(_frame({**m, "x-future": 1}))
    assert isinstance(e, ev.Deliver) and e.offset is None


def test_an_ill_typed_offset_is_a_protocol_error() -> None:
    m = {"m": "deliver", "ctag": "c", "dtag": 1, "exchange": "", "key": "s", "body": b"b"}
    reader, _ = _open_reader()
    with pytest.raises(RemoteProtocolError, match="offset"):
        reader.feed(_frame({**m, "offset": "5"}))
