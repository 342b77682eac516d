"""Messages in the management API's JSON: publish bodies and ``get`` results.

RabbitMQ's JSON names the AMQP 0-9-1 basic properties (``delivery_mode``,
``content_type``, ``headers``, ``expiration`` as text, ``timestamp`` in
seconds); the broker keeps its own ``props`` (docs/amqp.md has the table). This
module converts both ways and checks what a client sent; a mistake raises
:class:`BadMessage` with a text for the 400 reply.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from amqlite.protocol.codec import SHORT_TEXT_MAX, check_headers, check_props

__all__ = ["BadMessage", "message_json", "publish_fields"]

_TEXT_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
_KNOWN = frozenset(
    (*_TEXT_PROPERTIES, "delivery_mode", "priority", "expiration", "timestamp", "headers")
)


class BadMessage(ValueError):
    """The JSON describes no valid message; ``str()`` says why."""


def publish_fields(body: Any) -> tuple[str, bytes, dict[str, Any], dict[str, Any]]:
    """``(routing_key, payload, headers, props)`` from a publish request's JSON
    (``routing_key``, ``payload``, ``payload_encoding`` = string | base64,
    ``properties``)."""
    if not isinstance(body, dict):
        raise BadMessage("the body must be a JSON object")
    key = body.get("routing_key", "")
    payload = body.get("payload", "")
    encoding = body.get("payload_encoding", "string")
    if not isinstance(key, str) or not isinstance(payload, str):
        raise BadMessage("routing_key and payload must be strings")
    if len(key.encode()) > SHORT_TEXT_MAX:
        raise BadMessage(f"routing_key must be at most {SHORT_TEXT_MAX} bytes")
    if encoding == "string":
        data = payload.encode("utf-8")
    elif encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise BadMessage(f"payload is not base64: {exc}") from None
    else:
        raise BadMessage(f"payload_encoding must be 'string' or 'base64', got {encoding!r}")
    headers, props = _native_properties(body.get("properties", {}))
    return key, data, headers, props


def _native_properties(properties: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    if not isinstance(properties, dict):
        raise BadMessage("properties must be a JSON object")
    unknown = sorted(set(properties) - _KNOWN)
    if unknown:
        raise BadMessage(f"unknown properties: {', '.join(unknown)}")
    props: dict[str, Any] = {
        name: properties[name] for name in _TEXT_PROPERTIES if name in properties
    }
    mode = properties.get("delivery_mode")
    if mode is not None:
        if mode not in (1, 2) or isinstance(mode, bool):
            raise BadMessage("delivery_mode must be 1 (transient) or 2 (persistent)")
        props["persistent"] = mode == 2
    if "priority" in properties:
        props["priority"] = properties["priority"]
    expiration = properties.get("expiration")
    if expiration is not None:
        if not (isinstance(expiration, str) and expiration.isascii() and expiration.isdigit()):
            raise BadMessage("expiration must be milliseconds as a decimal string")
        props["expiration"] = int(expiration)
    timestamp = properties.get("timestamp")
    if timestamp is not None:
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise BadMessage("timestamp must be whole seconds")
        props["timestamp"] = timestamp * 1000
    headers = properties.get("headers", {})
    for problem, what in ((check_headers(headers), "headers"), (check_props(props), "properties")):
        if problem is not None:
            raise BadMessage(f"{what}: {problem}")
    return dict(headers), props


def message_json(
    *,
    exchange: str,
    routing_key: str,
    body: bytes,
    headers: dict[str, Any],
    props: dict[str, Any],
    redelivered: bool,
    remaining: int,
    encoding: str = "auto",
    truncate: int | None = None,
) -> dict[str, Any]:
    """One message of ``POST /api/queues/{vhost}/{name}/get`` as RabbitMQ shows it."""
    shown = body if truncate is None else body[:truncate]
    payload: str
    payload_encoding = "base64"
    if encoding == "auto":
        try:
            payload, payload_encoding = shown.decode("utf-8"), "string"
        except UnicodeDecodeError:
            payload = base64.b64encode(shown).decode("ascii")
    else:
        payload = base64.b64encode(shown).decode("ascii")
    properties: dict[str, Any] = {n: props[n] for n in _TEXT_PROPERTIES if n in props}
    if "persistent" in props:
        properties["delivery_mode"] = 2 if props["persistent"] else 1
    if "priority" in props:
        properties["priority"] = props["priority"]
    if "expiration" in props:
        properties["expiration"] = str(props["expiration"])
    if "timestamp" in props:
        properties["timestamp"] = props["timestamp"] // 1000
    if headers:
        properties["headers"] = {
            k: base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else v
            for k, v in headers.items()
        }
    return {
        "payload_bytes": len(body),
        "redelivered": redelivered,
        "exchange": exchange,
        "routing_key": routing_key,
        "message_count": remaining,
        "properties": properties,
        "payload": payload,
        "payload_encoding": payload_encoding,
    }
