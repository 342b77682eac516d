"""AMQP basic properties <-> native properties and headers (amqlite.amqp.mapping)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqlite.amqp import AmqpError, BasicProperties
from amqlite.amqp.mapping import (
    GROUP_HEADER,
    TABLE_HEADER,
    from_native,
    parse_expiration,
    to_native,
)
from amqlite.amqp.properties import NO_PROPERTIES
from amqlite.amqp.values import encode_table
from amqlite.errors import ReplyCode
from amqlite.protocol import check_headers, check_props

from .strategies import properties


def test_every_property_maps_and_comes_back() -> None:
    amqp = BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"a": 1, "nested": {"b": [1, "x"]}},
        delivery_mode=2,
        priority=5,
        correlation_id="c1",
        reply_to="amq.rabbitmq.reply-to",
        expiration="60000",
        message_id="m1",
        timestamp=datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC),
        type="order",
        user_id="guest",
        app_id="shop",
        cluster_id="c",
    )
    headers, props = to_native(amqp)
    assert headers == {"a": 1, TABLE_HEADER: encode_table({"nested": {"b": [1, "x"]}})}
    assert props == {
        "content_type": "application/json",
        "content_encoding": "gzip",
        "persistent": True,
        "priority": 5,
        "correlation_id": "c1",
        "reply_to": "amq.rabbitmq.reply-to",
        "expiration": 60000,
        "message_id": "m1",
        "timestamp": 1_795_608_000_000,
        "type": "order",
        "user_id": "guest",
        "app_id": "shop",
        "cluster_id": "c",
    }
    assert check_props(props) is None  # a native client could have sent them
    assert from_native(headers, props) == amqp


def test_absent_is_absent_both_ways() -> None:
    assert to_native(BasicProperties()) == ({}, {})
    assert from_native({}, {}) is NO_PROPERTIES  # encoded without walking the 14 fields


def test_transient_delivery_mode() -> None:
    assert to_native(BasicProperties(delivery_mode=1))[1] == {"persistent": False}
    assert from_native({}, {"persistent": False}).delivery_mode == 1


def test_native_milliseconds_become_amqp_seconds() -> None:
    amqp = from_native({}, {"timestamp": 1_795_608_000_999})
    assert amqp.timestamp == datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def test_group_id_travels_as_the_jms_header() -> None:
    amqp = from_native({"k": "v"}, {"group_id": "g1"})
    assert amqp.headers == {"k": "v", GROUP_HEADER: "g1"}
    headers, props = to_native(amqp)
    assert props["group_id"] == "g1"
    assert headers[GROUP_HEADER] == "g1"


@pytest.mark.parametrize("text", ["-1", "1.5", "", "abc", " 10", "\uff11\uff12", str(2**63)])
def test_a_bad_expiration_is_406_on_the_channel(text: str) -> None:
    with pytest.raises(AmqpError) as caught:
        to_native(BasicProperties(expiration=text), channel=3)
    assert caught.value.code == ReplyCode.PRECONDITION_FAILED
    assert caught.value.channel == 3
    assert not caught.value.closes_connection


def test_expiration_zero_is_allowed() -> None:
    assert parse_expiration("0") == 0


def _comparable(p: BasicProperties) -> dict[str, Any]:
    values = {
        name: getattr(p, name)
        for name in BasicProperties.__dataclass_fields__
        if getattr(p, name) is not None
    }
    if "timestamp" in values:
        values["timestamp"] = int(values["timestamp"].timestamp())
    if values.get("delivery_mode") not in (None, 2):
        values["delivery_mode"] = 1  # anything but 2 is transient
    if values.get("headers") == {}:
        del values["headers"]
    return values


@given(properties)
def test_any_valid_amqp_properties_survive_the_round_trip(amqp: BasicProperties) -> None:
    try:
        headers, props = to_native(amqp)
    except AmqpError as exc:
        assert exc.code == ReplyCode.PRECONDITION_FAILED
        return
    back = from_native(headers, props)
    assert _comparable(back) == _comparable(amqp)


@given(st.text())
def test_parse_expiration_takes_only_decimal_digits(text: str) -> None:
    try:
        value = parse_expiration(text)
    except AmqpError:
        assert not (text.isascii() and text.isdigit()) or int(text) >= 2**63
    else:
        assert str(value) == text.lstrip("0") or (value == 0 and set(text) == {"0"})


def test_dead_letter_headers_become_x_death_latest_first() -> None:
    headers = {
        "x-death-reason": "expired",
        "x-death-queue": "wait",
        "x-death-exchange": "work-x",
        "x-death-count": 3,
        # what a consumer republished with, from two earlier deaths
        "x-death": [
            {"count": 2, "reason": "expired", "queue": "wait", "exchange": "work-x"},
            {"count": 1, "reason": "rejected", "queue": "work", "exchange": ""},
        ],
    }
    props = from_native(headers, {})
    assert props.headers is not None
    assert props.headers["x-death"] == [
        {"count": 3, "reason": "expired", "queue": "wait", "exchange": "work-x"},
        {"count": 1, "reason": "rejected", "queue": "work", "exchange": ""},
    ]
    assert props.headers["x-death-count"] == 3  # the broker's own headers stay


def test_no_x_death_without_a_death() -> None:
    assert from_native({"a": 1}, {}).headers == {"a": 1}


def test_header_values_native_headers_cannot_hold_travel_in_one_table() -> None:
    amqp = BasicProperties(
        headers={
            "text": "t",
            "n": 2**40,
            "f": 0.5,
            "raw": b"\x00",
            "none": None,
            "nested": {"a": [1, {"b": True}]},
            "list": ["x"],
            "price": Decimal("9.99"),
            "when": datetime(2026, 1, 1, tzinfo=UTC),
        }
    )
    headers, _ = to_native(amqp)
    assert check_headers(headers) is None
    assert set(headers) == {"text", "n", "f", "raw", "none", TABLE_HEADER}
    assert from_native(headers, {}).headers == amqp.headers


def test_a_native_header_named_like_the_table_is_left_alone() -> None:
    for value in ("text", b"not a table", b"\x00\x00\x00\x01"):
        assert from_native({TABLE_HEADER: value}, {}).headers == {TABLE_HEADER: value}
