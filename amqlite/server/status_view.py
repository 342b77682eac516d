"""What a ``status`` request shows a user without the ``monitoring`` tag.

As RabbitMQ's management API does for a ``management`` user: the vhosts the user
has permissions on, in each only the exchanges and queues one of the user's three
patterns there covers, and only the user's own connections. The node's identity
and state stay (a client's ``welcome`` tells them anyway); the HA pair, the
peering links and the storage (paths, journal) are for ``monitoring`` only. The
map says ``"filtered": true`` so a reader knows it is partial.
"""

from __future__ import annotations

from typing import Any

from amqlite.auth import AuthenticatedUser, Permissions

__all__ = ["visible_status"]

_NODE_FIELDS = (
    "node_id",
    "version",
    "uptime_s",
    "started_at",
    "state",
    "listen",
    "amqp_listen",
    "tls",
    "http_listen",
    "alarms",
)
_DEFAULT_EXCHANGE = "amq.default"


def _covers(permissions: Permissions, name: str) -> bool:
    return any(permissions.allows(kind, name) for kind in ("configure", "write", "read"))


def _vhost_view(host: dict[str, Any], permissions: Permissions) -> dict[str, Any]:
    queues = [q for q in host.get("queues", []) if _covers(permissions, q["name"])]
    shown = {q["name"] for q in queues}
    exchanges = [
        {**ex, "bindings": [b for b in ex.get("bindings", []) if b["queue"] in shown]}
        for ex in host.get("exchanges", [])
        if _covers(permissions, ex["name"] or _DEFAULT_EXCHANGE)
    ]
    return {**host, "exchanges": exchanges, "queues": queues}


def visible_status(status: dict[str, Any], user: AuthenticatedUser) -> dict[str, Any]:
    """``status`` (the node's full map) cut down to what ``user`` may see."""
    view: dict[str, Any] = {key: status[key] for key in _NODE_FIELDS if key in status}
    view["vhosts"] = [
        _vhost_view(host, user.grants[host["name"]])
        for host in status.get("vhosts", [])
        if host["name"] in user.grants
    ]
    view["connections"] = [c for c in status.get("connections", []) if c.get("user") == user.name]
    view["filtered"] = True
    return view
