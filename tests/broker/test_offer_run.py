"""``Queue.offer_run`` (a run of plain messages, the credit of one consumer taken in
one go by ``Session._deliver_run``) against ``Queue.offer`` of each."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import Broker, Message


def _state(runs: list[int], setup: dict[str, Any], fast: bool) -> list[Any]:
    broker = Broker(node_id="n")
    session = broker.open_session("/")
    arguments = {"x-message-ttl": 60_000} if setup["ttl"] else {}
    session.declare_queue("q", durable=setup["durable"], arguments=arguments)
    consumer = broker.open_session("/")
    if setup["channel"]:
        consumer.set_channel_prefetch(setup["channel"], now=0.0)
    for _ in range(setup["consumers"]):
        consumer.consume("q", prefetch=setup["prefetch"], no_ack=setup["no_ack"], now=0.0)
    queue = broker.vhost("/").queues["q"]  # type: ignore[union-attr]
    seen: list[Any] = []
    sent = 0
    for step, n in enumerate(runs):
        messages = [Message("", "q", b"m%d" % (sent + i)) for i in range(n)]
        sent += n
        if fast:
            queue.offer_run(messages, 1.0)
        else:
            for message in messages:
                queue.offer(message, 1.0, None)
        taken = consumer.take_deliveries()
        seen.append([(d.ctag, d.dtag, d.message.body, d.redelivered) for d in taken])
        if step % 2 and taken and not setup["no_ack"]:
            consumer.ack(taken[len(taken) // 2].dtag, multiple=True, now=1.0)
        seen.append((queue.count(), queue.unacked, queue.stat_publish, queue.stat_deliver))
    return seen


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 9), max_size=8),
    st.fixed_dictionaries(
        {
            "ttl": st.booleans(),
            "durable": st.booleans(),
            "channel": st.sampled_from([0, 0, 3]),
            "consumers": st.sampled_from([0, 1, 1, 1, 2]),
            "prefetch": st.sampled_from([0, 1, 4, 7]),
            "no_ack": st.sampled_from([False, False, True]),
        }
    ),
)
def test_offering_a_run_is_offering_each(runs: list[int], setup: dict[str, Any]) -> None:
    """The same deliveries (consumer tag, delivery tag, body, flag), queue count,
    unacknowledged count and counters after each run, with partial acks between
    runs; a TTL, a channel-wide prefetch and two consumers (the run then goes
    through ``offer``), no-ack (the run handed out only), per-consumer prefetch.
    Checked to fail with the run's delivery tags one off, and with a no-ack
    run's ``stat_deliver`` one short."""
    assert _state(runs, setup, True) == _state(runs, setup, False)


def _settled(steps: list[tuple[str, int]], prefetch: int, channel: int) -> list[Any]:
    broker = Broker(node_id="n")
    session = broker.open_session("/")
    for name in ("q1", "q2"):
        session.declare_queue(name)
    consumer = broker.open_session("/")
    if channel:
        consumer.set_channel_prefetch(channel, now=0.0)
    consumer.consume("q1", prefetch=prefetch, now=0.0)
    consumer.consume("q2", prefetch=prefetch, now=0.0)
    queues = broker.vhost("/").queues  # type: ignore[union-attr]
    seen: list[Any] = []
    unacked: list[int] = []
    sent = 0
    for what, n in steps:
        if what in ("q1", "q2"):
            for _ in range(n):
                session.publish(Message("", what, b"m%d" % sent), now=1.0)
                sent += 1
        elif unacked:
            dtag = unacked[min(n, len(unacked) - 1)]
            if what == "ack":
                consumer.ack(dtag, multiple=True, now=1.0)
            elif what == "one":
                consumer.ack(dtag, now=1.0)
            else:
                consumer.nack(dtag, multiple=True, now=1.0)
            settled = [t for t in unacked if t <= dtag] if what != "one" else [dtag]
            unacked = [t for t in unacked if t not in settled]
        taken = consumer.take_deliveries()
        unacked += [d.dtag for d in taken]
        seen.append([(d.ctag, d.dtag, d.message.body, d.redelivered) for d in taken])
        seen.append([(q.count(), q.unacked, q.stat_ack) for q in queues.values()])
    return seen


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["q1", "q1", "q2", "ack", "ack", "one", "nack"]), st.integers(0, 6)
        ),
        max_size=16,
    ),
    st.sampled_from([0, 2, 5]),
    st.sampled_from([0, 0, 4]),
)
def test_settling_acked_deliveries_at_once_is_settling_each(
    steps: list[tuple[str, int]], prefetch: int, channel: int
) -> None:
    """``Session._settle_acked`` (an ack of many deliveries of one consumer and
    queue, counted at once) against the general loop of ``Session._release``:
    the same deliveries after each step (what the freed credit lets through),
    queue counts, unacknowledged counts and ack counters; two consumers of one
    session on two queues (an ack spanning both takes the general path), single
    acks, nacks, per-consumer and channel-wide prefetch. Checked to fail with
    the consumer's credit given back one short."""
    from amqlite.broker.session import Session

    fast = _settled(steps, prefetch, channel)
    settle = Session._settle_acked
    Session._settle_acked = lambda self, deliveries, now: False  # type: ignore[method-assign]
    try:
        general = _settled(steps, prefetch, channel)
    finally:
        Session._settle_acked = settle  # type: ignore[method-assign]
    assert fast == general
