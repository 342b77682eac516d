"""Exchange peering: the core's own work per peered message on each end, in process.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/peering_core_micro.py receive|send RUNS [setup]

No sockets and no broker, runs of 250 plain 100-byte messages:

- ``receive``: a receiving end takes RUNS compact ``peer.forwards`` frames
  (``cbor2.loads`` of each, ``link.receive``) and confirms each run
  (``link.confirm`` of its last tag);
- ``send``: a sending end with an interest in the key offers RUNS runs of
  plain client ``Publish`` events (``PeeredExchange.published_plain_run``),
  encodes the sends (``encode_frames``) and takes the remote's ack.

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


def send(runs: int, setup_only: bool) -> float:
    px = PeeredExchange(
        node_id="A", epoch=2, exchange="x", exchange_type="topic", rand=random.Random(0).random
    )
    mode = PeeringMode.PUBLISH
    link = px.add_link(LinkSettings(name="l", mode=mode, addresses=(Address("b", 1),)))
    link.start(0.0)
    link.connected(0.0)
    link.receive(Hello("B", "l", "/", "x", "topic", mode, 5), 0.0)
    link.receive(Interest(True, (BindingKey.of("k"),), (), 0, "0" * 16), 0.0)
    log = link.log
    assert log is not None
    reads = [[Publish(i, "x", "k", BODY) for i in range(RUN)] for _ in range(runs)]
    if setup_only:
        return 0.0
    started = time.perf_counter()
    for publishes in reads:
        actions = px.published_plain_run(publishes, now=1.0)
        peering_cbor.encode_frames([a.message for a in actions if type(a) is Send], 262144)
        link.receive(Ack(2, log.last_seq), 1.0)
    return (time.perf_counter() - started) / (runs * RUN)


def main() -> None:
    gc.set_threshold(20_000, 10, 10)  # the server's (amqlite/server/main.py)
    which, runs = sys.argv[1], int(sys.argv[2])
    setup_only = len(sys.argv) > 3 and sys.argv[3] == "setup"
    took = (receive if which == "receive" else send)(runs, setup_only)
    if not setup_only:
        print(f"{which}: {took * 1e6:.3f} us per message")


if __name__ == "__main__":
    main()
