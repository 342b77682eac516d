"""What folding delivery marks and acks costs the journal's state per message, in process.

    PYTHONPATH=TREE python benchmarks/marks_fold_core.py active|alone N [--warm W]

N persistent messages on one durable queue folded into a
:class:`~amqlite.store.state.StoreState` (``message.enqueue`` each), 60 at a time,
then their ``message.marks``: ``active`` as an HA pair's active node journals them
(a record with the 60 delivered ids before the deliveries are written out, the
acks in a later one), ``alone`` as a standalone node does (the ack alone: the
delivered mark of a message acked before the commit is left out). The records are
made before the clock starts; only ``StoreState.apply`` is timed. No journal, no
I/O.

Prints microseconds of ``time.process_time`` per message. Under valgrind
(``--tool=cachegrind --cache-sim=no``) the instructions per message,
``(I(N2) - I(N1)) / (N2 - N1)``, do not move with the neighbours.
"""

from __future__ import annotations

import argparse
import gc
import time

from amqlite.store.records import MessageEnqueue, MessageMarks, QueueDeclare, Record
from amqlite.store.state import StoreState

BODY = b"x" * 100
TURN = 60


def _records(mode: str, first: int, end: int) -> list[Record]:
    out: list[Record] = []
    for lo in range(first, end, TURN):
        ids = tuple(range(lo, min(lo + TURN, end)))
        out += [
            MessageEnqueue(
                id=i,
                vhost="/",
                queues=("q",),
                exchange="",
                routing_key="q",
                body=BODY,
                props={"persistent": True},
                enqueued_at=1000.0,
            )
            for i in ids
        ]
        if mode == "active":
            out.append(MessageMarks(queue="q", delivered=ids))
        out.append(MessageMarks(queue="q", acked=ids))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("active", "alone"))
    parser.add_argument("n", type=int)
    parser.add_argument("--warm", type=int, default=6_000)
    args = parser.parse_args()
    state = StoreState()
    state.apply(QueueDeclare(vhost="/", name="q"))
    warm = _records(args.mode, 1, 1 + args.warm)
    timed = _records(args.mode, 1 + args.warm, 1 + args.warm + args.n)
    gc.disable()
    apply = state.apply
    for record in warm:
        apply(record)
    start = time.process_time()
    for record in timed:
        apply(record)
    spent = time.process_time() - start
    assert state.live_messages == 0
    print(f"{args.mode} {args.n} {spent / args.n * 1e6:.3f} us/msg")


if __name__ == "__main__":
    main()
