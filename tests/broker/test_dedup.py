"""Publish keys: a publish sent again (same key) is routed once, and the key
survives the journal (docs/protocol.md, "Publishes sent again")."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker, Message, PublishOutcome, Session
from amqlite.broker.dedup import PublishKeys
from amqlite.store import StoreState
from amqlite.store.records import MessageEnqueue, Record, StreamAppend

from .support import drain


def keyed(key: str, body: bytes = b"m", exchange: str = "", routing_key: str = "q") -> Message:
    message = Message(exchange, routing_key, body, None, {"persistent": True})
    message.publish_key = key
    return message


def duplicates(broker: Broker, vhost: str = "/") -> int:
    host = broker.vhost(vhost)
    assert host is not None
    return host.publish_keys.duplicates


def follower(records: list[Record]) -> Session:
    """A session on a broker rebuilt from ``records`` (as after a restart, or on a
    passive HA node)."""
    state = StoreState()
    for r in records:
        state.apply(r)
    broker = Broker()
    broker.apply(state.snapshot(), now=0)
    return broker.open_session()


def test_a_key_seen_before_is_not_routed_again() -> None:
    broker = Broker()
    s = broker.open_session()
    s.declare_queue("q")
    assert s.publish(keyed("c1:1", b"a"), now=0) is PublishOutcome.ROUTED
    assert s.publish(keyed("c1:1", b"a"), now=0) is PublishOutcome.DUPLICATE
    assert s.publish(keyed("c1:2", b"b"), now=0) is PublishOutcome.ROUTED
    assert s.publish(Message("", "q", b"plain"), now=0) is PublishOutcome.ROUTED
    assert s.publish(Message("", "q", b"plain"), now=0) is PublishOutcome.ROUTED  # no key
    assert drain(s, "q") == [b"a", b"b", b"plain", b"plain"]
    assert duplicates(broker) == 1
    assert broker.status()["vhosts"][0]["duplicate_publishes"] == 1


def test_the_key_is_remembered_after_the_message_is_consumed() -> None:
    """A publish whose confirm was lost may be sent again after its message was
    consumed and acked: it must not come back."""
    broker = Broker()
    s = broker.open_session()
    s.declare_queue("q")
    s.publish(keyed("c1:1"), now=0)
    assert drain(s, "q") == [b"m"]
    assert s.publish(keyed("c1:1"), now=0) is PublishOutcome.DUPLICATE
    assert drain(s, "q") == []


def test_an_unroutable_publish_is_not_remembered() -> None:
    broker = Broker()
    s = broker.open_session()
    s.declare_exchange("ex", "direct")
    assert s.publish(keyed("c1:1", exchange="ex", routing_key="k"), now=0) is (
        PublishOutcome.UNROUTABLE
    )
    s.declare_queue("q")
    s.bind("q", "ex", "k")
    assert s.publish(keyed("c1:1", exchange="ex", routing_key="k"), now=0) is (
        PublishOutcome.ROUTED
    )
    assert drain(s, "q") == [b"m"]


def test_keys_are_per_vhost() -> None:
    broker = Broker(vhosts=("/", "other"))
    for vhost in ("/", "other"):
        s = broker.open_session(vhost)
        s.declare_queue("q")
        assert s.publish(keyed("c1:1"), now=0) is PublishOutcome.ROUTED
        assert drain(s, "q") == [b"m"]


def test_the_window_forgets_the_oldest_key_first() -> None:
    keys = PublishKeys(capacity=2)
    for k in ("a", "b", "a", "c"):
        keys.add(k)
    assert "a" not in keys and "b" in keys and "c" in keys and len(keys) == 2
    with pytest.raises(ValueError, match="at least 1"):
        PublishKeys(capacity=0)


def test_a_node_that_replays_the_journal_knows_the_keys() -> None:
    """The key is recorded with a persistent message; a node rebuilt from the
    records (a restart, or a passive HA node taking over) answers DUPLICATE."""
    records: list[Record] = []
    broker = Broker(record=records.append)
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    s.publish(keyed("c1:7", b"held"), now=0)
    enqueues = [r for r in records if isinstance(r, MessageEnqueue)]
    assert [r.publish_key for r in enqueues] == ["c1:7"]

    f = follower(records)
    assert f.publish(keyed("c1:7", b"held"), now=0) is PublishOutcome.DUPLICATE
    assert f.publish(keyed("c1:8", b"new"), now=0) is PublishOutcome.ROUTED
    assert drain(f, "q") == [b"held", b"new"]


def test_a_stream_append_carries_its_key_through_the_journal() -> None:
    records: list[Record] = []
    broker = Broker(record=records.append)
    s = broker.open_session()
    s.declare_queue("s", durable=True, arguments={"x-queue-type": "stream"})
    assert s.publish(keyed("c1:1", routing_key="s"), now=0) is PublishOutcome.ROUTED
    assert s.publish(keyed("c1:1", routing_key="s"), now=0) is PublishOutcome.DUPLICATE
    appends = [r for r in records if isinstance(r, StreamAppend)]
    assert [(r.offset, r.publish_key) for r in appends] == [(0, "c1:1")]
    f = follower(records)
    assert f.publish(keyed("c1:1", routing_key="s"), now=0) is PublishOutcome.DUPLICATE
    assert f.publish(keyed("c1:2", routing_key="s"), now=0) is PublishOutcome.ROUTED


def _model_add(model: OrderedDict[str, int], capacity: int, key: str, position: int) -> None:
    """The window as an OrderedDict (what PublishKeys kept before): a key not held
    goes in last; past ``capacity`` the oldest goes."""
    if key in model:
        return
    model[key] = position
    if len(model) > capacity:
        model.popitem(last=False)


@settings(max_examples=300, deadline=None, database=None)
@given(
    capacity=st.integers(1, 6),
    ops=st.lists(
        st.tuples(
            st.booleans(),  # add_many (else add)
            st.lists(st.sampled_from("abcdefghij"), min_size=1, max_size=5),
            st.integers(-1, 50),
        ),
        max_size=30,
    ),
)
def test_the_window_holds_what_an_ordered_dict_model_holds(
    capacity: int, ops: list[tuple[bool, list[str], int]]
) -> None:
    keys = PublishKeys(capacity)
    model: OrderedDict[str, int] = OrderedDict()
    for many, batch, position in ops:
        if many:
            keys.add_many(batch, position)
        else:
            for key in batch:
                keys.add(key, position)
        for key in batch:  # add_many is add of each, in order
            _model_add(model, capacity, key, position)
        assert list(keys.known.items()) == list(model.items())
        assert len(keys) == len(model)
        for key in "abcdefghij":
            assert (key in keys) == (key in model)
            assert keys.position(key) == model.get(key, 0)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 5),
    st.lists(st.tuples(st.sampled_from("abcdefg"), st.booleans()), max_size=40),
)
def test_a_publish_adds_its_key_as_publish_keys_add_does(
    capacity: int, publishes: list[tuple[str, bool]]
) -> None:
    """``VirtualHost.publish`` adds a routed message's key inline: the window it
    leaves is the one :meth:`PublishKeys.add` leaves, at the same positions."""
    positions = iter(range(1, 10_000))
    broker = Broker(record=lambda record: next(positions))
    host = broker.vhost("/")
    assert host is not None and host.recorder is not None
    host.publish_keys = PublishKeys(capacity)
    s = broker.open_session()
    s.declare_queue("q", durable=True)
    model = PublishKeys(capacity)
    for key, routable in publishes:
        outcome = s.publish(keyed(key, routing_key="q" if routable else "nowhere"), now=0)
        if key in model:
            assert outcome is PublishOutcome.DUPLICATE
        elif routable:
            assert outcome is PublishOutcome.ROUTED
            model.add(key, host.recorder.span_last)
        else:
            assert outcome is PublishOutcome.UNROUTABLE
        keys = host.publish_keys
        assert list(keys.known.items()) == list(model.known.items())
        assert list(keys.order) == list(model.order)
