"""Test doubles for the journal's file layer, and record factories.

:class:`TestLayer` wraps the real file layer and can count operations, run a
hook before each one (to fail it with an ``OSError`` or to "crash" with
:class:`Crash`), run out of disk space part-way through a write, forget
everything that was not fsynced (a power cut), and close every file it opened (a
process dying).
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from amqlite.store import (
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    QueueDeclare,
    Record,
    StoreState,
)
from amqlite.store.files import FileHandle, OsFileLayer
from amqlite.store.journal import Journal
from amqlite.store.segment import frame_record, parse_frames


def as_received(record: Record) -> Record:
    """``record`` as a passive node gets it in a snapshot: decoded from its frame, a
    new object. A journal given back its own snapshot's objects would take a resent
    enqueue for the one it wrote (``StoreState.place`` matches the record object) and
    place it at that first write: valid, but not what happens on a passive node."""
    [copy] = parse_frames(frame_record(record))
    return copy


class Crash(Exception):
    """The process died here (raised by a hook; the journal must not catch it)."""


Hook = Callable[[str, str], None]


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def eio() -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO))


class _Handle:
    def __init__(self, layer: TestLayer, path: str, inner: FileHandle) -> None:
        self.layer = layer
        self.path = path
        self.inner = inner
        self.closed = False

    def write(self, data: bytes) -> None:
        self.layer.before("write", self.path)
        space = self.layer.space
        if space is not None and len(data) > space:
            self.inner.write(data[:space])
            self.layer.space = 0
            raise enospc()
        if space is not None:
            self.layer.space = space - len(data)
        self.inner.write(data)

    def fsync(self) -> None:
        self.layer.before("fsync", self.path)
        self.inner.fsync()
        self.layer.synced[self.path] = os.path.getsize(self.path)

    def truncate(self, size: int) -> None:
        self.layer.before("truncate", self.path)
        self.inner.truncate(size)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.inner.close()


class TestLayer(OsFileLayer):
    """The real file layer with counters, fault injection and crash simulation."""

    __test__ = False  # not a pytest class

    def __init__(self, hook: Hook | None = None) -> None:
        self.hook = hook
        self.ops: Counter[str] = Counter()
        self.log: list[tuple[str, str]] = []
        self.space: int | None = None  # bytes left on the "disk"; None = plenty
        self.synced: dict[str, int] = {}  # path -> size an fsync covered
        self.handles: list[_Handle] = []

    def before(self, op: str, path: str) -> None:
        self.ops[op] += 1
        self.log.append((op, os.path.basename(path)))
        if self.hook is not None:
            self.hook(op, path)

    def listdir(self, path: str) -> list[str]:
        self.before("listdir", path)
        return super().listdir(path)

    def read(self, path: str, limit: int = -1) -> bytes:
        self.before("read", path)
        return super().read(path, limit)

    def open_append(self, path: str, *, truncate: bool = False) -> FileHandle:
        self.before("open", path)
        handle = _Handle(self, path, super().open_append(path, truncate=truncate))
        self.synced.setdefault(path, 0 if truncate else os.path.getsize(path))
        if truncate:
            self.synced[path] = 0
        self.handles.append(handle)
        return handle

    def rename(self, src: str, dst: str) -> None:
        self.before("rename", src)
        super().rename(src, dst)
        if src in self.synced:
            self.synced[dst] = self.synced.pop(src)

    def remove(self, path: str) -> None:
        self.before("remove", path)
        super().remove(path)
        self.synced.pop(path, None)

    def fsync_dir(self, path: str) -> None:
        self.before("fsync_dir", path)
        super().fsync_dir(path)

    def lock(self, path: str, owner: bytes) -> FileHandle:
        handle = _Handle(self, path, super().lock(path, owner))
        self.handles.append(handle)
        return handle

    def kill(self) -> None:
        """The process dies: every file it had open is closed, nothing is flushed."""
        for handle in self.handles:
            handle.close()

    def cut_power(self) -> None:
        """The machine loses power: files lose what no fsync covered (and the process
        dies). Directory entries are kept: the journal fsyncs them before relying on
        them, and this model does not check that."""
        self.kill()
        for path, size in self.synced.items():
            if os.path.exists(path) and os.path.getsize(path) > size:
                os.truncate(path, size)


def fail_on(op: str, exc: Callable[[], BaseException], *, times: int = 1) -> Hook:
    """A hook that raises ``exc()`` on the next ``times`` calls of ``op``."""
    left = [times]

    def hook(seen: str, path: str) -> None:
        if seen == op and left[0] > 0:
            left[0] -= 1
            raise exc()

    return hook


def open_journal(directory: Path, layer: TestLayer | None = None, **options: object) -> Journal:
    """A recovered journal in ``directory``."""
    journal = Journal(directory, file_layer=layer, **options)  # type: ignore[arg-type]
    journal.recover()
    return journal


def reopen(directory: Path, **options: object) -> tuple[Journal, StoreState]:
    journal = Journal(directory, **options)  # type: ignore[arg-type]
    return journal, journal.recover().state


def recovered_state(directory: Path) -> StoreState:
    """Recover ``directory`` with the real layer and close it again."""
    journal = Journal(directory)
    try:
        return journal.recover().state
    finally:
        journal.close()


def enq(
    journal_id: int, *queues: str, body: bytes | None = None, vhost: str = "/"
) -> MessageEnqueue:
    return MessageEnqueue(
        id=journal_id,
        vhost=vhost,
        queues=queues or ("q",),
        exchange="",
        routing_key=queues[0] if queues else "q",
        body=body if body is not None else b"m%d" % journal_id,
        props={"persistent": True},
        enqueued_at=1_700_000_000.0 + journal_id,
    )


def enq_of_kind(journal_id: int, queues: tuple[str, ...], kind: str) -> MessageEnqueue:
    """:func:`enq` of one of the kinds the scanned-enqueue tests draw: ``plain``, ``pk``
    (a publish key), ``expiring`` (a kept property: the scan leaves it to the
    decoder) or ``headers``."""
    record = enq(journal_id, *queues)
    if kind == "pk":
        record = dataclasses.replace(record, publish_key=f"i:{journal_id}")
    elif kind == "expiring":
        record = dataclasses.replace(record, props={"persistent": True, "expiration": 5000})
    elif kind == "headers":
        record = dataclasses.replace(record, headers={"h": journal_id % 3})
    return record


def ack(journal_id: int, queue: str = "q") -> MessageAck:
    return MessageAck(id=journal_id, queue=queue)


def delivered(journal_id: int, queue: str = "q") -> MessageDelivered:
    return MessageDelivered(id=journal_id, queue=queue)


def queue(name: str = "q", vhost: str = "/") -> QueueDeclare:
    return QueueDeclare(vhost=vhost, name=name)


def fold(records: Iterable[Record]) -> StoreState:
    return StoreState.fold(list(records))


def bodies(state: StoreState, name: str = "q", vhost: str = "/") -> list[bytes]:
    return [m.record.body for m in state.messages(vhost, name)]


def segments(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("journal-"))
