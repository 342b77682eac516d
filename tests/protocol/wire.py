"""Helpers for the protocol tests: raw frames, connections in a given state, and
one sample of every wire event with every field set away from its default."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import cbor2

from amqlite.protocol import NEED_DATA, Connection, ConnState, Role, Sender
from amqlite.protocol import events as ev


def frame(obj: Any) -> bytes:
    """A correctly framed CBOR payload (``obj`` need not be a valid frame map)."""
    payload = cbor2.dumps(obj)
    return struct.pack(">I", len(payload)) + payload


def raw_frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def payload_map(data: bytes) -> dict[str, Any]:
    """The CBOR map inside one complete frame."""
    (n,) = struct.unpack(">I", data[:4])
    assert len(data) == 4 + n
    m = cbor2.loads(data[4:])
    assert type(m) is dict
    return m


def feed(conn: Connection, data: bytes) -> list[ev.Event]:
    conn.receive_data(data)
    return conn.events()


def one_event(conn: Connection, data: bytes) -> ev.Event:
    events = feed(conn, data)
    assert len(events) == 1, events
    return events[0]


@dataclasses.dataclass(slots=True)
class FakeMessage:
    """What ``send_deliver`` needs from a broker message (codec.WireMessage)."""

    exchange: str
    routing_key: str
    body: bytes
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)
    wire: bytes | None = None


HELLO = ev.Hello(id=1)
WELCOME = ev.Welcome(re=1)


def server_in(state: ConnState) -> Connection:
    """A server connection brought to ``state`` by real traffic."""
    conn = Connection(Role.SERVER)
    if state is ConnState.HANDSHAKE:
        return conn
    assert one_event(conn, frame({"m": "hello", "id": 1})) == HELLO
    if state is ConnState.AUTHENTICATING:
        return conn
    conn.send(WELCOME)
    if state is ConnState.OPEN:
        return conn
    if state is ConnState.ERROR:
        conn.receive_data(frame(["not", "a", "map"]))
        _expect_protocol_error(conn)
        return _checked(conn, state)
    conn.send(ev.Close())
    if state is ConnState.CLOSING:
        return _checked(conn, state)
    assert one_event(conn, frame({"m": "close-ok"})) == ev.CloseOk()
    return _checked(conn, state)


def client_in(state: ConnState) -> Connection:
    """A client connection brought to ``state`` by real traffic."""
    conn = Connection(Role.CLIENT)
    if state is ConnState.HANDSHAKE:
        return conn
    conn.send(HELLO)
    if state is ConnState.AUTHENTICATING:
        return _checked(conn, state)
    assert one_event(conn, frame({"m": "welcome", "re": 1})) == WELCOME
    if state is ConnState.OPEN:
        return _checked(conn, state)
    if state is ConnState.ERROR:
        conn.receive_data(frame(["not", "a", "map"]))
        _expect_protocol_error(conn)
        return _checked(conn, state)
    conn.send(ev.Close())
    if state is ConnState.CLOSING:
        return _checked(conn, state)
    assert one_event(conn, frame({"m": "close-ok"})) == ev.CloseOk()
    return _checked(conn, state)


def conn_in(role: Role, state: ConnState) -> Connection:
    return server_in(state) if role is Role.SERVER else client_in(state)


def _checked(conn: Connection, state: ConnState) -> Connection:
    assert conn.state is state, (conn.state, state)
    return conn


def _expect_protocol_error(conn: Connection) -> None:
    from amqlite.errors import RemoteProtocolError

    try:
        conn.next_event()
    except RemoteProtocolError:
        return
    raise AssertionError("expected a protocol error")


def open_pair() -> tuple[Connection, Connection]:
    """A client and a server connection, both OPEN, wired through real bytes."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    assert one_event(server, client.send(HELLO)) == HELLO
    assert one_event(client, server.send(WELCOME)) == WELCOME
    assert client.state is server.state is ConnState.OPEN
    assert client.next_event() is NEED_DATA and server.next_event() is NEED_DATA
    return client, server


# One instance of every wire event with *every* field away from its default, and one
# with only the required fields. test_full_samples_set_every_field guards the first.
FULL: dict[type[ev.Event], ev.Event] = {
    ev.Hello: ev.Hello(
        id=7,
        vhost="/prod",
        login="alice",
        password="s3cret",
        client="billing-1",
        protocol=2,
        heartbeat=2.5,
        role="ha-peer",
        instance="5f0c2a9e1b7d4c63",
    ),
    ev.Welcome: ev.Welcome(
        re=7,
        server="node-a",
        version="0.1.0",
        state="active",
        cluster=["h1:5555", "h2:6666"],
        heartbeat=2.5,
        max_frame=65536,
    ),
    ev.Refused: ev.Refused(re=7, code=360, text="not active"),
    ev.Heartbeat: ev.Heartbeat(),
    ev.Close: ev.Close(code=320, text="shutting down"),
    ev.CloseOk: ev.CloseOk(),
    ev.ExchangeDeclare: ev.ExchangeDeclare(
        id=8,
        exchange="orders",
        type="topic",
        durable=True,
        auto_delete=True,
        internal=True,
        passive=True,
        arguments={"alternate-exchange": "ae", "n": 3},
    ),
    ev.ExchangeDelete: ev.ExchangeDelete(id=9, exchange="orders", if_unused=True),
    ev.QueueDeclare: ev.QueueDeclare(
        id=10,
        queue="q1",
        durable=True,
        exclusive=True,
        auto_delete=True,
        passive=True,
        arguments={
            "x-message-ttl": 1000,
            "x-dead-letter-exchange": "dlx",
            "nested": [1, {"a": b"b"}],
        },
    ),
    ev.QueueDelete: ev.QueueDelete(id=11, queue="q1", if_unused=True, if_empty=True),
    ev.QueuePurge: ev.QueuePurge(id=12, queue="q1"),
    ev.QueueBind: ev.QueueBind(
        id=13, queue="q1", exchange="orders", key="eu.*", arguments={"x-match": "any"}
    ),
    ev.QueueUnbind: ev.QueueUnbind(
        id=14, queue="q1", exchange="orders", key="eu.*", arguments={"x-match": "all"}
    ),
    ev.Publish: ev.Publish(
        id=15,
        exchange="orders",
        key="eu.fr",
        body=b"\x00payload\xff",
        headers={"s": "t", "i": -3, "f": 1.5, "b": True, "y": b"\x01", "n": None},
        props={
            "message_id": "m-1",
            "correlation_id": "c-1",
            "timestamp": 1_700_000_000_000,
            "expiration": 60_000,
            "priority": 5,
            "persistent": True,
            "reply_to": "replies",
            "content_type": "application/json",
            "content_encoding": "gzip",
            "group_id": "g",
            "type": "order.created",
            "user_id": "alice",
        },
        mandatory=True,
        confirm=True,
    ),
    ev.Consume: ev.Consume(
        id=16,
        queue="q1",
        tag="c1",
        prefetch=10,
        no_ack=True,
        exclusive=True,
        arguments={"x-priority": 1},
        selector="priority > 4",
    ),
    ev.Cancel: ev.Cancel(id=17, tag="c1"),
    ev.Ack: ev.Ack(id=18, dtag=5, multiple=True),
    ev.Nack: ev.Nack(id=19, dtag=6, multiple=True, requeue=False),
    ev.Reject: ev.Reject(id=20, dtag=7, requeue=False),
    ev.Get: ev.Get(id=21, queue="q1", no_ack=True),
    ev.Status: ev.Status(id=22),
    ev.OffsetStore: ev.OffsetStore(id=23, queue="events", name="audit", offset=2**40),
    ev.OffsetQuery: ev.OffsetQuery(id=24, queue="events", name="audit"),
    ev.Trace: ev.Trace(id=25, enabled=True),
    ev.HaHeartbeat: ev.HaHeartbeat(
        node="primary", role="primary", state="active", epoch=3, vhost="/"
    ),
    ev.HaSync: ev.HaSync(upto=2**33, data=b"\x00\x01framed", reset=True, epoch=3),
    ev.HaSynced: ev.HaSynced(upto=2**33, applied=True),
    ev.HaHandover: ev.HaHandover(upto=2**33, epoch=4),
    ev.PeerMessage: ev.PeerMessage(
        {"type": "peer.forward", "seq": 7, "body": b"\x00b", "headers": {"k": 1}, "path": ["a"]}
    ),
    ev.HaSwitchover: ev.HaSwitchover(id=25, timeout=2.5),
    ev.Ok: ev.Ok(re=22, info={"queue": "q1", "messages": 3, "consumers": 1}),
    ev.Error: ev.Error(re=21, code=404, text="no queue 'q1'"),
    ev.Returned: ev.Returned(re=15, code=312, text="NO_ROUTE"),
    ev.Nacked: ev.Nacked(re=15, code=406, text="queue full"),
    ev.Deliver: ev.Deliver(
        ctag="c1",
        dtag=9,
        exchange="orders",
        key="eu.fr",
        body=b"body",
        headers={"k": "v"},
        props={"priority": 1},
        redelivered=True,
        queue="q1",
        offset=12,
    ),
    ev.GetOk: ev.GetOk(
        re=21,
        dtag=3,
        exchange="orders",
        key="eu.fr",
        body=b"body",
        headers={"k": 1},
        props={"persistent": True},
        redelivered=True,
        remaining=4,
        queue="q1",
    ),
    ev.GetEmpty: ev.GetEmpty(re=21),
    ev.StreamFetch: ev.StreamFetch(id=30, queue="events", start=5, end=900, max_bytes=65536),
    ev.PublishBatch: ev.PublishBatch(
        id=31,
        exchange="orders",
        msgs=[["eu.fr", b"a"], ["eu.de", b"b", {"k": 1}, {"message_id": "m2"}]],
        mandatory=True,
        persistent=True,
    ),
    ev.PublishColumns: ev.PublishColumns(
        id=32,
        exchange="orders",
        count=2,
        keys=b"eu.freu.de",
        key_ends=b"\x00\x00\x00\x00\x05\x00\x00\x00\x0a\x00\x00\x00",
        bodies=b"ab",
        body_ends=b"\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00",
        extras=[[1, {"k": 1}, {"message_id": "m2"}]],
        mandatory=True,
        persistent=True,
    ),
    ev.StreamRecords: ev.StreamRecords(
        re=30,
        first=5,
        count=2,
        keys="eu.fré".encode(),
        key_ends=b"\x00\x00\x00\x00\x02\x00\x00\x00\x07\x00\x00\x00",
        exchanges=b"",
        exchange_ends=bytes(12),
        bodies=b"abc",
        body_ends=b"\x00\x00\x00\x00\x01\x00\x00\x00\x03\x00\x00\x00",
        extras=[[1, {"k": 1}, None]],
        dropped=3,
        kept_first=5,
        kept_next=10,
    ),
    ev.Cancelled: ev.Cancelled(tag="c1", code=404, text="queue deleted"),
    ev.Blocked: ev.Blocked(reason="low on memory"),
    ev.Unblocked: ev.Unblocked(),
}


def _required_only(sample: ev.Event) -> ev.Event:
    kwargs = {
        f.name: getattr(sample, f.name)
        for f in dataclasses.fields(sample)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    return type(sample)(**kwargs)


MINIMAL: dict[type[ev.Event], ev.Event] = {cls: _required_only(e) for cls, e in FULL.items()}


def senders(cls: type[ev.Event]) -> list[Role]:
    """The roles that may send ``cls``."""
    if cls.SENDER is Sender.BOTH:
        return [Role.CLIENT, Role.SERVER]
    return [Role.CLIENT] if cls.SENDER is Sender.CLIENT else [Role.SERVER]


def pair_ready_for(cls: type[ev.Event], sender: Role) -> tuple[Connection, Connection]:
    """(sending, receiving) connections in a state where a ``cls`` frame is legal."""
    receiver = Role.SERVER if sender is Role.CLIENT else Role.CLIENT
    if cls is ev.Hello:
        states = (ConnState.HANDSHAKE, ConnState.HANDSHAKE)
    elif cls in (ev.Welcome, ev.Refused):
        states = (ConnState.AUTHENTICATING, ConnState.AUTHENTICATING)
    elif cls is ev.CloseOk:
        states = (ConnState.CLOSING, ConnState.CLOSING)
    else:
        states = (ConnState.OPEN, ConnState.OPEN)
    return conn_in(sender, states[0]), conn_in(receiver, states[1])
