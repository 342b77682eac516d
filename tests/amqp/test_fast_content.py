"""The fast paths of the AMQP codec agree with the general ones.

The receive fast path for ``basic.publish`` (``FrameReader.peek_publish`` and
``AmqpConnection._fast_publish``) agrees with the general frame-by-frame path on
every byte stream: the same events in the same order, the same error (code,
channel, class and method) at the same point, and the same channel states after.
Streams mix publishes of every body size (none, one frame, several frames) with
other methods and channels, are cut into arbitrary chunks, and are sometimes
corrupted; the decoded ``basic.publish`` methods and property lists it keeps for
the next publish that repeats them agree with fresh decodes. The send fast path
for ``basic.deliver`` (``AmqpConnection.send_deliver``) gives the bytes, or the error, that
``send_content`` gives, in every channel state."""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.amqp import AmqpConnection, AmqpError, Event
from amqlite.amqp import connection as amqp_connection
from amqlite.amqp import methods as m
from amqlite.amqp import properties as amqp_properties
from amqlite.amqp.events import ContentReceived
from amqlite.amqp.frames import NEED_DATA
from amqlite.amqp.mapping import from_native
from amqlite.amqp.properties import BasicProperties
from amqlite.amqp.states import ChannelState

from ..examples import examples
from .strategies import properties
from .test_connection import events, handshake, open_channel


def _publish(draw: Any, client: AmqpConnection, channel: int) -> bytes:
    method = m.BasicPublish(
        0,
        draw(st.sampled_from(["", "amq.topic", "x" * 200])),
        draw(st.text(max_size=30)),
        draw(st.booleans()),
        False,
    )
    size = draw(st.sampled_from([0, 1, 100, 5000, 20000]))
    return client.send_content(channel, method, draw(properties), bytes(size))


def _frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        size = int.from_bytes(data[3:7], "big") + 8
        out.append(data[:size])
        data = data[size:]
    return out


@st.composite
def streams(draw: Any) -> tuple[int, int, bytes, list[int]]:
    frame_max = draw(st.sampled_from([4096, 8192, 131072]))
    max_body = draw(st.sampled_from([0, 0, 6000]))
    client, server = handshake(frame_max=frame_max)
    for channel in (1, 2):
        open_channel(client, server, channel)
    parts = []
    for _ in range(draw(st.integers(1, 8))):
        what = draw(st.sampled_from(["publish", "publish", "publish", "qos", "ack", "close"]))
        channel = draw(st.sampled_from([1, 2]))
        if client.channel_state(channel) is not ChannelState.OPEN:
            continue
        if (
            what == "publish"
            and draw(st.booleans())
            and all(client.channel_state(c) is ChannelState.OPEN for c in (1, 2))
        ):
            # two messages on two channels, their frames interleaved (legal in AMQP)
            a = _frames(_publish(draw, client, 1))
            b = _frames(_publish(draw, client, 2))
            merged = []
            while a or b:
                source = a if a and (not b or draw(st.booleans())) else b
                merged.append(source.pop(0))
            parts.append(b"".join(merged))
        elif what == "publish":
            parts.append(_publish(draw, client, channel))
        elif what == "qos":
            parts.append(client.send_method(channel, m.BasicQos(0, 10, False)))
        elif what == "ack":
            parts.append(client.send_method(channel, m.BasicAck(1, False)))
        else:
            parts.append(client.send_method(channel, m.ChannelClose(200, "bye", 0, 0)))
    data = bytearray(b"".join(parts))
    if data and draw(st.booleans()):  # corrupt one byte somewhere
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    return frame_max, max_body, bytes(data), cuts


def _run(frame_max: int, max_body: int, data: bytes, cuts: list[int]) -> tuple[Any, ...]:
    client, server = handshake(frame_max=frame_max)
    server.max_body_size = max_body
    for channel in (1, 2):
        open_channel(client, server, channel)
    got: list[Event] = []
    error = None
    start = 0
    try:
        for end in [*cuts, len(data)]:
            server.receive_data(data[start:end])
            start = end
            while (event := server.next_event()) is not NEED_DATA:
                assert isinstance(event, Event)
                got.append(event)
    except AmqpError as exc:
        error = (exc.code, exc.channel, exc.class_id, exc.method_id, exc.text)
    return got, error, server.channel_state(1), server.channel_state(2), server._reader.buffered


@settings(max_examples=examples(100), deadline=None)
@given(streams())
def test_the_fast_path_gives_what_the_general_path_gives(
    stream: tuple[int, int, bytes, list[int]],
) -> None:
    fast = _run(*stream)
    with mock.patch.object(AmqpConnection, "_fast_publish", lambda self: None):
        general = _run(*stream)
    assert fast == general


def test_a_header_of_another_channel_after_a_publish_is_not_taken_as_its_own() -> None:
    # m2, m1, h2 (no body), h1, b1: the frames after m1 open with channel 2's header,
    # which the fast path must not take as m1's (the general path gives m2's message)
    client, server = handshake()
    for channel in (1, 2):
        open_channel(client, server, channel)
    a = _frames(client.send_content(1, m.BasicPublish(0, "", "q"), BasicProperties(), b"a"))
    b = _frames(client.send_content(2, m.BasicPublish(0, "", "q"), BasicProperties(), b""))
    data = b"".join([b[0], a[0], b[1], a[1], a[2]])
    stream = (131072, 0, data, [len(b[0])])  # (m2 read alone: m1 starts a read)
    fast = _run(*stream)
    with mock.patch.object(AmqpConnection, "_fast_publish", lambda self: None):
        general = _run(*stream)
    assert fast == general


def test_the_fast_path_is_taken_for_a_usual_publish() -> None:
    client, server = handshake()
    open_channel(client, server)
    data = client.send_content(1, m.BasicPublish(0, "", "q"), BasicProperties(), b"hi")
    general = AssertionError("the publish went the general way")
    with mock.patch.object(AmqpConnection, "_receive_channel_frame", side_effect=general):
        [event] = events(server, data)
    assert event.body == b"hi"  # type: ignore[attr-defined]


def test_a_repeated_publish_method_is_decoded_once_and_shared() -> None:
    client, server = handshake()
    open_channel(client, server)
    method = m.BasicPublish(0, "amq.direct", "repeated-key", True, False)
    props = BasicProperties(delivery_mode=2)
    data = b"".join(client.send_content(1, method, props, b"%d" % i) for i in range(3))
    got = events(server, data)
    assert [e.body for e in got] == [b"0", b"1", b"2"]  # type: ignore[attr-defined]
    assert all(e.method == method for e in got)  # type: ignore[attr-defined]
    assert got[1].method is got[0].method and got[2].method is got[0].method  # type: ignore[attr-defined]
    assert got[2].properties is got[0].properties  # type: ignore[attr-defined]


def test_the_channel_table_leads_a_publish_back_to_open() -> None:
    assert amqp_connection._publish_keeps_the_channel_open()


def test_a_client_never_takes_the_server_fast_path() -> None:
    client, server = handshake()
    open_channel(client, server)
    # a broken server sending basic.publish to a client: the general path refuses it
    client._reader.receive_data(
        b"\x01\x00\x01\x00\x00\x00\x0b\x00\x3c\x00\x28\x00\x00\x00\x00\x00\xce"
    )
    assert client._fast_publish() is None


# --- sending basic.deliver -------------------------------------------------------------

_TEXT = st.one_of(st.text(max_size=12), st.text(min_size=250, max_size=260), st.integers(0, 3))


def _send(conn: AmqpConnection, general: bool, *args: Any) -> tuple[str, Any]:
    try:
        if general:
            deliver = m.BasicDeliver(*args[1:6])
            return "ok", conn.send_content(args[0], deliver, args[6], args[7])
        return "ok", conn.send_deliver(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=examples(100), deadline=None)
@given(
    frame_max=st.sampled_from([4096, 131072]),
    channel=st.sampled_from([1, 2, 3]),
    close_first=st.booleans(),
    tag=_TEXT,
    dtag=st.one_of(st.integers(-1, 2**64), st.just(1.5)),
    redelivered=st.one_of(st.booleans(), st.none()),
    exchange=_TEXT,
    key=_TEXT,
    props=st.one_of(
        properties,
        st.sampled_from(
            [
                amqp_properties.NO_PROPERTIES,
                amqp_properties.PERSISTENT_PROPERTIES,
                amqp_properties.TRANSIENT_PROPERTIES,
            ]
        ),
    ),
    size=st.sampled_from([0, 1, 100, 4088, 4089, 20000]),
)
def test_send_deliver_gives_the_bytes_send_content_gives(
    frame_max: int,
    channel: int,
    close_first: bool,
    tag: Any,
    dtag: Any,
    redelivered: Any,
    exchange: Any,
    key: Any,
    props: BasicProperties,
    size: int,
) -> None:
    outcomes = []
    for general in (False, True):
        client, server = handshake(frame_max=frame_max)
        for number in (1, 2):
            open_channel(client, server, number)
        if close_first:
            server.send_method(1, m.ChannelClose(200, "bye", 0, 0))
        args = (channel, tag, dtag, redelivered, exchange, key, props, bytes(size))
        outcome = _send(server, general, *args)
        outcomes.append((outcome, server.channel_state(channel), server.state))
        if outcome[0] == "ok":  # and the client reads it as that delivery
            got = events(client, outcome[1])
            deliver = m.BasicDeliver(tag, dtag, bool(redelivered), exchange, key)
            assert got == [ContentReceived(channel, deliver, props, bytes(size))]
    assert outcomes[0] == outcomes[1]


def test_the_usual_properties_are_shared_values_with_the_general_encoding() -> None:
    for shared in (
        amqp_properties.PERSISTENT_PROPERTIES,
        amqp_properties.TRANSIENT_PROPERTIES,
    ):
        copy = BasicProperties(delivery_mode=shared.delivery_mode)
        assert copy is not shared
        assert amqp_properties.encode_header_payload(7, shared) == (
            amqp_properties.encode_header_payload(7, copy)
        )
    assert from_native({}, {"persistent": True}) is amqp_properties.PERSISTENT_PROPERTIES
    assert from_native({}, {"persistent": False}) is amqp_properties.TRANSIENT_PROPERTIES
    assert from_native({}, {"persistent": True, "type": "t"}) == BasicProperties(
        delivery_mode=2, type="t"
    )


# --- the caches of decoded and mapped properties ---------------------------------------


def _header(props: BasicProperties, size: int) -> bytes:
    return amqp_properties.encode_header_payload(size, props)


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.tuples(properties, st.integers(0, 2**40), st.booleans()), min_size=1, max_size=12),
    st.integers(1, 4),
)
def test_cached_header_decodes_and_mappings_agree_with_the_general_ones(
    items: list[tuple[BasicProperties, int, bool]], cache_size: int
) -> None:
    """Decoding a header payload and mapping its properties to the native form give
    what the general paths give, whether the property list was seen before or not,
    with the caches filling up and starting again (a tiny size here), and in any
    order; a caller may change the dicts it gets without changing what the next
    caller gets."""
    from amqlite.amqp import mapping

    with (
        mock.patch.object(amqp_properties, "_DECODED", {}),
        mock.patch.object(amqp_properties, "_CACHED", cache_size),
        mock.patch.object(mapping, "_MAPPED", {}),
        mock.patch.object(mapping, "_MAPPED_MAX", cache_size),
    ):
        for props, size, again in items * 2:
            payload = _header(props, size)
            expect = amqp_properties._decode_header_payload(payload)
            got = amqp_properties.decode_header_payload(payload)
            assert got == expect
            try:
                native = mapping._to_native(expect[2], 1)
            except AmqpError as exc:
                with_cache: Any = None
                try:
                    mapping.to_native(got[2], channel=1)
                except AmqpError as again_exc:
                    with_cache = again_exc
                assert with_cache is not None and str(with_cache) == str(exc)
                continue
            headers, mapped = mapping.to_native(got[2], channel=1)
            assert (headers, mapped) == native
            if again:  # the caller scribbles on what it got
                headers["scribbled"] = 1
                mapped["scribbled"] = 2
                assert mapping.to_native(got[2], channel=1) == native


def test_a_repeated_property_list_is_decoded_once_and_shared() -> None:
    props = BasicProperties(content_type="application/json", delivery_mode=2, headers={"k": 1})
    first = amqp_properties.decode_header_payload(_header(props, 10))
    second = amqp_properties.decode_header_payload(_header(props, 20))
    assert (first[1], second[1]) == (10, 20)
    assert first[2] == props and second[2] is first[2]  # decoded once, shared
