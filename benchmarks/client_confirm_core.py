"""The client's own work per persistent confirmed message, in process, without sockets.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/client_confirm_core.py [N] [--repeat R] [--keys]

What the bench's client process does per message in ``1to1-persistent-confirm``
(publisher and consumer in one process, at most :data:`WINDOW` confirms
outstanding, a prefetch of 1000, an ack per message, 100-byte persistent
bodies): ``Connection.publish_nowait(..., persistent=True)`` into the link's
buffer (cleared as a write would), :data:`WINDOW` at a time; a read of the
broker's bare ``ok`` frames for them (``codec.encode_bare_oks``, as a commit
releases them) into the publisher's ``protocol.Connection`` and its batches to
``Connection._on_events`` (the confirm window); a read of :data:`WINDOW`
persistent deliver frames (``props`` ``{"persistent": true}``) into the
consumer's ``protocol.Connection``, its ``events_with_deliver_runs`` batches to
``_on_events`` (the consumer's buffer); then the bench's consumer loop, ``async
for d in consumer: await d.ack()``, with the settler's ``emit_acks`` every
:data:`ACKS_EVERY` deliveries. Everything runs in one trio task; the other
tasks and the sockets are not there.

``--keys`` gives the publisher a reconnect policy, as a client given two
addresses (an HA pair) has: each pending confirm then keeps its frame, to send
it again under the same publish key after a failover.

Prints microseconds of ``time.process_time`` per message, the least of
``--repeat`` runs. Under valgrind (``--tool=cachegrind --cache-sim=no``,
``--repeat 1``) the instructions per message, ``(I(N2) - I(N1)) / (N2 -
N1)``, do not move with the neighbours.
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
from amqlite.client.publisher import ConfirmWindow
from amqlite.client.settling import Settler
from amqlite.protocol import Connection, Role, codec
from amqlite.protocol import events as ev

BODY = b"x" * 100
#: confirms outstanding, and deliveries a read brings (the prefetch window)
WINDOW = 1000
#: deliveries handed out between two flushes of the acks (the consumer's yield)
ACKS_EVERY = 125
FIRST_TAG = 70_000
FIRST_ID = 70_000


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


class _Host:
    """The parts of a client Connection its publish and reader paths read."""

    is_open = True
    close_timeout = 1.0
    _ready = True
    _unreported = None
    _blocked = False
    max_frame = 1 << 20

    publish_nowait = ClientConnection.publish_nowait
    _queue_publish = ClientConnection._queue_publish
    _on_events = ClientConnection._on_events
    _on_control = ClientConnection._on_control

    def __init__(self, proto: Connection, link: _Link, settler: Settler, keys: bool) -> None:
        self._proto = proto
        self._link = link
        self._settler = settler
        self._next_id = FIRST_ID
        self._published = 0
        self._consumers = Subscriptions()
        self._confirms = ConfirmWindow(WINDOW)
        self._requests: dict[int, Any] = {}
        self.reconnect_policy = object() if keys else None


def _open_client() -> Connection:
    conn = Connection(Role.CLIENT)
    conn.send(ev.Hello(id=1))
    conn.receive_data(codec.encode(ev.Welcome(re=1)))
    assert conn.events() == [ev.Welcome(re=1)]
    return conn


def _frames() -> tuple[bytearray, list[int]]:
    """One read of WINDOW persistent deliver frames, and where each one's 32-bit tag sits."""
    m = {"m": "deliver", "ctag": "ctag-1", "dtag": FIRST_TAG, "exchange": "", "key": "q0"}
    enc = cbor2.dumps({**m, "body": BODY, "props": {"persistent": True}})
    frame = struct.pack(">I", len(enc)) + enc
    at = frame.index(b"\x1a" + struct.pack(">I", FIRST_TAG)) + 1
    return bytearray(frame * WINDOW), [at + i * len(frame) for i in range(WINDOW)]


async def _no_cancel(c: Consumer) -> None:
    return None


def _events(proto: Connection) -> Any:
    """What the tree's reader (client/transport.py) asks for."""
    return getattr(proto, "events_with_deliver_runs", proto.events_with_deliver_maps)


async def _run(n: int, keys: bool) -> float:
    proto = _open_client()
    link = _Link(proto)
    settler = Settler(link, lambda: 0)  # type: ignore[arg-type]
    host: Any = _Host(proto, link, settler, keys)
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
    publisher: Any = _Host(pub_link.proto, pub_link, settler, keys)
    data, places = _frames()
    pack = struct.Struct(">I").pack_into
    publish = publisher.publish_nowait
    pub_receive = pub_link.proto.receive_data
    pub_events = _events(pub_link.proto)
    pub_on_events = publisher._on_events
    receive = proto.receive_data
    events = _events(proto)
    on_events = host._on_events
    confirms = publisher._confirms
    tag = FIRST_TAG
    # the broker's confirms of each window, made before the clock starts
    oks = [
        codec.encode_bare_oks(list(range(first, first + WINDOW)))
        for first in range(FIRST_ID, FIRST_ID + n - n % WINDOW, WINDOW)
    ]
    start = time.process_time()
    for read in oks:
        for _ in range(WINDOW):
            await publish("", "q0", BODY, persistent=True)
        pub_link.out.clear()
        pub_receive(read)
        while batch := pub_events():
            pub_on_events(batch)
        assert not confirms.outstanding
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
    parser.add_argument("--keys", action="store_true", help="keep frames (two addresses)")
    args = parser.parse_args(argv)
    gc.collect()
    best = min(trio.run(_run, args.n, args.keys) for _ in range(args.repeat))
    print(f"{best:.3f} us/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
