"""The disk spill store of a peering link with ``overflow = "spill"``.

A FIFO of :class:`~amqlite.peering.Entry` in one file: each entry is a 4-byte
big-endian length and the CBOR of ``Entry.to_map()``. Appends go through a
buffered writer; reading the oldest entry flushes it first. Only the sizes of the
entries stay in memory. When the last entry is taken the file is truncated, so it
grows only while the link is behind. The file belongs to one run of the broker
(a restarted broker starts a new sending log, docs/peering.md): it is emptied when
the store is opened. Its directory is created ``0700`` and the file ``0600``.
"""

from __future__ import annotations

import os
import struct
from collections import deque

import cbor2

from amqlite.peering import Entry
from amqlite.store.files import make_private_dirs, open_private

_LENGTH = struct.Struct(">I")


class FileSpill:
    """A :class:`~amqlite.peering.SpillStore` in the file ``path``."""

    def __init__(self, path: str) -> None:
        make_private_dirs(os.path.dirname(path) or ".")
        self.path = path
        fd = open_private(path, os.O_RDWR | os.O_TRUNC)
        self._file = os.fdopen(fd, "w+b")  # held open for the store's life
        self._read_at = 0
        self._sizes: deque[tuple[int, int]] = deque()  # (entry size, bytes on disk)
        self._bytes = 0

    def append(self, entry: Entry) -> None:
        data = cbor2.dumps(entry.to_map())
        self._file.seek(0, os.SEEK_END)
        self._file.write(_LENGTH.pack(len(data)) + data)
        self._sizes.append((entry.size, _LENGTH.size + len(data)))
        self._bytes += entry.size

    def pop(self) -> Entry:
        size, stored = self._sizes.popleft()
        self._file.flush()
        self._file.seek(self._read_at)
        raw = self._file.read(stored)
        self._read_at += stored
        self._bytes -= size
        if not self._sizes:  # empty: start the file again
            self._file.seek(0)
            self._file.truncate()
            self._read_at = 0
        (length,) = _LENGTH.unpack_from(raw)
        return Entry.from_map(cbor2.loads(raw[_LENGTH.size : _LENGTH.size + length]))

    def peek_size(self) -> int:
        return self._sizes[0][0]

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def bytes(self) -> int:
        return self._bytes

    def close(self) -> None:
        self._file.close()
