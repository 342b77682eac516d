"""AMQP 0-9-1 basic properties <-> the broker's message properties and headers.

One broker carries both protocols, so a message published over AMQP reaches native
consumers and the reverse. The table (also in docs/amqp.md):

=================  ==================================  =============================
AMQP property      native                              note
=================  ==================================  =============================
content-type       ``props.content_type``
content-encoding   ``props.content_encoding``
headers            ``headers``                         scalars as they are; the rest
                                                       in ``x-amqp-table`` (below)
delivery-mode      ``props.persistent``                2 = True, 1 (or any other) = False
priority           ``props.priority``
correlation-id     ``props.correlation_id``
reply-to           ``props.reply_to``
expiration         ``props.expiration``                AMQP: decimal milliseconds as text
message-id         ``props.message_id``
timestamp          ``props.timestamp``                 AMQP: seconds; native: milliseconds
type               ``props.type``
user-id            ``props.user_id``
app-id             ``props.app_id``
cluster-id         ``props.cluster_id``
(header)           ``props.group_id``                  AMQP header ``JMSXGroupID``
(header)           ``x-death-*`` headers               AMQP header ``x-death`` added
=================  ==================================  =============================

An absent AMQP property is an absent native one, and the reverse. ``expiration``
that is not a non-negative decimal integer is refused as RabbitMQ refuses it (406
PRECONDITION_FAILED, which closes the channel).

Native headers hold scalars only (text, int, float, bool, bytes, null). An AMQP
header value that is none of these (a table, an array, a decimal, a timestamp)
travels in the native header ``x-amqp-table``: bytes, an AMQP field table of just
those entries. Native consumers see the scalar headers and that one bytes value
(and headers exchanges route on the scalars); AMQP consumers get every value back,
the table's entries after the scalar ones.

A dead-lettered message carries the broker's flat headers ``x-death-reason``,
``-queue``, ``-exchange`` and ``-count`` (all deaths so far). AMQP consumers also
get them as RabbitMQ's ``x-death``: a list, latest death first, whose first entry
(``count``, ``reason``, ``queue``, ``exchange``) is the latest death; entries the
message already carried for other queue/reason pairs follow. ``count`` is the
message's deaths in all, not per queue and reason as RabbitMQ counts.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..errors import ReplyCode
from .errors import AmqpError
from .properties import (
    NO_PROPERTIES,
    PERSISTENT_PROPERTIES,
    TRANSIENT_PROPERTIES,
    BasicProperties,
)
from .values import decode_table, encode_table

#: The AMQP header that carries a native message's ``group_id`` (the name JMS
#: brokers use for message groups).
GROUP_HEADER = "JMSXGroupID"

#: AMQP property name -> native property name, for the ones copied as they are.
_SAME = (
    "content_type",
    "content_encoding",
    "priority",
    "correlation_id",
    "reply_to",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)

_MAX_EXPIRATION = 2**63 - 1

#: The native header holding the AMQP header values native headers cannot.
TABLE_HEADER = "x-amqp-table"
#: What a native header value may be (amqlite.protocol.check_headers).
_NATIVE_SCALARS = frozenset((str, int, float, bool, bytes, type(None)))


#: The native form of properties mapped before, by the identity of the (frozen)
#: properties object: the header decoder hands out one shared object per distinct
#: property list (``amqp/properties.py``, ``_DECODED``), so a publisher's repeated
#: properties are mapped once. Why: mapping them was about 1 us of every publish.
#: Callers get fresh dicts (copies of the kept ones). At most ``_MAPPED_MAX``
#: entries; ``tests/amqp/test_fast_content.py`` checks agreement with hypothesis.
_MAPPED: dict[int, tuple[BasicProperties, dict[str, Any], dict[str, Any]]] = {}
_MAPPED_MAX = 256


def to_native(
    properties: BasicProperties, *, channel: int = 0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The native ``(headers, props)`` of a message published over AMQP."""
    known = _MAPPED.get(id(properties))
    if known is not None and known[0] is properties:
        return dict(known[1]), dict(known[2])
    headers, props = _to_native(properties, channel)
    if len(_MAPPED) >= _MAPPED_MAX:
        _MAPPED.clear()
    _MAPPED[id(properties)] = (properties, headers, props)
    return dict(headers), dict(props)


def _to_native(properties: BasicProperties, channel: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`to_native`, the general way."""
    props: dict[str, Any] = {}
    for name in _SAME:
        value = getattr(properties, name)
        if value is not None:
            props[name] = value
    if properties.delivery_mode is not None:
        props["persistent"] = properties.delivery_mode == 2
    if properties.expiration is not None:
        props["expiration"] = parse_expiration(properties.expiration, channel=channel)
    if properties.timestamp is not None:
        props["timestamp"] = int(properties.timestamp.timestamp()) * 1000
    headers: dict[str, Any] = {}
    if properties.headers:
        rest: dict[str, Any] = {}
        for key, value in properties.headers.items():
            if type(value) in _NATIVE_SCALARS:
                headers[key] = value
            else:
                rest[key] = value
        if rest:
            headers[TABLE_HEADER] = encode_table(rest)
    group = headers.get(GROUP_HEADER)
    if isinstance(group, str):
        props["group_id"] = group
    return headers, props


def from_native(headers: dict[str, Any], props: dict[str, Any]) -> BasicProperties:
    """The AMQP basic properties of a message the broker delivers."""
    if not headers:
        # the usual shapes get shared values, whose header is encoded once
        if not props:
            return NO_PROPERTIES
        if len(props) == 1:
            persistent = props.get("persistent")
            if persistent is True:
                return PERSISTENT_PROPERTIES
            if persistent is False:
                return TRANSIENT_PROPERTIES
    values: dict[str, Any] = {name: props[name] for name in _SAME if name in props}
    persistent = props.get("persistent")
    if persistent is not None:
        values["delivery_mode"] = 2 if persistent else 1
    expiration = props.get("expiration")
    if expiration is not None:
        values["expiration"] = str(expiration)
    timestamp = props.get("timestamp")
    if timestamp is not None:
        values["timestamp"] = datetime.fromtimestamp(timestamp // 1000, tz=UTC)
    group = props.get("group_id")
    if group is not None and GROUP_HEADER not in headers:
        headers = {**headers, GROUP_HEADER: group}
    if TABLE_HEADER in headers:
        headers = _with_table(headers)
    if "x-death-reason" in headers:
        headers = {**headers, "x-death": x_death(headers)}
    if headers:
        values["headers"] = headers
    return BasicProperties(**values)


def parse_expiration(text: str, *, channel: int = 0) -> int:
    """An AMQP ``expiration`` (milliseconds as decimal text) as an int, or 406."""
    if not (text.isascii() and text.isdigit()) or int(text) > _MAX_EXPIRATION:
        raise AmqpError(
            f"PRECONDITION_FAILED - invalid expiration {text!r}: must be a "
            "non-negative number of milliseconds",
            ReplyCode.PRECONDITION_FAILED,
            channel=channel,
            class_id=60,
            method_id=40,
        )
    return int(text)


def _with_table(headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` with the entries of ``x-amqp-table`` put back in its place."""
    rest = headers.get(TABLE_HEADER)
    if not isinstance(rest, bytes):
        return headers  # a native publisher's own header of that name
    try:
        table, end = decode_table(rest, 0)
    except AmqpError:
        return headers
    if end != len(rest):
        return headers
    out = {k: v for k, v in headers.items() if k != TABLE_HEADER}
    out.update(table)
    return out


def x_death(headers: dict[str, Any]) -> list[Any]:
    """RabbitMQ's ``x-death`` list from the broker's ``x-death-*`` headers."""
    latest: dict[str, Any] = {
        "count": headers.get("x-death-count", 1),
        "reason": headers.get("x-death-reason"),
        "queue": headers.get("x-death-queue"),
        "exchange": headers.get("x-death-exchange"),
    }
    deaths = [latest]
    earlier = headers.get("x-death")
    if isinstance(earlier, list):
        same = (latest["queue"], latest["reason"])
        deaths.extend(
            d for d in earlier if isinstance(d, dict) and (d.get("queue"), d.get("reason")) != same
        )
    return deaths
