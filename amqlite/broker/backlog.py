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
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

from .message import INF, Message

#: Messages a queue moves from its backlog to its head at a time (read-ahead).
READ_AHEAD = 256
#: Ready entries a queue keeps in memory when the node pages (the rest go to disk).
KEEP = READ_AHEAD
#: Messages per chunk of a backlog written out (21 bytes each: 344 KB a chunk).
CHUNK = 16384

_T = TypeVar("_T")

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

    __slots__ = ("active", "chunks", "paged", "pager")

    def __init__(self) -> None:
        self.pager: Pager | None = None
        #: where backlogs write their middle out (:class:`Backlog`), None: they do not
        self.chunks: ChunkStore | None = None
        self.active = False
        self.paged = 0  # messages paged out so far (a counter for status)


class _Flat:
    """Ready messages in order, each a journal id (``ids[i] > 0``) or an entry held in
    memory (``ids[i] == 0``, ``held[i]``), in arrays. ``bytes`` counts their body
    bytes. One stretch of a :class:`Backlog`."""

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

    def extend(self, other: _Flat) -> None:
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
            else:  # held: its flag is the flags' bit too (marks and flag_all set that)
                message, expires, _ = held.pop(k)
                out.append((message, expires, bool(flags[k] & 1)))
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
            self._held = {(k - 1 if k > i else k): e for k, e in self._held.items() if k != i}
        if self._hint > i:
            self._hint -= 1
        return True

    def flag_all(self) -> int:
        """Flag every message redelivered; how many were not yet."""
        flags = self._flags
        fresh = sum(1 for f in flags[self._head :] if not f & 1)
        if fresh:  # (a held entry's flag is read from here too: see pop)
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

    def dump(self) -> _Chunk:
        """What is here as a chunk: the arrays from the head on as raw bytes (ids,
        expiries, sizes, flags), the held entries and page references beside them."""
        head = self._head
        n = len(self._ids) - head
        parts = []
        for column in (self._ids, self._expires, self._sizes):
            width = column.itemsize
            with memoryview(column).cast("B") as view:
                parts.append(view[head * width :].tobytes())
        parts.append(bytes(self._flags[head:]))
        return _Chunk(
            b"".join(parts),
            n,
            self.bytes,
            self.earliest(),
            {k - head: e for k, e in self._held.items()},
            {k - head: r for k, r in self._refs.items()},
        )

    def id_range(self) -> tuple[int, int]:
        """The lowest and highest journal id here (0, 0: none)."""
        ids = [abs(i) for i in itertools.islice(self._ids, self._head, None) if i]
        return min(ids, default=0), max(ids, default=0)

    @classmethod
    def load(cls, chunk: _Chunk, data: bytes) -> _Flat:
        """The stretch :meth:`dump` made ``chunk`` (``data`` its bytes) of."""
        flat = cls()
        n = chunk.count
        if len(data) != n * _ENTRY:
            raise ValueError(f"a backlog chunk of {n} entries has {len(data)} bytes")
        with memoryview(data) as view:
            flat._ids.frombytes(view[: 8 * n])
            flat._expires.frombytes(view[8 * n : 16 * n])
            flat._sizes.frombytes(view[16 * n : 20 * n])
            flat._flags = bytearray(view[20 * n :])
        flat._held = dict(chunk.held)
        flat._refs = dict(chunk.refs)
        flat.bytes = chunk.bytes
        flat._low = chunk.low
        return flat


_ENTRY = 21  # bytes of a chunk per message: id (8), expiry (8), size (4), flags (1)


class _Chunk:
    """A stretch of a backlog written out (``ref``, in the shell's chunk store) or
    about to be (``data``); what stays in memory is this record."""

    __slots__ = ("bytes", "count", "data", "held", "hi", "lo", "low", "ref", "refs")

    def __init__(
        self,
        data: bytes,
        count: int,
        size: int,
        low: float,
        held: dict[int, Entry],
        refs: dict[int, int],
    ) -> None:
        self.data: bytes | None = data
        self.ref = 0
        self.count = count
        self.bytes = size
        self.low = low  # the earliest expiry in it
        self.held = held  # entries kept in memory, by their index in the chunk
        self.refs = refs  # page references of paged messages, by index
        # the lowest and highest journal id in it, found when first asked (-1: not
        # yet): a mark or ack by id skips the chunks that cannot hold it
        self.lo = self.hi = -1


class ChunkStore(Protocol):
    """The shell's store of backlog chunks (sans-IO boundary): raw bytes written to
    a disposable file and read back. Nothing in it survives a restart, nor has to:
    the journal holds every journaled message, and a restart rebuilds the backlogs
    from it."""

    def put_chunk(self, data: bytes) -> int:
        """Store ``data``; its reference."""
        ...

    def get_chunk(self, ref: int) -> bytes:
        """The bytes stored under ``ref`` (still stored)."""
        ...

    def drop_chunk(self, ref: int) -> None:
        """Forget what is stored under ``ref``."""
        ...


class Backlog:
    """A queue's ready messages behind its head, in order: a front stretch (popped
    from), chunks written out through the shell's :class:`ChunkStore`, and a tail
    stretch (pushed to) that becomes the next chunk once it holds :data:`CHUNK`
    messages. With no store (``paging.chunks`` unset) everything stays in memory.

    Why chunks: the arrays cost 21 bytes a message, so a backlog of millions would
    hold a hundred megabytes of them in memory while only its two ends are ever
    used (issue 16: a backlog bigger than the memory limit). The chunks are a cache:
    the journal holds every journaled message, a restart rebuilds the backlog from
    it and the store's directory is emptied. ``tests/broker/test_backlog.py``
    checks that a chunked backlog gives exactly what one in memory does."""

    __slots__ = ("_chunks", "_count", "_front", "_paging", "_size", "_tail")

    def __init__(self, paging: Paging | None = None) -> None:
        self._paging = paging
        self._front = _Flat()
        self._chunks: deque[_Chunk] = deque()
        self._count = 0  # messages in the chunks
        self._size = 0  # their body bytes
        self._tail = _Flat()

    # --- sizes ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._front) + self._count + len(self._tail)

    def __bool__(self) -> bool:
        return bool(self._front) or self._count > 0 or bool(self._tail)

    @property
    def bytes(self) -> int:
        """Body bytes of the messages here."""
        return self._front.bytes + self._size + self._tail.bytes

    @property
    def spilled(self) -> int:
        """Messages in chunks written out."""
        return self._count

    def _store(self) -> ChunkStore | None:
        paging = self._paging
        return paging.chunks if paging is not None else None

    # --- pushing --------------------------------------------------------------------

    def _target(self) -> tuple[_Flat, int]:
        """The stretch the next message goes to, and how many it takes before a spill."""
        store = self._store()
        front = self._front
        if not self._chunks and not self._tail:
            if store is None:
                return front, 1 << 62
            if len(front) < CHUNK:
                return front, CHUNK - len(front)
        if store is None:
            return self._tail, 1 << 62
        return self._tail, max(1, CHUNK - len(self._tail))

    def _pushed(self) -> None:
        """Write the tail out as a chunk once it is full (and a store is there)."""
        if len(self._tail) >= CHUNK:
            store = self._store()
            if store is not None:
                self._spill(store)

    def _spill(self, store: ChunkStore) -> None:
        chunk = self._tail.dump()
        data = chunk.data
        assert data is not None
        chunk.ref = store.put_chunk(data)
        chunk.data = None
        self._chunks.append(chunk)
        self._count += chunk.count
        self._size += chunk.bytes
        self._tail = _Flat()

    def push(self, journal_id: int, size: int, expires: float, redelivered: bool) -> None:
        """Append a journaled message by its id."""
        self._target()[0].push(journal_id, size, expires, redelivered)
        self._pushed()

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
        Copied straight from them a chunk at a time: no slice of a million is made."""
        each = None if isinstance(expires, float) else iter(expires)
        while start < stop:
            target, room = self._target()
            end = min(stop, start + room)
            part: float | Iterable[float] = (
                expires if each is None else itertools.islice(each, end - start)
            )
            target.push_run(journal_ids, sizes, flags, start, end, part)
            start = end
            self._pushed()

    def push_entry(self, entry: Entry) -> None:
        """Append a message kept in memory (one the journal cannot give back)."""
        self._target()[0].push_entry(entry)
        self._pushed()

    def push_paged(self, ref: int, size: int, expires: float, redelivered: bool) -> None:
        """Append a message the pager holds under ``ref``."""
        self._target()[0].push_paged(ref, size, expires, redelivered)
        self._pushed()

    def _append(self, flat: _Flat) -> None:
        """Append everything ``flat`` holds."""
        if not flat:
            return
        target, _ = self._target()
        target.extend(flat)
        if target is self._tail:
            self._pushed()

    def extend(self, other: Backlog) -> None:
        """Append everything ``other`` holds (which is then to be dropped)."""
        self._append(other._front)
        if other._chunks:
            store = self._store()
            if self._tail:
                if store is None:
                    raise RuntimeError("a backlog's chunks need the chunk store")
                self._spill(store)  # a short chunk: the order is kept
            self._chunks.extend(other._chunks)
            self._count += other._count
            self._size += other._size
        self._append(other._tail)

    # --- popping --------------------------------------------------------------------

    def _take(self, chunk: _Chunk) -> _Flat:
        """A chunk's stretch back in memory (and out of the store)."""
        store = self._store()
        if store is None:
            raise RuntimeError("a backlog's chunks need the chunk store")
        flat = _Flat.load(chunk, store.get_chunk(chunk.ref))
        store.drop_chunk(chunk.ref)
        return flat

    def _refill(self) -> bool:
        """The front is empty: the next chunk (or the tail) becomes it; False if none."""
        if self._chunks:
            chunk = self._chunks.popleft()
            self._count -= chunk.count
            self._size -= chunk.bytes
            self._front = self._take(chunk)
            return True
        if self._tail:
            self._front, self._tail = self._tail, _Flat()
            return True
        return False

    def pop(self, n: int, source: MessageSource | None, pager: Pager | None = None) -> list[Entry]:
        """Take up to ``n`` messages off the front, loading journaled and paged ones."""
        out = self._front.pop(n, source, pager)
        while len(out) < n and not self._front and self._refill():
            out += self._front.pop(n - len(out), source, pager)
        return out

    # --- by journal id --------------------------------------------------------------

    def _edit(self, chunk: _Chunk, change: Callable[[_Flat], _T]) -> _T:
        """Apply ``change`` to a chunk's stretch and write it back."""
        store = self._store()
        assert store is not None
        flat = self._take(chunk)
        result = change(flat)
        self._count -= chunk.count
        self._size -= chunk.bytes
        if not flat:
            self._chunks.remove(chunk)
            return result
        fresh = flat.dump()
        data = fresh.data
        assert data is not None
        fresh.ref = store.put_chunk(data)
        fresh.data = None
        self._chunks[self._chunks.index(chunk)] = fresh
        self._count += fresh.count
        self._size += fresh.bytes
        return result

    def _by_id(self, journal_id: int, change: Callable[[_Flat], bool]) -> bool:
        if not journal_id:
            return False
        if change(self._front):
            return True
        store = self._store()
        for chunk in list(self._chunks):
            if chunk.lo < 0:
                assert store is not None
                flat = _Flat.load(chunk, store.get_chunk(chunk.ref))
                chunk.lo, chunk.hi = flat.id_range()
            if chunk.lo <= journal_id <= chunk.hi and self._edit(chunk, change):
                return True
        return change(self._tail)

    def mark(self, journal_id: int) -> bool:
        """Flag message ``journal_id`` redelivered; False when not here."""
        return self._by_id(journal_id, lambda flat: flat.mark(journal_id))

    def remove(self, journal_id: int) -> bool:
        """Drop message ``journal_id`` (a journaled ack); False when not here."""
        return self._by_id(journal_id, lambda flat: flat.remove(journal_id))

    # --- all of it ------------------------------------------------------------------

    def flag_all(self) -> int:
        """Flag every message redelivered; how many were not yet."""
        fresh = self._front.flag_all() + self._tail.flag_all()
        for chunk in list(self._chunks):
            fresh += self._edit(chunk, _Flat.flag_all)
        return fresh

    def page_held(self, pager: Pager) -> int:
        """Page out the transient messages held in memory here; how many."""
        moved = self._front.page_held(pager) + self._tail.page_held(pager)
        for chunk in list(self._chunks):
            if chunk.held:
                moved += self._edit(chunk, lambda flat: flat.page_held(pager))
        return moved

    def held_bytes(self) -> int:
        """Body bytes of the messages held in memory here."""
        in_chunks = sum(len(e[0].body) for c in self._chunks for e in c.held.values())
        return self._front.held_bytes() + in_chunks + self._tail.held_bytes()

    def clear(self, pager: Pager | None = None) -> list[int]:
        """Drop everything (paged messages are discarded from ``pager``); the journal
        ids dropped (in order)."""
        ids = self._front.clear(pager)
        for chunk in self._chunks:
            ids += self._take(chunk).clear(pager)
        ids += self._tail.clear(pager)
        self._front, self._tail = _Flat(), _Flat()
        self._chunks.clear()
        self._count = self._size = 0
        return ids

    def journal_ids(self) -> list[int]:
        """The journal ids waiting here, in order."""
        ids = self._front.journal_ids()
        store = self._store()
        for chunk in self._chunks:
            assert store is not None
            ids += _Flat.load(chunk, store.get_chunk(chunk.ref)).journal_ids()
        return ids + self._tail.journal_ids()

    def earliest(self) -> float:
        """The earliest expiry here (INF: none expires)."""
        low = min(self._front.earliest(), self._tail.earliest())
        for chunk in self._chunks:
            if chunk.low < low:
                low = chunk.low
        return low
