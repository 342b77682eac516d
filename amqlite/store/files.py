"""The file layer: every operating-system call the journal makes, behind one object.

The journal never touches ``os`` directly, so a test can hand it a layer that
fails (``ENOSPC`` on the third write, ``EIO`` on fsync), counts fsyncs, or drops
everything that was not fsynced (a simulated power cut). :class:`OsFileLayer` is
the real one. A layer raises ``OSError`` for disk trouble; the journal turns
that into :class:`~amqlite.store.errors.StoreWriteError`. Anything else a layer
raises goes straight through (tests use that to simulate a crash).
"""

from __future__ import annotations

import fcntl
import os
from typing import Protocol


class FileHandle(Protocol):
    """An open file, written at its end."""

    def write(self, data: bytes) -> None:
        """Write all of ``data`` at the end of the file, or raise OSError."""

    def fsync(self) -> None: ...

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes; later writes go at the new end."""

    def close(self) -> None: ...


class FileLayer(Protocol):
    """The operations the journal needs; paths are plain strings."""

    def makedirs(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def size(self, path: str) -> int: ...

    def read(self, path: str, limit: int = -1) -> bytes:
        """The file's bytes (at most ``limit`` of them when ``limit`` >= 0)."""

    def open_append(self, path: str, *, truncate: bool = False) -> FileHandle:
        """Open (creating it if missing, emptying it when ``truncate``) for appending."""

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` by ``src``."""

    def remove(self, path: str) -> None: ...

    def fsync_dir(self, path: str) -> None:
        """Make renames, creations and removals in a directory durable."""

    def lock(self, path: str, owner: bytes) -> FileHandle:
        """Take an exclusive lock on ``path`` (created if missing) and write ``owner`` in
        it; raise ``BlockingIOError`` when another open file holds it. Closing the
        handle releases the lock."""


class OsFile:
    """A :class:`FileHandle` over a raw file descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def fsync(self) -> None:
        os.fsync(self.fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        os.lseek(self.fd, size, os.SEEK_SET)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class OsFileLayer:
    """The real file layer (POSIX)."""

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def read(self, path: str, limit: int = -1) -> bytes:
        with open(path, "rb") as f:
            return f.read(limit)

    def open_append(self, path: str, *, truncate: bool = False) -> FileHandle:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        os.lseek(fd, 0, os.SEEK_END)
        return OsFile(fd)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def lock(self, path: str, owner: bytes) -> FileHandle:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, owner, 0)
        except BaseException:
            os.close(fd)
            raise
        return OsFile(fd)
