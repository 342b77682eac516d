"""Framing: a 4-byte big-endian length, then one CBOR map; NEED_DATA until a frame
is complete; ``b""`` is the end of the stream."""

from __future__ import annotations

import struct

import pytest

from amqlite.errors import LocalProtocolError, RemoteProtocolError, ReplyCode
from amqlite.protocol import DEFAULT_MAX_FRAME, NEED_DATA, Connection, ConnState, Role
from amqlite.protocol import events as ev

from .wire import FULL, HELLO, frame, open_pair, server_in


@pytest.mark.parametrize(
    "event",
    [HELLO, FULL[ev.Hello], FULL[ev.Publish]],
    ids=["hello-minimal", "hello-full", "publish-full"],
)
def test_frame_split_at_every_byte_boundary(event: ev.Event) -> None:
    sender = Connection(Role.CLIENT)
    if type(event) is ev.Publish:
        sender, _ = open_pair()
    data = sender.send(event)
    for cut in range(1, len(data)):
        receiver = server_in(ConnState.OPEN if type(event) is ev.Publish else ConnState.HANDSHAKE)
        receiver.receive_data(data[:cut])
        assert receiver.next_event() is NEED_DATA, cut
        assert receiver.events() == []
        assert receiver.buffered == cut
        receiver.receive_data(data[cut:])
        assert receiver.next_event() == event
        assert receiver.next_event() is NEED_DATA
        assert receiver.buffered == 0


def test_frame_fed_one_byte_at_a_time() -> None:
    client, server = open_pair()
    data = client.send(FULL[ev.Publish]) + client.send(ev.Status(id=99))
    got: list[ev.Event] = []
    for i in range(len(data)):
        server.receive_data(data[i : i + 1])
        got += server.events()
    assert got == [FULL[ev.Publish], ev.Status(id=99)]


def test_many_frames_in_one_chunk() -> None:
    client, server = open_pair()
    publishes = [
        ev.Publish(id=i, exchange="x", key=f"k{i}", body=bytes([i % 256]) * (i % 50))
        for i in range(500)
    ]
    server.receive_data(b"".join(client.send(p) for p in publishes))
    assert server.events() == publishes
    assert server.buffered == 0


def test_long_stream_in_odd_chunks() -> None:
    """Megabytes through one connection (the buffer is compacted on the way)."""
    client, server = open_pair()
    publishes = [
        ev.Publish(id=i, exchange="", key="q", body=bytes([i % 256]) * 1000) for i in range(3000)
    ]
    data = b"".join(client.send(p) for p in publishes)
    assert len(data) > 3_000_000
    got: list[ev.Event] = []
    step = 7919  # prime: frames straddle chunk boundaries at every offset
    for i in range(0, len(data), step):
        server.receive_data(data[i : i + step])
        got += server.events()
        assert server.buffered < 1100  # at most one partial frame is left
    assert got == publishes
    assert server.buffered == 0


def test_end_of_stream_on_a_frame_boundary() -> None:
    client, server = open_pair()
    server.receive_data(client.send(ev.Status(id=3)))
    server.receive_data(b"")
    assert server.events() == [ev.Status(id=3), ev.EndOfStream()]
    assert server.next_event() == ev.EndOfStream()  # and it stays ended


def test_end_of_stream_before_anything() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(b"")
    assert server.next_event() == ev.EndOfStream()


def test_receive_after_end_of_stream_is_our_bug() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        server.receive_data(b"\x00")


@pytest.mark.parametrize("cut", [1, 2, 3], ids=lambda c: f"{c}-header-bytes")
def test_end_of_stream_inside_a_header(cut: int) -> None:
    server = Connection(Role.SERVER)
    server.receive_data(frame({"m": "hello", "id": 1})[:cut])
    assert server.next_event() is NEED_DATA
    server.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ReplyCode.FRAME_ERROR
    assert "inside a frame header" in info.value.text


def test_end_of_stream_inside_a_body() -> None:
    client, server = open_pair()
    data = client.send(ev.Status(id=1)) + client.send(ev.Status(id=2))
    server.receive_data(data[:-1])
    assert server.events() == [ev.Status(id=1)]
    server.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ReplyCode.FRAME_ERROR
    assert "stream ended inside a frame" in info.value.text


def test_frame_at_the_maximum_size_is_accepted() -> None:
    data = frame({"m": "status", "id": 1, "pad": b"x" * 100})
    at_limit = server_in(ConnState.OPEN)
    at_limit.max_frame_size = len(data) - 4
    at_limit.receive_data(data)
    assert at_limit.events() == [ev.Status(id=1)]
    one_short = server_in(ConnState.OPEN)
    one_short.max_frame_size = len(data) - 5
    one_short.receive_data(data)
    with pytest.raises(RemoteProtocolError):
        one_short.events()


@pytest.mark.parametrize("limit", [64, 1000, DEFAULT_MAX_FRAME])
def test_length_prefix_above_the_maximum_fails_at_once(limit: int) -> None:
    server = Connection(Role.SERVER, max_frame_size=limit)
    server.receive_data(struct.pack(">I", limit + 1))  # no body needed to refuse it
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ReplyCode.FRAME_ERROR
    assert f"exceeds the maximum of {limit}" in info.value.text
    assert server.state is ConnState.ERROR


def test_default_maximum() -> None:
    assert Connection(Role.SERVER).max_frame_size == DEFAULT_MAX_FRAME == 4 * 1024 * 1024


def test_configured_maximum_is_per_connection() -> None:
    data = frame({"m": "status", "id": 1})
    payload = data[4:]
    tight = Connection(Role.SERVER, max_frame_size=len(payload) - 1)
    tight.receive_data(data)
    with pytest.raises(RemoteProtocolError):
        tight.next_event()
    roomy = server_in(ConnState.OPEN)
    roomy.receive_data(data)
    assert roomy.events() == [ev.Status(id=1)]


def test_frames_before_a_bad_one_are_decoded_first() -> None:
    """next_event() yields every good frame ahead of a bad one, then the error."""
    client, server = open_pair()
    good = [ev.Publish(id=i, exchange="", key="q", body=b"m") for i in range(3)]
    server.receive_data(b"".join(client.send(p) for p in good) + frame([1, 2]))
    assert [server.next_event() for _ in good] == good
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ReplyCode.FRAME_ERROR
