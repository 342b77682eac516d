"""The page file: where transient messages wait while the node is short of memory
(the broker core's :class:`~amqlite.broker.backlog.Pager`; docs/storage.md,
"Backlogs on disk").

Append-only segment files ``page-<n>.bin`` in ``<data dir>/page/`` (for a node
without a data dir, files in the system's temporary directory that are unlinked as
soon as they are made, so that nothing is left behind even by a ``kill -9``), each
message one frame: a
4-byte length, a 4-byte CRC-32, then the CBOR list ``[exchange, routing key, body,
headers, properties, deaths, publish key, journal id, mesh]``. A reference is
``segment << 36 | offset``. A message is read once (then it is back in memory) or
discarded; a segment whose every message is gone is deleted, the active one
included (the next write starts a new one). Nothing here survives a restart:
transient messages do not, and the directory is emptied when the node starts.

The same files hold queue backlogs' chunks (the core's
:class:`~amqlite.broker.backlog.ChunkStore`): the journal ids, expiries, sizes and
flags of a stretch of waiting messages as raw bytes, framed the same way (length,
CRC-32, the bytes). They are a cache of what the journal holds: a restart empties
the directory with the rest and rebuilds the backlogs from the journal.

Writes are buffered and reach the file before any read or every
:data:`FLUSH_BYTES`; the file is never fsynced (a crash loses transient messages
anyway). Reads and writes are a few syscalls each, done on the event loop: page
cache speed, like the journal's reads for queue backlogs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Sequence
from typing import Any

import cbor2

from amqlite.broker import Message
from amqlite.store.files import make_private_dirs, open_private

PAGE_DIR = "page"
SEGMENT_BYTES = 16 * 1024 * 1024
FLUSH_BYTES = 256 * 1024
_BITS = 36
_MASK = (1 << _BITS) - 1
_HEAD = struct.Struct(">II")


class PageFileError(Exception):
    """A page read back is not what was written (the file was damaged)."""


def _encode(m: Message) -> bytes:
    mesh = m.mesh
    if mesh is not None and not isinstance(mesh, dict):
        mesh = mesh.mesh_map()
    payload = cbor2.dumps(
        [
            m.exchange,
            m.routing_key,
            m.body,
            m.headers,
            m.properties,
            [list(d) for d in m.deaths],
            m.publish_key,
            m.journal_id,
            mesh,
        ]
    )
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def _decode(payload: bytes) -> Message:
    fields: list[Any] = cbor2.loads(payload)
    exchange, key, body, headers, props, deaths, publish_key, journal_id, mesh = fields
    m = Message(exchange, key, body, headers, props)
    m.deaths = tuple((q, r) for q, r in deaths)
    m.publish_key = publish_key
    m.journal_id = journal_id
    m.mesh = mesh
    return m


class PageFile:
    """Transient messages on disk; see the module docstring."""

    def __init__(self, data_dir: str | None) -> None:
        #: None: unnamed files in the system's temporary directory (no data dir)
        self.directory: str | None = None
        if data_dir is not None:
            self.directory = os.path.join(data_dir, PAGE_DIR)
            shutil.rmtree(self.directory, ignore_errors=True)  # last run's: transient
            make_private_dirs(self.directory)
        self._fds: dict[int, int] = {}
        self._live: dict[int, int] = {}  # segment -> messages still in it
        self._seq = 0
        self._size = 0  # of the active segment, buffered bytes included
        self._buffer = bytearray()
        self._written = 0  # bytes of the active segment in the file
        self.messages = 0  # paged messages not yet read back or discarded
        self.bytes = 0  # their frame bytes
        self.paged = 0  # messages ever paged out
        self.chunks = 0  # backlog chunks stored (Backlog: queues' waiting journal ids)
        self.chunk_bytes = 0

    def _path(self, seq: int) -> str:
        if self.directory is None:
            return f"page segment {seq} (an unnamed file in {tempfile.gettempdir()})"
        return os.path.join(self.directory, f"page-{seq:08d}.bin")

    def _start_segment(self) -> None:
        self._flush()
        self._seq += 1
        if self.directory is None:
            fd, path = tempfile.mkstemp(prefix="amqlite-page-", suffix=".bin")
            os.unlink(path)  # it lives as long as the descriptor: gone with the process
        else:
            fd = open_private(self._path(self._seq), os.O_RDWR | os.O_TRUNC)
        self._fds[self._seq] = fd
        self._live[self._seq] = 0
        self._size = self._written = 0

    def _flush(self) -> None:
        if self._buffer:
            fd = self._fds[self._seq]
            view = memoryview(self._buffer)
            while view:
                n = os.pwrite(fd, view, self._written)
                self._written += n
                view = view[n:]
            self._buffer = bytearray()

    # --- the Pager ----------------------------------------------------------------------

    def page_out(self, messages: Sequence[Message]) -> list[int]:
        refs = []
        for m in messages:
            if not self._seq or self._size >= SEGMENT_BYTES:
                self._start_segment()
            frame = _encode(m)
            refs.append(self._seq << _BITS | self._size)
            self._buffer += frame
            self._size += len(frame)
            self._live[self._seq] += 1
            self.messages += 1
            self.bytes += len(frame)
        self.paged += len(messages)
        if len(self._buffer) >= FLUSH_BYTES:
            self._flush()
        return refs

    def page_in(self, refs: Sequence[int]) -> list[Message]:
        self._flush()
        out = []
        for ref in refs:
            seq, payload = self._read(ref, "page")
            out.append(_decode(payload))
            self._gone(seq, _HEAD.size + len(payload))
        return out

    def _read(self, ref: int, what: str) -> tuple[int, bytes]:
        """The segment and the checked bytes of the entry at ``ref`` (a page or a
        chunk: the same head, length and CRC-32); PageFileError when damaged."""
        seq, offset = ref >> _BITS, ref & _MASK
        fd = self._fds[seq]
        length, crc = _HEAD.unpack(os.pread(fd, _HEAD.size, offset))
        data = os.pread(fd, length, offset + _HEAD.size)
        if len(data) != length or zlib.crc32(data) != crc:
            raise PageFileError(f"{self._path(seq)}: damaged {what} at offset {offset}")
        return seq, data

    # --- the ChunkStore (backlog chunks: raw bytes) ----------------------------------

    def put_chunk(self, data: bytes) -> int:
        if not self._seq or self._size >= SEGMENT_BYTES:
            self._start_segment()
        ref = self._seq << _BITS | self._size
        self._buffer += _HEAD.pack(len(data), zlib.crc32(data))
        self._buffer += data
        self._size += _HEAD.size + len(data)
        self._live[self._seq] += 1
        self.chunks += 1
        self.chunk_bytes += len(data)
        if len(self._buffer) >= FLUSH_BYTES:
            self._flush()
        return ref

    def get_chunk(self, ref: int) -> bytes:
        self._flush()
        return self._read(ref, "chunk")[1]

    def drop_chunk(self, ref: int) -> None:
        self._flush()
        seq, offset = ref >> _BITS, ref & _MASK
        length, _ = _HEAD.unpack(os.pread(self._fds[seq], _HEAD.size, offset))
        self.chunks -= 1
        self.chunk_bytes -= length
        self._gone(seq, 0)

    def discard(self, refs: Sequence[int]) -> None:
        self._flush()
        for ref in refs:
            seq, offset = ref >> _BITS, ref & _MASK
            length, _ = _HEAD.unpack(os.pread(self._fds[seq], _HEAD.size, offset))
            self._gone(seq, _HEAD.size + length)

    def _gone(self, seq: int, size: int) -> None:
        """One message of ``size`` frame bytes (or, with 0, a chunk) left segment ``seq``."""
        if size:
            self.messages -= 1
            self.bytes -= size
        self._live[seq] -= 1
        if not self._live[seq]:
            del self._live[seq]
            os.close(self._fds.pop(seq))
            if self.directory is not None:
                os.unlink(self._path(seq))
            if seq == self._seq:  # the next write starts a new segment
                self._buffer = bytearray()
                self._seq_done()

    def _seq_done(self) -> None:
        self._size = SEGMENT_BYTES  # forces _start_segment on the next page_out

    # --- status and closing --------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "messages": self.messages,
            "bytes": self.bytes,
            "segments": len(self._fds),
            "paged_total": self.paged,
            "backlog_chunks": self.chunks,
            "backlog_chunk_bytes": self.chunk_bytes,
        }

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self.directory is not None:
            for seq in list(self._live):
                with contextlib.suppress(OSError):
                    os.unlink(self._path(seq))
