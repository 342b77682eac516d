"""The HTTP side's pure pieces: rates, the status -> RabbitMQ JSON mapping, the
message JSON, the credential cache and the commit-time histogram."""

from __future__ import annotations

import base64

import pytest

from amqlite.server.http.login import CredentialCache, SessionStore
from amqlite.server.http.messages import BadMessage, message_json, publish_fields
from amqlite.server.http.rates import RateSampler
from amqlite.server.http.views import (
    binding_views,
    connection_views,
    properties_key,
    queue_views,
    rate_sample,
    vhost_views,
)
from amqlite.server.storage import LatencyHistogram

STATUS = {
    "node_id": "n1",
    "listen": "127.0.0.1:5555",
    "amqp_listen": "127.0.0.1:5672",
    "started_at": 1000.0,
    "uptime_s": 10.0,
    "vhosts": [
        {
            "name": "/",
            "exchanges": [
                {"name": "", "type": "direct", "bindings": []},
                {
                    "name": "logs",
                    "type": "headers",
                    "bindings": [
                        {"queue": "q", "key": "", "arguments": {"x-match": "any", "h": 1}}
                    ],
                },
            ],
            "queues": [
                {
                    "name": "q",
                    "messages": 4,
                    "unacked": 1,
                    "consumers": 2,
                    "stats": {"publish": 10, "deliver_get": 6, "redeliver": 1, "ack": 5},
                }
            ],
        }
    ],
    "connections": [
        {"remote": "127.0.0.1:40000", "user": "u", "vhost": "/", "client": "c", "since_s": 4.0},
        {
            "remote": "[::1]:40001",
            "user": "u",
            "vhost": "/",
            "client": "",
            "protocol": "amqp-0-9-1",
            "channels": 3,
            "since_s": 1.0,
            "blocked": "memory",
        },
    ],
}


def test_rates_are_the_change_per_second_between_the_last_two_samples() -> None:
    rates = RateSampler()
    rates.observe(0.0, {"a": 10, "d": 5})
    assert rates.rate("a") == 0.0  # one sample: no rate yet
    rates.observe(5.0, {"a": 60, "d": 0})
    assert rates.rate("a") == 10.0
    assert rates.rate("d") == 0.0  # a counter never goes backwards
    assert rates.rate("d", counter=False) == -1.0  # a depth may
    rates.observe(10.0, {"b": 1})
    assert rates.rate("a") == 0.0 and rates.rate("b") == 0.0


def test_queue_view_counts_and_rates() -> None:
    rates = RateSampler()
    rates.observe(0.0, rate_sample(STATUS))
    later = {**STATUS["vhosts"][0]["queues"][0], "stats": {"publish": 20}, "messages": 9}
    rates.observe(2.0, rate_sample({"vhosts": [{"name": "/", "exchanges": [], "queues": [later]}]}))
    (q,) = queue_views(STATUS, rates)
    assert (q["messages"], q["messages_ready"], q["messages_unacknowledged"]) == (5, 4, 1)
    assert q["message_stats"]["publish"] == 10
    assert q["message_stats"]["publish_details"] == {"rate": 5.0}
    assert q["messages_ready_details"] == {"rate": 2.5}
    assert q["node"] == "n1" and q["consumers"] == 2
    (vhost,) = vhost_views(STATUS, rates)
    assert vhost["messages"] == 5 and vhost["message_stats"]["ack"] == 5


def test_bindings_list_the_default_exchanges_implicit_ones_first() -> None:
    bindings = binding_views(STATUS)
    assert [(b["source"], b["destination"], b["routing_key"]) for b in bindings] == [
        ("", "q", "q"),
        ("logs", "q", ""),
    ]
    assert bindings[0]["properties_key"] == "q"
    key = bindings[1]["properties_key"]
    assert key.startswith("~") and key == properties_key("", {"h": 1, "x-match": "any"})
    assert key != properties_key("", {"h": 2, "x-match": "any"})


def test_connection_views() -> None:
    native, amqp = connection_views(STATUS)
    assert native["name"] == "127.0.0.1:40000 -> 127.0.0.1:5555"
    assert (native["peer_host"], native["peer_port"]) == ("127.0.0.1", 40000)
    assert native["protocol"] == "amqlite" and native["state"] == "running"
    assert native["connected_at"] == 1006000
    assert amqp["name"] == "[::1]:40001 -> 127.0.0.1:5672"
    assert amqp["peer_host"] == "::1" and amqp["channels"] == 3
    assert amqp["protocol"] == "AMQP 0-9-1" and amqp["state"] == "blocked"


def test_publish_fields_map_rabbitmqs_properties() -> None:
    key, body, headers, props = publish_fields(
        {
            "routing_key": "k",
            "payload": base64.b64encode(b"\x00\xff").decode(),
            "payload_encoding": "base64",
            "properties": {
                "delivery_mode": 2,
                "expiration": "1500",
                "timestamp": 7,
                "priority": 3,
                "message_id": "m",
                "headers": {"a": 1},
            },
        }
    )
    assert (key, body, headers) == ("k", b"\x00\xff", {"a": 1})
    assert props == {
        "message_id": "m",
        "persistent": True,
        "priority": 3,
        "expiration": 1500,
        "timestamp": 7000,
    }
    shown = message_json(
        exchange="",
        routing_key="k",
        body=body,
        headers=headers,
        props=props,
        redelivered=False,
        remaining=0,
    )
    assert shown["payload_encoding"] == "base64"  # not UTF-8
    assert shown["properties"] == {
        "message_id": "m",
        "delivery_mode": 2,
        "priority": 3,
        "expiration": "1500",
        "timestamp": 7,
        "headers": {"a": 1},
    }


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"routing_key": 1},
        {"payload_encoding": "hex"},
        {"properties": {"colour": "red"}},
        {"properties": {"expiration": 100}},
        {"properties": {"timestamp": "now"}},
        {"properties": {"priority": "high"}},
        {"properties": {"headers": {"nested": {"a": 1}}}},
    ],
)
def test_publish_fields_refuse_what_is_no_message(body: object) -> None:
    with pytest.raises(BadMessage):
        publish_fields(body)


def test_credential_cache_forgets_after_its_time() -> None:
    cache = CredentialCache(ttl=10.0, size=2)
    cache.remember("u", "pw", now=0.0)
    assert cache.known("u", "pw", now=5.0)
    assert not cache.known("u", "other", now=5.0)
    assert not cache.known("u", "pw", now=11.0)
    for n in range(5):  # bounded
        cache.remember(f"u{n}", "pw", now=20.0)
    assert len(cache._until) <= 2


def test_latency_histogram_buckets_are_cumulative() -> None:
    histogram = LatencyHistogram()
    for seconds in (0.00005, 0.002, 0.002, 30.0):
        histogram.observe(seconds)
    buckets = dict(histogram.buckets())
    assert buckets["0.0001"] == 1 and buckets["0.0025"] == 3 and buckets["10.0"] == 3
    assert buckets["+Inf"] == 4 and histogram.count == 4


def test_sessions_idle_out_and_stay_bounded() -> None:
    sessions = SessionStore(idle=10.0, size=2)
    token = sessions.open("u", now=0.0)
    assert sessions.login(token, now=9.0) == "u"  # use moves the deadline on
    assert sessions.login(token, now=18.0) == "u"
    assert sessions.login(token, now=29.0) is None
    assert sessions.login("made-up", now=0.0) is None
    first = sessions.open("a", now=30.0)
    second = sessions.open("b", now=30.0)
    third = sessions.open("c", now=30.0)
    assert sessions.login(first, now=31.0) is None  # the oldest went
    assert sessions.login(second, now=31.0) == "b" and sessions.login(third, now=31.0) == "c"
    sessions.close(third)
    assert sessions.login(third, now=31.0) is None
