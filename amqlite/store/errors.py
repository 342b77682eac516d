"""Errors of the storage layer, all under :class:`amqlite.errors.AmqliteError`.

- :class:`RecordError`: a record is ill-typed (on encode: a caller bug; on decode:
  a journal written by something else).
- :class:`StoreLocked`: another process holds the data directory.
- :class:`StoreWriteError`: the disk refused a write or an fsync; carries exactly
  which appended records were not stored.
- :class:`JournalCorrupt`: recovery found damage it must not repair on its own
  (anything but a torn tail of the last segment); the text says what to do.
"""

from __future__ import annotations

import errno as _errno

from amqlite.errors import AmqliteError, ReplyCode


class StoreError(AmqliteError):
    """Root of the storage errors."""

    code = ReplyCode.INTERNAL_ERROR


class RecordError(StoreError):
    """A record failed validation; the text names the record type and field."""


class StoreLocked(StoreError):
    """The data directory is locked by another process (``pid`` when known)."""

    code = ReplyCode.RESOURCE_LOCKED

    def __init__(self, directory: str, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"data dir {directory} is in use by {holder}")
        self.directory = directory
        self.pid = pid


class StoreWriteError(StoreError):
    """A write or fsync failed; nothing listed here is durable.

    ``dropped`` holds the positions of the ``message.enqueue`` records that were
    discarded: they will never be stored, so their publishes must be refused
    (nack), never confirmed. ``retrying`` holds the positions of the other records
    of the failed batch (declarations, bindings, acks, delivered flags): the
    journal keeps them, ahead of anything appended later, and writes them with the
    next successful commit, so the durable topology never misses a change the
    broker already made. ``errno`` is the operating system's error number.
    """

    code = ReplyCode.RESOURCE_ERROR

    def __init__(
        self,
        text: str,
        *,
        dropped: tuple[int, ...] = (),
        retrying: tuple[int, ...] = (),
        errno: int | None = None,
    ) -> None:
        super().__init__(text)
        self.dropped = dropped
        self.retrying = retrying
        self.errno = errno

    @property
    def not_stored(self) -> tuple[int, ...]:
        """Every position this failure left unstored, in order."""
        return tuple(sorted(self.dropped + self.retrying))

    @property
    def disk_full(self) -> bool:
        return self.errno in (_errno.ENOSPC, _errno.EDQUOT)


class JournalCorrupt(StoreError):
    """The journal is damaged where recovery may not simply cut it off."""
