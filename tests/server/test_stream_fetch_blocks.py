"""``stream.fetch`` answered from kept block replies (``amqlite.broker.stream``'s
``FETCH_BLOCK``) gives exactly the records the stream holds, as the per-record
path does: any order of fetches, retention, a block too large for one reply."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.auth import AuthenticatedUser, Permissions
from amqlite.broker import Broker, Message
from amqlite.broker import stream as stream_module
from amqlite.client.bulk import FETCH_BLOCK, StreamBatch
from amqlite.protocol import events as ev
from amqlite.server.dispatch import RequestDispatcher

_message = st.tuples(
    st.sampled_from(["a", "clé", ""]),
    st.binary(max_size=30),
    st.one_of(st.just({}), st.dictionaries(st.sampled_from(["h", "n"]), st.integers(0, 9))),
)


def _setup(messages: list[Any], max_length: int | None) -> tuple[Broker, RequestDispatcher]:
    broker = Broker()
    s = broker.open_session("/")
    d = RequestDispatcher(s, AuthenticatedUser("guest", Permissions.full()), "/", lambda: {})
    arguments: dict[str, Any] = {"x-queue-type": "stream"}
    if max_length is not None:
        arguments["x-max-length"] = max_length
    s.declare_queue("s", durable=True, arguments=arguments)
    for key, body, headers in messages:
        s.publish(Message("", "s", body, dict(headers), {}), now=0.0)
        s.publish(Message("", "s", body, {}, {"message_id": key} if key else {}), now=0.0)
    return broker, d


def _expected(broker: Broker) -> dict[int, tuple[Any, ...]]:
    q = broker.vhost("/").queues["s"]  # type: ignore[union-attr]
    assert isinstance(q, stream_module.StreamQueue)
    log = q._log[q._head :]
    return {
        q.first + i: (q.first + i, m.exchange, m.routing_key, m.body, m.headers, m.properties)
        for i, m in enumerate(log)
    }


@settings(max_examples=120, deadline=None)
@given(
    messages=st.lists(_message, max_size=25),
    max_length=st.one_of(st.none(), st.integers(1, 30)),
    fetches=st.lists(
        st.tuples(
            st.integers(0, 60),
            st.one_of(st.none(), st.integers(0, 70)),
            st.sampled_from([1, 60, 400, 1 << 20]),
        ),
        max_size=12,
    ),
    block=st.sampled_from([2, 4, 7]),
    reply_limit=st.sampled_from([1500, 1 << 20]),
)
def test_block_replies_hold_exactly_the_stored_records(
    messages: list[Any],
    max_length: int | None,
    fetches: list[tuple[int, int | None, int]],
    block: int,
    reply_limit: int,
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stream_module, "FETCH_BLOCK", block)
        broker, d = _setup(messages, max_length)
        d.max_reply_bytes = reply_limit
        stored = _expected(broker)
        q = broker.vhost("/").queues["s"]  # type: ignore[union-attr]
        assert isinstance(q, stream_module.StreamQueue)
        for n, (start, end, budget) in enumerate(fetches * 2):  # twice: the kept blocks
            if end is not None and end < start:
                continue
            reply = d.handle(ev.StreamFetch(n, "s", start, end, budget), 0.0)
            assert isinstance(reply, ev.StreamRecords)
            batch = StreamBatch(reply)
            hi = q.next if end is None else min(end, q.next)
            assert batch.first == max(start, q.first) or batch.count == 0
            assert (reply.re, batch.kept_first, batch.kept_next) == (n, q.first, q.next)
            assert batch.dropped == max(0, (q.first if end is None else min(end, q.first)) - start)
            assert list(batch.rows()) == [stored[o] for o in range(batch.first, batch.next)]
            assert batch.next <= max(hi, batch.first)
            if batch.first < hi:
                assert batch.count >= 1  # something readable: at least one record
        # read the whole stream front to back: every record once
        at, seen = 0, []
        while (reply := d.handle(ev.StreamFetch(0, "s", at, None, 1 << 20), 0.0)).count:  # type: ignore[union-attr]
            b = StreamBatch(reply)  # type: ignore[arg-type]
            seen.extend(b.rows())
            at = b.next
        assert seen == list(stored.values())
        assert q.blocks_bytes == sum(size for _, size in q.blocks.values())


def test_a_fetch_from_inside_a_block_stops_at_its_end_and_the_next_is_kept() -> None:
    broker, d = _setup([("a", b"x" * 10, {})] * 8192, None)  # 16,384 records: 2 blocks
    q = broker.vhost("/").queues["s"]  # type: ignore[union-attr]
    assert isinstance(q, stream_module.StreamQueue)
    first = d.handle(ev.StreamFetch(1, "s", 100, None, 1 << 22), 0.0)
    assert isinstance(first, ev.StreamRecords)
    assert (first.first, first.count) == (100, FETCH_BLOCK - 100)
    assert not q.blocks
    second = d.handle(ev.StreamFetch(2, "s", FETCH_BLOCK, None, 1 << 22), 0.0)
    assert isinstance(second, ev.StreamRecords) and second.count == FETCH_BLOCK
    assert list(q.blocks) == [1]
    again = d.handle(ev.StreamFetch(3, "s", FETCH_BLOCK, None, 1 << 22), 0.0)
    assert again == dataclasses.replace(second, re=3)
    small = d.handle(ev.StreamFetch(4, "s", FETCH_BLOCK, None, 1000), 0.0)
    assert isinstance(small, ev.StreamRecords) and 0 < small.count < FETCH_BLOCK  # the budget


def test_client_and_broker_agree_on_the_block() -> None:
    assert FETCH_BLOCK == stream_module.FETCH_BLOCK


def _fields(r: ev.StreamRecords) -> dict[str, Any]:
    return {name: getattr(r, name) for name in r.__dataclass_fields__}


def test_kept_replies_show_in_the_status_and_go_when_memory_is_short() -> None:
    """The kept block replies are a cache: the stream's status counts their bytes,
    and the memory alarm's paging (``Broker.page_out``) drops them (a later fetch
    makes them again, the same)."""
    broker, d = _setup([("a", b"x" * 10, {})] * 4096, None)  # 8,192 records: 1 block
    q = broker.vhost("/").queues["s"]  # type: ignore[union-attr]
    assert isinstance(q, stream_module.StreamQueue)
    first = d.handle(ev.StreamFetch(1, "s", 0, None, 1 << 22), 0.0)
    assert isinstance(first, ev.StreamRecords) and list(q.blocks) == [0]
    (vhost,) = broker.status()["vhosts"]
    (status,) = [s for s in vhost["queues"] if s["name"] == "s"]
    assert status["fetch_cache_bytes"] == q.blocks_bytes > 0
    broker.page_out()
    assert not q.blocks and q.blocks_bytes == 0
    again = d.handle(ev.StreamFetch(2, "s", 0, None, 1 << 22), 0.0)
    assert again == dataclasses.replace(first, re=2)
    assert list(q.blocks) == [0]
