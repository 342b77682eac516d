"""Limits the core decides: connection counts (pending sockets, node, per user),
queues per vhost, consumers per connection, message size. Each refusal names its
setting."""

from __future__ import annotations

import pytest

from amqlite.broker import Broker
from amqlite.broker.limits import BrokerLimits, ConnectionLimits, check_message_size
from amqlite.errors import NotAllowed, PreconditionFailed, ReplyCode

# --- connection counts ------------------------------------------------------------------


def test_pending_sockets_past_the_bound_evict_the_oldest() -> None:
    limits = ConnectionLimits(max_connections=10, max_per_user=0, max_pending=3)
    assert [limits.arrived(k) for k in "abc"] == [None, None, None]
    assert limits.arrived("d") == "a"
    assert limits.admit("b", "u") is None  # b opens: no longer pending
    assert limits.arrived("e") is None  # c, d, e pending
    assert limits.arrived("f") == "c"
    assert (limits.pending, limits.open, limits.evicted) == (3, 1, 2)


def test_a_socket_that_left_frees_its_pending_place() -> None:
    limits = ConnectionLimits(max_connections=10, max_per_user=0, max_pending=2)
    limits.arrived("a")
    limits.arrived("b")
    limits.left("a")
    assert limits.arrived("c") is None
    assert limits.pending == 2


def test_the_node_limit_refuses_one_more_and_names_its_setting() -> None:
    limits = ConnectionLimits(max_connections=2, max_per_user=0, max_pending=10)
    for key in "abc":
        limits.arrived(key)
    assert limits.admit("a", "u") is None
    assert limits.admit("b", "v") is None
    reached = limits.admit("c", "w")
    assert reached is not None
    assert (reached.setting, reached.limit, reached.code) == (
        "limits.max_connections",
        2,
        ReplyCode.NOT_ALLOWED,
    )
    assert reached.text == "node connection limit (2) is reached (limits.max_connections)"
    assert limits.pending == 1  # c stays pending until it leaves
    limits.left("a")
    assert limits.admit("c", "w") is None
    assert limits.open == 2


def test_the_per_user_limit_counts_each_user_apart() -> None:
    limits = ConnectionLimits(max_connections=10, max_per_user=2, max_pending=10)
    assert limits.admit("a1", "alice") is None
    assert limits.admit("a2", "alice") is None
    reached = limits.admit("a3", "alice")
    assert reached is not None and reached.setting == "limits.max_connections_per_user"
    assert reached.text == (
        "user connection limit (2) of user 'alice' is reached (limits.max_connections_per_user)"
    )
    assert limits.admit("b1", "bob") is None
    limits.left("a1")
    assert limits.user_connections("alice") == 1
    assert limits.admit("a3", "alice") is None


def test_an_uncounted_connection_passes_a_full_node_and_is_not_counted() -> None:
    limits = ConnectionLimits(max_connections=1, max_per_user=1, max_pending=10)
    assert limits.admit("client", "u") is None
    limits.arrived("peer")
    assert limits.admit("peer", "u", counted=False) is None
    assert (limits.open, limits.pending, limits.user_connections("u")) == (1, 0, 1)
    limits.left("peer")  # unknown to the counts: no error
    assert limits.open == 1


def test_no_per_user_limit_when_zero() -> None:
    limits = ConnectionLimits(max_connections=100, max_per_user=0, max_pending=10)
    assert all(limits.admit(i, "u") is None for i in range(50))


# --- queues per vhost -------------------------------------------------------------------


def test_a_queue_past_the_vhost_limit_is_406_naming_the_setting() -> None:
    broker = Broker(vhosts=("/", "other"), limits=BrokerLimits(max_queues_per_vhost=2))
    s = broker.open_session("/")
    s.declare_queue("a")
    s.declare_queue("")  # server-named queues count too
    with pytest.raises(PreconditionFailed) as info:
        s.declare_queue("c")
    assert info.value.code == ReplyCode.PRECONDITION_FAILED
    assert info.value.text == (
        "cannot declare queue 'c': queue limit in vhost '/' (2) is reached "
        "(limits.max_queues_per_vhost)"
    )
    s.declare_queue("a")  # declaring one that exists is no new queue
    s.declare_queue("a", passive=True)
    broker.open_session("other").declare_queue("c")  # each vhost has its own count
    s.delete_queue("a")
    s.declare_queue("c")


def test_reserved_queues_of_the_broker_itself_pass_the_limit() -> None:
    broker = Broker(limits=BrokerLimits(max_queues_per_vhost=1))
    s = broker.open_session("/")
    s.declare_queue("a")
    s.declare_queue("amq.peering.x", reserved=True)


# --- consumers per connection --------------------------------------------------------------


def test_consumers_are_counted_over_every_session_a_connection_holds() -> None:
    broker = Broker(limits=BrokerLimits(max_consumers_per_connection=2))
    holder = broker.open_session("/")
    one, two = (broker.open_session("/", holder=holder) for _ in range(2))
    one.declare_queue("q")
    one.consume("q", now=0)
    two.consume("q", now=0)
    with pytest.raises(NotAllowed) as info:
        one.consume("q", now=0)
    assert info.value.code == ReplyCode.NOT_ALLOWED
    assert info.value.text == (
        "reached maximum (2) of consumers per connection (limits.max_consumers_per_connection)"
    )
    other = broker.open_session("/")  # another connection has its own count
    other.consume("q", now=0)


def test_a_cancel_a_close_and_a_deleted_queue_give_consumers_back() -> None:
    broker = Broker(limits=BrokerLimits(max_consumers_per_connection=1))
    holder = broker.open_session("/")
    s = broker.open_session("/", holder=holder)
    s.declare_queue("q")
    tag = s.consume("q", now=0)
    s.cancel(tag)
    s.consume("q", now=0)
    s.close(now=0)
    assert holder.consumers_held == 0
    t = broker.open_session("/", holder=holder)
    t.declare_queue("gone")
    t.consume("gone", now=0)
    t.delete_queue("gone")  # the broker cancels its consumer
    assert holder.consumers_held == 0
    t.consume("q", now=0)


def test_no_consumer_limit_by_default() -> None:
    s = Broker().open_session("/")
    s.declare_queue("q")
    for _ in range(100):
        s.consume("q", now=0)


# --- message size ---------------------------------------------------------------------------


def test_a_body_over_the_size_limit_is_406_in_rabbitmq_words() -> None:
    check_message_size(1000, 1000)
    check_message_size(10**9, 0)  # 0: no limit
    with pytest.raises(PreconditionFailed) as info:
        check_message_size(1001, 1000)
    assert info.value.text == (
        "message size 1001 is larger than configured max size 1000 (limits.max_message_size)"
    )
