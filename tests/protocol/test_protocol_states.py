"""Every (state, trigger) pair of the connection table, sent and received.

Connections are brought to each state by real traffic, then one frame firing the
trigger is received (or sent). A pair in ``TRANSITIONS`` must move the connection
to the table's state; a missing pair must raise (RemoteProtocolError on receive,
LocalProtocolError on send).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from amqlite.errors import LocalProtocolError, RemoteProtocolError, ReplyCode
from amqlite.protocol import NEED_DATA, TRANSITIONS, Connection, ConnState, Role, Trigger
from amqlite.protocol import events as ev
from amqlite.protocol.states import next_state, trigger_of

from .wire import FakeMessage, conn_in, frame

S, T = ConnState, Trigger

# One frame per trigger, per role that may send it.
_SAMPLE: dict[tuple[Trigger, Role], ev.Event] = {
    (T.HELLO, Role.CLIENT): ev.Hello(id=1),
    (T.WELCOME, Role.SERVER): ev.Welcome(re=1),
    (T.REFUSED, Role.SERVER): ev.Refused(re=1, code=403, text="no"),
    (T.OPERATION, Role.CLIENT): ev.Status(id=5),
    (T.OPERATION, Role.SERVER): ev.Ok(re=5),
    (T.HEARTBEAT, Role.CLIENT): ev.Heartbeat(),
    (T.HEARTBEAT, Role.SERVER): ev.Heartbeat(),
    (T.CLOSE, Role.CLIENT): ev.Close(),
    (T.CLOSE, Role.SERVER): ev.Close(),
    (T.CLOSE_OK, Role.CLIENT): ev.CloseOk(),
    (T.CLOSE_OK, Role.SERVER): ev.CloseOk(),
}

_PEER = {Role.CLIENT: Role.SERVER, Role.SERVER: Role.CLIENT}

# receiving in CLOSED and ERROR does not consult the table (see the tests below)
_TABLE_RECEIVE_STATES = [S.HANDSHAKE, S.AUTHENTICATING, S.OPEN, S.CLOSING]

_RECEIVE_CASES = [
    (state, trigger, _PEER[sender])
    for state in _TABLE_RECEIVE_STATES
    for (trigger, sender) in _SAMPLE
]
_SEND_CASES = [(state, trigger, sender) for state in S for (trigger, sender) in _SAMPLE]


def _wire_map(event: ev.Event) -> dict[str, object]:
    from amqlite.protocol.codec import event_to_map

    return event_to_map(event)


def test_samples_fire_their_trigger() -> None:
    for (trigger, _), event in _SAMPLE.items():
        assert trigger_of(type(event)) is trigger


def test_every_pair_is_exercised() -> None:
    """Each (state, trigger) pair appears in the send or receive cases below."""
    covered = {(s, t) for s, t, _ in _RECEIVE_CASES} | {(s, t) for s, t, _ in _SEND_CASES}
    covered |= {(s, T.PROTOCOL_ERROR) for s in S}  # test_protocol_error_moves_per_table
    assert covered == set(itertools.product(S, T))


def test_table_only_names_known_states_and_triggers() -> None:
    for (state, trigger), new in TRANSITIONS.items():
        assert isinstance(state, ConnState)
        assert isinstance(trigger, Trigger)
        assert isinstance(new, ConnState)
    assert not any(state is S.CLOSED for state, _ in TRANSITIONS)  # CLOSED is final


@pytest.mark.parametrize(
    ("state", "trigger", "receiver"),
    _RECEIVE_CASES,
    ids=[f"{s.value}-{t.value}-{r.value}" for s, t, r in _RECEIVE_CASES],
)
def test_receive(state: ConnState, trigger: Trigger, receiver: Role) -> None:
    conn = conn_in(receiver, state)
    event = _SAMPLE[(trigger, _PEER[receiver])]
    conn.receive_data(frame(_wire_map(event)))
    expected = TRANSITIONS.get((state, trigger))
    if expected is None:
        with pytest.raises(RemoteProtocolError) as info:
            conn.next_event()
        assert info.value.code == ReplyCode.UNEXPECTED_FRAME
        assert conn.state is TRANSITIONS[(state, T.PROTOCOL_ERROR)]
    else:
        assert conn.next_event() == event
        assert conn.state is expected
        assert conn.next_event() is NEED_DATA


@pytest.mark.parametrize(
    ("state", "trigger", "sender"),
    _SEND_CASES,
    ids=[f"{s.value}-{t.value}-{r.value}" for s, t, r in _SEND_CASES],
)
def test_send(state: ConnState, trigger: Trigger, sender: Role) -> None:
    conn = conn_in(sender, state)
    event = _SAMPLE[(trigger, sender)]
    expected = TRANSITIONS.get((state, trigger))
    if expected is None:
        with pytest.raises(LocalProtocolError):
            conn.send(event)
        assert conn.state is state
    else:
        data = conn.send(event)
        assert data[4:] and len(data) == 4 + int.from_bytes(data[:4], "big")
        assert conn.state is expected


@pytest.mark.parametrize("state", list(S), ids=[s.value for s in S])
@pytest.mark.parametrize("role", list(Role), ids=[r.value for r in Role])
def test_protocol_error_moves_per_table(role: Role, state: ConnState) -> None:
    conn = conn_in(role, state)
    conn.receive_data(frame(12345))  # a frame that is not a map
    if state is S.CLOSED:
        assert conn.next_event() is NEED_DATA  # a closed connection reads nothing more
        assert conn.state is S.CLOSED
        return
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.code == ReplyCode.FRAME_ERROR
    assert conn.state is TRANSITIONS[(state, T.PROTOCOL_ERROR)]


@pytest.mark.parametrize("role", list(Role), ids=[r.value for r in Role])
def test_error_state_is_sticky_on_receive(role: Role) -> None:
    """After a protocol error nothing more is decoded, even a legal close."""
    conn = conn_in(role, S.ERROR)
    conn.receive_data(frame({"m": "close"}))
    with pytest.raises(RemoteProtocolError) as first:
        conn.next_event()
    with pytest.raises(RemoteProtocolError) as second:
        conn.events()
    assert first.value is second.value
    assert first.value.code == ReplyCode.FRAME_ERROR
    assert conn.state is S.ERROR


@pytest.mark.parametrize("role", list(Role), ids=[r.value for r in Role])
def test_closed_reads_nothing_more(role: Role) -> None:
    """Frames after CLOSED are dropped: in a close race the peer's close-ok arrives."""
    conn = conn_in(role, S.CLOSED)
    conn.receive_data(frame({"m": "close-ok"}) + frame({"m": "heartbeat"}))
    assert conn.next_event() is NEED_DATA
    assert conn.state is S.CLOSED
    conn.receive_data(b"")
    assert conn.events() == [ev.EndOfStream()]


def test_wrong_sender_is_refused_before_the_table() -> None:
    client = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        client.send(ev.Welcome(re=1))
    assert client.state is S.HANDSHAKE
    server = Connection(Role.SERVER)
    with pytest.raises(LocalProtocolError):
        server.send(ev.Hello(id=1))
    assert server.state is S.HANDSHAKE


# --- the fast paths follow the same table ------------------------------------------


def _msg() -> FakeMessage:
    return FakeMessage("ex", "rk", b"body")


@pytest.mark.parametrize("state", list(S), ids=[s.value for s in S])
def test_send_deliver_and_get_ok_follow_the_table(state: ConnState) -> None:
    allowed = next_state(state, T.OPERATION)
    pushes: list[Callable[[Connection], bytes]] = [
        lambda c: c.send_deliver("c1", 1, False, _msg()),
        lambda c: c.send_get_ok(3, 1, False, 0, "q", _msg()),
    ]
    for push in pushes:
        conn = conn_in(Role.SERVER, state)
        if allowed is None:
            with pytest.raises(LocalProtocolError):
                push(conn)
        else:
            assert push(conn)[4:5] != b""
        assert conn.state is (allowed or state)


def test_client_cannot_use_the_server_fast_paths() -> None:
    client = conn_in(Role.CLIENT, S.OPEN)
    with pytest.raises(LocalProtocolError, match="client does not send 'deliver'"):
        client.send_deliver("c1", 1, False, _msg())
    with pytest.raises(LocalProtocolError, match="client does not send 'get-ok'"):
        client.send_get_ok(3, 1, False, 0, "q", _msg())
    assert client.state is S.OPEN
