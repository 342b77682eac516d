"""Durable storage: the journal, its records, and the state they describe.

See ``docs/storage.md`` for the on-disk format and the guarantees, and
:mod:`amqlite.store.journal` for how a trio shell drives the journal.
"""

from .codec import decode_record, encode_record
from .errors import JournalCorrupt, RecordError, StoreError, StoreLocked, StoreWriteError
from .files import FileHandle, FileLayer, OsFileLayer
from .journal import (
    FSYNC_POLICIES,
    CompactionReport,
    FsyncPolicy,
    Journal,
    JournalStats,
    RecoveryReport,
)
from .records import (
    ExchangeDeclare,
    ExchangeDelete,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    Record,
    SnapshotBegin,
    SnapshotEnd,
)
from .segment import Defect, SegmentReader
from .state import StoredMessage, StoreState

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
    "decode_record",
    "encode_record",
]
