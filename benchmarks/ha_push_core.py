"""What holding pushes for the passive node costs the HA active node, in process.

    PYTHONPATH=TREE python benchmarks/ha_push_core.py held|alone N [--warm W]

A :class:`~amqlite.server.endpoints.client.ClientEndpoint` on a real server
protocol ``Connection`` pushes N deliveries of plain persistent 100-byte messages
(journal ids in order), 60 a pump turn as a busy pair's pump hands them over.
``held``: the storage says a passive node is replicated to, and it acknowledges
(``applied``) every third turn the messages of the sync before (those appended
while that sync was on its way wait for the next one), so most deliveries are held
and released by ``_push_replicated``, part of the held ones at a time, as on a
busy pair; ``alone``: no passive node (``ClientEndpoint.push``'s plain path, the
standalone broker's). The link's bytes are dropped every turn. No trio, no socket.

Prints microseconds of ``time.process_time`` per delivery. Under valgrind
(``--tool=cachegrind --cache-sim=no``) the instructions per delivery,
``(I(N2) - I(N1)) / (N2 - N1)``, do not move with the neighbours.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

from amqlite.broker import Delivery, Message
from amqlite.protocol import Connection, Role, codec
from amqlite.protocol import events as ev
from amqlite.server.endpoints.client import ClientEndpoint

BODY = b"x" * 100
TURN = 60
NO_PEER = sys.maxsize


class _Replica:
    def __init__(self) -> None:
        self.held_id = NO_PEER


class _Storage:
    """What the gate asks of NodeStorage (plain messages only)."""

    def __init__(self, held: bool) -> None:
        self.replica = _Replica()
        self.replica_upto: int | None = 0 if held else None
        if held:
            self.replica.held_id = 0
        self.waiters: set[Any] = set()

    def when_replicated(self, callback: Any) -> None:
        self.waiters.add(callback)

    def discard_waiter(self, callback: Any) -> None:
        self.waiters.discard(callback)


class _Link:
    def __init__(self, proto: Connection) -> None:
        self.proto = proto
        self.out = bytearray()
        self.remote_address = "test"

    def kick(self) -> None:
        pass


class _Session:
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []

    def take_deliveries(self) -> list[Delivery]:
        taken, self.deliveries = self.deliveries, []
        return taken

    def take_cancellations(self) -> list[Any]:
        return []

    def set_writable(self, writable: bool) -> None:
        pass


class _Node:
    def __init__(self, storage: _Storage) -> None:
        self.storage = storage


class _Dispatcher:
    max_reply_bytes = 0
    stream_visible: Any = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("held", "alone"))
    parser.add_argument("n", type=int)
    parser.add_argument("--warm", type=int, default=6_000)
    args = parser.parse_args()
    storage = _Storage(args.mode == "held")
    proto = Connection(Role.SERVER)
    proto.receive_data(codec.encode(ev.Hello(id=1)))
    proto.events()
    proto.send(ev.Welcome(re=1))
    link = _Link(proto)
    session = _Session()
    endpoint = ClientEndpoint(
        _Node(storage),  # type: ignore[arg-type]
        link,  # type: ignore[arg-type]
        session,  # type: ignore[arg-type]
        _Dispatcher(),  # type: ignore[arg-type]
        user="u",
        vhost="/",
        client="bench",
        connected_at=0.0,
    )
    props = {"persistent": True}
    last_id = 0
    cut = 0  # the last journal id of the sync on its way

    def run(turns: int) -> None:
        nonlocal last_id, cut
        for turn in range(turns):
            batch = []
            for _ in range(TURN):
                last_id += 1
                message = Message("", "q", BODY, {}, props)
                message.journal_id = last_id
                batch.append(Delivery("c1", last_id, False, message, "q"))
            session.deliveries = batch
            endpoint.push()
            if storage.replica_upto is not None and turn % 3 == 2:
                storage.replica.held_id = cut  # the passive node applied that sync
                cut = last_id  # and the next one takes what gathered meanwhile
                for callback in list(storage.waiters):
                    callback()
            link.out.clear()

    gc.disable()
    run(args.warm // TURN)
    start = time.process_time()
    run(args.n // TURN)
    spent = time.process_time() - start
    print(f"{args.mode} {args.n} {spent / args.n * 1e6:.3f} us/delivery")


if __name__ == "__main__":
    main()
