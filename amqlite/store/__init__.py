"""Durable storage: the journal's records and the state they describe.

This package is in two halves (``docs/storage.md``, "Module layout"):

- **pure** (sans-IO, checked by ``tests/test_sans_io.py``): :mod:`.records`,
  :mod:`.codec`, :mod:`.segment` (framing and parsing: bytes in, records out),
  :mod:`.state` (the fold) and :mod:`.errors`. This module re-exports their public
  names and imports nothing else, so the sans-IO broker core can import the
  records without pulling in the journal.
- **I/O**: :mod:`amqlite.store.journal` (segment files, group commit, recovery,
  compaction, the lock; driven from a worker thread) and :mod:`amqlite.store.files`
  (every operating-system call). Shells import them by their module names.
"""

from .codec import decode_record, encode_record
from .errors import JournalCorrupt, RecordError, StoreError, StoreLocked, StoreWriteError
from .records import (
    ExchangeDeclare,
    ExchangeDelete,
    GroupOwner,
    MessageAck,
    MessageDelivered,
    MessageEnqueue,
    MessageMarks,
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
from .state import MessageRef, MessageRun, StoredMessage, StoredStream, StoreState

__all__ = [
    "Defect",
    "ExchangeDeclare",
    "ExchangeDelete",
    "GroupOwner",
    "JournalCorrupt",
    "MessageAck",
    "MessageDelivered",
    "MessageEnqueue",
    "MessageMarks",
    "MessageRef",
    "MessageRun",
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
