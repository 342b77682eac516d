"""The client's own work per transient message, in process, without sockets.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/client_core.py [N] [--repeat R]

What the bench's client process does per message in ``1to1-transient``
(publisher and consumer in one process, a prefetch of 1000, an ack per message,
100-byte bodies): ``Connection.publish`` of a plain message into the link's
buffer (cleared as a write would); a read of :data:`WINDOW` deliver frames into
the client ``protocol.Connection``, its ``events_with_deliver_runs`` batches (or
``events_with_deliver_maps``, in a tree without runs) to
``Connection._on_events`` (the consumer's buffer); then the bench's consumer
loop, ``async for d in consumer: await d.ack()``, with the connection's
``Settler.emit_acks`` every :data:`ACKS_EVERY` deliveries (what the writer does
before a flush when the consumer lets it run). Everything runs in one trio
task: the consumer's checkpoints are real, the other tasks and the sockets are
not there.

The deliver frames are the broker's bytes for ``ctag-1``, the default
exchange, key ``q0``, with delivery tags past 16 bits that increase over the
run (patched into one read's worth of frames each round). Prints microseconds
of ``time.process_time`` per message, the least of ``--repeat`` runs. Under
valgrind (``--tool=cachegrind --cache-sim=no``, ``--repeat 1``) the
instructions per message, ``(I(N2) - I(N1)) / (N2 - N1)``, do not move with
the neighbours.
"""

from __future__ import annotations

import argparse
import gc
import struct
import sys
import time
from typing import Any

import cbor2
import trio

from amqlite.client.connection import Connection as ClientConnection
from amqlite.client.consumer import Consumer, Subscriptions
from amqlite.client.settling import Settler
from amqlite.protocol import Connection, Role, codec
from amqlite.protocol import events as ev

BODY = b"x" * 100
#: deliveries a read brings (the prefetch window)
WINDOW = 1000
#: deliveries handed out between two flushes of the acks (the consumer's yield)
ACKS_EVERY = 125
FIRST_TAG = 70_000


class _Link:
    """What the publisher and the settler use of a FramedLink."""

    def __init__(self, proto: Connection) -> None:
        self.proto = proto
        self.out = bytearray()
        self.kicked = False

    def kick(self) -> None:
        self.kicked = True

    def send(self, event: ev.Event) -> None:
        self.out += self.proto.send(event)


class _Confirms:
    def confirm(self, rid: int) -> bool:
        return False

    def confirm_run(self, res: list[int], start: int = 0) -> int:
        return start


class _Host:
    """The parts of a client Connection its publish and reader paths read."""

    is_open = True
    close_timeout = 1.0
    _ready = True
    _unreported = None
    _blocked = False
    max_frame = 1 << 20

    publish = ClientConnection.publish
    _on_events = ClientConnection._on_events

    def __init__(self, proto: Connection, link: _Link, settler: Settler) -> None:
        self._proto = proto
        self._link = link
        self._settler = settler
        self._next_id = 2
        self._published = 0
        self._consumers = Subscriptions()
        self._confirms = _Confirms()


def _open_client() -> Connection:
    conn = Connection(Role.CLIENT)
    conn.send(ev.Hello(id=1))
    conn.receive_data(codec.encode(ev.Welcome(re=1)))
    assert conn.events() == [ev.Welcome(re=1)]
    return conn


def _frames() -> tuple[bytearray, list[int]]:
    """One read of WINDOW deliver frames, and where each one's 32-bit tag sits."""
    m = {"m": "deliver", "ctag": "ctag-1", "dtag": FIRST_TAG, "exchange": "", "key": "q0"}
    enc = cbor2.dumps({**m, "body": BODY})
    frame = struct.pack(">I", len(enc)) + enc
    at = frame.index(b"\x1a" + struct.pack(">I", FIRST_TAG)) + 1
    return bytearray(frame * WINDOW), [at + i * len(frame) for i in range(WINDOW)]


async def _no_cancel(c: Consumer) -> None:
    return None


async def _run(n: int) -> float:
    proto = _open_client()
    link = _Link(proto)
    settler = Settler(link, lambda: 0)  # type: ignore[arg-type]
    host: Any = _Host(proto, link, settler)
    consumer = Consumer(
        host,
        _no_cancel,
        "q0",
        tag="ctag-1",
        prefetch=WINDOW,
        no_ack=False,
        exclusive=False,
        arguments={},
        settler=settler,
    )
    host._consumers["ctag-1"] = consumer
    pub_link = _Link(_open_client())
    publisher: Any = _Host(pub_link.proto, pub_link, settler)
    data, places = _frames()
    pack = struct.Struct(">I").pack_into
    publish = publisher.publish
    receive = proto.receive_data
    # what the tree's reader (client/transport.py) asks for
    events: Any = getattr(proto, "events_with_deliver_runs", proto.events_with_deliver_maps)
    on_events = host._on_events
    tag = FIRST_TAG
    start = time.process_time()
    for _ in range(n // WINDOW):
        for _ in range(WINDOW):
            await publish("", "q0", BODY)
        pub_link.out.clear()
        for at in places:
            pack(data, at, tag)
            tag += 1
        receive(data)
        while batch := events():
            on_events(batch)
        k = 0
        async for d in consumer:
            await d.ack()
            k += 1
            if k % ACKS_EVERY == 0:
                settler.emit_acks()
                link.out.clear()
                link.kicked = False
                if k == WINDOW:
                    break
    elapsed = time.process_time() - start
    assert not consumer.buffered and not len(settler.acks) and not settler.acks.pending
    return 1e6 * elapsed / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", type=int, nargs="?", default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    gc.collect()
    best = min(trio.run(_run, args.n) for _ in range(args.repeat))
    print(f"{best:.3f} us/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
