"""Hypothesis fuzz of every decoder: arbitrary bytes either decode or raise our
AmqpError with a reply code, never anything else; and framing does not depend on
how the stream is cut."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.amqp import (
    CONNECTION_CODES,
    NEED_DATA,
    PROTOCOL_HEADER,
    AmqpConnection,
    AmqpError,
    ConnState,
    FrameReader,
    Role,
    decode_method,
)
from amqlite.amqp import methods as m
from amqlite.amqp.frames import encode_content, encode_method_frame
from amqlite.amqp.properties import decode_header_payload
from amqlite.amqp.values import decode_table

from .strategies import properties

_CODES = {int(c) for c in CONNECTION_CODES} | {406}


def _decodes_or_refuses(decode: object, data: bytes) -> None:
    try:
        decode(data)  # type: ignore[operator]
    except AmqpError as exc:
        assert exc.code in _CODES
        assert str(exc)


_METHOD_IDS = st.sampled_from(
    [(c.CLASS_ID, c.METHOD_ID) for c in (m.BasicPublish, m.QueueDeclare, m.ConnectionStart)]
)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_method_decoder_refuses_garbage_cleanly(data: bytes) -> None:
    _decodes_or_refuses(decode_method, data)


@settings(max_examples=300, deadline=None)
@given(ids=_METHOD_IDS, args=st.binary(max_size=120))
def test_method_arguments_fuzzed_behind_real_ids(ids: tuple[int, int], args: bytes) -> None:
    _decodes_or_refuses(decode_method, struct.pack(">HH", *ids) + args)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_content_header_decoder_refuses_garbage_cleanly(data: bytes) -> None:
    _decodes_or_refuses(decode_header_payload, data)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_field_table_decoder_refuses_garbage_cleanly(data: bytes) -> None:
    _decodes_or_refuses(lambda d: decode_table(d, 0), data)


def test_deeply_nested_tables_are_refused_not_a_recursion_error() -> None:
    depth = 500
    inner = b""
    for _ in range(depth):
        item = b"\x01aF" + struct.pack(">I", len(inner)) + inner
        inner = item
    with pytest.raises(AmqpError) as caught:
        decode_table(struct.pack(">I", len(inner)) + inner, 0)
    assert caught.value.code == 502


@pytest.mark.parametrize("server", [True, False])
@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), cut=st.integers(1, 64))
def test_frame_reader_refuses_garbage_cleanly(server: bool, data: bytes, cut: int) -> None:
    reader = FrameReader(expect_protocol_header=server, max_frame_size=4096)
    try:
        for start in range(0, len(data), cut):
            reader.receive_data(data[start : start + cut])
            while reader.next_frame() is not NEED_DATA:
                pass
    except AmqpError as exc:
        assert exc.code in _CODES


@settings(max_examples=300, deadline=None)
@given(
    frame_type=st.sampled_from([1, 2, 3, 8]),
    channel=st.integers(0, 3),
    payload=st.binary(max_size=100),
    end=st.sampled_from([0xCE, 0xCE, 0x00]),
)
def test_well_framed_garbage_is_refused_cleanly(
    frame_type: int, channel: int, payload: bytes, end: int
) -> None:
    """Valid frame headers around random payloads reach the payload decoders."""
    conn = AmqpConnection(Role.SERVER)
    conn.receive_data(PROTOCOL_HEADER)
    assert conn.next_event() is not NEED_DATA
    conn.receive_data(
        struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes((end,))
    )
    try:
        while conn.next_event() is not NEED_DATA:
            pass
    except AmqpError as exc:
        assert exc.code in _CODES


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=400))
def test_a_server_connection_refuses_garbage_cleanly(data: bytes) -> None:
    conn = AmqpConnection(Role.SERVER)
    conn.receive_data(PROTOCOL_HEADER)
    assert conn.next_event() is not NEED_DATA
    conn.send_method(0, m.ConnectionStart())
    conn.receive_data(data)
    try:
        while conn.next_event() is not NEED_DATA:
            pass
    except AmqpError as exc:
        assert exc.code in _CODES
        # after start there is a close to send, unless the garbage held a close itself
        closing = conn.state in (ConnState.CLOSE_RECEIVED, ConnState.CLOSE_SENT)
        assert conn.send_close_for(exc) or closing


@settings(max_examples=100, deadline=None)
@given(
    props=properties,
    body=st.binary(max_size=3000),
    cuts=st.lists(st.integers(1, 700), min_size=1, max_size=20),
)
def test_framing_does_not_depend_on_how_the_stream_is_cut(
    props: object, body: bytes, cuts: list[int]
) -> None:
    stream = encode_method_frame(0, m.ConnectionBlocked("low on memory")) + encode_content(
        5,
        m.BasicDeliver("ctag", 9, False, "ex", "rk"),
        props,
        body,
        frame_max=4096,  # type: ignore[arg-type]
    )
    whole = FrameReader()
    whole.receive_data(stream)
    expected = []
    while (frame := whole.next_frame()) is not NEED_DATA:
        expected.append(frame)
    reader = FrameReader()
    got = []
    position, i = 0, 0
    while position < len(stream):
        step = cuts[i % len(cuts)]
        reader.receive_data(stream[position : position + step])
        position += step
        i += 1
        while (frame := reader.next_frame()) is not NEED_DATA:
            got.append(frame)
    assert got == expected
    assert len(expected) == 3 + (len(body) + 4087) // 4088
