"""Exchange peering: the core's own work per peered message on each end, in process.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/peering_core_micro.py MODE N [setup]

MODE is one of receive, deliver, send, subscribe, forward.

No sockets (and but for ``deliver`` no broker), runs of 250 plain 100-byte messages:

- ``receive``: a receiving end takes RUNS compact ``peer.forwards`` frames
  (``cbor2.loads`` of each, ``link.receive``) and confirms each run
  (``link.confirm`` of its last tag);
- ``deliver``: ``receive`` through the receiving broker's shell: each frame
  goes to ``ActionApplier.receive`` (the link end, then its actions: the run's
  messages published into the exchange ``x`` of a broker session, a queue ``q``
  bound to it with the key, a consumer without acks on it, the confirms at the
  turn's end), the session's deliveries taken after each run (as the node's
  pump does); a trio run around it for the applier's clock;
- ``send``: a sending end with an interest in the key offers RUNS runs of
  plain client publishes' keys and bodies (``PeeredExchange.published_plain_run``),
  encodes the sends (``encode_frames``) and takes the remote's ack;
- ``subscribe``: a subscriber's remote (mode subscribe, the accepting end): RUNS
  runs of plain client publishes into the exchange ``y`` (a broker session's
  ``RequestDispatcher`` with the exchange's publish hook; each run a
  ``PublishRun`` taken as ``ClientEndpoint.handle_run`` takes a client's read:
  ``publish_run``, else each publish), the durable peering
  queue bound to ``y`` with the key, fed to its link end
  (``ActionApplier.feed``), the sends encoded (``ActionApplier.flush``) and the
  subscriber's ack taken (``ActionApplier.receive``: the queue settles them);
  a trio run around it for the applier's clock;
- ``forward``: a sending site (no queue bound to ``x``, one link end up in mode
  publish with an interest in the key): RUNS client reads of plain publishes
  taken as ``ClientEndpoint.handle_run`` takes them (``RequestDispatcher.publish_run``,
  else each publish), offered and sent (``ActionApplier.flush``: the hook's run,
  the link's log, ``encode_frames``) and the remote's ack taken; a trio run
  around it for the applier's clock. It uses only what every tree since round 14
  has, so it measures an older tree as well (``PYTHONPATH`` to that tree).

Prints microseconds per message. With ``setup`` it stops after building the
frames / publishes: under valgrind (``--tool=cachegrind --cache-sim=no``) the
core's instructions per message are
``((I(120) - I(20)) - (I(120, setup) - I(20, setup))) / 25,000``, a figure a
shared machine does not move (ROUND10_PEERING.md).
"""

from __future__ import annotations

import gc
import random
import sys
import time
from typing import Any

import cbor2

from amqlite.peering import (
    Ack,
    Address,
    BindingKey,
    Envelope,
    Forwards,
    Hello,
    Interest,
    LinkSettings,
    MeshId,
    PeeredExchange,
    PeeringMode,
    Send,
)
from amqlite.peering import cbor as peering_cbor
from amqlite.protocol import PublishRun
from amqlite.protocol.events import Publish

RUN = 250
BODY = b"x" * 100


def receive(runs: int, setup_only: bool) -> float:
    px = PeeredExchange(
        node_id="B", epoch=1, exchange="x", exchange_type="topic", rand=random.Random(0).random,
        max_hops=3,
    )  # fmt: skip
    link, _ = px.attach(Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 5), 0.0)
    assert link is not None
    frames, seq = [], 1
    for _ in range(runs):
        envs = [
            Envelope(MeshId("A", 5, seq + i), "k", BODY, {}, {}, "x", ("A",), 1) for i in range(RUN)
        ]
        frames.append(peering_cbor.encode(Forwards(seq, envs)))
        seq += RUN
    if setup_only:
        return 0.0
    started = time.perf_counter()
    for frame in frames:
        link.receive(cbor2.loads(frame), 1.0)
        link.confirm(link._tags, 1.0)
    return (time.perf_counter() - started) / (runs * RUN)


class _Durability:
    """What the applier asks of the journal, for transient messages: nothing."""

    def __init__(self) -> None:
        self.marks_pending: dict[Any, Any] = {}
        self.storage = self

    def hold(self) -> None: ...
    def release(self) -> None: ...
    def marks_due(self, px: Any) -> None: ...


def deliver(runs: int, setup_only: bool) -> float:
    import trio

    from amqlite.broker import Broker
    from amqlite.server.peering.applier import ActionApplier
    from amqlite.server.peering.registry import LinkRegistry

    broker = Broker(node_id="B")
    session = broker.open_session("/")
    session.declare_exchange("x", "topic")
    session.declare_queue("q")
    session.bind("q", "x", "k")
    session.consume("q", no_ack=True, now=0.0)  # (the benchmark's consumer on B)
    px = PeeredExchange(
        node_id="B", epoch=1, exchange="x", exchange_type="topic", rand=random.Random(0).random,
        max_hops=3,
    )  # fmt: skip
    link, _ = px.attach(Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 5), 0.0)
    assert link is not None
    registry = LinkRegistry()
    registry.owner[link.id] = px
    applier = ActionApplier(
        registry,
        _Durability(),  # type: ignore[arg-type]
        session=lambda vhost: session,
        dial=lambda link, address: None,
        pump=lambda: None,
        turn_ended=lambda: None,
    )
    frames, seq = [], 1
    for _ in range(runs):
        envs = [
            Envelope(MeshId("A", 5, seq + i), "k", BODY, {}, {}, "x", ("A",), 1) for i in range(RUN)
        ]
        frames.append(peering_cbor.encode(Forwards(seq, envs)))
        seq += RUN
    if setup_only:
        return 0.0

    async def run() -> float:
        started = time.perf_counter()
        for frame in frames:
            applier.receive(link, cbor2.loads(frame), 1.0)
            session.take_deliveries()  # (what the node's pump takes for the connection)
        return (time.perf_counter() - started) / (runs * RUN)

    took: float = trio.run(run)
    assert link._pending == type(link._pending)(), "every delivery confirmed"
    return took


def publishing_link() -> tuple[PeeredExchange, Any]:
    """A sending end: node A's topic exchange ``x`` with one link end in mode
    publish, up, its remote (B) heard and interested in the key ``k``. Also
    ``peering_sender_micro.py``'s."""
    px = PeeredExchange(
        node_id="A", epoch=2, exchange="x", exchange_type="topic", rand=random.Random(0).random
    )
    mode = PeeringMode.PUBLISH
    link = px.add_link(LinkSettings(name="l", mode=mode, addresses=(Address("b", 1),)))
    link.start(0.0)
    link.connected(0.0)
    link.receive(Hello("B", "l", "/", "x", "topic", mode, 5), 0.0)
    link.receive(Interest(True, (BindingKey.of("k"),), (), 0, "0" * 16), 0.0)
    return px, link


def send(runs: int, setup_only: bool) -> float:
    px, link = publishing_link()
    log = link.log
    assert log is not None
    reads = [(["k"] * RUN, [BODY] * RUN) for _ in range(runs)]
    if setup_only:
        return 0.0
    started = time.perf_counter()
    for keys, bodies in reads:
        actions = px.published_plain_run(keys, bodies, now=1.0)
        peering_cbor.encode_frames([a.message for a in actions if type(a) is Send], 262144)
        link.receive(Ack(2, log.last_seq), 1.0)
    return (time.perf_counter() - started) / (runs * RUN)


def _wired(px: Any, link: Any, session: Any) -> tuple[Any, Any, list[bytes]]:
    """``link`` of ``px`` wired as the peering service wires it: its registry, its
    connection (what it sends is kept: the frames) and the applier."""
    from amqlite.server.peering.applier import ActionApplier
    from amqlite.server.peering.registry import LinkRegistry

    registry = LinkRegistry()
    registry.owner[link.id] = px
    frames: list[bytes] = []

    class _Conn:
        def send_peer(self, frame: bytes) -> None:
            frames.append(frame)

    registry.conns[link.id] = _Conn()  # type: ignore[assignment]
    applier = ActionApplier(
        registry,
        _Durability(),  # type: ignore[arg-type]
        session=lambda vhost: session,
        dial=lambda link, address: None,
        pump=lambda: None,
        turn_ended=lambda: None,
    )
    return applier, registry, frames


def subscribe(runs: int, setup_only: bool) -> float:
    import trio

    from amqlite.auth import AuthenticatedUser, Permissions
    from amqlite.broker import Broker
    from amqlite.server.dispatch import RequestDispatcher
    from amqlite.server.peering.hooks import PublishHook
    from amqlite.server.peering.peering_queue import PeeringQueue

    broker = Broker(node_id="B")
    session = broker.open_session("/")
    session.declare_exchange("y", "topic")
    px = PeeredExchange(
        node_id="B", epoch=1, exchange="y", exchange_type="topic", rand=random.Random(0).random,
        max_hops=3,
    )  # fmt: skip
    hello = Hello("A", "l", "/", "y", "topic", PeeringMode.SUBSCRIBE, 5, None, lease=60.0)
    link, _ = px.attach(hello, 0.0)
    assert link is not None and link.queue_fed
    applier, registry, frames = _wired(px, link, session)
    prefetch = 2 * link.settings.max_in_flight
    pq = PeeringQueue(broker, px, link, prefetch=prefetch, now=0.0, on_deliveries=applier.feed)
    registry.queues[link.id] = pq
    session.bind(pq.name, "y", "k")
    log = link.log
    assert log is not None
    user = AuthenticatedUser("u", Permissions(".*", ".*", ".*"))
    hook = PublishHook(applier, px)
    dispatcher = RequestDispatcher(session, user, "/", dict, "i", {"y": hook})
    read = PublishRun(0, "y", "k", [BODY] * RUN)
    if setup_only:
        return 0.0

    async def run() -> float:
        started = time.perf_counter()
        for _ in range(runs):
            # a client read, as ClientEndpoint.handle_run takes it: in one go when
            # the dispatcher can, else each publish
            if not dispatcher.publish_run(read, 1.0):
                for p in read.publishes():
                    dispatcher.publish(p, 1.0)
            pq.push()  # (what the node's pump does for the queue's session)
            applier.flush()
            frames.clear()
            applier.receive(link, Ack(1, log.last_seq).to_map(), 1.0)
        return (time.perf_counter() - started) / (runs * RUN)

    took: float = trio.run(run)
    assert not pq.taken and pq.queued() == 0, "every message sent and settled"
    return took


def forward(runs: int, setup_only: bool) -> float:
    import trio

    from amqlite.auth import AuthenticatedUser, Permissions
    from amqlite.broker import Broker
    from amqlite.server.dispatch import RequestDispatcher
    from amqlite.server.peering.hooks import PublishHook

    broker = Broker(node_id="A")
    session = broker.open_session("/")
    session.declare_exchange("x", "topic")  # no queue bound: a sending site
    px, link = publishing_link()
    applier, _, frames = _wired(px, link, session)
    log = link.log
    assert log is not None
    user = AuthenticatedUser("u", Permissions(".*", ".*", ".*"))
    dispatcher = RequestDispatcher(session, user, "/", dict, "i", {"x": PublishHook(applier, px)})
    dispatcher.publish(Publish(0, "x", "k", BODY), 0.0)  # (the write permission known)
    reads = [PublishRun(1 + i * RUN, "x", "k", [BODY] * RUN) for i in range(runs)]
    if setup_only:
        return 0.0

    async def run() -> float:
        started = time.perf_counter()
        for read in reads:
            # a client read, as ClientEndpoint.handle_run takes it: in one go when
            # the dispatcher can, else each publish
            if not dispatcher.publish_run(read, 1.0):
                for p in read.publishes():
                    dispatcher.publish(p, 1.0)
            applier.flush()  # (the service's flusher: the run offered, the frames sent)
            frames.clear()
            applier.receive(link, Ack(2, log.last_seq).to_map(), 1.0)
        return (time.perf_counter() - started) / (runs * RUN)

    took: float = trio.run(run)
    assert log.unacked == 0, "every message sent and acknowledged"
    return took


def main() -> None:
    gc.set_threshold(100_000, 10, 10)  # the server's (amqlite/server/main.py)
    which, runs = sys.argv[1], int(sys.argv[2])
    setup_only = len(sys.argv) > 3 and sys.argv[3] == "setup"
    modes = {
        "receive": receive,
        "deliver": deliver,
        "send": send,
        "subscribe": subscribe,
        "forward": forward,
    }
    took = modes[which](runs, setup_only)
    if not setup_only:
        print(f"{which}: {took * 1e6:.3f} us per message")


if __name__ == "__main__":
    main()
