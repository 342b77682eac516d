"""The durable state a journal describes, folded from its records (sans-IO, pure).

:class:`StoreState` is what a broker needs on restart: durable exchanges, durable
queues, bindings, and per queue the live persistent messages in enqueue order,
each with its ``redelivered`` flag. :meth:`StoreState.apply` folds one record;
:meth:`StoreState.snapshot` returns records that rebuild the same state from
nothing (compaction writes them; HA sends them to a rejoining peer). For any
records ``a`` and ``b``::

    fold(snapshot(fold(a)) + b) == fold(a + b)

**The caller's contract** (what a broker journals):

- durable exchanges (not the predeclared ``""`` and ``amq.*`` ones), durable
  non-exclusive queues, bindings whose queue is durable and whose exchange is
  durable or predeclared;
- persistent messages, naming only the durable queues they were routed to (a
  message that reached no durable queue is not journaled at all);
- ``message.delivered`` the first time a journaled message is handed out from a
  queue, and ``message.ack`` when it leaves that queue for good.

Nothing non-durable is ever written. The fold is forgiving all the same: it
ignores what it cannot place (an ack or delivered flag for an unknown message, a
binding to an unknown queue or exchange, a message for no known queue), because
a write error may have dropped the record that would have introduced it (see
:class:`~amqlite.store.errors.StoreWriteError`).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import operator
from array import array
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

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

#: Exchanges every vhost has without a declaration; bindings to them are kept.
PREDECLARED_PREFIX = "amq."

_Key = tuple[str, str]  # (vhost, name)
_BindingKey = tuple[str, str, str, str, Any]  # vhost, exchange, queue, key, arguments


@dataclasses.dataclass(frozen=True, slots=True)
class StoredMessage:
    """A live message of one queue, as a restarted broker should see it."""

    record: MessageEnqueue
    redelivered: bool


class StoredStream:
    """A stream queue's stored log: messages from ``first`` (in offset order), the
    ``next`` offset to append at, and the offsets consumers stored by name."""

    __slots__ = ("bytes", "first", "messages", "next", "tracked")

    def __init__(self) -> None:
        self.messages: deque[StreamAppend] = deque()
        self.first = 0
        self.next = 0
        self.bytes = 0
        self.tracked: dict[str, int] = {}

    def truncate(self, before: int) -> None:
        messages = self.messages
        while messages and messages[0].offset < before:
            self.bytes -= len(messages.popleft().body)
        # the first message kept, as an append to an empty stream sets it (offsets
        # may skip: a snapshot must rebuild the same ``first``)
        self.first = messages[0].offset if messages else max(self.first, before)
        self.next = max(self.next, before)

    def canonical(self) -> tuple[Any, ...]:
        return (list(self.messages), self.first, self.next, self.tracked)


#: What recovery's scan reads of a ``message.enqueue`` record (id, vhost, queues,
#: body size, enqueued_at, publish key): :meth:`StoreState.enqueue_placed_many`.
ScannedEnqueue = tuple[int, str, tuple[str, ...], int, float, str]

#: Reads the ``message.enqueue`` record at a journal location (the journal sets it;
#: the fold itself never reads).
Reader = Callable[[int], MessageEnqueue]

#: Properties that keep a message's record in memory even once the journal placed
#: it: a restart needs them to rebuild the queue entry (expiry, message groups).
KEPT_PROPS = _KEPT_PROPS = ("expiration", "group_id")


@dataclasses.dataclass(frozen=True, slots=True)
class MessageRef:
    """A live message in a lazy snapshot (:meth:`StoreState.snapshot_refs`): what a
    restart needs to queue it without its body. ``location`` is where the journal
    holds its ``message.enqueue`` record (-1: not placed; ``record`` is then the
    record, as enqueued); ``delivered`` names the queues that handed it out."""

    id: int
    vhost: str
    queues: tuple[str, ...]
    delivered: tuple[str, ...]
    location: int
    size: int
    enqueued_at: float
    publish_key: str
    record: MessageEnqueue | None


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class MessageRun:
    """Placed messages of one queue, consecutive in enqueue order, in a lazy snapshot
    (:meth:`StoreState.iter_refs` with ``runs``): the bulk form of as many
    :class:`MessageRef` s with one queue and no record: entries ``start`` to
    ``stop`` of the state's index arrays (journal ids, increasing; body sizes;
    enqueue times; a flag byte each, 1: delivered before) and the publish keys of
    those that have one. The arrays are the index's own, not copies: read them
    while the state is held still (``Journal.with_refs``), and keep nothing.

    Why it exists: a restart queues a million waiting messages; a ref object each,
    and a call per ref into the queue, were most of the rebuild (issue 16). The
    index already holds them as arrays, so a queue's backlog copies its part
    straight from them (copies of the slices in between cost a restart a fifth
    more memory: freed arrays that size leave the heap fragmented).
    ``tests/store/test_scan.py`` checks that the runs and the refs describe the
    same messages and that a broker rebuilt from either holds the same."""

    vhost: str
    queue: str
    ids: array[int]
    sizes: array[int]
    ats: array[float]
    flags: bytearray
    start: int
    stop: int
    publish_keys: tuple[str, ...]


class _Live:
    """A live message and, per queue still holding it, the delivered flag. Its record
    is in memory (``record``) until the journal has written it and placed it: then
    only its location in the journal files (``loc``) and what a restart needs
    (``size``, ``at``, ``pk``) stay here. A passive HA node's enqueue, scanned and not
    yet written, holds its frame instead of its record (``frame``; see
    :meth:`StoreState.enqueue_scanned`)."""

    __slots__ = ("at", "frame", "loc", "pk", "q", "record", "seq", "size", "vhost")

    def __init__(
        self, record: MessageEnqueue, queues: list[str] | tuple[str, ...], seq: int = 0
    ) -> None:
        self.seq = seq  # enqueue order
        self.record: MessageEnqueue | None = record
        # the queues holding it and their delivered flags: the name alone for the
        # usual message (one queue, not yet handed out), a dict otherwise (a dict
        # per message would be the largest part of a waiting message's memory)
        self.q: str | dict[str, bool] = (
            queues[0] if len(queues) == 1 else dict.fromkeys(queues, False)
        )
        self.loc = -1
        self.frame: bytes | None = None
        self.size = len(record.body)
        self.vhost = record.vhost
        self.at = record.enqueued_at
        self.pk = record.publish_key

    def holds(self, queue: str) -> bool:
        q = self.q
        return q == queue if isinstance(q, str) else queue in q

    def flag(self, queue: str) -> None:
        """Flag it delivered from ``queue`` (when held there)."""
        q = self.q
        if isinstance(q, str):
            if q == queue:
                self.q = {q: True}
        elif queue in q:
            q[queue] = True

    def drop(self, queue: str) -> bool:
        """Take it off ``queue`` (which holds it); True when no queue holds it now."""
        q = self.q
        if isinstance(q, str):
            self.q = {}
            return True
        del q[queue]
        return not q

    def items(self) -> tuple[tuple[str, bool], ...]:
        """(queue, delivered) for each queue holding it, in enqueue order."""
        q = self.q
        return ((q, False),) if isinstance(q, str) else tuple(q.items())

    def names(self) -> tuple[str, ...]:
        q = self.q
        return (q,) if isinstance(q, str) else tuple(q)

    @classmethod
    def placed(
        cls,
        seq: int,
        vhost: str,
        queues: tuple[str, ...],
        loc: int,
        size: int,
        at: float,
        pk: str,
    ) -> _Live:
        """A message the journal placed as it was enqueued (recovery's scan)."""
        live = cls.__new__(cls)
        live.seq, live.record, live.vhost, live.loc, live.frame = seq, None, vhost, loc, None
        live.q = queues[0] if len(queues) == 1 else dict.fromkeys(queues, False)
        live.size, live.at, live.pk = size, at, pk
        return live

    @classmethod
    def view(
        cls,
        seq: int,
        vhost: str,
        queue: str,
        delivered: bool,
        loc: int,
        size: int,
        at: float,
        pk: str,
    ) -> _Live:
        """A placed message of the index, as the other entries look (while iterating)."""
        live = cls.__new__(cls)
        live.seq, live.record, live.vhost, live.loc, live.frame = seq, None, vhost, loc, None
        live.q = {queue: True} if delivered else queue
        live.size, live.at, live.pk = size, at, pk
        return live


_DELIVERED = 1
DEAD = _DEAD = 2
_KEEP = bytes(0 if f & _DEAD else 1 for f in range(256))  # flag byte -> kept?
#: Acked entries the index keeps before it drops them from its arrays (when they are
#: also half of it).
SQUEEZE_AFTER = 4096


#: A message folded by :meth:`StoreState.enqueue_scanned` and not yet placed: its
#: journal id and entry.
Unwritten = tuple[int, _Live | None]

_SEQ_NARROW = (1 << 32) - 1  # the largest enqueue order an "I" column holds
_Q_NARROW = (1 << 16) - 1  # the largest queue number an "H" column holds


class _Index:
    """The placed messages of one queue each, in enqueue order, as arrays: about 45
    bytes a message instead of a few hundred as objects (issue 16: a million waiting
    messages). Ids only grow here (a message whose id does not stays a ``_Live``);
    acked ones are flagged dead and dropped from the arrays now and then.

    Why a second representation: it is the one a large backlog lives in; the
    ``_Live`` objects hold what is unusual (several queues, a record kept in
    memory, an id out of order). ``tests/store/test_placement.py`` checks that a
    journal's state (which uses it) and the plain fold agree at every step."""

    __slots__ = (
        "ats",
        "dead",
        "flags",
        "ids",
        "locs",
        "pks",
        "qs",
        "seqs",
        "sizes",
    )

    def __init__(self) -> None:
        self.ids = array("q")
        # enqueue order and queue number: narrow until a value needs more (widen)
        self.seqs = array("I")
        self.locs = array("q")
        self.sizes = array("I")  # bodies are far below 4 GiB (limits.max_message_size)
        self.ats = array("d")
        self.qs = array("H")  # index into StoreState._qkeys
        self.flags = bytearray()
        self.pks: dict[int, str] = {}  # id -> publish key, for the messages that have one
        self.dead = 0

    def find(self, journal_id: int) -> int:
        """The index of live message ``journal_id``, or -1."""
        ids = self.ids
        i = bisect.bisect_left(ids, journal_id)
        if i < len(ids) and ids[i] == journal_id and not self.flags[i] & _DEAD:
            return i
        return -1

    def live(self) -> int:
        return len(self.ids) - self.dead

    def widen(self, seq: int, qi: int) -> None:
        """Make room for enqueue order ``seq`` and queue number ``qi``: the columns
        start narrow (4 and 2 bytes: 6 bytes a message less over a million) and
        become 8 and 4 bytes wide the first time a value needs it."""
        if seq > _SEQ_NARROW and self.seqs.typecode == "I":
            self.seqs = array("q", self.seqs)
        if qi > _Q_NARROW and self.qs.typecode == "H":
            self.qs = array("i", self.qs)

    def squeeze(self) -> None:
        """Drop the dead entries from the arrays, one column at a time (each old one
        freed before the next is copied: a squeeze of millions peaks at one
        column's worth, not the index's)."""
        keep = self.flags.translate(_KEEP)  # a byte a message, not a list of bools
        self.ids = array("q", itertools.compress(self.ids, keep))
        self.seqs = array(self.seqs.typecode, itertools.compress(self.seqs, keep))
        self.locs = array("q", itertools.compress(self.locs, keep))
        self.sizes = array("I", itertools.compress(self.sizes, keep))
        self.ats = array("d", itertools.compress(self.ats, keep))
        self.qs = array(self.qs.typecode, itertools.compress(self.qs, keep))
        self.flags = bytearray(itertools.compress(self.flags, keep))
        self.dead = 0


def _freeze(value: Any) -> Any:
    """A hashable, type-exact stand-in for a plain value (binding arguments)."""
    if type(value) is dict:
        return ("map", tuple(sorted((k, _freeze(v)) for k, v in value.items())))
    if type(value) in (list, tuple):
        return ("list", tuple(_freeze(v) for v in value))
    return (type(value).__name__, value)


class StoreState:
    """The durable state; see the module docstring for the fold rules."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self) -> None:
        #: Reads a placed message's record back from the journal (set by the journal).
        self.read: Reader | None = None
        self._reset()

    def _reset(self) -> None:
        self._exchanges: dict[_Key, ExchangeDeclare] = {}
        self._queues: dict[_Key, QueueDeclare] = {}
        self._bindings: dict[_BindingKey, QueueBind] = {}
        self._messages: dict[int, _Live] = {}
        self._queue_messages: dict[_Key, dict[int, None]] = {}
        # placed single-queue messages (most of a backlog), see _Index
        self._index = _Index()
        self._indexed: dict[_Key, int] = {}  # live indexed messages per queue
        self._qkeys: list[_Key] = []
        self._qindex: dict[_Key, int] = {}
        self._seq = 0
        self._pinned = False  # a compaction walks the index: its entries stay in place
        self._streams: dict[_Key, StoredStream] = {}
        #: Exchange peering's receive marks, the latest per (vhost, exchange).
        self.peering: dict[_Key, PeeringMarks] = {}
        #: Message groups with an owner, per (vhost, queue, group): the latest record.
        self.groups: dict[tuple[str, str, str], GroupOwner] = {}
        #: Exchange peering's durable sending logs: per (vhost, exchange, link), the
        #: persistent messages not yet acknowledged by the remote, in ``id`` order.
        self.peering_out: dict[tuple[str, str, str], dict[int, PeeringOut]] = {}
        #: Highest ``peering.out`` id seen: a restarted node continues above it.
        self.last_peering_out = 0
        #: Highest journal id seen: a restarted node continues above it.
        self.last_journal_id = 0
        #: True between ``snapshot.begin`` and ``snapshot.end``.
        self.snapshot_open = False
        #: Body bytes of the live messages (each counted once).
        self.message_bytes = 0

    @classmethod
    def fold(cls, records: Iterator[Record] | Collection[Record]) -> StoreState:
        state = cls()
        for record in records:
            state.apply(record)
        return state

    # --- folding ---------------------------------------------------------------------

    def apply(self, record: Record) -> None:
        """Fold one record into the state."""
        handler = _HANDLERS[type(record)]
        handler(self, record)

    def _exchange_declare(self, r: ExchangeDeclare) -> None:
        self._exchanges[(r.vhost, r.name)] = r

    def _exchange_delete(self, r: ExchangeDelete) -> None:
        if self._exchanges.pop((r.vhost, r.name), None) is None:
            return
        for key in [k for k in self._bindings if k[0] == r.vhost and k[1] == r.name]:
            del self._bindings[key]

    def _queue_declare(self, r: QueueDeclare) -> None:
        key = (r.vhost, r.name)
        self._queues[key] = r
        self._queue_messages.setdefault(key, {})
        if r.arguments.get("x-queue-type") == "stream":
            self._streams.setdefault(key, StoredStream())
        else:  # the latest declaration wins
            self._streams.pop(key, None)

    def _queue_delete(self, r: QueueDelete) -> None:
        key = (r.vhost, r.name)
        if key not in self._queues:
            return
        self._purge(key)
        del self._queues[key]
        del self._queue_messages[key]
        self._indexed.pop(key, None)
        self._streams.pop(key, None)
        for bkey in [k for k in self._bindings if k[0] == r.vhost and k[2] == r.name]:
            del self._bindings[bkey]
        for gkey in [k for k in self.groups if k[0] == r.vhost and k[1] == r.name]:
            del self.groups[gkey]

    def _queue_purge(self, r: QueuePurge) -> None:
        key = (r.vhost, r.name)
        if key in self._queues:
            self._purge(key)

    def _purge(self, key: _Key) -> None:
        ids = self._queue_messages[key]
        for journal_id in ids:
            self._leave(self._messages[journal_id], journal_id, key[1])
        ids.clear()
        qi = self._qindex.get(key)
        if qi is not None and self._indexed.get(key):
            index = self._index
            flags = index.flags
            for i, q in enumerate(index.qs):
                if q == qi and not flags[i] & _DEAD:
                    self._kill(i)

    def _binding_key(self, r: QueueBind | QueueUnbind) -> _BindingKey:
        return (r.vhost, r.exchange, r.queue, r.key, _freeze(r.arguments))

    def _queue_bind(self, r: QueueBind) -> None:
        if (r.vhost, r.queue) not in self._queues:
            return
        if (r.vhost, r.exchange) not in self._exchanges and not r.exchange.startswith(
            PREDECLARED_PREFIX
        ):
            return
        self._bindings[self._binding_key(r)] = r

    def _queue_unbind(self, r: QueueUnbind) -> None:
        self._bindings.pop(self._binding_key(r), None)

    def _message_enqueue(self, r: MessageEnqueue) -> None:
        journal_id = r.id
        if journal_id > self.last_journal_id:
            self.last_journal_id = journal_id
        ids = self._index.ids
        if journal_id in self._messages or (
            ids and journal_id <= ids[-1] and self._index.find(journal_id) >= 0
        ):  # the index is sorted: a new id above its last is not in it (no search)
            return
        vhost, names = r.vhost, r.queues
        if len(names) == 1:  # the usual message: no list, no loop
            ids_of = self._queue_messages.get((vhost, names[0]))
            if ids_of is None:  # not a known queue (each known one has its dict)
                return
            self._seq = seq = self._seq + 1
            self._messages[journal_id] = _Live(r, names, seq)
            ids_of[journal_id] = None
            self.message_bytes += len(r.body)
            return
        known = self._queues
        queues = [q for q in names if (vhost, q) in known]
        if not queues:
            return
        self._seq += 1
        self._messages[journal_id] = _Live(r, queues, self._seq)
        qm = self._queue_messages
        for q in queues:
            qm[(vhost, q)][journal_id] = None
        self.message_bytes += len(r.body)

    def _message_delivered(self, r: MessageDelivered) -> None:
        self._delivered(r.id, r.queue)

    def _message_ack(self, r: MessageAck) -> None:
        self._acked(r.id, r.queue)

    def _message_marks(self, r: MessageMarks) -> None:
        """:meth:`_delivered` of each delivered id, then :meth:`_acked` of each acked
        one, with the usual message inline: live, held by ``queue`` alone (flagged:
        its ``q`` becomes ``{queue: True}``; acked: it is gone).

        Why inline: an HA pair's active node journals a mark for every persistent
        message it hands out (before the consumer sees it) and its ack later, and a
        standalone node an ack each: two calls an id, and the passive node folds
        the same records. ``tests/store/test_marks_fold.py`` checks with hypothesis
        that this agrees with the per-id records (``message.delivered``,
        ``message.ack``) folded one by one."""
        queue = r.queue
        messages = self._messages
        for journal_id in r.delivered:
            live = messages.get(journal_id)
            if live is not None and live.q == queue:  # (a str: one queue, not flagged)
                live.q = {queue: True}
            else:
                self._delivered(journal_id, queue)
        acked = r.acked
        if not acked:
            return
        vhost = ""
        ids: dict[int, None] | None = None
        for journal_id in acked:
            live = messages.get(journal_id)
            if live is not None:
                q = live.q
                if q == queue:  # one queue, not flagged
                    live.q = {}
                elif type(q) is dict and len(q) == 1 and queue in q:  # one queue, flagged
                    del q[queue]
                else:
                    self._acked(journal_id, queue)
                    continue
                if ids is None or live.vhost != vhost:
                    vhost = live.vhost
                    ids = self._queue_messages[(vhost, queue)]
                del ids[journal_id]
                del messages[journal_id]
                self.message_bytes -= live.size
            else:
                self._acked(journal_id, queue)

    def _delivered(self, journal_id: int, queue: str) -> None:
        live = self._messages.get(journal_id)
        if live is not None:
            live.flag(queue)
            return
        i = self._index_of(journal_id, queue)
        if i >= 0:
            self._index.flags[i] |= _DELIVERED

    def _acked(self, journal_id: int, queue: str) -> None:
        live = self._messages.get(journal_id)
        if live is not None:
            if live.holds(queue):
                del self._queue_messages[(live.vhost, queue)][journal_id]
                self._leave(live, journal_id, queue)
            return
        i = self._index_of(journal_id, queue)
        if i >= 0:
            self._kill(i)
            index = self._index
            if index.dead > SQUEEZE_AFTER and index.dead * 2 > len(index.ids) and not self._pinned:
                index.squeeze()

    def _index_of(self, journal_id: int, queue: str) -> int:
        """The index entry of live message ``journal_id`` held by ``queue``, or -1."""
        index = self._index
        if not index.ids:
            return -1
        i = index.find(journal_id)
        if i >= 0 and self._qkeys[index.qs[i]][1] == queue:
            return i
        return -1

    def _kill(self, i: int) -> None:
        """An indexed message left its queue: it is gone."""
        index = self._index
        index.flags[i] |= _DEAD
        index.dead += 1
        self.message_bytes -= index.sizes[i]
        self._indexed[self._qkeys[index.qs[i]]] -= 1
        if index.pks:
            index.pks.pop(index.ids[i], None)

    def _leave(self, live: _Live, journal_id: int, queue: str) -> None:
        """Take a message off one queue (its per-queue index is the caller's job)."""
        if live.drop(queue):
            del self._messages[journal_id]
            self.message_bytes -= live.size

    def _stream_append(self, r: StreamAppend) -> None:
        stream = self._streams.get((r.vhost, r.queue))
        if stream is None or r.offset < stream.next:
            return  # no such stream, or an offset it already has: ignored
        stream.messages.append(r)
        stream.bytes += len(r.body)
        stream.next = r.offset + 1
        if not stream.messages or stream.messages[0] is r:
            stream.first = r.offset

    def _stream_truncate(self, r: StreamTruncate) -> None:
        stream = self._streams.get((r.vhost, r.queue))
        if stream is not None:
            stream.truncate(r.before)

    def _stream_track(self, r: StreamTrack) -> None:
        stream = self._streams.get((r.vhost, r.queue))
        if stream is not None:
            stream.tracked[r.name] = r.offset

    def _group_owner(self, r: GroupOwner) -> None:
        key = (r.vhost, r.queue, r.group)
        if not r.owner:
            self.groups.pop(key, None)
        elif (r.vhost, r.queue) in self._queues:
            self.groups[key] = r

    def _peering_marks(self, r: PeeringMarks) -> None:
        self.peering[(r.vhost, r.exchange)] = r

    def _peering_out(self, r: PeeringOut) -> None:
        self.peering_out.setdefault((r.vhost, r.exchange, r.link), {})[r.id] = r
        self.last_peering_out = max(self.last_peering_out, r.id)

    def _peering_out_ack(self, r: PeeringOutAck) -> None:
        self.last_peering_out = max(self.last_peering_out, r.id)
        key = (r.vhost, r.exchange, r.link)
        kept = self.peering_out.get(key)
        if kept is None:
            return
        for oid in list(kept):
            if oid > r.id:
                break
            del kept[oid]
        if not kept:
            del self.peering_out[key]

    def _snapshot_begin(self, r: SnapshotBegin) -> None:
        self._reset()
        self.last_journal_id = r.last_journal_id
        self.snapshot_open = True

    def _snapshot_end(self, r: SnapshotEnd) -> None:
        self.snapshot_open = False

    def forget_message(self, journal_id: int) -> None:
        """Drop a message from every queue without a record (its enqueue record was
        never stored, or the broker says it is gone; see ``Journal.compact``)."""
        live = self._messages.get(journal_id)
        if live is None:
            i = self._index.find(journal_id) if self._index.ids else -1
            if i >= 0:
                self._kill(i)
            return
        for q in live.names():
            del self._queue_messages[(live.vhost, q)][journal_id]
            self._leave(live, journal_id, q)

    # --- where the journal holds the messages ------------------------------------------

    def place(self, record: MessageEnqueue, location: int) -> bool:
        """The journal wrote ``record`` at ``location``: forget the record (the body is
        read back from there), unless it is no longer the live message's (acked, or
        a second enqueue of its id) or a restart needs more of it (expiration,
        group). True when placed."""
        live = self._messages.get(record.id)
        if live is None or live.record is not record:
            return False
        props = record.props
        if props and any(k in props for k in _KEPT_PROPS):
            return False
        live.record = None
        self._located(record.id, live, location)
        return True

    def _located(self, journal_id: int, live: _Live, location: int) -> None:
        live.loc = location
        index = self._index
        q = live.q
        if (
            isinstance(q, str)
            and (not index.ids or (journal_id > index.ids[-1] and live.seq > index.seqs[-1]))
            and journal_id < 1 << 63
        ):
            self._to_index(journal_id, live, q)

    def enqueue_scanned(self, fields: ScannedEnqueue, frame: bytes) -> Unwritten:
        """``apply`` of a ``message.enqueue`` record from its scanned fields
        (``amqlite.store.codec.EnqueueScan``), its ``frame`` kept instead of a record
        object until :meth:`place_scanned` places it where the journal wrote it.
        Returns what to hand :meth:`place_scanned` (its id, and its entry or None
        when the fold ignored it).

        Why it exists: a passive HA node folds every replicated enqueue, and decoding
        each one whole (CBOR, a record object, the property checks) was most of its
        CPU (issue 16); like recovery it needs only the index's fields. Anything that
        needs the record (a snapshot, a rebuild, a read) decodes the frame then
        (``_materialise``), which makes the entry exactly what ``apply`` makes.
        ``tests/store/test_scanned_enqueue.py`` checks with hypothesis that a journal
        fed this way and one fed whole records agree at every step."""
        journal_id, vhost, queues, size, at, pk = fields
        if journal_id > self.last_journal_id:
            self.last_journal_id = journal_id
        messages = self._messages
        ids = self._index.ids
        if journal_id in messages or (
            ids and journal_id <= ids[-1] and self._index.find(journal_id) >= 0
        ):  # the index is sorted: a new id above its last is not in it (no search:
            # replicated ids come in order, and the search was a tenth of this fold)
            return journal_id, None
        known = self._queues
        live_queues: tuple[str, ...]
        if len(queues) == 1:  # the usual message: no generator
            live_queues = queues if (vhost, queues[0]) in known else ()
        else:
            live_queues = tuple(q for q in queues if (vhost, q) in known)
        if not live_queues:
            return journal_id, None
        self._seq += 1
        live = _Live.placed(self._seq, vhost, live_queues, -1, size, at, pk)
        live.frame = frame
        messages[journal_id] = live
        for q in live_queues:
            self._queue_messages[(vhost, q)][journal_id] = None
        self.message_bytes += size
        return journal_id, live

    def place_scanned(self, scanned: Unwritten, location: int) -> bool:
        """:meth:`place` of an enqueue folded by :meth:`enqueue_scanned`: the journal
        wrote its frame at ``location``. True when placed."""
        journal_id, live = scanned
        if live is None or self._messages.get(journal_id) is not live:
            return False  # acked meanwhile, or a snapshot replaced the state
        if live.record is not None:  # materialised meanwhile: the general path's form
            return self.place(live.record, location)
        if live.frame is None:
            return False
        live.frame = None
        self._located(journal_id, live, location)
        return True

    def fold_replicated(
        self, items: Sequence[tuple[Record | ScannedEnqueue, bytes]]
    ) -> list[tuple[int, Unwritten | MessageEnqueue]]:
        """Fold a passive HA node's unfolded tail, ``items`` as
        :func:`~amqlite.store.segment.parse_scanned` gives them (a tuple is a scanned
        enqueue's fields), in order: the same state as :meth:`apply` /
        :meth:`enqueue_scanned` of each. Returns what the journal must place once it
        has written them: (index in ``items``, the scanned enqueue's
        :data:`Unwritten` or the ``message.enqueue`` record).

        Why it exists: a passive node folds every replicated record, and most of its
        CPU went to messages already acked a few syncs later (the consumer keeps up).
        Folded in bulk, an enqueue of a message on one queue and its ack in the same
        run of message records (enqueues, marks, acks, up to any other record) cancel
        out: neither builds nor removes an entry. Exactly when the general fold would
        leave no trace of the message but ``last_journal_id``: its only enqueue in
        the run, on one queue, not held before the run, an ack from that queue after
        it; its marks and acks from that queue in the run are then no-ops or undone.
        ``tests/store/test_lazy_fold.py`` checks with hypothesis that a journal folded
        this way agrees with one folding each record as it comes."""
        return self.fold_records([record for record, _ in items], lambda i: items[i][1])

    def fold_records(
        self,
        records: Sequence[Record | ScannedEnqueue],
        frame_of: Callable[[int], bytes],
    ) -> list[tuple[int, Unwritten | MessageEnqueue]]:
        """:meth:`fold_replicated` of ``records`` (as
        :meth:`~amqlite.store.recover.ReplicaFrames.scan` gives them), asking ``frame_of(i)``
        for the frame of ``records[i]`` only when it is kept (an enqueue that does not
        cancel out): the journal's bulk fold, which then slices few frames."""
        out: list[tuple[int, Unwritten | MessageEnqueue]] = []
        start, n = 0, len(records)
        while start < n:
            stop = start
            while stop < n and type(records[stop]) in _RUN_TYPES:
                stop += 1
            if stop > start:
                self._fold_run(records, frame_of, start, stop, out)
            if stop < n:
                self.apply(records[stop])  # type: ignore[arg-type]  # not a tuple: a record
                stop += 1
            start = stop
        return out

    def _fold_run(
        self,
        records: Sequence[Record | ScannedEnqueue],
        frame_of: Callable[[int], bytes],
        start: int,
        stop: int,
        out: list[tuple[int, Unwritten | MessageEnqueue]],
    ) -> None:
        """:meth:`fold_records` of ``records[start:stop]``, message records only."""
        # id -> its queue while its only enqueue in the run is a scanned one on one
        # queue, None once it is not; the ids acked from that queue after it
        only: dict[int, str | None] = {}
        acked: list[int] = []
        for i in range(start, stop):
            r: Any = records[i]
            t = type(r)
            if t is tuple:
                journal_id, queues = r[0], r[2]
                only[journal_id] = (
                    queues[0] if len(queues) == 1 and journal_id not in only else None
                )
            elif t is MessageMarks:
                queue = r.queue
                for journal_id in r.acked:
                    if only.get(journal_id) == queue:
                        acked.append(journal_id)
            elif t is MessageAck:
                if only.get(r.id) == r.queue:
                    acked.append(r.id)
            elif t is MessageEnqueue:
                only[r.id] = None
        cancel: dict[int, str] = {}
        if acked:
            messages, index = self._messages, self._index
            ids = index.ids
            top = ids[-1] if ids else -1
            for journal_id in acked:
                queue = only[journal_id]
                if queue is None or journal_id in messages:
                    continue
                if journal_id <= top and index.find(journal_id) >= 0:
                    continue
                cancel[journal_id] = queue
        enqueue_scanned = self.enqueue_scanned
        for i in range(start, stop):
            r = records[i]
            t = type(r)
            if t is tuple:
                journal_id = r[0]
                if journal_id in cancel:
                    if journal_id > self.last_journal_id:
                        self.last_journal_id = journal_id
                    continue
                out.append((i, enqueue_scanned(r, frame_of(i))))
            elif t is MessageMarks:
                if not cancel:
                    self._message_marks(r)
                    continue
                queue = r.queue
                for journal_id in r.delivered:
                    if cancel.get(journal_id) != queue:
                        self._delivered(journal_id, queue)
                for journal_id in r.acked:
                    if cancel.get(journal_id) != queue:
                        self._acked(journal_id, queue)
            elif t is MessageEnqueue:
                self._message_enqueue(r)
                out.append((i, r))
            elif cancel.get(r.id) != r.queue:  # an ack or delivered mark
                self.apply(r)

    def enqueue_placed(self, fields: ScannedEnqueue, location: int) -> None:
        """:meth:`enqueue_placed_many` of one message."""
        self.enqueue_placed_many(((fields, location),))

    def enqueue_placed_many(self, batch: Iterable[tuple[ScannedEnqueue, int]]) -> None:
        """``apply`` then ``place`` of ``message.enqueue`` records already in the
        journal, from their fields alone and their locations (recovery's scan,
        ``amqlite.store.codec.EnqueueScan``: no ``deaths``, ``mesh`` or kept
        property), in order.

        Why it exists: a restart folds a million of them, and the record objects,
        a ``_Live`` each and their moves into the index were most of that; here the
        usual message (one queue, ids growing) goes straight to the index's arrays,
        the rest becomes a ``_Live`` as ``place`` leaves it.
        ``tests/store/test_scan.py`` checks that it agrees with apply and place."""
        index = self._index
        ids = index.ids
        top = ids[-1] if ids else -1
        find = index.find
        messages = self._messages
        known = self._queues
        qindex = self._qindex
        indexed = self._indexed
        pks = index.pks
        add_id, add_seq, add_loc = ids.append, index.seqs.append, index.locs.append
        add_size, add_at, add_q = index.sizes.append, index.ats.append, index.qs.append
        add_flag = index.flags.append
        seq = self._seq
        # above this, the index's enqueue order column is widened (rebinding add_seq)
        seq_cap = _SEQ_NARROW if index.seqs.typecode == "I" else 1 << 63
        last = self.last_journal_id
        added = 0
        # the last route (the scan gives the same objects for the same route) and
        # what it comes to: the queues known here, the index's key when just one
        route: tuple[str, tuple[str, ...]] | None = None
        live_queues: tuple[str, ...] = ()
        key: _Key | None = None
        qi = -1
        for (journal_id, vhost, queues, size, at, pk), location in batch:
            if journal_id > last:
                last = journal_id
            if journal_id in messages or (journal_id <= top and find(journal_id) >= 0):
                continue
            if route is None or queues is not route[1] or vhost is not route[0]:
                route = (vhost, queues)
                live_queues = tuple(q for q in queues if (vhost, q) in known)
                key = None
                if len(live_queues) == 1:
                    key = (vhost, live_queues[0])
                    qi = qindex.get(key, -1)
            if not live_queues:
                continue
            if key is not None and journal_id > top:
                if qi < 0:
                    qi = qindex[key] = len(self._qkeys)
                    self._qkeys.append(key)
                    if qi > _Q_NARROW:
                        index.widen(0, qi)
                        add_q = index.qs.append
                seq += 1
                if seq > seq_cap:
                    index.widen(seq, 0)
                    add_seq, seq_cap = index.seqs.append, 1 << 63
                added += size
                add_id(journal_id)
                add_seq(seq)
                add_loc(location)
                add_size(size)
                add_at(at)
                add_q(qi)
                add_flag(0)
                if pk:
                    pks[journal_id] = pk
                indexed[key] = indexed.get(key, 0) + 1
                top = journal_id
                continue
            seq += 1
            added += size
            messages[journal_id] = _Live.placed(seq, vhost, live_queues, location, size, at, pk)
            for q in live_queues:
                self._queue_messages[(vhost, q)][journal_id] = None
        self._seq = seq
        self.last_journal_id = last
        self.message_bytes += added

    def enqueue_placed_run(
        self,
        ids: array[int],
        ats: array[float],
        locations: array[int],
        vhost: str,
        queues: tuple[str, ...],
        size: int,
        keys: list[str] | None = None,
    ) -> None:
        """:meth:`enqueue_placed_many` of a run of enqueues that differ only in their
        ids, times, locations and publish keys (``keys``: None for none), given as
        columns.

        Why it exists: recovery reads a backlog's records a run at a time
        (``amqlite.store.recover``); the usual run (one known queue, ids above any
        seen) extends the index's columns in C, about 30 times cheaper than a tuple
        a message. Anything else goes through :meth:`enqueue_placed_many`.
        ``tests/store/test_recover_pass.py`` checks that they agree."""
        n = len(ids)
        if not n:
            return
        known = self._queues
        live_queues = tuple(q for q in queues if (vhost, q) in known)
        if (
            len(live_queues) != 1
            or ids[0] <= self.last_journal_id
            or not all(map(operator.lt, ids, itertools.islice(ids, 1, None)))
        ):
            self.enqueue_placed_many(
                ((i, vhost, queues, size, at, key), loc)
                for i, at, loc, key in zip(
                    ids, ats, locations, keys or itertools.repeat("", n), strict=True
                )
            )
            return
        index = self._index
        key = (vhost, live_queues[0])
        qi = self._qindex.get(key, -1)
        if qi < 0:
            qi = self._qindex[key] = len(self._qkeys)
            self._qkeys.append(key)
        seq = self._seq
        index.widen(seq + n, qi)
        index.ids.extend(ids if ids.typecode == "q" else array("q", ids))
        index.seqs.extend(range(seq + 1, seq + n + 1))
        index.locs.extend(locations)
        index.sizes.extend(array("I", (size,)) * n)
        index.ats.extend(ats)
        index.qs.extend(array(index.qs.typecode, (qi,)) * n)
        index.flags.extend(bytes(n))
        if keys is not None:  # (a key is never empty: the shape has one or none)
            index.pks.update(zip(ids, keys, strict=True))
        self._indexed[key] = self._indexed.get(key, 0) + n
        self._seq = seq + n
        self.last_journal_id = ids[-1]
        self.message_bytes += size * n

    def _to_index(self, journal_id: int, live: _Live, queue: str) -> None:
        key = (live.vhost, queue)
        qi = self._qindex.get(key)
        if qi is None:
            qi = self._qindex[key] = len(self._qkeys)
            self._qkeys.append(key)
        del self._messages[journal_id]
        del self._queue_messages[key][journal_id]
        index = self._index
        index.widen(live.seq, qi)
        index.ids.append(journal_id)
        index.seqs.append(live.seq)
        index.locs.append(live.loc)
        index.sizes.append(live.size)
        index.ats.append(live.at)
        index.qs.append(qi)
        index.flags.append(0)
        if live.pk:
            index.pks[journal_id] = live.pk
        self._indexed[key] = self._indexed.get(key, 0) + 1

    def _entries(self) -> Iterator[tuple[int, _Live]]:
        """Every live message in enqueue order: (journal id, its entry), the indexed
        ones as views made on the fly."""
        index = self._index
        if not index.live():
            yield from self._messages.items()
            return
        qkeys, pks = self._qkeys, index.pks
        view = _Live.view

        def indexed() -> Iterator[tuple[int, _Live]]:
            flags = index.flags
            for i, journal_id in enumerate(index.ids):
                f = flags[i]
                if f & _DEAD:
                    continue
                vhost, queue = qkeys[index.qs[i]]
                yield (
                    journal_id,
                    view(
                        index.seqs[i],
                        vhost,
                        queue,
                        bool(f & _DELIVERED),
                        index.locs[i],
                        index.sizes[i],
                        index.ats[i],
                        pks.get(journal_id, ""),
                    ),
                )

        yield from heapq.merge(self._messages.items(), indexed(), key=lambda e: e[1].seq)

    def relocate(self, moves: list[tuple[int, MessageEnqueue | int, int]]) -> None:
        """Compaction rewrote messages: ``(journal_id, was, location)``, ``was`` being
        the location the message had (or its record, when it had none)."""
        messages = self._messages
        index = self._index
        for journal_id, was, location in moves:
            live = messages.get(journal_id)
            if live is None:
                i = index.find(journal_id) if index.ids and type(was) is int else -1
                if i >= 0 and index.locs[i] == was:
                    index.locs[i] = location
                continue
            if type(was) is int:
                if live.record is None and live.loc == was:
                    live.loc = location
            elif live.record is was:
                self.place(was, location)

    def located(self, journal_id: int) -> MessageEnqueue | int | None:
        """A live message's record when in memory, else its journal location; None
        when the message is not live."""
        live = self._messages.get(journal_id)
        if live is None:
            i = self._index.find(journal_id) if self._index.ids else -1
            return self._index.locs[i] if i >= 0 else None
        if live.frame is not None:
            return _materialise(live)
        return live.record if live.record is not None else live.loc

    def _record(self, live: _Live) -> MessageEnqueue:
        """The message's record as enqueued (read back when placed)."""
        if live.record is not None:
            return live.record
        if live.frame is not None:
            return _materialise(live)
        if self.read is None:
            raise RuntimeError("a placed message needs the journal's reader")
        return self.read(live.loc)

    # --- snapshots -------------------------------------------------------------------

    def _head(self) -> list[Record]:
        """A snapshot's opening: ``snapshot.begin``, then the topology (exchanges,
        queues, bindings), before any message."""
        head: list[Record] = [SnapshotBegin(last_journal_id=self.last_journal_id)]
        head.extend(self._exchanges.values())
        head.extend(self._queues.values())
        head.extend(self._bindings.values())
        return head

    def snapshot(self) -> list[Record]:
        """Records that rebuild this state from nothing, framed by ``snapshot.begin``
        and ``snapshot.end`` (left out while a snapshot being received is still
        open, so the rest of it can follow): exchanges, queues, bindings, then the live messages in
        enqueue order (each naming only the queues still holding it, followed by its
        ``message.delivered`` flags)."""
        out = self._head()
        for journal_id, live in self._entries():
            out.append(_current(self._record(live), live))
            out.extend(
                MessageDelivered(id=journal_id, queue=q)
                for q, delivered in live.items()
                if delivered
            )
        self._tail(out)
        return out

    def snapshot_refs(self) -> list[Record | MessageRef]:
        """:meth:`snapshot` without reading anything back: each live message is one
        :class:`MessageRef` (its delivered flags in it) instead of its records.
        Compaction resolves them outside the journal's lock; a restart queues them
        by journal id, their bodies left in the journal (:meth:`iter_refs`)."""
        return [r for r in self.iter_refs() if not isinstance(r, MessageRun)]  # none are

    def iter_refs(self, *, runs: bool = False) -> Iterator[Record | MessageRef | MessageRun]:
        """:meth:`snapshot_refs` one item at a time (a restart's recovery: a million
        refs never exist at once). With ``runs``, the index's messages come as
        :class:`MessageRun` s instead of a ref each (the messages held as objects
        still come as refs, at their place in enqueue order). Do not change the
        state meanwhile."""
        yield from self._head()
        if runs:
            yield from self._runs()
        else:
            for journal_id, live in self._entries():
                yield _ref(journal_id, live)
        tail: list[Record] = []
        self._tail(tail)
        yield from tail

    def _runs(self) -> Iterator[MessageRef | MessageRun]:
        """The live messages in enqueue order: the objects as refs, the index between
        them as runs."""
        seqs = self._index.seqs
        done = 0
        for journal_id, live in self._messages.items():  # in enqueue order
            before = bisect.bisect_left(seqs, live.seq, done)
            yield from self._index_runs(done, before)
            done = before
            yield _ref(journal_id, live)
        yield from self._index_runs(done, len(seqs))

    def _index_runs(self, start: int, stop: int) -> Iterator[MessageRun]:
        """Index entries ``start`` to ``stop`` as runs: split where the queue changes
        and around the dead (one slice of each array when neither happens)."""
        if start >= stop:
            return
        index = self._index
        qs, flags = index.qs, index.flags
        first = qs[start]
        if self._uniform(first, start, stop):
            yield self._run(first, start, stop)
            return
        begin = -1
        for i in range(start, stop):
            if flags[i] & _DEAD:
                if begin >= 0:
                    yield self._run(first, begin, i)
                    begin = -1
            elif begin < 0:
                begin, first = i, qs[i]
            elif qs[i] != first:
                yield self._run(first, begin, i)
                begin, first = i, qs[i]
        if begin >= 0:
            yield self._run(first, begin, stop)

    def _uniform(self, qi: int, start: int, stop: int) -> bool:
        """Index entries ``start`` to ``stop`` are all live and of queue ``qi`` (found
        without copying the arrays: a restart's index may be a million long)."""
        index = self._index
        flags, qs = index.flags, index.qs
        if index.dead and any(flags.find(bytes((f,)), start, stop) >= 0 for f in (2, 3)):
            return False
        if len(self._qkeys) > 8:
            return False  # the caller walks the entries
        for other in range(len(self._qkeys)):
            if other != qi:
                try:
                    qs.index(other, start, stop)
                except ValueError:
                    continue
                return False
        return True

    def _run(self, qi: int, start: int, stop: int) -> MessageRun:
        """Live index entries ``start`` to ``stop``, all of queue ``qi``."""
        index = self._index
        vhost, queue = self._qkeys[qi]
        pks = index.pks
        keys: tuple[str, ...] = ()
        if pks:
            keys = tuple(pks[i] for i in itertools.islice(index.ids, start, stop) if i in pks)
        return MessageRun(
            vhost=vhost,
            queue=queue,
            ids=index.ids,
            sizes=index.sizes,
            ats=index.ats,
            flags=index.flags,
            start=start,
            stop=stop,
            publish_keys=keys,
        )

    def compaction_parts(
        self,
    ) -> tuple[list[Record], list[tuple[int, MessageRef]], list[Record], _Index, int]:
        """What compaction writes, without a ref per indexed message: the records
        before the messages, the messages held as objects (with their enqueue order),
        the records after, and the index with how many of its entries to walk (in
        enqueue order, skipping the dead). The index is pinned (its entries keep
        their places) until :meth:`unpin`; a message acked meanwhile may be left out
        of the snapshot (its ack follows the snapshot in the journal anyway)."""
        if self._index.dead and not self._pinned:
            # the dead go first: the walk and its new locations (8 bytes an entry)
            # then cover the live ones only (a drained backlog of millions)
            self._index.squeeze()
        head = self._head()
        objects = [(live.seq, _ref(i, live)) for i, live in self._messages.items()]
        tail: list[Record] = []
        self._tail(tail)
        self._pinned = True
        return head, objects, tail, self._index, len(self._index.ids)

    def unpin(self) -> None:
        self._pinned = False

    def queue_of(self, index: _Index, i: int) -> str:
        """The queue name of index entry ``i``."""
        return self._qkeys[index.qs[i]][1]

    def relocate_index(self, index: _Index, locations: array[int]) -> None:
        """Compaction rewrote the first ``len(locations)`` index entries (the dead ones
        keep what they had); a snapshot received meanwhile made a new index: then
        there is nothing to move."""
        if index is self._index:
            index.locs[: len(locations)] = locations

    def _tail(self, out: list[Record]) -> None:
        """The snapshot after the messages: streams, peering, ``snapshot.end``."""
        for key in self._queues:  # queue order: a snapshot's snapshot is identical
            stream = self._streams.get(key)
            if stream is None:
                continue
            vhost, queue = key
            if stream.first:
                out.append(StreamTruncate(vhost=vhost, queue=queue, before=stream.first))
            out.extend(stream.messages)  # an emptied stream: first == next, kept above
            out.extend(
                StreamTrack(vhost=vhost, queue=queue, name=name, offset=offset)
                for name, offset in stream.tracked.items()
            )
        out.extend(self.groups.values())
        out.extend(self.peering.values())
        for kept in self.peering_out.values():
            out.extend(kept.values())
        if not self.snapshot_open:  # mid-way through a snapshot stays mid-way
            out.append(SnapshotEnd())

    # --- reading ---------------------------------------------------------------------

    def exchanges(self) -> list[ExchangeDeclare]:
        """Durable exchanges, in first-declaration order."""
        return list(self._exchanges.values())

    def queues(self) -> list[QueueDeclare]:
        """Durable queues, in first-declaration order."""
        return list(self._queues.values())

    def bindings(self) -> list[QueueBind]:
        return list(self._bindings.values())

    def messages(self, vhost: str, queue: str) -> list[StoredMessage]:
        """The live messages of a queue in enqueue order; [] for an unknown queue."""
        out = []
        for _, live in self._entries():
            if live.vhost == vhost and live.holds(queue):
                out.append(StoredMessage(self._record(live), dict(live.items())[queue]))
        return out

    def message_counts(self) -> dict[tuple[str, str], int]:
        """Live persistent messages per durable queue (stored messages per stream),
        keyed by (vhost, queue)."""
        indexed = self._indexed
        counts = {key: len(ids) + indexed.get(key, 0) for key, ids in self._queue_messages.items()}
        for key, stream in self._streams.items():
            counts[key] = len(stream.messages)
        return counts

    def stream(self, vhost: str, queue: str) -> StoredStream | None:
        """A stream queue's stored log, or None."""
        return self._streams.get((vhost, queue))

    @property
    def stream_messages(self) -> int:
        return sum(len(s.messages) for s in self._streams.values())

    @property
    def stream_bytes(self) -> int:
        return sum(s.bytes for s in self._streams.values())

    @property
    def live_messages(self) -> int:
        """Live messages (a message on several queues counts once)."""
        return len(self._messages) + self._index.live()

    def live_journal_ids(self) -> list[int]:
        return [journal_id for journal_id, _ in self._entries()]

    def _canonical(self) -> tuple[Any, ...]:
        entries = list(self._entries())
        per_queue: dict[_Key, list[int]] = {key: [] for key in self._queue_messages}
        for journal_id, live in entries:
            for q in live.names():
                per_queue[(live.vhost, q)].append(journal_id)
        return (
            self._exchanges,
            self._queues,
            set(self._bindings),
            [
                (journal_id, live.vhost, live.size, live.at, live.pk, live.items())
                for journal_id, live in entries
            ],
            per_queue,
            self.last_journal_id,
            self.snapshot_open,
            self.message_bytes,
            {key: stream.canonical() for key, stream in self._streams.items()},
            self.groups,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoreState):
            return NotImplemented
        if self._canonical() != other._canonical():
            return False
        theirs = dict(other._entries())
        return all(  # the records themselves, where both hold them (or can read them)
            _current(self._record(live), live) == _current(other._record(theirs[i]), live)
            for i, live in self._entries()
            if (live.record is not None or self.read is not None)
            and (theirs[i].record is not None or other.read is not None)
        )

    def __repr__(self) -> str:
        return (
            f"StoreState(exchanges={len(self._exchanges)}, queues={len(self._queues)}, "
            f"bindings={len(self._bindings)}, messages={self.live_messages}, "
            f"last_journal_id={self.last_journal_id})"
        )


def _ref(journal_id: int, live: _Live) -> MessageRef:
    if live.frame is not None:
        _materialise(live)
    queues = live.items()
    return MessageRef(
        id=journal_id,
        vhost=live.vhost,
        queues=tuple(q for q, _ in queues),
        delivered=tuple(q for q, d in queues if d),
        location=live.loc,
        size=live.size,
        enqueued_at=live.at,
        publish_key=live.pk,
        record=live.record,
    )


def _materialise(live: _Live) -> MessageEnqueue:
    """The record of a scanned enqueue not yet written (``enqueue_scanned``), decoded
    from its frame and kept: the entry is then what the general path (``apply``) makes,
    and ``place`` places it once written. Snapshots, rebuilds and reads of such a
    message are rare (it is written within a commit), so decoding them is cheap."""
    from .codec import decode_record  # the codec imports this module

    frame = live.frame
    assert frame is not None
    record = decode_record(memoryview(frame)[8:])
    assert type(record) is MessageEnqueue
    live.record, live.frame = record, None
    return record


def _current(record: MessageEnqueue, live: _Live) -> MessageEnqueue:
    """The message's record naming only the queues that still hold it."""
    queues = live.names()
    if queues == record.queues:
        return record
    return dataclasses.replace(record, queues=queues)


_HANDLERS: dict[type[Record], Any] = {
    ExchangeDeclare: StoreState._exchange_declare,
    ExchangeDelete: StoreState._exchange_delete,
    QueueDeclare: StoreState._queue_declare,
    QueueDelete: StoreState._queue_delete,
    QueuePurge: StoreState._queue_purge,
    QueueBind: StoreState._queue_bind,
    QueueUnbind: StoreState._queue_unbind,
    MessageEnqueue: StoreState._message_enqueue,
    MessageDelivered: StoreState._message_delivered,
    MessageAck: StoreState._message_ack,
    MessageMarks: StoreState._message_marks,
    StreamAppend: StoreState._stream_append,
    StreamTruncate: StoreState._stream_truncate,
    StreamTrack: StoreState._stream_track,
    GroupOwner: StoreState._group_owner,
    PeeringMarks: StoreState._peering_marks,
    PeeringOut: StoreState._peering_out,
    PeeringOutAck: StoreState._peering_out_ack,
    SnapshotBegin: StoreState._snapshot_begin,
    SnapshotEnd: StoreState._snapshot_end,
}

#: the records a run of :meth:`StoreState.fold_replicated` is made of (a tuple: a
#: scanned enqueue); any other record ends the run
_RUN_TYPES: frozenset[type] = frozenset(
    {tuple, MessageEnqueue, MessageMarks, MessageAck, MessageDelivered}
)
