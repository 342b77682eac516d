"""What the HA active node's journal tee costs per persistent message, in process.

    PYTHONPATH=TREE python benchmarks/ha_tee_core.py ha|alone N [--warm W]

N persistent 100-byte messages published to a durable queue through a broker
session whose sink is a real :class:`~amqlite.server.storage.NodeStorage` over a
real journal (in a temporary directory), the queue purged every 1,000 messages and
the journal committed every 500 records. ``ha``: the storage tees every record to
a :class:`~amqlite.ha.Replicator` (``coalesce``, as the shell's) wired as the
tree's ``HaService`` wires it (``storage.tee``), and every 100 records the
passive node acknowledges (``applied``, ``synced``) the sync on its way and a
stand-in sender takes what gathered meanwhile, as a busy pair's sender does when
that ack wakes it (so, as there, the appends in between find the last sync not yet
applied and wake nobody); ``alone``: no tee. No trio run, no socket, no HA link.

Prints microseconds of ``time.process_time`` per message. Under valgrind
(``--tool=cachegrind --cache-sim=no``) the instructions per message,
``(I(N2) - I(N1)) / (N2 - N1)``, do not move with the neighbours.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import types
from typing import Any

from amqlite.broker import Broker, Message
from amqlite.config import StorageConfig
from amqlite.ha import Replicator
from amqlite.server import ha as ha_shell
from amqlite.server.storage import NodeStorage
from amqlite.store.journal import Journal

BODY = b"x" * 100


class _Wake:
    """The sender's event, counting the wake-ups."""

    def __init__(self) -> None:
        self.count = 0

    def set(self) -> None:
        self.count += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("ha", "alone"))
    parser.add_argument("n", type=int)
    parser.add_argument("--warm", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        storage = NodeStorage(StorageConfig(fsync="never"))
        journal = storage.journal = Journal(tmp, fsync="never")
        journal.recover()
        replicator = Replicator(coalesce=True)
        wake = _Wake()
        if args.mode == "ha":
            replicator.start(1, [], journal.appended)
            if hasattr(storage, "tee_to"):  # round 15's: the replicator's appended inline
                storage.tee_to = replicator
                storage.tee_wake = wake.set
            elif hasattr(ha_shell.HaService, "_wake_sender"):  # round 14's wiring
                storage.tee = replicator.appended
                storage.tee_wake = wake.set
            else:  # the shell's _tee (before): it asks ``sendable`` itself
                shell: Any = types.SimpleNamespace(replicator=replicator, _sender_wake=wake)
                storage.tee = types.MethodType(ha_shell.HaService._tee, shell)
        broker = Broker(record=storage.record)
        session = broker.open_session()
        session.declare_queue("q", durable=True)
        host = broker.vhost("/")
        assert host is not None
        queue = host.queues["q"]
        props = {"persistent": True}
        sent = 0
        on_its_way: list[int] = []

        def run(first: int, end: int) -> None:
            nonlocal sent, on_its_way
            for i in range(first, end):
                session.publish(Message("", "q", BODY, {}, props), now=1000.0)
                if i % 100 == 99 and args.mode == "ha":
                    for upto in on_its_way:
                        replicator.applied(upto)
                        replicator.synced(upto)
                    on_its_way = [sync.upto for sync in replicator.take()]
                    sent += len(on_its_way)
                if i % 500 == 499:
                    journal.commit()
                if i % 1000 == 999:
                    queue.purge()

        gc.disable()
        run(0, args.warm)
        start = time.process_time()
        run(args.warm, args.warm + args.n)
        spent = time.process_time() - start
        journal.close()
    print(f"{args.mode} {args.n} {spent / args.n * 1e6:.3f} us/msg syncs {sent} wakes {wake.count}")


if __name__ == "__main__":
    main()
