"""An HA pair's passive node: the store's own work per replicated message, in process.

    PYTHONPATH=TREE python benchmarks/ha_passive_micro.py N [setup|once]

No sockets, no broker: the syncs the active node sends during the ``ha_cpu.py`` run
(``1to1-persistent-confirm``, 100-byte bodies, the client's publish keys), made up
front: N ``message.enqueue`` frames (one queue, a 16-hex instance and a counter as
the publish key), after each 64 a ``message.marks`` record acking 64 of those
``LAG`` before (the consumer's lag), cut into syncs of ~64 KiB. Each sync is checked
(``ReplicaFrames.check``, or ``segment.check_frames`` in a tree without it, as
``HaService._apply_chunk`` does) and journaled unfolded; the journal folds at
``FOLD_AFTER`` (the tree's ``HaService`` ``FOLD_AFTER_BYTES``) and commits (``fsync never``), the
followed records are taken. Prints microseconds per message (thread CPU time; min
of 3, ``once``: one run). With ``setup`` it stops after making the syncs: under
valgrind (``--tool=cachegrind --cache-sim=no``), with ``once``, the instructions per
message are ``((I(N2) - I(N1)) - (I(N2, setup) - I(N1, setup))) / (N2 - N1)``, a
figure a shared machine does not move (benchmarks/README.md, round 13, the passive node).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable

from amqlite.server.ha import FOLD_AFTER_BYTES
from amqlite.store import MessageEnqueue, MessageMarks, QueueDeclare
from amqlite.store.journal import Journal
from amqlite.store.segment import check_frames, frame_record

QUEUE = "bench.1to1-persistent-confirm.16821.1.q0"
SYNC = 64 * 1024
#: the tree's own bound (``FOLD_AFTER`` in the environment: another)
FOLD_AFTER = int(os.environ.get("FOLD_AFTER", FOLD_AFTER_BYTES))
#: the acks come this many messages behind the enqueues: with it about a quarter of
#: the enqueues are acked in a later fold than theirs, as round 12 counted in a pair
LAG = 448


def syncs(messages: int) -> list[bytes]:
    frames = [frame_record(QueueDeclare(name=QUEUE))]
    for k in range(1, messages + 1):
        frames.append(
            frame_record(
                MessageEnqueue(
                    id=k,
                    queues=(QUEUE,),
                    exchange="",
                    routing_key=QUEUE,
                    body=b"x" * 100,
                    props={"persistent": True},
                    enqueued_at=1_795_779_623.0 + k / 1000,
                    publish_key=f"9130da9380c6bda9:{k + 1}",
                )
            )
        )
        if k % 64 == 0 and k > LAG:
            acked = tuple(range(k - LAG - 63, k - LAG + 1))
            frames.append(frame_record(MessageMarks(queue=QUEUE, acked=acked)))
    out: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for f in frames:
        chunk.append(f)
        size += len(f)
        if size >= SYNC:
            out.append(b"".join(chunk))
            chunk, size = [], 0
    if chunk:
        out.append(b"".join(chunk))
    return out


def _checker() -> Callable[[bytes], None]:
    try:
        from amqlite.store.recover import ReplicaFrames
    except ImportError:  # a tree before it
        return check_frames
    return ReplicaFrames().check


def run(data: list[bytes]) -> float:
    check = _checker()
    with tempfile.TemporaryDirectory() as directory:
        journal = Journal(directory, fsync="never")
        journal.recover()
        started = time.thread_time()
        for chunk in data:
            check(chunk)
            journal.append_unfolded(chunk)
            if journal.unfolded_bytes >= FOLD_AFTER:
                journal.fold()
                journal.take_followed()
                journal.commit()
        journal.fold()
        journal.take_followed()
        journal.commit()
        spent = time.thread_time() - started
        journal.close()
    return spent


def main() -> None:
    messages = int(sys.argv[1])
    data = syncs(messages)
    if sys.argv[2:] == ["setup"]:
        return
    best = min(run(data) for _ in range(1 if sys.argv[2:] == ["once"] else 3))
    print(f"{best / messages * 1e6:.2f} us a message ({len(data)} syncs)")


if __name__ == "__main__":
    main()
