"""Queue arguments, validated once into a frozen :class:`QueueSettings`.

Recognised arguments and their rules:

- ``x-message-ttl``: int >= 0, milliseconds a message may stay in the queue;
- ``x-expires``: int > 0, milliseconds the queue may stay unused (no consumer, no
  get, no redeclaration) before the broker deletes it, as RabbitMQ does;
- ``x-max-length``: int >= 0, ready messages kept;
- ``x-max-length-bytes``: int >= 0, body bytes of ready messages kept;
- ``x-overflow``: ``drop-head`` (default) or ``reject-publish``;
- ``x-dead-letter-exchange``: str; ``x-dead-letter-routing-key``: str (needs the former);
- ``x-queue-type``: ``classic`` (default) or ``stream`` (an append-only log read by
  offset: see :mod:`amqlite.broker.stream`);
- ``x-max-age``: streams only, how long messages are kept: a number and a unit,
  ``Y``, ``M`` (30 days), ``D``, ``h``, ``m`` or ``s`` (``"7D"``, ``"12h"``), as in
  RabbitMQ. Streams take neither TTLs, dead-lettering nor ``reject-publish``.

A wrong type or value raises 406 naming the argument. Unknown arguments are kept
(they show in status) but ignored, also when comparing a redeclaration.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from amqlite.errors import PreconditionFailed


class Overflow(enum.Enum):
    DROP_HEAD = "drop-head"
    REJECT_PUBLISH = "reject-publish"


@dataclasses.dataclass(frozen=True, slots=True)
class QueueSettings:
    message_ttl: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Overflow = Overflow.DROP_HEAD
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    queue_type: str = "classic"
    max_age: float | None = None  # seconds, streams only
    expires: int | None = None  # milliseconds unused before the queue is deleted

    def difference(self, other: QueueSettings) -> str | None:
        """The argument name of the first setting that differs, or None."""
        for field in dataclasses.fields(self):
            if getattr(self, field.name) != getattr(other, field.name):
                return _ARGUMENT_OF[field.name]
        return None


_ARGUMENT_OF = {
    "message_ttl": "x-message-ttl",
    "max_length": "x-max-length",
    "max_length_bytes": "x-max-length-bytes",
    "overflow": "x-overflow",
    "dead_letter_exchange": "x-dead-letter-exchange",
    "dead_letter_routing_key": "x-dead-letter-routing-key",
    "queue_type": "x-queue-type",
    "max_age": "x-max-age",
    "expires": "x-expires",
}

_AGE_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}


def _age(arguments: Mapping[str, Any]) -> float | None:
    value = arguments.get("x-max-age")
    if value is None:
        return None
    what = "a number and a unit Y, M, D, h, m or s, like '7D'"
    if type(value) is not str or len(value) < 2 or value[-1] not in _AGE_UNITS:
        raise _bad("x-max-age", what, value)
    try:
        amount = int(value[:-1])
    except ValueError:
        raise _bad("x-max-age", what, value) from None
    if amount <= 0:
        raise _bad("x-max-age", what, value)
    return float(amount * _AGE_UNITS[value[-1]])


def _bad(name: str, what: str, value: Any) -> PreconditionFailed:
    return PreconditionFailed(f"invalid arg {name!r}: must be {what}, got {value!r}")


def _count(arguments: Mapping[str, Any], name: str) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise _bad(name, "a non-negative integer", value)
    return value


def _text(arguments: Mapping[str, Any], name: str) -> str | None:
    value = arguments.get(name)
    if value is None:
        return None
    if type(value) is not str:
        raise _bad(name, "text", value)
    return value


def parse_queue_arguments(arguments: Mapping[str, Any]) -> QueueSettings:
    """Validate ``arguments``; raises 406 naming the bad argument."""
    overflow_name = _text(arguments, "x-overflow") or Overflow.DROP_HEAD.value
    try:
        overflow = Overflow(overflow_name)
    except ValueError:
        raise _bad("x-overflow", "'drop-head' or 'reject-publish'", overflow_name) from None
    queue_type = _text(arguments, "x-queue-type") or "classic"
    if queue_type not in ("classic", "stream"):
        raise _bad("x-queue-type", "'classic' or 'stream'", queue_type)
    max_age = _age(arguments)
    if queue_type == "stream":
        for name in (
            "x-message-ttl",
            "x-expires",
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
        ):
            if name in arguments:
                raise PreconditionFailed(f"invalid arg {name!r}: stream queues do not take it")
        if overflow is Overflow.REJECT_PUBLISH:
            raise PreconditionFailed("invalid arg 'x-overflow': streams only drop their head")
    elif max_age is not None:
        raise PreconditionFailed("invalid arg 'x-max-age': only stream queues take it")
    dlx = _text(arguments, "x-dead-letter-exchange")
    dlrk = _text(arguments, "x-dead-letter-routing-key")
    if dlrk is not None and dlx is None:
        raise PreconditionFailed(
            "invalid arg 'x-dead-letter-routing-key': needs 'x-dead-letter-exchange'"
        )
    expires = _count(arguments, "x-expires")
    if expires == 0:
        raise _bad("x-expires", "a positive integer (milliseconds)", expires)
    return QueueSettings(
        message_ttl=_count(arguments, "x-message-ttl"),
        expires=expires,
        max_length=_count(arguments, "x-max-length"),
        max_length_bytes=_count(arguments, "x-max-length-bytes"),
        overflow=overflow,
        dead_letter_exchange=dlx,
        dead_letter_routing_key=dlrk,
        queue_type=queue_type,
        max_age=max_age,
    )
