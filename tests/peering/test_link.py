"""Link ends on their own: stats for ``amqlite status``, lag, remote faults, and
the exchange-level bookkeeping (acceptor ends, removal)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from amqlite.peering import (
    Ack,
    Acked,
    Address,
    Blocked,
    BufferAvailable,
    Disconnect,
    Envelope,
    Forward,
    Forwards,
    Hello,
    Interest,
    LinkSettings,
    LinkState,
    LinkStateError,
    MeshId,
    OverflowPolicy,
    PeeredExchange,
    PeeringLink,
    PeeringMode,
    PeeringProtocolError,
    Persist,
    Send,
)

from .sim import Net

STATS_FIELDS = {
    "link", "role", "vhost", "exchange", "mode", "state", "remote_address", "remote_node",
    "last_error", "lag_seconds", "lag_messages", "in_flight", "buffered_bytes",
    "spilled_bytes", "accepted", "forwarded", "resent", "restored", "acked", "received",
    "duplicates_dropped", "duplicates_resent", "duplicates_other_path", "loops_dropped",
    "overflow_dropped", "overflow_blocked", "spilled", "skipped", "interest_size",
    "reconnects", "resyncs", "filter", "filtered",
}  # fmt: skip


def test_stats_report_lag_in_flight_and_counts() -> None:
    net = Net(1)
    a, b = net.node("A"), net.node("B")
    b.bind("q", "#")
    link = a.dial(b, PeeringMode.PUBLISH)
    net.run()
    net.now = 10.0
    for i in range(4):
        a.publish("k", b"%d" % i)
    stats = link.stats(12.5)
    assert set(stats) == STATS_FIELDS
    assert stats["state"] == "up" and stats["mode"] == "publish" and stats["role"] == "dialer"
    assert stats["remote_address"] == "B:5555" and stats["remote_node"] == "B"
    assert stats["lag_seconds"] == 2.5 and stats["lag_messages"] == 4
    assert stats["in_flight"] == 4 and stats["buffered_bytes"] > 0
    assert stats["accepted"] == stats["forwarded"] == 4 and stats["interest_size"] == 1
    net.run()
    stats = link.stats(net.now)
    assert stats["lag_seconds"] == 0.0 and stats["lag_messages"] == 0 and stats["acked"] == 4
    (remote,) = b.px.status(net.now)
    assert remote["role"] == "acceptor" and remote["received"] == 4
    assert remote["remote_address"] is None and remote["link"] == "A/A->B"


def _up_dialer(mode: PeeringMode = PeeringMode.PUBLISH) -> tuple[PeeredExchange, PeeringLink]:
    px = PeeredExchange(
        node_id="A", epoch=2, exchange="x", exchange_type="topic", rand=random.Random(0).random
    )
    link = px.add_link(LinkSettings(name="l", mode=mode, addresses=(Address("b", 1),)))
    link.start(0.0)
    link.connected(0.0)
    link.receive(Hello("B", "l", "/", "x", "topic", mode, 5), 0.0)
    assert link.state is LinkState.UP
    return px, link


BAD_FOR_A_SENDER: list[Any] = [
    Forward(1, PeeredExchange(
        node_id="Z", epoch=1, exchange="x", exchange_type="topic", rand=random.random
    ).envelope("k", b"")),
    Hello("B", "l", "/", "x", "topic", PeeringMode.PUBLISH, 5),
    Ack(2, 1),  # seq 1 was never sent
    {"type": "peer.ack", "seq": "x"},
    {"no": "type"},
]  # fmt: skip


@pytest.mark.parametrize("message", BAD_FOR_A_SENDER)
def test_remote_faults_end_the_connection(message: Any) -> None:
    _, link = _up_dialer()
    actions = link.receive(message, 1.0)
    assert isinstance(actions[0], Disconnect)
    assert link.state is LinkState.BACKOFF
    assert link.stats(1.0)["last_error"]


def test_a_receiving_end_refuses_acks_and_interest() -> None:
    for message in (Ack(5, 0), Interest(True, (), (), 0, "0" * 16)):
        _, link = _up_dialer(PeeringMode.SUBSCRIBE)
        assert isinstance(link.receive(message, 1.0)[0], Disconnect)


def test_acks_for_an_older_log_are_ignored_and_late_frames_too() -> None:
    _, link = _up_dialer()
    assert link.receive(Ack(1, 0), 1.0) == []  # epoch 1 is not this log's (2)
    link.connection_lost(1.0)
    assert link.receive(Ack(2, 0), 1.0) == []  # no connection any more


def test_attach_needs_a_hello_first() -> None:
    px = PeeredExchange(
        node_id="B", epoch=1, exchange="x", exchange_type="topic", rand=random.random
    )
    with pytest.raises(PeeringProtocolError, match=r"must start with peer\.hello"):
        px.attach({"type": "peer.heartbeat"}, 0.0)
    with pytest.raises(PeeringProtocolError):
        px.attach({"type": "peer.hello"}, 0.0)


def test_attach_refuses_a_resume_beyond_what_was_sent() -> None:
    px = PeeredExchange(
        node_id="B", epoch=4, exchange="x", exchange_type="topic", rand=random.random
    )
    hello = Hello("A", "l", "/", "x", "topic", PeeringMode.SUBSCRIBE, 0)
    link, _ = px.attach(hello, 0.0)
    assert link is not None and link.sends
    link.connection_lost(0.0)
    bad = Hello("A", "l", "/", "x", "topic", PeeringMode.SUBSCRIBE, 0, resume=(4, 99))
    again, actions = px.attach(bad, 1.0)
    assert again is None and isinstance(actions[-1], Disconnect)
    assert "never sent" in actions[-1].reason


def test_a_reconfigured_dialer_replaces_its_acceptor_end() -> None:
    px = PeeredExchange(
        node_id="B", epoch=1, exchange="x", exchange_type="topic", rand=random.random
    )
    first, _ = px.attach(Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 1), 0.0)
    second, _ = px.attach(Hello("A", "l", "/", "x", "topic", PeeringMode.SUBSCRIBE, 1), 0.0)
    assert first is not None and second is not None and first is not second
    assert first.state is LinkState.CLOSED and second.sends
    assert list(px.links) == ["A/l"]
    assert px.remove_link("A/l", 0.0) and px.links == {}
    assert px.remove_link("A/l", 0.0) == []


def test_exchange_checks_its_settings() -> None:
    px = PeeredExchange(
        node_id="A", epoch=1, exchange="x", exchange_type="topic", rand=random.random
    )
    px.add_link(LinkSettings(name="l", addresses=(Address("b", 1),)))
    with pytest.raises(ValueError, match="already exists"):
        px.add_link(LinkSettings(name="l", addresses=(Address("b", 1),)))
    with pytest.raises(ValueError, match="address"):
        px.add_link(LinkSettings(name="m"))
    with pytest.raises(ValueError, match="spill store"):
        from amqlite.peering import OverflowPolicy

        px.add_link(
            LinkSettings(name="n", addresses=(Address("b", 1),), overflow=OverflowPolicy.SPILL)
        )
    for bad in ({"exchange_type": "nope"}, {"max_hops": 0}, {"node_id": ""}):
        options: dict[str, Any] = {
            "node_id": "A", "epoch": 1, "exchange": "x", "exchange_type": "topic",
            "rand": random.random, **bad,
        }  # fmt: skip
        with pytest.raises(ValueError):
            PeeredExchange(**options)
    for settings in ({"name": ""}, {"buffer_bytes": 0}, {"heartbeat": -1.0}, {"backoff_max": 0}):
        with pytest.raises(ValueError):
            LinkSettings(**{"name": "l", **settings})  # type: ignore[arg-type]


def test_acks_are_batched_and_flushed_after_the_delay() -> None:
    net = Net(3)
    a = net.node("A")
    b = net.node("B", acceptor=LinkSettings(name="t", heartbeat=0, resync_interval=1e9,
                                              ack_every=4, ack_delay=0.25))  # fmt: skip
    b.bind("q", "#")
    a.dial(b, PeeringMode.PUBLISH)
    net.run(horizon=0.1)
    net.log.clear()
    for i in range(6):
        a.publish("k", b"%d" % i)
    while net.pending():
        net.step(0)
    acks = [x.message for x in net.log if isinstance(x, Send) and isinstance(x.message, Ack)]
    assert [ack.seq for ack in acks] == [4]  # one ack for the first four
    receiver = b.link("A/A->B")
    assert receiver.next_deadline() == pytest.approx(net.now + 0.25)
    net.advance(0.25)
    while net.pending():
        net.step(0)
    acks = [x.message for x in net.log if isinstance(x, Send) and isinstance(x.message, Ack)]
    assert [ack.seq for ack in acks] == [4, 6]
    assert a.link("A->B").stats(net.now)["lag_messages"] == 0


def test_a_closed_acceptor_end_is_replaced_on_the_next_hello() -> None:
    px = PeeredExchange(
        node_id="B", epoch=1, exchange="x", exchange_type="topic", rand=random.random
    )
    hello = Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 1)
    first, _ = px.attach(hello, 0.0)
    assert first is not None
    first.close(0.0)
    second, _ = px.attach(hello, 1.0)
    assert second is not None and second is not first and second.state is LinkState.UP


def _subscriber_hello(resume: tuple[int, int] | None = None) -> Hello:
    return Hello(
        "A", "l", "/", "x", "topic", PeeringMode.SUBSCRIBE, 0, resume, lease=60.0, buffer_bytes=4096
    )


def _sent(actions: list[Any], kind: type) -> list[Any]:
    """The messages of ``kind`` sent; a run (``Forwards``) counts as its forwards."""
    out: list[Any] = []
    for a in actions:
        if isinstance(a, Send):
            message = a.message
            if isinstance(message, Forwards) and kind is Forward:
                out += message.forwards()
            elif isinstance(message, kind):
                out.append(message)
    return out


def test_a_queue_fed_end_takes_from_its_queue_only_and_reports_what_was_acked() -> None:
    px = PeeredExchange(
        node_id="B", epoch=3, exchange="x", exchange_type="topic", rand=random.random
    )
    end, _ = px.attach(_subscriber_hello(), 0.0)
    assert end is not None and end.queue_fed
    assert (end.remote_lease, end.remote_buffer_bytes) == (60.0, 4096)
    env = px.envelope("k", b"published")
    assert px.published(env, routed_locally=False, now=0.0) == []  # the queue takes it
    assert end.counters["accepted"] == 0
    seq, actions = end.take(env, 0.0)
    assert seq == 1
    (fwd,) = _sent(actions, Forward)
    assert (fwd.seq, fwd.envelope.mesh_id, fwd.envelope.path) == (1, env.mesh_id, ("B",))
    looped = Envelope(MeshId("C", 1, 1), "k", b"from a", path=("A",), hops=1)
    assert end.take(looped, 0.0) == (None, [])  # the subscriber is on its path: skipped
    assert end.skipped["remote-on-path"] == 1
    seq2, _ = end.take(px.envelope("k", b"two"), 0.0)
    assert seq2 == 2
    actions = end.receive(Ack(3, 2).to_map(), 0.1)
    assert [a for a in actions if isinstance(a, Acked)] == [Acked(end.id, 2)]
    end.connection_lost(0.2)  # a new connection resumes past what A holds
    again, actions = px.attach(_subscriber_hello(resume=(3, 2)), 0.3)
    assert again is end and not _sent(actions, Forward)
    assert [a for a in actions if isinstance(a, Acked)] == [Acked(end.id, 2)]


def test_take_is_for_queue_fed_ends_only() -> None:
    net = Net()
    a, b = net.node("A"), net.node("B")
    link = a.dial(b, PeeringMode.PUBLISH)
    with pytest.raises(LinkStateError):
        link.take(a.px.envelope("k", b""), 0.0)


def test_the_mesh_identity_survives_as_plain_data() -> None:
    env = Envelope(MeshId("B", 7, 41), "k", b"m", {"h": 1}, {}, "x", ("C",), 1)
    plain = env.mesh_map()
    assert plain == {"id": ["B", 7, 41], "path": ["C"], "hops": 1}
    assert Envelope.from_mesh_map(plain, "k", b"m", {"h": 1}, {}, "x") == env
    with pytest.raises(PeeringProtocolError):
        Envelope.from_mesh_map({"id": ["B", 7]}, "k", b"m", {}, {}, "x")


def test_a_durable_log_keeps_persistent_messages_until_acked_and_restores_them() -> None:
    net = Net()
    a, b = net.node("A"), net.node("B")
    b.bind("q", "k")
    link = a.dial(b, PeeringMode.PUBLISH)
    link.durable_log = True
    net.run()
    assert link.state is LinkState.UP
    net.partitioned.add(frozenset({"A", "B"}))
    net.cut_all()
    actions: list[Any] = []
    for i, persistent in enumerate([True, False, True]):
        env = a.px.envelope("k", b"m%d" % i, None, {"persistent": persistent})
        actions += a.px.published(env, routed_locally=False, now=net.now)
    kept = [x for x in actions if isinstance(x, Persist)]
    assert [(x.seq, x.envelope.body, x.envelope.path) for x in kept] == [
        (1, b"m0", ("A",)),
        (3, b"m2", ("A",)),
    ]
    # a restart: a new log takes the kept ones back, before it starts
    fresh = PeeredExchange(
        node_id="A", epoch=9, exchange="x", exchange_type="topic", rand=random.random
    )
    again = fresh.add_link(LinkSettings(name="l", addresses=(Address("B", 1),)))
    again.durable_log = True
    assert again.restore([x.envelope for x in kept], 0.0) == [1, 2]
    assert again.stats(0.0)["restored"] == 2 and again.log is not None
    assert again.log.unacked == 2
    with pytest.raises(LinkStateError):
        PeeredExchange(
            node_id="B", epoch=1, exchange="x", exchange_type="topic", rand=random.random
        ).add_link(
            LinkSettings(name="s", mode=PeeringMode.SUBSCRIBE, addresses=(Address("A", 1),))
        ).restore([], 0.0)


def test_a_durable_log_reports_what_acks_and_drops_settle() -> None:
    net = Net()
    a, b = net.node("A"), net.node("B")
    b.bind("q", "k")
    link = a.dial(b, PeeringMode.PUBLISH)
    link.durable_log = True
    net.run()
    a.publish("k", b"one")
    net.run()
    acked = [x for x in net.log if isinstance(x, Acked) and x.link == link.id]
    assert acked and acked[-1].seq == 1  # the remote acknowledged it
    small = a.dial(
        b, PeeringMode.PUBLISH, name="small", buffer_bytes=300, overflow=OverflowPolicy.DROP_OLDEST
    )
    small.durable_log = True
    net.partitioned.add(frozenset({"A", "B"}))
    net.cut_all()
    out: list[Any] = []
    for _ in range(3):
        out += small.offer(a.px.envelope("k", b"x" * 100), routed_locally=False, now=net.now)
    drops = [x for x in out if isinstance(x, Acked)]
    assert drops and drops[-1].seq == small.log.gone_upto >= 1  # type: ignore[union-attr]


def _blocked_dialer() -> tuple[PeeredExchange, PeeringLink, list[Envelope], int]:
    """An up dialer (``block``, room for 20 messages) that refused one: the
    envelopes it sent, and the seq of the last one."""
    px = PeeredExchange(
        node_id="A", epoch=2, exchange="x", exchange_type="topic", rand=random.Random(0).random
    )
    size = px.envelope("k", b"x" * 100).onward("A").size()
    link = px.add_link(
        LinkSettings(
            name="l",
            addresses=(Address("b", 1),),
            buffer_bytes=20 * size,
            overflow=OverflowPolicy.BLOCK,
        )
    )
    link.start(0.0)
    link.connected(0.0)
    link.receive(Hello("B", "l", "/", "x", "topic", PeeringMode.PUBLISH, 5), 0.0)
    sent: list[Envelope] = []
    while True:
        actions = link.offer(px.envelope("k", b"x" * 100), routed_locally=False, now=1.0)
        if any(isinstance(a, Blocked) for a in actions):
            return px, link, sent, len(sent)
        sent += [s.message.envelope for s in actions if isinstance(s, Send)]


def _taken(actions: list[Any]) -> list[Envelope]:
    return [
        e
        for a in actions
        if isinstance(a, Send)
        for e in (a.message.envelopes if isinstance(a.message, Forwards) else [a.message.envelope])
    ]


def test_a_blocked_link_takes_nothing_past_the_message_it_refused() -> None:
    """Once ``block`` refused a message, every later one is refused too until the
    link has room again (``BufferAvailable``), however it is offered: the shell
    holds them in order behind the first, and the remote, which takes a sender's
    messages in mesh id order within a window, never sees one overtaken (it
    dropped such a message as already seen: 40,881 of 300,000 lost in a
    benchmark)."""
    px, link, sent, last = _blocked_dialer()
    assert len(sent) == 20
    # the remote acknowledges a few: there is room, but the link is still over half full
    assert link.receive(Ack(2, 4), 2.0) == []
    assert link.log is not None and link.log.has_room(200)
    later = px.envelope("k", b"x" * 100)
    assert not link.has_room(later)  # a confirmed publish is nacked
    assert link.offer(later, routed_locally=False, now=2.0) == [Blocked(link.id, later)]
    run = [px.envelope("k", b"x" * 100) for _ in range(2)]
    actions = link.offer_run(run, [False, False], 2.0)
    assert actions == [Blocked(link.id, e) for e in run] and link.took
    first = px._minted + 1
    px.skip_mints(2)
    actions = link.offer_plain_run(first, ["k", "k"], [b"y", b"z"], 2.0)
    assert [a.envelope.mesh_id.seq for a in actions if isinstance(a, Blocked)] == [
        first,
        first + 1,
    ]
    assert _taken(actions) == [] and link.stats(2.0)["accepted"] == last
    # at half full it has room again: the first refused one goes first
    again = link.receive(Ack(2, 10), 3.0)
    assert again[-1] == BufferAvailable(link.id)
    assert link.has_room(later)
    assert _taken(link.offer(later, routed_locally=False, now=3.0))[0].mesh_id == later.mesh_id
