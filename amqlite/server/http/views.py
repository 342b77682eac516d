"""The node's status map in the shapes of RabbitMQ's management API.

Pure functions from the map ``amqlite status --json`` returns (the full one, or
what :func:`amqlite.server.status_view.visible_status` leaves a ``management``
user) to the JSON RabbitMQ's ``/api/...`` endpoints answer with: the same paths,
the same field names where the concept exists (``messages_ready``,
``messages_unacknowledged``, ``message_stats.publish_details.rate``, a binding's
``source``/``destination``/``properties_key``), so scripts and monitors written
for RabbitMQ read them. amqlite's own facts (HA state, peering links, the
journal) are extra fields or extra endpoints, never renamed RabbitMQ ones.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .rates import RateSampler

__all__ = [
    "DEFAULT_EXCHANGE",
    "binding_views",
    "connection_views",
    "exchange_views",
    "listeners",
    "node_view",
    "overview",
    "properties_key",
    "queue_views",
    "rate_sample",
    "vhost_views",
]

#: how RabbitMQ names the default exchange ("") in a URL
DEFAULT_EXCHANGE = "amq.default"
#: the counters of ``message_stats`` (the broker's queue ``stats``)
STATS = ("publish", "deliver_get", "redeliver", "ack")
DEPTHS = ("messages", "messages_ready", "messages_unacknowledged")


def rate_sample(broker_status: dict[str, Any]) -> dict[Any, float]:
    """The values :class:`RateSampler` keeps rates of: each queue's counters and depths."""
    values: dict[Any, float] = {}
    for host in broker_status.get("vhosts", []):
        for q in host.get("queues", []):
            key = (host["name"], q["name"])
            for name, value in q.get("stats", {}).items():
                values[(*key, name)] = value
            for name, value in _depths(q).items():
                values[(*key, name)] = value
    return values


def _depths(q: dict[str, Any]) -> dict[str, int]:
    ready, unacked = q.get("messages", 0), q.get("unacked", 0)
    return {
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
    }


def _details(rate: float) -> dict[str, float]:
    return {"rate": rate}


def _message_stats(totals: dict[str, int], rate_of: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in STATS:
        out[name] = totals.get(name, 0)
        out[f"{name}_details"] = _details(rate_of(name))
    return out


def queue_views(
    status: dict[str, Any], rates: RateSampler, vhost: str | None = None
) -> list[dict[str, Any]]:
    """``GET /api/queues`` (every vhost) or ``/api/queues/{vhost}``."""
    node = status.get("node_id", "")
    out = []
    for host in status.get("vhosts", []):
        if vhost is not None and host["name"] != vhost:
            continue
        for q in host.get("queues", []):
            out.append(_queue_view(host["name"], q, node, rates))
    return out


def _queue_view(vhost: str, q: dict[str, Any], node: str, rates: RateSampler) -> dict[str, Any]:
    key = (vhost, q["name"])
    view: dict[str, Any] = {
        "name": q["name"],
        "vhost": vhost,
        "type": q.get("type", "classic"),
        "durable": q.get("durable", False),
        "auto_delete": q.get("auto_delete", False),
        "exclusive": q.get("exclusive", False),
        "arguments": q.get("arguments", {}),
        "node": node,
        "state": "running",
        "consumers": q.get("consumers", 0),
    }
    for name, value in _depths(q).items():
        view[name] = value
        view[f"{name}_details"] = _details(rates.rate((*key, name), counter=False))
    view["message_stats"] = _message_stats(
        q.get("stats", {}), lambda name: rates.rate((*key, name))
    )
    for extra in ("persistent", "first_offset", "next_offset", "bytes"):
        if extra in q:
            view[extra] = q[extra]
    return view


def exchange_views(status: dict[str, Any], vhost: str | None = None) -> list[dict[str, Any]]:
    """``GET /api/exchanges`` (every vhost) or ``/api/exchanges/{vhost}``."""
    out = []
    for host in status.get("vhosts", []):
        if vhost is not None and host["name"] != vhost:
            continue
        for ex in host.get("exchanges", []):
            out.append(
                {
                    "name": ex["name"],
                    "vhost": host["name"],
                    "type": ex.get("type", "direct"),
                    "durable": ex.get("durable", False),
                    "auto_delete": ex.get("auto_delete", False),
                    "internal": ex.get("internal", False),
                    "arguments": {},
                    "user_who_performed_action": "",
                }
            )
    return out


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's name for one binding between a source and a destination: the
    routing key when there are no arguments, else the key, ``~`` and a digest of
    the arguments (as RabbitMQ, a value to copy, not to compute)."""
    if not arguments:
        return routing_key or "~"
    digest = hashlib.sha256(
        json.dumps(arguments, sort_keys=True, default=repr).encode()
    ).hexdigest()
    return f"{routing_key}~{digest[:16]}"


def binding_views(status: dict[str, Any], vhost: str | None = None) -> list[dict[str, Any]]:
    """``GET /api/bindings`` (every vhost) or ``/api/bindings/{vhost}``: the default
    exchange's implicit binding of every queue first, as RabbitMQ lists them."""
    out = []
    for host in status.get("vhosts", []):
        if vhost is not None and host["name"] != vhost:
            continue
        name = host["name"]
        for q in host.get("queues", []):
            out.append(_binding(name, "", q["name"], q["name"], {}))
        for ex in host.get("exchanges", []):
            if not ex["name"]:
                continue
            for b in ex.get("bindings", []):
                out.append(_binding(name, ex["name"], b["queue"], b["key"], b["arguments"]))
    return out


def _binding(
    vhost: str, source: str, queue: str, key: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    return {
        "source": source,
        "vhost": vhost,
        "destination": queue,
        "destination_type": "queue",
        "routing_key": key,
        "arguments": arguments,
        "properties_key": properties_key(key, arguments),
    }


def vhost_views(status: dict[str, Any], rates: RateSampler) -> list[dict[str, Any]]:
    """``GET /api/vhosts``: per vhost the totals of its queues."""
    out = []
    for host in status.get("vhosts", []):
        queues = queue_views(status, rates, host["name"])
        view: dict[str, Any] = {
            "name": host["name"],
            "description": "",
            "tags": [],
            "default_queue_type": "classic",
            "tracing": bool(status.get("trace", False)),
            "cluster_state": {status.get("node_id", ""): "running"},
        }
        view.update(_totals(queues))
        out.append(view)
    return out


def _totals(queues: list[dict[str, Any]]) -> dict[str, Any]:
    """Depths, depth rates and message_stats summed over ``queues``."""
    out: dict[str, Any] = {}
    for name in DEPTHS:
        out[name] = sum(q[name] for q in queues)
        out[f"{name}_details"] = _details(
            round(sum(q[f"{name}_details"]["rate"] for q in queues), 3)
        )
    stats: dict[str, Any] = {}
    for name in STATS:
        stats[name] = sum(q["message_stats"][name] for q in queues)
        stats[f"{name}_details"] = _details(
            round(sum(q["message_stats"][f"{name}_details"]["rate"] for q in queues), 3)
        )
    out["message_stats"] = stats
    return out


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") else host
    return host, int(port) if port.isdigit() else 0


def listeners(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The node's listeners as ``overview.listeners`` lists them."""
    node = status.get("node_id", "")
    out = []
    for key, protocol in (("listen", "amqlite"), ("amqp_listen", "amqp"), ("http_listen", "http")):
        address = status.get(key)
        if address:
            host, port = _split_address(address)
            out.append({"node": node, "protocol": protocol, "ip_address": host, "port": port})
    return out


_PROTOCOL_NAMES = {
    "amqp-0-9-1": "AMQP 0-9-1",
    "browser-ws": "amqlite WebSocket",
    "browser-poll": "amqlite long polling",
}


def connection_views(status: dict[str, Any]) -> list[dict[str, Any]]:
    """``GET /api/connections``: client connections (native and AMQP 0-9-1)."""
    node = status.get("node_id", "")
    listen = status.get("listen", "")
    started = status.get("started_at", 0.0) + status.get("uptime_s", 0.0)
    out = []
    for c in status.get("connections", []):
        host, port = _split_address(c.get("remote", ""))
        protocol = c.get("protocol", "")
        amqp = protocol == "amqp-0-9-1"
        browser = protocol.startswith("browser-")
        local = status.get("amqp_listen") if amqp else listen
        if browser:
            local = status.get("http_listen") or listen
        out.append(
            {
                "name": f"{c.get('remote', '')} -> {local}",
                "node": node,
                "user": c.get("user", ""),
                "vhost": c.get("vhost", ""),
                "peer_host": host,
                "peer_port": port,
                "protocol": _PROTOCOL_NAMES.get(protocol, "amqlite"),
                "channels": c.get("channels", 1),
                "state": "blocked" if c.get("blocked") else "running",
                "connected_at": round((started - c.get("since_s", 0.0)) * 1000),
                "client_properties": {"connection_name": c.get("client", "")},
                **({"blocked_reason": c["blocked"]} if c.get("blocked") else {}),
            }
        )
    return out


def node_view(status: dict[str, Any]) -> dict[str, Any]:
    """One entry of ``GET /api/nodes``: RabbitMQ's memory and disk fields, plus
    amqlite's HA state (``ha``, monitoring users only) and journal."""
    limits = status.get("limits", {})
    memory, disk = limits.get("memory", {}), limits.get("disk", {})
    alarms = status.get("alarms", [])
    view: dict[str, Any] = {
        "name": status.get("node_id", ""),
        "type": "disc",
        "running": True,
        "uptime": round(status.get("uptime_s", 0.0) * 1000),
        "mem_used": memory.get("used"),
        "mem_limit": memory.get("high_watermark"),
        "mem_alarm": "memory" in alarms,
        "disk_free": disk.get("free"),
        "disk_free_limit": disk.get("free_limit"),
        "disk_free_alarm": "disk" in alarms,
        "partitions": [],
        "state": status.get("state", ""),
        "version": status.get("version", ""),
    }
    if "ha" in status:
        view["ha"] = status["ha"]
    if "storage" in status:
        view["journal"] = status["storage"]
    return view


def overview(status: dict[str, Any], rates: RateSampler, user: str) -> dict[str, Any]:
    """``GET /api/overview``."""
    queues = queue_views(status, rates)
    totals = _totals(queues)
    vhosts = status.get("vhosts", [])
    view: dict[str, Any] = {
        "management_version": status.get("version", ""),
        "product_name": "amqlite",
        "product_version": status.get("version", ""),
        "node": status.get("node_id", ""),
        "cluster_name": status.get("node_id", ""),
        "state": status.get("state", ""),
        "user": user,
        "listeners": listeners(status),
        "message_stats": totals["message_stats"],
        "queue_totals": {k: v for k, v in totals.items() if k != "message_stats"},
        "object_totals": {
            "connections": len(status.get("connections", [])),
            "channels": sum(c.get("channels", 1) for c in status.get("connections", [])),
            "exchanges": sum(len(h.get("exchanges", [])) for h in vhosts),
            "queues": len(queues),
            "consumers": sum(q["consumers"] for q in queues),
        },
        "alarms": status.get("alarms", []),
    }
    if "ha" in status:
        view["ha"] = _ha_summary(status["ha"])
    if "links" in status:
        view["links"] = len(status["links"])
    return view


def _ha_summary(ha: dict[str, Any]) -> dict[str, Any]:
    keys = ("role", "state", "epoch", "peer_state", "peer_alive", "link_up")
    return {k: ha[k] for k in keys if k in ha}
