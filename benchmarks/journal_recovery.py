"""Journal bytes per message and restart time for N persistent messages.

    .venv/bin/python benchmarks/journal_recovery.py [--messages 1000000] [--body 100]

Writes N persistent messages (a ``message.enqueue`` each, one durable queue, the
records a broker writes for ``publish --persistent``) into a fresh journal with
the broker's own recording path, then measures what a restart does: recover the
journal (read, checksum, scan and fold) and rebuild the broker from it, its
messages queued by journal id with the bodies left in the journal. Prints bytes
per message on disk and the seconds (and CPU seconds: the machine is shared) of
each step. The same code path runs on every ``amqlite server`` start
(amqlite/server/storage.py, NodeStorage.open).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence

from amqlite.broker import Broker, Message
from amqlite.store.journal import Journal


class _Unread:
    """The rebuilt broker's message source: nothing is read back here (a restart
    reads bodies only when consumers come)."""

    def load(self, journal_ids: Sequence[int]) -> list[Message | None]:
        raise AssertionError("a restart reads no body")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=100, help="body bytes (100)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(tmp, fsync="never")
        journal.recover()
        broker = Broker(record=journal.append)
        s = broker.open_session()
        s.declare_queue("q", durable=True)
        body = b"x" * args.body
        started = time.perf_counter()
        for i in range(args.messages):
            s.publish(Message("", "q", body, None, {"persistent": True}), now=0.0)
            if i % 10_000 == 9_999:
                journal.commit()
        journal.close()
        wrote = time.perf_counter() - started
        size = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
        print(f"messages            {args.messages:,} of {args.body} bytes")
        print(f"journal             {size / 1e6:,.1f} MB, {size / args.messages:.1f} bytes/message")
        print(f"write (no fsync)    {wrote:.1f} s ({args.messages / wrote:,.0f} messages/s)")

        started, cpu = time.perf_counter(), time.process_time()
        journal = Journal(tmp, fsync="never")
        report = journal.recover()
        recovered = time.perf_counter() - started
        recovered_cpu = time.process_time() - cpu
        started, cpu = time.perf_counter(), time.process_time()
        rebuilt = Broker(record=journal.append)
        assert rebuilt.recorder is not None
        rebuilt.recorder.source = _Unread()
        journal.with_refs(lambda refs: rebuilt.apply(refs, 0.0))
        applied = time.perf_counter() - started
        applied_cpu = time.process_time() - cpu
        queue = rebuilt.vhost("/").queues["q"]  # type: ignore[union-attr]
        assert queue.count() == args.messages, queue.count()
        journal.close()
        print(
            f"recover journal     {recovered:.2f} s, CPU {recovered_cpu:.2f} s "
            f"({report.records:,} records)"
        )
        print(f"rebuild broker      {applied:.2f} s, CPU {applied_cpu:.2f} s")
        print(
            f"restart total       {recovered + applied:.2f} s, "
            f"CPU {recovered_cpu + applied_cpu:.2f} s"
        )


if __name__ == "__main__":
    main()
