"""Byte agreement with pamqp, the test oracle: what we encode pamqp decodes to the
same values, what pamqp encodes we decode to the same values, and re-encoding
pamqp's bytes gives the same bytes, for every method, the basic properties and
every field-table type."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pamqp.commands
import pamqp.frame
import pamqp.header
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.amqp import METHODS, BasicProperties, FrameReader, Method
from amqlite.amqp.frames import HeaderFrame, MethodFrame, encode_header_frame, encode_method_frame
from amqlite.amqp.values import decode_table, encode_table

from .strategies import PLAIN_SCALARS, RESERVED, field_kinds, methods_of, properties, tables

# pamqp warns that basic.recover-async is deprecated; RabbitMQ clients still send it
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ALL = sorted(METHODS.values(), key=lambda c: (c.CLASS_ID, c.METHOD_ID))
_PAMQP_BY_INDEX = {
    cls.index: cls
    for group in vars(pamqp.commands).values()
    if isinstance(group, type)
    for cls in vars(group).values()
    if isinstance(cls, type) and hasattr(cls, "index") and hasattr(cls, "marshal")
}


def _channel(cls: type[Method]) -> int:
    return 0 if cls.CLASS_ID == 10 else 7


def _plain(value: Any) -> Any:
    """pamqp's decoded values in our types (bytearray -> bytes, nested)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _to_pamqp(value: Any) -> Any:
    """Our values in the types pamqp encodes (bytes -> bytearray, nested)."""
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, dict):
        return {k: _to_pamqp(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_pamqp(v) for v in value]
    return value


def _decode_ours(data: bytes) -> Any:
    reader = FrameReader()
    reader.receive_data(data)
    frame = reader.next_frame()
    assert reader.buffered == 0
    return frame


def test_every_pamqp_method_we_claim_exists_with_the_same_ids() -> None:
    # tx and confirm and every class RabbitMQ clients use: 64 methods
    assert len(ALL) == 64
    for cls in ALL:
        oracle = _PAMQP_BY_INDEX[(cls.CLASS_ID << 16) | cls.METHOD_ID]
        assert oracle.name.lower().replace("ok", "-ok").split(".")[0] == cls.NAME.split(".")[0]
        ours = {name for name, _ in field_kinds(cls)}
        assert ours == set(oracle.__slots__), cls.NAME


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.NAME)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_pamqp_decodes_what_we_encode(cls: type[Method], data: st.DataObject) -> None:
    method = data.draw(methods_of(cls))
    frame = encode_method_frame(_channel(cls), method)
    consumed, channel, value = pamqp.frame.unmarshal(frame)
    assert (consumed, channel) == (len(frame), _channel(cls))
    assert value.index == (cls.CLASS_ID << 16) | cls.METHOD_ID
    for name, kind in field_kinds(cls):
        if name in RESERVED:
            continue
        theirs = _plain(getattr(value, name))
        if kind == "longbytes" and isinstance(theirs, str):
            theirs = theirs.encode()
        assert theirs == getattr(method, name), name


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.NAME)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_we_decode_what_pamqp_encodes(cls: type[Method], data: st.DataObject) -> None:
    method = data.draw(methods_of(cls))
    kwargs = {}
    for name, kind in field_kinds(cls):
        if name in RESERVED:
            continue
        value = getattr(method, name)
        kwargs[name] = value.decode() if kind == "longbytes" else _to_pamqp(value)
    oracle = _PAMQP_BY_INDEX[(cls.CLASS_ID << 16) | cls.METHOD_ID](**kwargs)
    wire = pamqp.frame.marshal(oracle, _channel(cls))
    frame = _decode_ours(wire)
    assert isinstance(frame, MethodFrame)
    assert frame.channel == _channel(cls)
    for name, _ in field_kinds(cls):
        if name not in RESERVED:
            assert getattr(frame.method, name) == getattr(method, name), name


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.NAME)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_reencoding_pamqp_bytes_gives_the_same_bytes(
    cls: type[Method], data: st.DataObject
) -> None:
    method = data.draw(methods_of(cls, tables(PLAIN_SCALARS)))
    kwargs = {
        name: (getattr(method, name).decode() if kind == "longbytes" else getattr(method, name))
        for name, kind in field_kinds(cls)
        if name not in RESERVED
    }
    oracle = _PAMQP_BY_INDEX[(cls.CLASS_ID << 16) | cls.METHOD_ID](**kwargs)
    wire = pamqp.frame.marshal(oracle, _channel(cls))
    frame = _decode_ours(wire)
    assert isinstance(frame, MethodFrame)
    assert encode_method_frame(frame.channel, frame.method) == wire


# --- properties ------------------------------------------------------------------------

_RENAMED = {"type": "message_type"}


def _pamqp_props(props: BasicProperties) -> pamqp.commands.Basic.Properties:
    kwargs = {
        _RENAMED.get(name, name): _to_pamqp(getattr(props, name))
        for name in BasicProperties.__dataclass_fields__
        if getattr(props, name) is not None
    }
    return pamqp.commands.Basic.Properties(**kwargs)


@settings(max_examples=200, deadline=None)
@given(props=properties, body_size=st.integers(0, 2**40))
def test_pamqp_decodes_our_content_header(props: BasicProperties, body_size: int) -> None:
    wire = encode_header_frame(3, body_size, props)
    consumed, channel, header = pamqp.frame.unmarshal(wire)
    assert (consumed, channel, header.body_size) == (len(wire), 3, body_size)
    for name in BasicProperties.__dataclass_fields__:
        theirs = _plain(getattr(header.properties, _RENAMED.get(name, name)))
        ours = getattr(props, name)
        assert theirs == ours or (ours is None and theirs in (None, "")), name


@settings(max_examples=200, deadline=None)
@given(props=properties, body_size=st.integers(0, 2**40))
def test_we_decode_pamqp_content_headers(props: BasicProperties, body_size: int) -> None:
    wire = pamqp.frame.marshal(pamqp.header.ContentHeader(0, body_size, _pamqp_props(props)), 3)
    frame = _decode_ours(wire)
    assert isinstance(frame, HeaderFrame)
    assert (frame.channel, frame.class_id, frame.body_size) == (3, 60, body_size)
    assert frame.properties == props
    if props.headers is None or _only_plain(props.headers):
        assert encode_header_frame(3, body_size, frame.properties) == wire


def _only_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(_only_plain(v) for v in value.values())
    if isinstance(value, list):
        return all(_only_plain(v) for v in value)
    return value is None or isinstance(value, bool | str)


# --- field tables ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(table=tables())
def test_field_tables_agree_both_ways(table: dict[str, Any]) -> None:
    ours = encode_table(table)
    _, theirs_decoded = pamqp.decode.field_table(ours)
    assert _plain(theirs_decoded) == table
    theirs = pamqp.encode.field_table(_to_pamqp(table))
    decoded, end = decode_table(theirs, 0)
    assert end == len(theirs)
    assert decoded == table


def _entry(tag: bytes, payload: bytes) -> bytes:
    item = b"\x01k" + tag + payload
    return struct.pack(">I", len(item)) + item


@pytest.mark.parametrize(
    ("tag", "payload", "value"),
    [
        (b"t", b"\x01", True),
        (b"b", b"\xfe", -2),
        (b"B", b"\xfe", 254),
        (b"s", b"\xff\xfe", -2),
        (b"u", b"\xff\xfe", 65534),
        (b"I", b"\xff\xff\xff\xfe", -2),
        (b"i", b"\xff\xff\xff\xfe", 2**32 - 2),
        (b"l", b"\xff" * 7 + b"\xfe", -2),
        (b"f", struct.pack(">f", 1.5), 1.5),
        (b"d", struct.pack(">d", -2.25), -2.25),
        (b"D", b"\x02\x00\x00\x01\x2d", Decimal("3.01")),
        (b"S", b"\x00\x00\x00\x03h\xc3\xa9", "hé"),
        (b"x", b"\x00\x00\x00\x02\x00\xff", b"\x00\xff"),
        (b"T", b"\x00" * 7 + b"\x3c", datetime(1970, 1, 1, 0, 1, tzinfo=UTC)),
        (b"F", b"\x00\x00\x00\x03\x01aV", {"a": None}),
        (b"A", b"\x00\x00\x00\x03t\x00V", [False, None]),
        (b"V", b"", None),
    ],
)
def test_every_rabbitmq_field_type_decodes_as_pamqp_does(
    tag: bytes, payload: bytes, value: Any
) -> None:
    wire = _entry(tag, payload)
    ours, end = decode_table(wire, 0)
    assert end == len(wire)
    assert ours == {"k": value}
    _, theirs = pamqp.decode.field_table(wire)
    assert _plain(theirs) == ours
