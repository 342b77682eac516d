"""An AMQP channel's publisher confirm path, in process: publish -> barrier -> ack.

    PYTHONPATH=TREE .venv/bin/python benchmarks/amqp_confirm_micro.py MESSAGES

No sockets and no journal: the channel of TREE (``amqlite.server.amqp.channel``)
over a real :class:`~amqlite.server.storage.NodeStorage` whose journal is a
counter, and a dispatcher that only says "routed, journaled at the next
position". Read turns of 64 confirmed persistent publishes (``AmqpChannel.publish``
with delivery-mode 2); after each turn a commit covers the turn
(``NodeStorage._release``) and the writer flushes the acks due
(``flush_confirms``: one ``basic.ack`` with ``multiple`` a turn). So it counts what
the channel and the barrier do per confirmed message, nothing of the broker's
routing, journal or codec.

Prints microseconds per message (thread CPU time, best of 5 runs). Under valgrind
(``--tool=cachegrind --cache-sim=no``) the path's instructions per message are
``(I(N2) - I(N1)) / (5 (N2 - N1))`` (five runs each; start-up cancels out), a
figure a shared machine does not move. Run the same file with each tree first on
``PYTHONPATH`` to compare trees.
"""

from __future__ import annotations

import gc
import sys
import time
import types
from typing import Any

import trio

from amqlite.amqp import BasicProperties
from amqlite.amqp import methods as m
from amqlite.config import StorageConfig
from amqlite.protocol import events as ev
from amqlite.server.amqp.channel import AmqpChannel
from amqlite.server.storage import NodeStorage

TURN = 64


class _Link:
    remote_address = "bench"

    def __init__(self) -> None:
        self.sent = 0
        self.pending: list[AmqpChannel] = []

    def send_method(self, channel: int, method: Any) -> None:
        self.sent += 1

    def confirms_pending(self, channel: AmqpChannel) -> None:
        self.pending.append(channel)


class _Dispatcher:
    vhost = "/"

    def __init__(self, session: Any, journal: Any) -> None:
        self.session = session
        self.journal = journal

    def publish(self, p: ev.Publish, now: float) -> ev.Event:
        journal = self.journal
        journal.appended += 1
        self.session.journal_span = (journal.appended, journal.appended)
        return ev.Ok(p.id)

    handle = publish  # (the trees before the runs called handle)


def main() -> None:
    messages = int(sys.argv[1])
    best = float("inf")

    async def run() -> float:
        storage = NodeStorage(StorageConfig())
        journal = types.SimpleNamespace(appended=0)
        storage.journal = journal  # type: ignore[assignment]
        node: Any = types.SimpleNamespace(storage=storage)
        session: Any = types.SimpleNamespace(journal_span=(0, 0), close=lambda now: None)
        link = _Link()
        channel = AmqpChannel(node, link, 1, session, _Dispatcher(session, journal))  # type: ignore[arg-type]
        channel.confirming = True
        method = m.BasicPublish(0, "", "q", False, False)
        props = BasicProperties(delivery_mode=2)
        body = b"x" * 100
        gc.collect()
        started = time.thread_time()
        now = 0.0
        publish = channel.publish
        for done in range(0, messages, TURN):
            for _ in range(min(TURN, messages - done)):
                publish(method, props, body, now)
            storage._release(journal.appended)
            pending, link.pending = link.pending, []
            for c in pending:
                c.flush_confirms()
            now += 0.001
        elapsed = time.thread_time() - started
        assert channel._confirmed_upto == messages, channel._confirmed_upto
        return elapsed

    for _ in range(5):
        best = min(best, trio.run(run))
    print(f"{1e6 * best / messages:.3f} us a confirmed message")


if __name__ == "__main__":
    main()
