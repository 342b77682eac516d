"""The acks a receiving end sends in one go, the earlier ones a later ack covers
left out (``applier.latest_acks``), leave the sending end where the acks one by
one leave it: the same log (settled up to the same seq, the same in flight and
unsent), the same forwards sent (gathered: the same seqs and messages in order)
and the same counters; every other message is kept, in order."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.peering import (
    Ack,
    Address,
    BindingKey,
    Forwards,
    Heartbeat,
    Hello,
    Interest,
    LinkSettings,
    PeeredExchange,
    PeeringLink,
    PeeringMode,
    Send,
)
from amqlite.server.peering.applier import latest_acks

from ..examples import examples


def _sender(window: int) -> tuple[PeeredExchange, PeeringLink]:
    px = PeeredExchange(
        node_id="A", epoch=2, exchange="x", exchange_type="topic", rand=random.Random(0).random
    )
    mode = PeeringMode.PUBLISH
    link = px.add_link(
        LinkSettings(name="l", mode=mode, addresses=(Address("b", 1),), max_in_flight=window)
    )
    link.start(0.0)
    link.connected(0.0)
    link.receive(Hello("B", "l", "/", "x", "topic", mode, 5), 0.0)
    link.receive(Interest(True, (BindingKey.of("k"),), (), 0, "0" * 16), 0.0)
    return px, link


def _sent(actions: list[Any]) -> list[tuple[int, Any]]:
    """The forwards the actions send, one (seq, envelope) a message."""
    out = []
    for a in actions:
        if type(a) is Send and type(a.message) is Forwards:
            out += [(a.message.seq + i, e) for i, e in enumerate(a.message.envelopes)]
    return out


def _state(link: PeeringLink) -> tuple[Any, ...]:
    log = link.log
    assert log is not None
    return (
        log.gone_upto,
        log.in_flight,
        log.unsent,
        log.buffered_bytes,
        link.counters["acked"],
        link.counters["forwarded"],
    )


@settings(max_examples=examples(200), deadline=None)
@given(
    st.integers(1, 40),  # the window
    st.lists(st.integers(1, 30), min_size=1, max_size=6),  # runs of publishes offered
    st.lists(  # the receiver's sends, in flushes: acks (a step up, or one for another
        # epoch) and heartbeats
        st.lists(
            st.one_of(
                st.tuples(st.just("ack"), st.integers(0, 12)),
                st.tuples(st.just("old"), st.integers(0, 12)),
                st.tuples(st.just("beat"), st.just(0)),
            ),
            max_size=8,
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_the_latest_ack_does_what_the_acks_one_by_one_do(
    window: int, runs: list[int], flushes: list[list[tuple[str, int]]]
) -> None:
    (px_one, one), (px_last, last) = _sender(window), _sender(window)
    sent_one: list[tuple[int, Any]] = []
    sent_last: list[tuple[int, Any]] = []
    for i, n in enumerate(runs):
        bodies = [bytes([65 + i]) * j for j in range(n)]
        sent_one += _sent(px_one.published_plain_run(["k"] * n, list(bodies), now=1.0))
        sent_last += _sent(px_last.published_plain_run(["k"] * n, list(bodies), now=1.0))
    acked = 0
    for flush in flushes:
        messages: list[Any] = []
        highest = max((s for s, _ in sent_one), default=0)
        for kind, step in flush:
            if kind == "beat":
                messages.append(Heartbeat())
            elif kind == "old":  # an earlier log's epoch: the sender ignores it
                messages.append(Ack(1, step))
            else:
                acked = min(highest, acked + step)
                messages.append(Ack(2, acked))
        kept = latest_acks(messages)
        others = [m for m in messages if type(m) is not Ack]
        assert [m for m in kept if type(m) is not Ack] == others
        for epoch in (1, 2):
            mine = [m for m in messages if type(m) is Ack and m.epoch == epoch]
            assert [m for m in kept if type(m) is Ack and m.epoch == epoch] == mine[-1:]
        for m in messages:
            sent_one += _sent(one.receive(m.to_map(), 2.0))
        for m in kept:
            sent_last += _sent(last.receive(m.to_map(), 2.0))
        assert _state(one) == _state(last)
        assert sent_one == sent_last
