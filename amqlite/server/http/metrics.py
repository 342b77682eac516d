"""``GET /metrics``: the node in Prometheus's text format.

Built at each scrape from the node's status by a custom collector on a private
registry (nothing global), plus prometheus-client's process collector (RSS, CPU
seconds, open files) on Linux. Names follow RabbitMQ's Prometheus plugin with
``amqlite_`` for ``rabbitmq_``, and so do the labels: ``vhost`` and ``queue``
per queue, ``vhost``, ``exchange`` and ``link`` per peering link end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ..context import NodeView

__all__ = ["CONTENT_TYPE", "NodeMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_QUEUE_GAUGES = (
    ("queue_messages_ready", "messages ready to be delivered", "messages"),
    ("queue_messages_unacked", "messages delivered and not yet acknowledged", "unacked"),
    ("queue_consumers", "consumers on the queue", "consumers"),
)
_QUEUE_COUNTERS = (
    ("queue_messages_published", "messages the queue took", "publish"),
    ("queue_messages_delivered", "messages delivered or got (redeliveries too)", "deliver_get"),
    ("queue_messages_redelivered", "messages delivered again", "redeliver"),
    ("queue_messages_acked", "deliveries acknowledged", "ack"),
)
_LINK_GAUGES = (
    ("peering_link_lag_messages", "messages accepted and not yet acknowledged", "lag_messages"),
    ("peering_link_lag_seconds", "age of the oldest unacknowledged message", "lag_seconds"),
    ("peering_link_in_flight", "messages sent and not yet acknowledged", "in_flight"),
    ("peering_link_buffered_bytes", "bytes held in the link's sending log", "buffered_bytes"),
)
_LINK_COUNTERS = (
    ("peering_link_forwarded", "messages sent over the link", "forwarded"),
    ("peering_link_received", "messages received over the link", "received"),
    ("peering_link_duplicates_dropped", "duplicates dropped at the receiver", "duplicates_dropped"),
    ("peering_link_loops_dropped", "messages dropped because they looped", "loops_dropped"),
    (
        "peering_link_overflow_dropped",
        "messages dropped by the overflow policy",
        "overflow_dropped",
    ),
    ("peering_link_reconnects", "reconnections", "reconnects"),
)
_HA_STATES = ("primary", "backup", "active", "passive")


class _NodeCollector(Collector):
    def __init__(self, node: NodeView) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        status = self.node.status()
        yield from _identity(status)
        yield from _queues(status)
        yield from _connections(status)
        yield from _alarms(status)
        yield from _journal(self.node, status)
        yield from _ha(status)
        yield from _links(status)


def _identity(status: dict[str, Any]) -> Iterator[Metric]:
    info = InfoMetricFamily("amqlite_identity", "the node: its id, version and state")
    info.add_metric(
        [],
        {
            "node": status.get("node_id", ""),
            "version": status.get("version", ""),
            "state": status.get("state", ""),
        },
    )
    yield info
    uptime = GaugeMetricFamily("amqlite_uptime_seconds", "seconds since the node started")
    uptime.add_metric([], status.get("uptime_s", 0.0))
    yield uptime


def _queues(status: dict[str, Any]) -> Iterator[Metric]:
    labels = ["vhost", "queue"]
    gauges = {
        key: GaugeMetricFamily(f"amqlite_{name}", text, labels=labels)
        for name, text, key in _QUEUE_GAUGES
    }
    total = GaugeMetricFamily(
        "amqlite_queue_messages", "messages ready and unacknowledged", labels=labels
    )
    counters = {
        key: CounterMetricFamily(f"amqlite_{name}", text, labels=labels)
        for name, text, key in _QUEUE_COUNTERS
    }
    for host in status.get("vhosts", []):
        for q in host.get("queues", []):
            values = [host["name"], q["name"]]
            for key, family in gauges.items():
                family.add_metric(values, q.get(key, 0))
            total.add_metric(values, q.get("messages", 0) + q.get("unacked", 0))
            stats = q.get("stats", {})
            for key, counter in counters.items():
                counter.add_metric(values, stats.get(key, 0))
    yield from gauges.values()
    yield total
    yield from counters.values()


def _connections(status: dict[str, Any]) -> Iterator[Metric]:
    family = GaugeMetricFamily("amqlite_connections", "open client connections")
    family.add_metric([], len(status.get("connections", [])))
    yield family


def _alarms(status: dict[str, Any]) -> Iterator[Metric]:
    raised = status.get("alarms", [])
    for name, alarm, text in (
        ("alarms_memory_used_watermark", "memory", "1 while the memory alarm is raised"),
        ("alarms_free_disk_space_watermark", "disk", "1 while the disk alarm is raised"),
    ):
        family = GaugeMetricFamily(f"amqlite_{name}", text)
        family.add_metric([], 1 if alarm in raised else 0)
        yield family
    memory = status.get("limits", {}).get("memory", {})
    if memory.get("high_watermark") is not None:
        family = GaugeMetricFamily(
            "amqlite_resident_memory_limit_bytes", "the memory high watermark in bytes"
        )
        family.add_metric([], memory["high_watermark"])
        yield family


def _journal(node: NodeView, status: dict[str, Any]) -> Iterator[Metric]:
    storage = status.get("storage", {})
    if not storage.get("persist"):
        return
    for name, key, text in (
        ("journal_bytes", "journal_bytes", "bytes in the journal's segment files"),
        ("journal_segments", "segments", "segment files"),
        ("journal_live_messages", "live_messages", "persistent messages the journal holds"),
        ("journal_held_replies", "held_replies", "replies waiting for the durability barrier"),
    ):
        family = GaugeMetricFamily(f"amqlite_{name}", text)
        family.add_metric([], storage.get(key) or 0)
        yield family
    errors = CounterMetricFamily("amqlite_journal_write_errors", "failed journal writes")
    errors.add_metric([], storage.get("write_errors", 0))
    yield errors
    if node.storage is not None:
        times = node.storage.commit_times
        histogram = HistogramMetricFamily(
            "amqlite_journal_commit_seconds", "time of one journal commit (write and fsync)"
        )
        histogram.add_metric([], [(le, float(n)) for le, n in times.buckets()], times.sum)
        yield histogram


def _ha(status: dict[str, Any]) -> Iterator[Metric]:
    ha = status.get("ha")
    if not ha or "state" not in ha:
        return
    state = GaugeMetricFamily(
        "amqlite_ha_state", "1 for the node's HA state, 0 for the others", labels=["state"]
    )
    for name in _HA_STATES:
        state.add_metric([name], 1 if ha.get("state") == name else 0)
    yield state
    epoch = GaugeMetricFamily(
        "amqlite_ha_epoch", "the pair's epoch: one more at every promotion (failover)"
    )
    epoch.add_metric([], ha.get("epoch", 0))
    yield epoch
    for name, key, text in (
        ("ha_peer_alive", "peer_alive", "1 while the peer's heartbeats arrive"),
        ("ha_link_up", "link_up", "1 while the peer link is up"),
        ("ha_replication_lag_records", "replication_lag_records", "records the peer lacks"),
    ):
        family = GaugeMetricFamily(f"amqlite_{name}", text)
        family.add_metric([], float(ha.get(key) or 0))
        yield family


def _links(status: dict[str, Any]) -> Iterator[Metric]:
    labels = ["vhost", "exchange", "link"]
    gauges: list[tuple[str, GaugeMetricFamily | CounterMetricFamily]] = [
        (key, GaugeMetricFamily(f"amqlite_{name}", text, labels=labels))
        for name, text, key in _LINK_GAUGES
    ]
    counters: list[tuple[str, GaugeMetricFamily | CounterMetricFamily]] = [
        (key, CounterMetricFamily(f"amqlite_{name}", text, labels=labels))
        for name, text, key in _LINK_COUNTERS
    ]
    up = GaugeMetricFamily("amqlite_peering_link_up", "1 while the link is up", labels=labels)
    for link in status.get("links", []):
        values = [link.get("vhost", ""), link.get("exchange", ""), str(link.get("link", ""))]
        for key, family in (*gauges, *counters):
            family.add_metric(values, float(link.get(key) or 0))
        up.add_metric(values, 1 if link.get("state") == "up" else 0)
    yield from (family for _, family in gauges)
    yield from (family for _, family in counters)
    yield up


class NodeMetrics:
    """One node's registry; :meth:`exposition` renders a scrape."""

    def __init__(self, node: NodeView) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(node))
        ProcessCollector(namespace="", registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
