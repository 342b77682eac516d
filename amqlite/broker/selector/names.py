"""What a selector's identifiers name in a message.

- The message's own fields by their amqlite names: ``routing_key``, ``exchange``,
  and every property (``priority``, ``message_id``, ``correlation_id``,
  ``timestamp``, ``type``, ``expiration``, ``persistent``, ``reply_to``,
  ``content_type``, ``content_encoding``, ``group_id``, ``user_id``, ``app_id``,
  ``cluster_id``): NULL when the message does not have the property.
- The JMS header fields a JMS selector may name: ``JMSMessageID``,
  ``JMSCorrelationID``, ``JMSType`` and ``JMSTimestamp`` (NULL when absent, as in
  JMS), ``JMSPriority`` (4, JMS's default, when absent) and ``JMSDeliveryMode``
  (``'PERSISTENT'`` or ``'NON_PERSISTENT'``). ``JMSXGroupID`` is ``group_id``.
  The other JMS header fields (``JMSDestination``, ``JMSReplyTo``,
  ``JMSRedelivered``, ``JMSExpiration``, ...) are refused, as JMS refuses them.
- Any other name (``JMSX...`` and ``JMS_...`` included) is a header of the message,
  NULL when it has none. A header named like one of the names above is shadowed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..message import Message
from .errors import SelectorError

Getter = Callable[[Message], Any]

#: JMS header field -> the amqlite property it reads
_JMS_PROPERTIES = {
    "JMSMessageID": "message_id",
    "JMSCorrelationID": "correlation_id",
    "JMSType": "type",
    "JMSTimestamp": "timestamp",
    "JMSXGroupID": "group_id",
}
JMS_DEFAULT_PRIORITY = 4
#: the message properties (``amqlite.protocol.codec.PROPERTY_TYPES``; a test keeps
#: the two in step, and the broker core does not import the wire codec)
PROPERTIES = frozenset(
    (
        "message_id",
        "correlation_id",
        "timestamp",
        "expiration",
        "priority",
        "persistent",
        "reply_to",
        "content_type",
        "content_encoding",
        "group_id",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    )
)


def _routing_key(m: Message) -> Any:
    return m.routing_key


def _exchange(m: Message) -> Any:
    return m.exchange


def _jms_priority(m: Message) -> Any:
    return m.properties.get("priority", JMS_DEFAULT_PRIORITY)


def _jms_delivery_mode(m: Message) -> Any:
    return "PERSISTENT" if m.properties.get("persistent") is True else "NON_PERSISTENT"


_FIXED: dict[str, Getter] = {
    "routing_key": _routing_key,
    "exchange": _exchange,
    "JMSPriority": _jms_priority,
    "JMSDeliveryMode": _jms_delivery_mode,
}


def check_identifier(name: str, pos: int) -> None:
    """Refuse the JMS header fields a selector may not name."""
    if (
        name.startswith("JMS")
        and not name.startswith(("JMSX", "JMS_"))
        and name not in _FIXED
        and name not in _JMS_PROPERTIES
    ):
        raise SelectorError(
            pos,
            f"{name} cannot be used in a selector (JMS allows JMSDeliveryMode, "
            "JMSPriority, JMSMessageID, JMSTimestamp, JMSCorrelationID and JMSType)",
        )


def getter(name: str) -> Getter:
    """A function reading identifier ``name``'s value from a message (None: NULL)."""
    fixed = _FIXED.get(name)
    if fixed is not None:
        return fixed
    prop = _JMS_PROPERTIES.get(name, name)
    if prop in PROPERTIES:

        def read_property(m: Message) -> Any:
            return m.properties.get(prop)

        return read_property

    def read_header(m: Message) -> Any:
        return m.headers.get(name)

    return read_header


def is_header(name: str) -> bool:
    """True when identifier ``name`` reads a header (:func:`getter`'s last case)."""
    return name not in _FIXED and _JMS_PROPERTIES.get(name, name) not in PROPERTIES


def value_of(message: Message, name: str) -> Any:
    """Identifier ``name``'s value in ``message`` (None: NULL)."""
    return getter(name)(message)
