"""Durable storage: the journal, its records, and the state they describe.

See ``docs/storage.md`` for the on-disk format and the guarantees, and
:mod:`amqlite.store.journal` for how a trio shell drives the journal.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .codec import decode_record, encode_record
from .errors import JournalCorrupt, RecordError, StoreError, StoreLocked, StoreWriteError
from .records import (
    ExchangeDeclare,
    ExchangeDelete,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    PeeringMarks,
    PeeringOut,
    PeeringOutAck,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    Record,
    SnapshotBegin,
    SnapshotEnd,
    StreamAppend,
    StreamTrack,
    StreamTruncate,
)
from .segment import Defect, SegmentReader
from .state import StoredMessage, StoredStream, StoreState

# The journal and the file layer (threads, fcntl) load on first use, so the
# sans-IO broker core can import the records above without pulling them in.
if TYPE_CHECKING:
    from .files import FileHandle, FileLayer, OsFileLayer
    from .journal import (
        FSYNC_POLICIES,
        CompactionReport,
        FsyncPolicy,
        Journal,
        JournalStats,
        RecoveryReport,
    )

_LAZY = {
    "FileHandle": "files",
    "FileLayer": "files",
    "OsFileLayer": "files",
    "FSYNC_POLICIES": "journal",
    "CompactionReport": "journal",
    "FsyncPolicy": "journal",
    "Journal": "journal",
    "JournalStats": "journal",
    "RecoveryReport": "journal",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "FSYNC_POLICIES",
    "CompactionReport",
    "Defect",
    "ExchangeDeclare",
    "ExchangeDelete",
    "FileHandle",
    "FileLayer",
    "FsyncPolicy",
    "Journal",
    "JournalCorrupt",
    "JournalStats",
    "MessageAck",
    "MessageDelivered",
    "MessageEnqueue",
    "OsFileLayer",
    "PeeringMarks",
    "PeeringOut",
    "PeeringOutAck",
    "QueueBind",
    "QueueDeclare",
    "QueueDelete",
    "QueuePurge",
    "QueueUnbind",
    "Record",
    "RecordError",
    "RecoveryReport",
    "SegmentReader",
    "SnapshotBegin",
    "SnapshotEnd",
    "StoreError",
    "StoreLocked",
    "StoreState",
    "StoreWriteError",
    "StoredMessage",
    "StoredStream",
    "StreamAppend",
    "StreamTrack",
    "StreamTruncate",
    "decode_record",
    "encode_record",
]
