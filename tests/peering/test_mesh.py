"""Loop freedom and exactly-once delivery in rings and meshes, simulated in memory.

Every pair of neighbours is peered in ``publish`` mode both ways (each dials the
other). Every node publishes; every node's local queues must get every message
exactly once, and the network must fall quiet: nothing circulates forever. Copies
that reach a node along a second path are dropped there (and counted), a sender
never sends to a broker already on the path, and a receiver drops what names it on
the path or has too many hops.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from amqlite.peering import (
    Deliver,
    Envelope,
    Forward,
    Hello,
    MeshId,
    PeeredExchange,
    PeeringMode,
    Send,
)

from .sim import Net, SimNode

PER_NODE = 12


def _ring(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)]


def _full(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


TOPOLOGIES = {
    "ring-3": (3, _ring(3)),
    "ring-4": (4, _ring(4)),
    "ring-5": (5, _ring(5)),
    "mesh-4": (4, _full(4)),
}


def _build(n: int, edges: list[tuple[int, int]], seed: int) -> tuple[Net, list[SimNode]]:
    net = Net(seed)
    nodes = [net.node(f"N{i}") for i in range(n)]
    for node in nodes:
        node.bind("all", "#")
        node.bind("red", "red.*")
        node.bind("red-too", "red.*")  # same key on another queue: still one copy per broker
    for i, j in edges:
        nodes[i].dial(nodes[j], PeeringMode.PUBLISH)
        nodes[j].dial(nodes[i], PeeringMode.PUBLISH)
    net.run()
    assert net.all_up()
    return net, nodes


def _publish_all(nodes: list[SimNode]) -> tuple[list[bytes], list[bytes]]:
    everything, red = [], []
    for node in nodes:
        for k in range(PER_NODE):
            key = "red.x" if k % 3 == 0 else "blue.x"
            body = f"{node.node_id}:{k}".encode()
            node.publish(key, body)
            everything.append(body)
            if key.startswith("red"):
                red.append(body)
    return everything, red


def _forwards(net: Net) -> int:
    return sum(1 for a in net.log if isinstance(a, Send) and isinstance(a.message, Forward))


def _check_exactly_once(nodes: list[SimNode], everything: list[bytes], red: list[bytes]) -> None:
    for node in nodes:
        for queue, expected in (("all", everything), ("red", red), ("red-too", red)):
            got = Counter(node.drain(queue))
            assert set(got) == set(expected), (node.node_id, queue)
            assert set(got.values()) == {1}, (node.node_id, queue, got.most_common(3))


def _per_origin_in_order(node: SimNode, origin: str) -> bool:
    seq = [int(b.split(b":")[1]) for b in node.received["all"] if b.startswith(origin.encode())]
    return seq == sorted(seq)


@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_every_node_gets_every_message_exactly_once(name: str) -> None:
    n, edges = TOPOLOGIES[name]
    net, nodes = _build(n, edges, seed=n)
    before = _forwards(net)
    everything, red = _publish_all(nodes)
    net.run()  # fails if frames keep circulating
    _check_exactly_once(nodes, everything, red)
    # each message crosses each directed link at most once
    directed = 2 * len(edges)
    assert _forwards(net) - before <= len(everything) * directed
    stats = [s for node in nodes for s in node.px.status(net.now)]
    assert sum(s["skipped"].get("remote-on-path", 0) for s in stats) > 0
    assert sum(s["lag_messages"] for s in stats) == 0
    if name != "ring-3":  # two paths of different lengths: copies meet and are dropped
        assert sum(s["duplicates_other_path"] for s in stats) > 0
    # with no cuts, order per origin holds along every path
    assert all(_per_origin_in_order(node, o.node_id) for node in nodes for o in nodes)


@pytest.mark.parametrize("name", list(TOPOLOGIES))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_exactly_once_with_links_cut_while_publishing(name: str, seed: int) -> None:
    n, edges = TOPOLOGIES[name]
    net, nodes = _build(n, edges, seed=seed)
    everything: list[bytes] = []
    red: list[bytes] = []
    for round_ in range(6):
        e, r = _publish_all_round(nodes, round_)
        everything += e
        red += r
        for _ in range(net.rng.randrange(40)):
            net.step(net.rng.randrange(1 << 30))
        for conn in list(net.conns):
            if net.rng.random() < 0.3:
                net.cut(conn)
        net.advance(net.rng.random())
    net.run()
    assert net.all_up()
    _check_exactly_once(nodes, everything, red)


def _publish_all_round(nodes: list[SimNode], round_: int) -> tuple[list[bytes], list[bytes]]:
    everything, red = [], []
    for node in nodes:
        for k in range(3):
            key = "red.x" if k == 0 else "blue.x"
            body = f"{node.node_id}:{round_}:{k}".encode()
            node.publish(key, body)
            everything.append(body)
            if key.startswith("red"):
                red.append(body)
    return everything, red


def test_max_hops_bounds_a_long_chain() -> None:
    """A chain of 6 brokers with max_hops 3: a message travels 3 links, no further."""
    net = Net(8)
    nodes = [net.node(f"C{i}", max_hops=3) for i in range(6)]
    for node in nodes:
        node.bind("all", "#")
    for left, right in itertools.pairwise(nodes):
        left.dial(right, PeeringMode.PUBLISH)
    net.run()
    nodes[0].publish("k", b"m")
    net.run()
    assert [len(node.drain("all")) for node in nodes] == [1, 1, 1, 1, 0, 0]
    assert nodes[3].link("C3->C4").stats(net.now)["skipped"] == {"hops-exhausted": 1}


def test_transit_needs_interest_on_the_broker_in_between() -> None:
    """A broker passes on only what its own exchange routes: interest is advertised
    per broker, not propagated (docs/peering.md)."""
    net = Net(9)
    a, b, c = net.node("A"), net.node("B"), net.node("C")
    c.bind("q", "#")
    a.dial(b, PeeringMode.PUBLISH)
    b.dial(c, PeeringMode.PUBLISH)
    net.run()
    a.publish("k", b"1")
    net.run()
    assert c.drain("q") == []
    b.bind("relay", "#")
    net.run()
    a.publish("k", b"2")
    net.run()
    assert c.drain("q") == [b"2"]


# --- the receiver's own checks ------------------------------------------------------------


def _receiver() -> tuple[PeeredExchange, Any]:
    px = PeeredExchange(
        node_id="B", epoch=1, exchange="x", exchange_type="topic", rand=lambda: 0.5, max_hops=4
    )
    link, _ = px.attach(Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 1), 0.0)
    assert link is not None
    return px, link


def _forward(seq: int, path: tuple[str, ...], hops: int, n: int = 1) -> Forward:
    return Forward(seq, Envelope(MeshId("Z", 1, n), "k", b"", path=path, hops=hops))


def test_receiver_drops_what_passed_it_already_or_went_too_far() -> None:
    px, link = _receiver()
    looped = link.receive(_forward(1, ("Z", "B", "A"), 3, n=1), 0.0)  # B is on the path
    too_far = link.receive(_forward(2, ("Z", "Q", "R", "S", "A"), 5, n=2), 0.0)  # 5 > 4 hops
    assert not any(isinstance(a, Deliver) for a in looped + too_far)
    delivered = link.receive(_forward(3, ("Z", "A"), 2, n=3), 0.0)
    assert isinstance(delivered[0], Deliver)
    stats = link.stats(0.0)
    assert stats["loops_dropped"] == 2 and stats["received"] == 1
    # dropped messages are settled at once: the sender may forget them
    link.confirm(1, 0.0)
    assert px.ctx.marks.position("A", "l") == (1, 3)
