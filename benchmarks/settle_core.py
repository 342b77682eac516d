"""What delivering and acking a persistent message costs the broker core, in process.

    PYTHONPATH=TREE python benchmarks/settle_core.py active|alone N [--warm W]

N persistent 100-byte messages published to a durable queue with one consumer
(prefetch 1000, manual acks) through a broker session whose recorder gathers
delivery marks and acks (``Recorder.gather_marks``) into a sink that only numbers
the records; 60 a turn: the publishes, the deliveries taken, then one multiple ack
of the turn's deliveries. ``active``: the marks are flushed before the deliveries
are taken, as an HA pair's active node does (``BrokerNode.pump_sized``), and again
after the ack; ``alone``: once after the ack, as a standalone node's commit does.
No journal, no trio, no socket.

Prints microseconds of ``time.process_time`` per message. Under valgrind
(``--tool=cachegrind --cache-sim=no``) the instructions per message,
``(I(N2) - I(N1)) / (N2 - N1)``, do not move with the neighbours.
"""

from __future__ import annotations

import argparse
import gc
import time

from amqlite.broker import Broker, Message
from amqlite.store.records import Record

BODY = b"x" * 100
TURN = 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("active", "alone"))
    parser.add_argument("n", type=int)
    parser.add_argument("--warm", type=int, default=6_000)
    args = parser.parse_args()
    records = [0]

    def sink(record: Record) -> int:
        records[0] += 1
        return records[0]

    broker = Broker(record=sink)
    recorder = broker.recorder
    assert recorder is not None
    recorder.gather_marks(lambda: None)
    pub, sub = broker.open_session(), broker.open_session()
    pub.declare_queue("q", durable=True)
    sub.consume("q", prefetch=1000, now=1000.0)
    props = {"persistent": True}
    active = args.mode == "active"

    def run(count: int) -> None:
        for _ in range(count // TURN):
            for _ in range(TURN):
                pub.publish(Message("", "q", BODY, {}, props), now=1000.0)
            if active:
                recorder.flush_marks()
            deliveries = sub.take_deliveries()
            sub.ack(deliveries[-1].dtag, multiple=True, now=1000.0)
            recorder.flush_marks()

    gc.disable()
    run(args.warm)
    start = time.process_time()
    run(args.n)
    spent = time.process_time() - start
    print(f"{args.mode} {args.n} {spent / args.n * 1e6:.3f} us/msg records {records[0]}")


if __name__ == "__main__":
    main()
