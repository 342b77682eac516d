"""What a publish key costs the broker per persistent message, in process.

    PYTHONPATH=TREE TREE/.venv/bin/python benchmarks/publish_key_core.py key|nokey N [--warm W]

N persistent 100-byte messages published to a durable queue through a broker
session (routing, the vhost's publish key window, the recorder), whose journal
sink encodes and frames each record as the journal does (``frame_record``: the
plain enqueue encoder, the CRC), with (``key``: ``instance:id`` as
``RequestDispatcher._publish`` builds it for a client that sent
``hello.instance``) or without a publish key; the queue is purged every 1,000
messages (its ``message.ack`` records go through the sink too). ``--warm`` (default
110,000) messages go first, so the key window (100,000 keys) is full and every key
added forgets one. No trio, no socket, no disk, no HA.

Prints microseconds of ``time.process_time`` per message. Under valgrind
(``--tool=cachegrind --cache-sim=no``) the instructions per message,
``(I(N2) - I(N1)) / (N2 - N1)``, do not move with the neighbours; the difference
between ``key`` and ``nokey`` is the key's instructions (not its cache misses: the
window holds 100,000 keys, ~15 MB).
"""

from __future__ import annotations

import argparse
import gc
import time

from amqlite.broker import Broker, Message
from amqlite.store.records import Record
from amqlite.store.segment import frame_record

PREFIX = "Zk3f9a1c2b7d4e5f60a1b:"  # a hello.instance token and ":", as the dispatcher's
BODY = b"x" * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("key", "nokey"))
    parser.add_argument("n", type=int)
    parser.add_argument("--warm", type=int, default=110_000)
    args = parser.parse_args()
    appended = 0

    def sink(record: Record) -> int:
        nonlocal appended
        frame_record(record)
        appended += 1
        return appended

    broker = Broker(record=sink)
    session = broker.open_session()
    session.declare_queue("q", durable=True)
    host = broker.vhost("/")
    assert host is not None
    queue = host.queues["q"]
    props = {"persistent": True}
    keyed = args.mode == "key"

    def run(first: int, end: int) -> None:
        for i in range(first, end):
            message = Message("", "q", BODY, {}, props)
            if keyed:
                message.publish_key = f"{PREFIX}{i}"
            session.publish(message, now=1000.0)  # (at 0 the plain encoder declines)
            if i % 1000 == 999:
                queue.purge()

    gc.disable()
    run(0, args.warm)
    start = time.process_time()
    run(args.warm, args.warm + args.n)
    spent = time.process_time() - start
    print(f"{args.mode} {args.n} {spent / args.n * 1e6:.3f} us/msg")


if __name__ == "__main__":
    main()
