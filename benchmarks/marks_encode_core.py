"""What encoding a ``message.marks`` record costs, in process.

    PYTHONPATH=TREE python benchmarks/marks_encode_core.py fast|general N

N encodings of ``message.marks`` records of 60 delivered journal ids (above 100,000,
one CBOR width: what a running node's ``Recorder.flush_marks`` makes), 50
different records in turn: ``fast`` through ``encode_record`` (the tree's own
path), ``general`` through ``cbor2.dumps(record_to_map(record))``. Under valgrind
(``--tool=cachegrind --cache-sim=no``) the instructions per record,
``(I(N2) - I(N1)) / (N2 - N1)``, do not move with the neighbours.
"""

from __future__ import annotations

import argparse
import time

import cbor2

from amqlite.store.codec import encode_record
from amqlite.store.records import MessageMarks, Record, record_to_map


def _general(record: Record) -> bytes:
    return cbor2.dumps(record_to_map(record))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("fast", "general"))
    parser.add_argument("n", type=int)
    args = parser.parse_args()
    records = [
        MessageMarks(queue="q", delivered=tuple(range(100_000 + i, 100_060 + i))) for i in range(50)
    ]
    encode = encode_record if args.mode == "fast" else _general
    start = time.process_time()
    for i in range(args.n):
        encode(records[i % 50])
    spent = time.process_time() - start
    print(f"{args.mode} {args.n} {spent / args.n * 1e6:.3f} us/record")


if __name__ == "__main__":
    main()
