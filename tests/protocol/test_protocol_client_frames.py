"""The client's hand-built frames (send_publish, send_ack) decode to the events the
codec would produce."""

import pytest

from amqlite.errors import LocalProtocolError
from amqlite.protocol import Connection, ConnState, Role
from amqlite.protocol import events as ev

from .wire import client_in


def _server_events(data: bytes) -> list[ev.Event]:
    server = Connection(Role.SERVER)
    server._state = ConnState.OPEN  # skip the handshake: only frame decoding is tested
    server.receive_data(bytes(data))
    return server.events()


@pytest.mark.parametrize("rid", [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**40])
def test_publish_ids_of_every_width(rid: int) -> None:
    data = client_in(ConnState.OPEN).send_publish(rid, "ex", "k", b"body")
    assert _server_events(data) == [ev.Publish(rid, "ex", "k", b"body")]


def test_publish_with_everything() -> None:
    headers = {"n": 1, "s": "x", "f": 1.5, "b": True}
    props = {"persistent": True, "message_id": "m-1", "priority": 3}
    body = b"\x00" * 70000
    data = client_in(ConnState.OPEN).send_publish(
        7, "", "q\u00e9", body, headers, props, True, True
    )
    expected = ev.Publish(7, "", "q\u00e9", body, headers, props, mandatory=True, confirm=True)
    assert _server_events(data) == [expected]


def test_many_frames_in_one_buffer() -> None:
    client = client_in(ConnState.OPEN)
    out = bytearray()
    for i in range(1, 4):
        out += client.send_publish(i, "amq.direct", f"k{i}", b"x" * i, None, None, i == 2, i == 3)
    out += client.send_ack(4, 10, False)
    out += client.send_ack(5, 300, True)
    assert _server_events(out) == [
        ev.Publish(1, "amq.direct", "k1", b"x"),
        ev.Publish(2, "amq.direct", "k2", b"xx", mandatory=True),
        ev.Publish(3, "amq.direct", "k3", b"xxx", confirm=True),
        ev.Ack(4, 10, False),
        ev.Ack(5, 300, True),
    ]


def test_the_state_table_governs_the_hand_built_frames() -> None:
    """Outside OPEN they are checked like send(): not before the welcome, still
    while closing, never from a server."""
    with pytest.raises(LocalProtocolError, match="cannot send 'publish'"):
        client_in(ConnState.AUTHENTICATING).send_publish(1, "", "k", b"")
    with pytest.raises(LocalProtocolError, match="cannot send 'ack'"):
        client_in(ConnState.CLOSED).send_ack(1, 1)
    closing = client_in(ConnState.CLOSING)
    assert _server_events(closing.send_ack(2, 3)) == [ev.Ack(2, 3)]
    server = Connection(Role.SERVER)
    server._state = ConnState.OPEN
    with pytest.raises(LocalProtocolError, match="does not send 'publish'"):
        server.send_publish(1, "", "k", b"")


def test_a_publish_over_the_peers_frame_limit_is_refused() -> None:
    client = client_in(ConnState.OPEN)
    client.remote_max_frame_size = 100
    client.send_publish(1, "", "k", b"x" * 50)
    with pytest.raises(LocalProtocolError, match="exceeds the other end's maximum"):
        client.send_publish(2, "", "k", b"x" * 200)
