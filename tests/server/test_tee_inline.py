"""NodeStorage.record's inline tee (``tee_to``: the replicator's ``appended`` made in
place, as the HA shell wires it) against the general one (``tee``: a call of
``Replicator.appended`` a record): the same records queued, the same sender
wake-ups, the same syncs taken, whatever the records, journal turns, acks,
coalescing and window."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.config import StorageConfig
from amqlite.ha import Replicator
from amqlite.server.storage import NodeStorage
from amqlite.store.journal import Journal
from amqlite.store.records import MessageEnqueue, MessageMarks, QueueDeclare, Record

EPOCH = 3

_step = st.one_of(
    st.tuples(st.just("enqueue"), st.integers(1, 400)),
    st.tuples(st.just("marks"), st.integers(1, 40)),
    st.tuples(st.sampled_from(["hold", "release", "ack", "applied", "take"]), st.just(0)),
)


class _Side:
    """One storage, its replicator and its sender's wake-ups."""

    def __init__(self, directory: str, inline: bool, chunk: int, window: int) -> None:
        self.storage = storage = NodeStorage(StorageConfig(fsync="never"))
        self.journal = storage.journal = Journal(directory, fsync="never")
        self.journal.recover()
        self.replicator = r = Replicator(chunk=chunk, window=window, coalesce=True)
        self.wakes: list[int] = []
        self.sent: list[tuple[int, bytes, int]] = []
        r.start(EPOCH, [], self.journal.appended)
        if inline:
            storage.tee_to = r
        else:
            storage.tee = r.appended
        storage.tee_wake = lambda: self.wakes.append(self.journal.appended)
        storage.tee_turn = self._turn

    def _turn(self, opened: bool) -> None:  # HaService._tee_turn
        if opened:
            self.replicator.hold()
        else:
            self.replicator.release()
            self.wakes.append(-self.journal.appended)

    def take(self) -> None:
        self.sent += [(s.upto, s.data, s.last_id) for s in self.replicator.take()]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_step, max_size=60),
    st.integers(200, 3000),
    st.integers(300, 5000),
)
def test_the_inline_tee_queues_wakes_and_sends_as_the_tee(
    steps: list[tuple[str, int]], chunk: int, window: int
) -> None:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        sides = [_Side(a, False, chunk, window), _Side(b, True, chunk, window)]
        for side in sides:
            side.storage.record(QueueDeclare(vhost="/", name="q"))
        ids = turns = 0
        for kind, size in steps:
            if kind == "release" and not turns:
                continue  # (the journal refuses a release with no turn open)
            turns += {"hold": 1, "release": -1}.get(kind, 0)
            record: Record | None = None
            if kind == "enqueue":
                ids += 1
                record = MessageEnqueue(
                    id=ids, vhost="/", queues=("q",), exchange="", routing_key="q",
                    body=b"x" * size, props={"persistent": True}, enqueued_at=1.0,
                )  # fmt: skip
            elif kind == "marks":
                record = MessageMarks(queue="q", delivered=tuple(range(1, size + 1)))
            for side in sides:
                r = side.replicator
                if record is not None:
                    side.storage.record(record)
                elif kind == "hold":
                    side.storage.hold()
                elif kind == "release":
                    side.storage.release()
                elif kind == "ack":
                    r.synced(r.sent_upto)
                elif kind == "applied":
                    r.applied(r.sent_upto)
                if kind == "take" or (kind in ("ack", "applied") and r.sendable):
                    side.take()
            general, inline = sides
            assert inline.wakes == general.wakes
            assert inline.sent == general.sent
            assert inline.replicator.wakes == general.replicator.sendable or not (
                general.replicator._pending
            )
            assert list(inline.replicator._pending) == list(general.replicator._pending)
        for side in sides:
            side.journal.close()
