"""The broker's own work per transient message, in process, without sockets.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/transient_core.py 1to1|fanout [N] [--repeat R]

What a broker does per message in ``amqlite bench``'s ``1to1-transient`` (a
publisher to the default exchange, key ``q``, one consumer with a prefetch of
1000, multiple acks) or ``fanout-1to10`` (a fanout exchange bound to ten queues,
one consumer each): the client-encoded publish frames of 100-byte bodies go into a
server ``protocol.Connection`` (a read of them: 64 frames at a time, as
``NativeConnection._handle_buffered`` takes them), each event to its
``ClientEndpoint.handle`` (the dispatcher, routing, the queue, the delivery);
the node's ``pump_sized`` after each batch (``append_deliveries`` into each
consumer's link buffer, which is then cleared as a write would); every 128
deliveries a consumer's multiple ack frame goes in through its connection and
endpoint (the session's settle, the queue's dispatch). No trio, no socket, no
journal; the turn structure is simplified (one batch then the acks).

The same read of 64 frames goes in again and again, so the setup does not
grow with N. Prints microseconds of ``time.process_time`` per message (per delivery for
``fanout``: N publishes, 10 N deliveries), the least of ``--repeat`` runs. On a
shared machine the least is the figure to compare; under valgrind
(``--tool=cachegrind --cache-sim=no``, ``--repeat 1``) the instructions per
message, ``(I(N2) - I(N1)) / (N2 - N1)`` (deliveries for ``fanout``), do not move
with the neighbours.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

from amqlite import protocol
from amqlite.auth import AuthenticatedUser, Permissions
from amqlite.broker import Broker
from amqlite.protocol import Connection, Role, codec
from amqlite.protocol import events as ev
from amqlite.server.connection import FRAMES_PER_TURN
from amqlite.server.dispatch import RequestDispatcher
from amqlite.server.endpoints.client import ClientEndpoint
from amqlite.server.node import BrokerNode

BODY = b"x" * 100
ACK_EVERY = 128


class _Link:
    def __init__(self, proto: Connection) -> None:
        self.proto = proto
        self.out = bytearray()
        self.remote_address = "test"

    def kick(self) -> None:
        pass

    def send(self, event: ev.Event) -> None:
        self.out += self.proto.send(event)


class _Node:
    """What ``ClientEndpoint`` and ``BrokerNode.pump_sized`` read of the node."""

    storage = None
    ha = None
    peering = None

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def pump_sized(self) -> int:
        return BrokerNode.pump_sized(self)  # type: ignore[arg-type]

    def pump(self) -> None:
        self.pump_sized()


def _open_server() -> Connection:
    conn = Connection(Role.SERVER)
    conn.receive_data(codec.encode(ev.Hello(id=1)))
    assert conn.events() == [ev.Hello(id=1)]
    conn.send(ev.Welcome(re=1))
    return conn


def _endpoint(node: _Node, broker: Broker) -> tuple[ClientEndpoint, _Link]:
    link = _Link(_open_server())
    session = broker.open_session("/")
    user = AuthenticatedUser("guest", Permissions(".*", ".*", ".*"))
    dispatcher = RequestDispatcher(session, user, "/", lambda: {}, instance="i")
    endpoint = ClientEndpoint(
        node,  # type: ignore[arg-type]
        link,  # type: ignore[arg-type]
        session,
        dispatcher,
        user="guest",
        vhost="/",
        client="bench",
        connected_at=0.0,
    )
    session.owner = endpoint
    return endpoint, link


def _setup(fanout: bool) -> tuple[Any, ...]:
    broker = Broker()
    node = _Node(broker)
    publisher, pub_link = _endpoint(node, broker)
    consumers = []
    queues = 10 if fanout else 1
    if fanout:
        assert publisher.session is not None
        publisher.session.declare_exchange("fan", "fanout")
    for i in range(queues):
        endpoint, link = _endpoint(node, broker)
        session = endpoint.session
        assert session is not None
        name = f"q{i}"
        session.declare_queue(name)
        if fanout:
            session.bind(name, "fan")
        session.consume(name, tag=f"c{i}", prefetch=1000, now=0.0)
        consumers.append([endpoint, link, 0, 0])  # endpoint, link, delivered, acked
    return node, publisher, pub_link, consumers


def _chunk(fanout: bool) -> bytes:
    """One read: FRAMES_PER_TURN publish frames (the same read again and again: a
    broker uses a transient publish's id only in a reply, and there is none)."""
    exchange, key = ("fan", "") if fanout else ("", "q0")
    first = 70_000  # ids past 16 bits, as in a long run
    return b"".join(
        codec.encode_publish(first + i, exchange, key, BODY, None, None, False, False)
        for i in range(FRAMES_PER_TURN)
    )


def run(n: int, fanout: bool) -> float:
    node, publisher, pub_link, consumers = _setup(fanout)
    chunk = _chunk(fanout)
    n -= n % FRAMES_PER_TURN
    proto = pub_link.proto
    rid = 10
    runs = hasattr(proto, "events_with_publish_runs")
    run_type = getattr(protocol, "PublishRun", None)
    gc.collect()
    start = time.process_time()
    for _ in range(n // FRAMES_PER_TURN):
        proto.receive_data(chunk)
        if runs:  # as NativeConnection._handle_buffered takes them
            while batch := proto.events_with_publish_runs(FRAMES_PER_TURN)[0]:
                for event in batch:
                    if type(event) is run_type:
                        publisher.handle_run(event, 0.0)
                    else:
                        publisher.handle(event, 0.0)
        else:  # a tree before publish runs
            while batch := proto.events(FRAMES_PER_TURN):
                for event in batch:
                    publisher.handle(event, 0.0)
        node.pump_sized()
        for c in consumers:
            endpoint, link, delivered, acked = c
            if link.out:  # written: the session's last delivery tag is what it sent
                link.out.clear()
                delivered = c[2] = endpoint.session._last_dtag
            if delivered - acked >= ACK_EVERY:
                rid += 1
                cproto = link.proto
                cproto.receive_data(codec.encode_ack(rid, delivered, True))
                for event in cproto.events():
                    endpoint.handle(event, 0.0)
                c[3] = delivered
                node.pump_sized()
    took = time.process_time() - start
    moved = n * len(consumers)
    assert sum(c[2] for c in consumers) == moved, [c[2] for c in consumers]
    return 1e6 * took / moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=["1to1", "fanout"])
    parser.add_argument("n", type=int, nargs="?", default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    fanout = args.scenario == "fanout"
    n = args.n // 10 if fanout else args.n
    runs = [run(n, fanout) for _ in range(args.repeat)]
    print(f"{min(runs):.3f} us/msg (runs: {' '.join(f'{r:.3f}' for r in runs)})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
