"""Small files replaced whole and durably: the epoch counters of HA and peering.

:func:`write_durably` writes the new content beside the file, fsyncs it, renames
it over the file and fsyncs the directory, so after a crash the file holds either
the old content or the new one, never a mix, and once it returns the new content
survives a power cut. It blocks on the disk: a trio shell runs it in a worker
thread (``trio.to_thread.run_sync``).
"""

from __future__ import annotations

import contextlib
import os

from amqlite.store.files import open_private


def write_durably(path: str, data: bytes) -> None:
    """Replace the file ``path`` by ``data``, durably (see the module docstring).

    Raises ``OSError`` when the disk refuses; the file then still holds its old
    content (or is still missing) and no temporary file is left behind. A file it
    creates is ``0600``."""
    tmp = path + ".tmp"
    try:
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_if_present(path: str) -> bytes | None:
    """The content of ``path``, or None when there is no such file (never written).
    Other ``OSError`` go to the caller."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
