"""The file layer: every operating-system call the journal makes, behind one object.

The journal never touches ``os`` directly, so a test can hand it a layer that
fails (``ENOSPC`` on the third write, ``EIO`` on fsync), counts fsyncs, or drops
everything that was not fsynced (a simulated power cut). :class:`OsFileLayer` is
the real one. A layer raises ``OSError`` for disk trouble; the journal turns
that into :class:`~amqlite.store.errors.StoreWriteError`. Anything else a layer
raises goes straight through (tests use that to simulate a crash).

Everything the store creates is private to the broker's user whatever the umask:
directories ``0700`` (:func:`make_private_dirs`), files ``0600``
(:func:`open_private`). A name that comes from outside (a peering link's name, a
remote node id) becomes a file name only through :func:`file_name_for`, which can
never leave the directory it is joined to.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from typing import Protocol

DIR_MODE = 0o700
FILE_MODE = 0o600
#: The readable part of :func:`file_name_for` (the hash makes it unique).
_READABLE_MAX = 64
_READABLE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def file_name_for(name: str) -> str:
    """One safe path component for an arbitrary ``name``: its ASCII letters, digits,
    ``-`` and ``_`` (others become ``_``, at most 64 kept), then ``-`` and 16 hex
    digits of the SHA-256 of the name. Never empty, never ``.`` or ``..``, no ``/``
    or NUL, at most 81 characters; two different names never share one (the hash)."""
    readable = "".join(c if c in _READABLE else "_" for c in name[:_READABLE_MAX])
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{readable}-{digest}"


def make_private_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, the directories it creates ``0700``
    whatever the umask (an existing one keeps its mode: the operator's choice)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.normpath(path))
    if parent and parent != path:
        make_private_dirs(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return
    os.chmod(path, DIR_MODE)  # the umask may have taken bits mkdir asked for


def open_private(path: str, flags: int) -> int:
    """``os.open(path, flags | O_CREAT | O_CLOEXEC)``; a file it creates is ``0600``
    whatever the umask (an existing file keeps its mode)."""
    flags |= os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # exactly 0600, whatever the umask took
    except BaseException:
        os.close(fd)
        raise
    return fd


class FileHandle(Protocol):
    """An open file, written at its end."""

    def write(self, data: bytes) -> None:
        """Write all of ``data`` at the end of the file, or raise OSError."""

    def fsync(self) -> None: ...

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes; later writes go at the new end."""

    def close(self) -> None: ...


class ReadHandle(Protocol):
    """A file open for reading at any offset."""

    def pread(self, size: int, offset: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer at the end of the file)."""

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

    def open_read(self, path: str) -> ReadHandle:
        """Open an existing file for reading."""

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

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)


class OsFileLayer:
    """The real file layer (POSIX)."""

    def makedirs(self, path: str) -> None:
        make_private_dirs(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def read(self, path: str, limit: int = -1) -> bytes:
        with open(path, "rb") as f:
            return f.read(limit)

    def open_append(self, path: str, *, truncate: bool = False) -> FileHandle:
        fd = open_private(path, os.O_WRONLY | (os.O_TRUNC if truncate else 0))
        os.lseek(fd, 0, os.SEEK_END)
        return OsFile(fd)

    def open_read(self, path: str) -> ReadHandle:
        return OsFile(os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))

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
        fd = open_private(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, owner, 0)
        except BaseException:
            os.close(fd)
            raise
        return OsFile(fd)
