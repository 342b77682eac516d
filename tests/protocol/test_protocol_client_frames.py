"""The client's hand-built frames decode to the events the codec would produce."""

import pytest

from amqlite.protocol import Connection, ConnState, Role
from amqlite.protocol import codec as wire
from amqlite.protocol import events as ev


def _server_events(data: bytes) -> list[ev.Event]:
    server = Connection(Role.SERVER)
    server._state = ConnState.OPEN  # skip the handshake: only frame decoding is tested
    server.receive_data(bytes(data))
    return server.events()


@pytest.mark.parametrize("rid", [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**40])
def test_publish_ids_of_every_width(rid: int) -> None:
    out = bytearray()
    wire.append_publish(out, rid, "ex", "k", b"body", None, None, False, False)
    assert _server_events(out) == [ev.Publish(rid, "ex", "k", b"body")]


def test_publish_with_everything() -> None:
    out = bytearray()
    headers = {"n": 1, "s": "x", "f": 1.5, "b": True}
    props = {"persistent": True, "message_id": "m-1", "priority": 3}
    body = b"\x00" * 70000
    size = wire.append_publish(out, 7, "", "q\u00e9", body, headers, props, True, True)
    assert size == len(out) - 4
    expected = ev.Publish(7, "", "q\u00e9", body, headers, props, mandatory=True, confirm=True)
    assert _server_events(out) == [expected]


def test_many_frames_in_one_buffer() -> None:
    out = bytearray()
    for i in range(1, 4):
        wire.append_publish(out, i, "amq.direct", f"k{i}", b"x" * i, None, None, i == 2, i == 3)
    wire.append_ack(out, 4, 10, False)
    wire.append_ack(out, 5, 300, True)
    assert _server_events(out) == [
        ev.Publish(1, "amq.direct", "k1", b"x"),
        ev.Publish(2, "amq.direct", "k2", b"xx", mandatory=True),
        ev.Publish(3, "amq.direct", "k3", b"xxx", confirm=True),
        ev.Ack(4, 10, False),
        ev.Ack(5, 300, True),
    ]
