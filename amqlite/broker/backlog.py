"""A queue's backlog: the ready messages behind its in-memory head, as a compact index.

A queue holds its first ready messages as entries (``Queue.ready``, a deque of
``(message, expires_at, redelivered)``). Behind them it may keep a
:class:`Backlog`: the messages that wait further back, in order, each as a few
machine words in arrays instead of Python objects. A persistent message there is
its journal id only (about 25 bytes: id, expiry, size, a flag byte); its body
stays in the journal and comes back through the :class:`MessageSource` the shell
provides (the core does no file I/O) when the queue's head runs short: the queue
reads ahead a batch at a time for its consumers (:data:`READ_AHEAD`).

A message that has no journal id (a transient one arriving behind a backlog)
stays an entry, held in a side table at its place in the order, so the order of
the queue is always ``ready`` then the backlog. While the node is over its memory
watermark (:class:`Paging`), transient messages are paged out instead: the
shell's :class:`Pager` writes them to a page file and the backlog keeps the page
reference (docs/storage.md, "Backlogs on disk").

Why two representations: a queue with consumers keeping up never has a backlog
and pays nothing for it (the plain path in ``Queue.offer``); a queue of a million
waiting messages (after a restart, or publishers far ahead of consumers) would
cost over a kilobyte per message as objects. ``tests/broker/test_backlog.py``
checks with hypothesis that a queue with a backlog hands out exactly what the
same queue fully in memory does.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Sequence
from typing import Protocol

from .message import INF, Message

#: Messages a queue moves from its backlog to its head at a time (read-ahead).
READ_AHEAD = 256
#: Ready entries a queue keeps in memory when the node pages (the rest go to disk).
KEEP = READ_AHEAD

_PAGED = 2  # flag: the message is in the page file under ``_refs[i]``
# sizes are unsigned 32-bit: a message body is far below 4 GiB (limits.max_message_size)

Entry = tuple[Message, float, bool]


class MessageSource(Protocol):
    """The shell's reader of journaled messages (sans-IO boundary)."""

    def load(self, journal_ids: Sequence[int]) -> list[Message | None]:
        """The messages under ``journal_ids``, in that order (one per id; None for
        one the journal does not hold: its enqueue record was lost to a disk error,
        and its publisher was told so)."""
        ...


class Pager(Protocol):
    """The shell's page file for messages the journal does not hold (sans-IO
    boundary): transient bodies paged out while memory is short."""

    def page_out(self, messages: Sequence[Message]) -> list[int]:
        """Store ``messages``; one reference each."""
        ...

    def page_in(self, refs: Sequence[int]) -> list[Message]:
        """The messages stored under ``refs`` (each read once: then forgotten)."""
        ...

    def discard(self, refs: Sequence[int]) -> None:
        """Forget messages without reading them (a purge, a deleted queue)."""
        ...


class Paging:
    """The broker's paging switch, shared by its queues: while ``active`` (the
    shell saw memory over its mark), messages past a queue's first :data:`KEEP`
    wait on disk, transient ones in ``pager``."""

    __slots__ = ("active", "paged", "pager")

    def __init__(self) -> None:
        self.pager: Pager | None = None
        self.active = False
        self.paged = 0  # messages paged out so far (a counter for status)


class Backlog:
    """Ready messages in order, each a journal id (``ids[i] > 0``) or an entry held in
    memory (``ids[i] == 0``, ``held[i]``). ``bytes`` counts their body bytes."""

    __slots__ = (
        "_expires",
        "_flags",
        "_head",
        "_held",
        "_hint",
        "_ids",
        "_low",
        "_refs",
        "_sizes",
        "bytes",
    )

    def __init__(self) -> None:
        self._ids = array("q")
        self._refs: dict[int, int] = {}  # absolute index -> page reference (paged only)
        self._expires = array("d")
        self._sizes = array("I")
        self._flags = bytearray()  # 1: redelivered, 2: paged
        self._held: dict[int, Entry] = {}  # absolute index -> entry kept in memory
        self._head = 0  # index of the first message still here
        self._hint = 0  # where the next mark() is likely to find its id
        # the earliest expiry here, kept while known: Queue.expire asks at every tick
        # while its head is empty (after a restart: a min over a million otherwise)
        self._low: float | None = INF
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._ids) - self._head

    def __bool__(self) -> bool:
        return len(self._ids) > self._head

    def push(self, journal_id: int, size: int, expires: float, redelivered: bool) -> None:
        """Append a journaled message by its id."""
        self._ids.append(journal_id)
        self._expires.append(expires)
        self._sizes.append(size)
        self._flags.append(1 if redelivered else 0)
        self.bytes += size
        self._lower(expires)

    def push_run(
        self,
        journal_ids: array[int],
        sizes: array[int],
        flags: bytearray,
        start: int,
        stop: int,
        expires: float | Iterable[float],
    ) -> None:
        """:meth:`push` of entries ``start`` to ``stop`` of these arrays (``flags``: 1
        redelivered, else 0), each expiring at ``expires`` or at the next of it.
        Copied straight from them: no slice of a million is made and freed."""
        if journal_ids.typecode != self._ids.typecode or sizes.typecode != self._sizes.typecode:
            raise TypeError("push_run: journal ids and sizes must be arrays of q and I")
        if stop <= start:
            return
        with memoryview(journal_ids).cast("B") as view:
            width = journal_ids.itemsize
            self._ids.frombytes(view[start * width : stop * width])
        with memoryview(sizes).cast("B") as view:
            width = sizes.itemsize
            self._sizes.frombytes(view[start * width : stop * width])
        with memoryview(flags) as view:
            self._flags += view[start:stop]
        if isinstance(expires, float):
            self._expires.extend(itertools.repeat(expires, stop - start))
            self._lower(expires)
        else:
            self._expires.extend(expires)
            self._low = None
        self.bytes += sum(itertools.islice(sizes, start, stop))

    def push_entry(self, entry: Entry) -> None:
        """Append a message kept in memory (one the journal cannot give back). Its
        journal id, if any, is kept negated, so marks and acks still find it."""
        self._held[len(self._ids)] = entry
        size = len(entry[0].body)
        self._ids.append(-entry[0].journal_id)
        self._expires.append(entry[1])
        self._sizes.append(size)
        self._flags.append(1 if entry[2] else 0)
        self.bytes += size
        self._lower(entry[1])

    def push_paged(self, ref: int, size: int, expires: float, redelivered: bool) -> None:
        """Append a message the pager holds under ``ref``."""
        self._refs[len(self._ids)] = ref
        self._ids.append(0)
        self._expires.append(expires)
        self._sizes.append(size)
        self._flags.append(_PAGED | (1 if redelivered else 0))
        self.bytes += size
        self._lower(expires)

    def extend(self, other: Backlog) -> None:
        """Append everything ``other`` holds (which is then to be dropped)."""
        base = len(self._ids) - other._head
        head = other._head
        self._ids.extend(other._ids[head:])
        for k, ref in other._refs.items():
            self._refs[base + k] = ref
        self._expires.extend(other._expires[head:])
        self._sizes.extend(other._sizes[head:])
        self._flags.extend(other._flags[head:])
        for k, entry in other._held.items():
            self._held[base + k] = entry
        self.bytes += other.bytes
        if other:
            self._lower(other.earliest())

    def _lower(self, expires: float) -> None:
        """An expiry was added: the earliest is no later than it."""
        low = self._low
        if low is not None and expires < low:
            self._low = expires

    def _removed(self) -> None:
        """Messages left: the earliest expiry is unknown again (unless none expires)."""
        if self._low != INF:
            self._low = None

    def page_held(self, pager: Pager) -> int:
        """Page out the transient messages held in memory here; how many."""
        held = self._held
        keys = [k for k, e in held.items() if type(e[0]) is Message and not e[0].journal_id]
        if not keys:
            return 0
        refs = pager.page_out([held[k][0] for k in keys])
        for k, ref in zip(keys, refs, strict=True):
            del held[k]
            self._refs[k] = ref
            self._flags[k] |= _PAGED
        return len(keys)

    def held_bytes(self) -> int:
        """Body bytes of the messages held in memory here."""
        return sum(len(e[0].body) for e in self._held.values())

    def pop(self, n: int, source: MessageSource | None, pager: Pager | None = None) -> list[Entry]:
        """Take up to ``n`` messages off the front, loading journaled and paged ones."""
        start = self._head
        stop = min(len(self._ids), start + n)
        if stop <= start:
            return []
        ids = self._ids[start:stop]
        flags = self._flags
        wanted = [i for i in ids if i > 0]
        if wanted and source is None:
            raise RuntimeError("a backlog of journaled messages needs a message source")
        loaded = iter(source.load(wanted) if source is not None and wanted else ())
        refs = [self._refs.pop(k) for k in range(start, stop) if flags[k] & _PAGED]
        if refs and pager is None:
            raise RuntimeError("a backlog of paged messages needs the pager")
        paged = iter(pager.page_in(refs) if pager is not None and refs else ())
        held = self._held
        out: list[Entry] = []
        for k in range(start, stop):
            journal_id = ids[k - start]
            if journal_id > 0:
                message = next(loaded)
                if message is not None:  # None: the journal lost it (a write error)
                    out.append((message, self._expires[k], bool(flags[k] & 1)))
            elif flags[k] & _PAGED:
                out.append((next(paged), self._expires[k], bool(flags[k] & 1)))
            else:
                out.append(held.pop(k))
            self.bytes -= self._sizes[k]
        self._head = stop
        self._removed()
        self._trim()
        return out

    def _trim(self) -> None:
        """Drop the consumed front of the arrays once it is most of them."""
        head = self._head
        if head < 4096 or head * 2 < len(self._ids):
            if head == len(self._ids) and head:
                self._reset()
            return
        del self._ids[:head]
        if self._refs:
            self._refs = {k - head: r for k, r in self._refs.items()}
        del self._expires[:head]
        del self._sizes[:head]
        del self._flags[:head]
        if self._held:
            self._held = {k - head: e for k, e in self._held.items()}
        self._hint = max(0, self._hint - head)
        self._head = 0

    def _reset(self) -> None:
        self._ids = array("q")
        self._refs = {}
        self._expires = array("d")
        self._sizes = array("I")
        self._flags = bytearray()
        self._held = {}
        self._head = self._hint = 0
        self._low = INF

    def _index(self, journal_id: int, start: int) -> int:
        ids = self._ids
        head = self._head
        start = max(start, head)
        for wanted in (journal_id, -journal_id):
            try:
                return ids.index(wanted, start)
            except ValueError:
                pass
            try:
                return ids.index(wanted, head, start)
            except ValueError:
                pass
        return -1

    def mark(self, journal_id: int) -> bool:
        """Flag message ``journal_id`` redelivered; False when not here."""
        if not journal_id:
            return False
        i = self._index(journal_id, self._hint)
        if i < 0:
            return False
        self._flags[i] |= 1
        self._hint = i + 1
        return True

    def remove(self, journal_id: int) -> bool:
        """Drop message ``journal_id`` (a journaled ack); False when not here."""
        if not journal_id:
            return False
        i = self._index(journal_id, self._head)
        if i < 0:
            return False
        self.bytes -= self._sizes[i]
        del self._ids[i]
        if self._refs:
            self._refs = {(k - 1 if k > i else k): r for k, r in self._refs.items() if k != i}
        del self._expires[i]
        del self._sizes[i]
        del self._flags[i]
        self._removed()
        if self._held:
            self._held = {(k - 1 if k > i else k): e for k, e in self._held.items()}
        if self._hint > i:
            self._hint -= 1
        return True

    def flag_all(self) -> int:
        """Flag every message redelivered; how many were not yet."""
        flags = self._flags
        fresh = sum(1 for f in flags[self._head :] if not f & 1)
        if fresh:
            for k, (message, expires, _) in list(self._held.items()):
                self._held[k] = (message, expires, True)
            self._flags = bytearray(f | 1 for f in flags)
        return fresh

    def clear(self, pager: Pager | None = None) -> list[int]:
        """Drop everything (paged messages are discarded from ``pager``); the journal
        ids dropped (in order)."""
        head = self._head
        ids = [abs(i) for i in self._ids[head:] if i]
        refs = [r for k, r in self._refs.items() if k >= head]
        if refs and pager is not None:
            pager.discard(refs)
        self._reset()
        self.bytes = 0
        return ids

    def journal_ids(self) -> list[int]:
        """The journal ids waiting here, in order."""
        return [abs(i) for i in self._ids[self._head :] if i]

    def earliest(self) -> float:
        """The earliest expiry here (INF: none expires)."""
        low = self._low
        if low is None:
            low = self._low = min(itertools.islice(self._expires, self._head, None), default=INF)
        return low
