"""Bad input against a running server: each bad connection gets a clear error (or is
closed with one), while every other client keeps working and nothing accepted is lost."""

from __future__ import annotations

import cbor2
import pytest
import trio

from amqlite.errors import ReplyCode
from amqlite.protocol import events as ev
from amqlite.server import BrokerNode

from .rawclient import RawClient, read_raw_until_closed


def frame(obj: object) -> bytes:
    payload = cbor2.dumps(obj)
    return len(payload).to_bytes(4, "big") + payload


async def open_client(node: BrokerNode) -> RawClient:
    client = await RawClient.connect(node.port)
    welcome = await client.handshake()
    assert isinstance(welcome, ev.Welcome), welcome
    return client


HARD_ERRORS = [
    pytest.param(
        b"\x00\x00\x00\x05\xff\xff\xff\xff\xff", ReplyCode.FRAME_ERROR, "CBOR", id="garbage-cbor"
    ),
    pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ReplyCode.FRAME_ERROR, "HTTP", id="http"),
    pytest.param(b"AMQP\x00\x00\x09\x01", ReplyCode.FRAME_ERROR, "AMQP", id="amqp-header"),
    pytest.param(
        b"\x7f\xff\xff\xff" + b"x" * 16, ReplyCode.FRAME_ERROR, "exceeds", id="huge-length"
    ),
    pytest.param(frame([1, 2, 3]), ReplyCode.FRAME_ERROR, "map", id="not-a-map"),
    pytest.param(frame({"m": 7}), ReplyCode.SYNTAX_ERROR, "method", id="ill-typed-method"),
    pytest.param(
        frame({"m": "queue.declare", "id": 1, "queue": "q"}),
        ReplyCode.UNEXPECTED_FRAME,
        "hello",
        id="request-before-handshake",
    ),
    pytest.param(
        frame({"m": "deliver", "ctag": "x"}),
        ReplyCode.COMMAND_INVALID,
        "server",
        id="server-method",
    ),
]


@pytest.mark.parametrize(("data", "code", "fragment"), HARD_ERRORS)
async def test_hard_error_closes_only_that_connection(
    node: BrokerNode, data: bytes, code: int, fragment: str
) -> None:
    bystander = await open_client(node)
    declared = await bystander.request(ev.QueueDeclare, queue="bystander")
    assert isinstance(declared, ev.Ok)

    bad = await trio.open_tcp_stream("127.0.0.1", node.port)
    await bad.send_all(data)
    with trio.fail_after(5):
        raw = await read_raw_until_closed(bad)
    client_proto = RawClient(bad).proto
    client_proto.receive_data(raw)
    close = client_proto.next_event()
    assert isinstance(close, ev.Close), close
    assert close.code == code
    assert fragment in close.text

    published = await bystander.request(
        ev.Publish, exchange="", key="bystander", body=b"still here", confirm=True
    )
    assert isinstance(published, ev.Ok)
    got = await bystander.request(ev.Get, queue="bystander", no_ack=True)
    assert isinstance(got, ev.GetOk)
    assert got.body == b"still here"


async def test_truncated_frame_then_eof(node: BrokerNode) -> None:
    bad = await trio.open_tcp_stream("127.0.0.1", node.port)
    await bad.send_all(b"\x00\x00\x01\x00" + b"\xa1" * 10)
    await bad.send_eof()
    with trio.fail_after(5):
        raw = await read_raw_until_closed(bad)
    proto = RawClient(bad).proto
    proto.receive_data(raw)
    close = proto.next_event()
    assert isinstance(close, ev.Close)
    assert close.code == ReplyCode.FRAME_ERROR


SOFT_ERRORS = [
    pytest.param(
        {"m": "no.such.method"}, ReplyCode.NOT_IMPLEMENTED, "unknown method", id="unknown-method"
    ),
    pytest.param(
        {"m": "publish", "exchange": "", "key": "q", "body": "text, not bytes"},
        ReplyCode.SYNTAX_ERROR,
        "body",
        id="ill-typed-body",
    ),
    pytest.param(
        {"m": "publish", "exchange": "", "key": "q", "body": b"x", "props": {"colour": "red"}},
        ReplyCode.SYNTAX_ERROR,
        "colour",
        id="unknown-property",
    ),
    pytest.param({"m": "queue.declare"}, ReplyCode.SYNTAX_ERROR, "", id="missing-fields-ok"),
    pytest.param(
        {"m": "queue.bind", "queue": "q"}, ReplyCode.SYNTAX_ERROR, "exchange", id="missing-field"
    ),
]


@pytest.mark.parametrize(("fields", "code", "fragment"), SOFT_ERRORS)
async def test_soft_error_fails_one_request(
    node: BrokerNode, fields: dict[str, object], code: int, fragment: str
) -> None:
    client = await open_client(node)
    rid = client.next_id()
    await client.send_raw(frame({**fields, "id": rid}))
    reply = await client.receive()
    if fields == {"m": "queue.declare"}:
        # every queue.declare field has a default: a server-named queue is fine
        assert isinstance(reply, ev.Ok)
        assert reply.info["queue"].startswith("amq.gen")
        return
    assert isinstance(reply, ev.Error), reply
    assert reply.re == rid
    assert reply.code == code
    assert fragment in reply.text
    # the connection still works
    ok = await client.request(ev.QueueDeclare, queue="after-error")
    assert isinstance(ok, ev.Ok)


async def test_publish_to_missing_exchange_is_404_on_that_request(node: BrokerNode) -> None:
    client = await open_client(node)
    reply = await client.request(ev.Publish, exchange="nope", key="k", body=b"x")
    assert isinstance(reply, ev.Error)
    assert reply.code == ReplyCode.NOT_FOUND
    assert "nope" in reply.text
    ok = await client.request(ev.ExchangeDeclare, exchange="nope", type="fanout")
    assert isinstance(ok, ev.Ok)


async def test_redeclare_with_other_properties_is_406(node: BrokerNode) -> None:
    client = await open_client(node)
    assert isinstance(await client.request(ev.QueueDeclare, queue="q1"), ev.Ok)
    reply = await client.request(ev.QueueDeclare, queue="q1", auto_delete=True)
    assert isinstance(reply, ev.Error)
    assert reply.code == ReplyCode.PRECONDITION_FAILED
    assert isinstance(await client.request(ev.ExchangeDeclare, exchange="x1", type="topic"), ev.Ok)
    reply = await client.request(ev.ExchangeDeclare, exchange="x1", type="direct")
    assert isinstance(reply, ev.Error)
    assert reply.code == ReplyCode.PRECONDITION_FAILED


async def test_wrong_password_is_refused_with_403(node: BrokerNode) -> None:
    client = await RawClient.connect(node.port)
    reply = await client.handshake(password="wrong")
    assert isinstance(reply, ev.Refused)
    assert reply.code == ReplyCode.ACCESS_REFUSED
    assert "wrong" not in reply.text
    with trio.fail_after(5):
        assert isinstance(await client.receive(), ev.EndOfStream)


async def test_accepted_messages_survive_a_misbehaving_neighbour(node: BrokerNode) -> None:
    """Confirmed messages stay queued while other connections break the protocol."""
    producer = await open_client(node)
    assert isinstance(await producer.request(ev.QueueDeclare, queue="keep"), ev.Ok)
    sent = 0
    for round_ in range(5):
        for i in range(20):
            body = f"{round_}-{i}".encode()
            assert isinstance(
                await producer.request(
                    ev.Publish, exchange="", key="keep", body=body, confirm=True
                ),
                ev.Ok,
            )
            sent += 1
        vandal = await trio.open_tcp_stream("127.0.0.1", node.port)
        await vandal.send_all(b"\xde\xad\xbe\xef" * 8)
        with trio.fail_after(5):
            await read_raw_until_closed(vandal)
    declared = await producer.request(ev.QueueDeclare, queue="keep", passive=True)
    assert isinstance(declared, ev.Ok)
    assert declared.info["messages"] == sent
    seen = set()
    for _ in range(sent):
        got = await producer.request(ev.Get, queue="keep", no_ack=True)
        assert isinstance(got, ev.GetOk)
        seen.add(got.body)
    assert len(seen) == sent


async def test_shutdown_closes_clients_with_320(node: BrokerNode) -> None:
    client = await open_client(node)
    node.stop()
    with trio.fail_after(5):
        event = await client.receive_until(ev.Close)
    assert isinstance(event, ev.Close)
    assert event.code == ReplyCode.CONNECTION_FORCED
    await client.send(ev.CloseOk())
    with trio.fail_after(5):
        await node.stopped.wait()


async def test_permissions_are_enforced_with_403(nursery: trio.Nursery) -> None:
    from dataclasses import replace

    from amqlite.auth import hash_password
    from amqlite.config import UserConfig, VhostPermissions, load_config

    own = r"^own\."
    user = UserConfig(
        name="app",
        password_hash=hash_password("s3cret", n=16),
        permissions=(VhostPermissions("/", configure=own, write=own, read=own),),
    )
    config = replace(load_config(overrides={"server.port": 0}), users=(user,))
    limited = BrokerNode(config)
    await nursery.start(limited.run)
    try:
        guest = await RawClient.connect(limited.port)
        refused = await guest.handshake()  # guest no longer exists once users are configured
        assert isinstance(refused, ev.Refused)
        assert refused.code == ReplyCode.ACCESS_REFUSED

        client = await RawClient.connect(limited.port)
        assert isinstance(await client.handshake(login="app", password="s3cret"), ev.Welcome)
        assert isinstance(await client.request(ev.QueueDeclare, queue="own.q"), ev.Ok)
        for make, fields in [
            (ev.QueueDeclare, {"queue": "other.q"}),
            (ev.ExchangeDeclare, {"exchange": "other.x", "type": "fanout"}),
            (ev.Publish, {"exchange": "amq.fanout", "key": "", "body": b"x"}),
            (ev.QueueBind, {"queue": "own.q", "exchange": "amq.fanout"}),
            (ev.Get, {"queue": "other.q"}),
        ]:
            reply = await client.request(make, **fields)
            assert isinstance(reply, ev.Error), (make, reply)
            assert reply.code == ReplyCode.ACCESS_REFUSED
            assert "refused" in reply.text
        assert isinstance(
            await client.request(ev.ExchangeDeclare, exchange="own.x", type="fanout"), ev.Ok
        )
        assert isinstance(
            await client.request(ev.QueueBind, queue="own.q", exchange="own.x"), ev.Ok
        )
        ok = await client.request(ev.Publish, exchange="own.x", key="", body=b"y", confirm=True)
        assert isinstance(ok, ev.Ok)
    finally:
        limited.stop()


async def test_a_crashing_request_costs_one_connection_not_the_node(
    node: BrokerNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    from amqlite.server.dispatch import RequestDispatcher

    def explode(self: RequestDispatcher, request: ev.QueuePurge, now: float) -> None:
        raise RuntimeError("simulated bug")

    bystander = await open_client(node)
    assert isinstance(await bystander.request(ev.QueueDeclare, queue="safe"), ev.Ok)
    ok = await bystander.request(ev.Publish, exchange="", key="safe", body=b"kept", confirm=True)
    assert isinstance(ok, ev.Ok)

    monkeypatch.setattr(RequestDispatcher, "_queue_purge", explode)
    victim = await open_client(node)
    reply = await victim.request(ev.QueuePurge, queue="safe")
    assert isinstance(reply, ev.Close)
    assert reply.code == ReplyCode.INTERNAL_ERROR

    got = await bystander.request(ev.Get, queue="safe", no_ack=True)
    assert isinstance(got, ev.GetOk)
    assert got.body == b"kept"


async def test_an_ha_handover_from_a_client_is_refused_and_a_malformed_one_closes_only_it(
    node: BrokerNode,
) -> None:
    """``ha.handover`` belongs to an HA pair's peer link: an ordinary client that
    sends it is told 503 and keeps its connection; one that sends it ill-typed is
    closed with 502; a bystander's accepted message stays."""
    bystander = await open_client(node)
    assert isinstance(await bystander.request(ev.QueueDeclare, queue="kept"), ev.Ok)
    published = await bystander.request(
        ev.Publish, exchange="", key="kept", body=b"accepted", confirm=True
    )
    assert isinstance(published, ev.Ok)

    client = await open_client(node)
    await client.send_raw(frame({"m": "ha.handover", "upto": 5, "epoch": 1}))
    refused = await client.receive()
    assert isinstance(refused, ev.Error), refused
    assert refused.code == ReplyCode.COMMAND_INVALID
    assert "ha.handover" in refused.text
    assert isinstance(await client.request(ev.QueueDeclare, queue="after"), ev.Ok)

    await client.send_raw(frame({"m": "ha.handover", "upto": "x", "epoch": 1}))
    closed = await client.receive_until(ev.Close)
    assert isinstance(closed, ev.Close), closed
    assert closed.code == ReplyCode.SYNTAX_ERROR
    assert "upto" in closed.text

    got = await bystander.request(ev.Get, queue="kept", no_ack=True)
    assert isinstance(got, ev.GetOk) and got.body == b"accepted"
