"""Queues and their consumers: ready messages, credit, round-robin dispatch, expiry.

Guarantees:
- A message is pushed to at most one consumer per queue, round-robin over the
  consumers that have credit (prefetch not used up, session writable).
- A message published into an empty queue with a ready consumer goes straight to
  that consumer; otherwise it waits in order behind the others.
- An expired message is never handed out: every entry's expiry is checked when it
  leaves the queue, and :meth:`Queue.expire` clears expired entries in between.
- Requeued messages go back to the head, in the order given.
- A consumer with a selector gets only the messages its selector accepts, in queue
  order; a message no consumer with credit accepts stays where it is, for a later
  consumer (JMS). The messages of a group (``group_id``) go to one consumer at a
  time, in order (:mod:`.groups`). Only a queue that has a selector consumer or has
  seen a grouped message pays for this ("constrained" dispatch): any other takes
  the plain path in ``offer`` and ``dispatch`` (a counter and a flag test more).

A ready entry is ``(message, expires_at, redelivered)``; ``expires_at`` is ``inf``
for a message that never expires.

Behind its first ready entries a queue may keep a :class:`~.backlog.Backlog`: the
rest of its ready messages as a compact index, persistent ones by journal id only
(their bodies stay in the journal; the recorder's ``source`` reads them back a
batch at a time as the head drains). A recovered queue restores into it; a
journaled message arriving while the queue already holds :data:`HEAD` entries
goes there too. The order is always ``ready`` then the backlog.
"""

from __future__ import annotations

import itertools
import sys
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .arguments import Overflow, QueueSettings
from .backlog import KEEP, READ_AHEAD, Backlog
from .dead_letter import EXPIRED, MAXLEN, REJECTED
from .groups import GROUP_PROPERTY, NO_RESUME, Group, GroupFirstMessage, identity
from .message import INF, PEERING_QUEUE_PREFIX, Message

if TYPE_CHECKING:
    from .recording import Recorder
    from .session import Session
    from .vhost import VirtualHost

Entry = tuple[Message, float, bool]

#: Ready entries a recorded queue keeps as objects before journaled messages go to
#: its backlog (by journal id) instead.
HEAD = 1024


class Consumer:
    """A subscription of one session to one queue.

    ``limit`` is the prefetch as a bound on ``inflight`` (unlimited for 0);
    ``writable`` mirrors the session's flow-control flag and is False once cancelled;
    ``accepts`` is the compiled selector (None: every message); ``groups`` the ids
    of the message groups it holds (None: none); ``removed``: taken off its queue
    (cancelled, closed), its deliveries perhaps not all settled yet.
    """

    __slots__ = (
        "accepts",
        "arguments",
        "cursor",
        "exclusive",
        "groups",
        "inflight",
        "limit",
        "no_ack",
        "prefetch",
        "queue",
        "removed",
        "selector",
        "session",
        "tag",
        "writable",
    )

    def __init__(
        self,
        tag: str,
        queue: Queue,
        session: Session,
        prefetch: int,
        no_ack: bool,
        exclusive: bool,
        arguments: dict[str, Any],
        writable: bool,
        accepts: Callable[[Message], bool] | None = None,
    ) -> None:
        self.tag = tag
        self.queue = queue
        self.session = session
        self.prefetch = prefetch
        self.limit = prefetch or sys.maxsize
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        self.writable = writable
        self.inflight = 0
        self.cursor = 0  # streams: the next offset to deliver
        self.accepts = accepts
        self.selector: str | None = None  # the selector's text (exchange peering's filter)
        self.groups: set[str] | None = None
        self.removed = False


class Queue:
    """One queue of a virtual host. Counts: ``len(ready)`` ready, ``unacked``
    delivered and not yet settled, ``ready_bytes`` body bytes of ready messages."""

    is_stream = False

    __slots__ = (
        "_earliest",
        "_mark_hint",
        "_max_bytes",
        "_max_length",
        "_reject_publish",
        "_rr",
        "_sorted",
        "_ttl",
        "arguments",
        "auto_delete",
        "backlog",
        "bindings",
        "consumers",
        "deleted",
        "durable",
        "grouped",
        "groups",
        "had_consumer",
        "journal",
        "name",
        "owner",
        "ready",
        "ready_bytes",
        "recorder",
        "selecting",
        "settings",
        "stat_ack",
        "stat_deliver",
        "stat_publish",
        "stat_redeliver",
        "unacked",
        "used_at",
        "vhost",
    )

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        *,
        durable: bool,
        owner: Session | None,
        auto_delete: bool,
        arguments: dict[str, Any],
        settings: QueueSettings,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.owner = owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.settings = settings
        self.ready: deque[Entry] = deque()
        self.ready_bytes = 0  # of ``ready``; the backlog counts its own
        self.backlog: Backlog | None = None
        self._mark_hint = 0  # where the next message.delivered is likely (see _find)
        self.unacked = 0
        # RabbitMQ's message_stats: messages in, delivered or got (redelivered ones
        # counted in both), acknowledged; the shell turns them into rates
        self.stat_publish = 0
        self.stat_deliver = 0
        self.stat_redeliver = 0
        self.stat_ack = 0
        self.consumers: list[Consumer] = []
        self.selecting = 0  # how many consumers have a selector
        self.grouped = False  # a grouped message came here: dispatch is constrained for good
        self.groups: dict[str, Group] = {}
        self.had_consumer = False
        self.deleted = False
        self.bindings: set[Any] = set()
        # The journal's recorder when this queue is recorded (a durable, non-exclusive
        # queue on a broker with a journal), else None: ``journal`` for its topology
        # (and a stream's log), ``recorder`` for a classic queue's persistent messages.
        self.journal: Recorder | None = None
        self.recorder: Recorder | None = None
        self._rr = 0
        self._ttl = None if settings.message_ttl is None else settings.message_ttl / 1000
        self._max_length = settings.max_length
        self._max_bytes = settings.max_length_bytes
        self._reject_publish = settings.overflow is Overflow.REJECT_PUBLISH
        self._earliest = INF  # no ready entry expires before this
        self._sorted = True  # ready entries are in expiry order
        #: x-expires: the last tick that saw the queue in use; None: used since the
        #: last tick (declared, got from), so the next tick restarts its clock
        self.used_at: float | None = None

    def count(self) -> int:
        """Messages waiting: ready ones (a stream: every message it keeps)."""
        backlog = self.backlog
        return len(self.ready) + len(backlog) if backlog else len(self.ready)

    def has_ready(self) -> bool:
        return bool(self.ready) or bool(self.backlog)

    def waiting_bytes(self) -> int:
        """Body bytes of the ready messages, the backlog's included."""
        backlog = self.backlog
        return self.ready_bytes + backlog.bytes if backlog else self.ready_bytes

    # --- the backlog --------------------------------------------------------------

    def _to_backlog(self, message: Message, expires: float, redelivered: bool) -> bool:
        """Put a message behind the others in the backlog: by journal id when the
        journal can give it back, else held as an entry. False: it goes to ``ready``
        (no backlog, and the head is not full or the message not journaled)."""
        backlog = self.backlog
        by_id = self._pages(message)
        paging = self.vhost.paging
        pager = paging.pager if paging.active and type(message) is Message else None
        if backlog is None:
            if not (
                (by_id and len(self.ready) >= HEAD)
                or (pager is not None and len(self.ready) >= KEEP)
            ):
                return False
            backlog = self.backlog = Backlog(self.vhost.paging)
        if by_id:
            backlog.push(message.journal_id, len(message.body), expires, redelivered)
        elif pager is not None:
            (ref,) = pager.page_out((message,))
            paging.paged += 1
            backlog.push_paged(ref, len(message.body), expires, redelivered)
        else:
            backlog.push_entry((message, expires, redelivered))
        return True

    def page_out(self, keep: int | None = None) -> int:
        """Memory is short: move the ready messages past the first ``keep`` to the
        backlog (ahead of what it holds), journaled ones by id, the others paged out
        through the pager; how many moved."""
        ready = self.ready
        paging = self.vhost.paging
        pager = paging.pager
        if keep is None:
            keep = KEEP
        if pager is None:
            return 0
        held = self.backlog.page_held(pager) if self.backlog is not None else 0
        paging.paged += held
        if len(ready) <= keep:
            return held
        moved = [ready.pop() for _ in range(len(ready) - keep)]
        moved.reverse()
        out = [e[0] for e in moved if not self._pages(e[0]) and type(e[0]) is Message]
        refs = iter(pager.page_out(out) if out else ())
        paging.paged += len(out)
        front = Backlog(self.vhost.paging)
        for message, expires, redelivered in moved:
            size = len(message.body)
            self.ready_bytes -= size
            if self._pages(message):
                front.push(message.journal_id, size, expires, redelivered)
            elif type(message) is Message:
                front.push_paged(next(refs), size, expires, redelivered)
            else:
                front.push_entry((message, expires, redelivered))
        if self.backlog is not None:
            front.extend(self.backlog)
        self.backlog = front
        return held + len(moved)

    def restore_ref(self, journal_id: int, size: int, expires: float, redelivered: bool) -> None:
        """Append a recovered journaled message by its id (body left in the journal)."""
        backlog = self.backlog
        if backlog is None:
            backlog = self.backlog = Backlog(self.vhost.paging)
        backlog.push(journal_id, size, expires, redelivered)

    def restore_refs(
        self,
        journal_ids: array[int],
        sizes: array[int],
        enqueued_at: array[float],
        redelivered: bytearray,
        start: int,
        stop: int,
        wall_offset: float,
    ) -> None:
        """:meth:`restore_ref` for entries ``start`` to ``stop`` of these arrays at
        once (``MessageRun``, a restart): ``enqueued_at`` is wall-clock time,
        ``redelivered`` a byte per message (1 or 0)."""
        backlog = self.backlog
        if backlog is None:
            backlog = self.backlog = Backlog(self.vhost.paging)
        ttl = self._ttl
        expires: float | Iterator[float] = INF
        if ttl is not None:  # as expiry(at - wall_offset, None), to the last bit
            expires = (
                (at - wall_offset) + ttl for at in itertools.islice(enqueued_at, start, stop)
            )
        backlog.push_run(journal_ids, sizes, redelivered, start, stop, expires)

    def _refill(self) -> None:
        """Move the next batch of the backlog to the head (read-ahead)."""
        backlog = self.backlog
        if backlog is None:
            return
        recorder = self.recorder
        source = recorder.source if recorder is not None else None
        for message, expires, redelivered in backlog.pop(
            READ_AHEAD, source, self.vhost.paging.pager
        ):
            if GROUP_PROPERTY in message.properties and not self.grouped:
                self._start_grouping()
            self._append_ready(message, expires, redelivered)
        if not backlog:
            self.backlog = None

    # --- consumers ----------------------------------------------------------------

    def next_consumer(self) -> Consumer | None:
        """The next consumer in round-robin order that has credit, or None."""
        consumers = self.consumers
        n = len(consumers)
        i = self._rr
        for _ in range(n):
            if i >= n:
                i = 0
            c = consumers[i]
            i += 1
            if c.writable and c.inflight < c.limit:
                self._rr = i
                return c
        return None

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def next_selecting(self, message: Message) -> Consumer | None:
        """The next consumer in round-robin order that has credit and accepts
        ``message`` (no selector, or one that selects it), or None."""
        consumers = self.consumers
        n = len(consumers)
        i = self._rr
        for _ in range(n):
            if i >= n:
                i = 0
            c = consumers[i]
            i += 1
            if c.writable and c.inflight < c.limit and (c.accepts is None or c.accepts(message)):
                self._rr = i
                return c
        return None

    def _has_credit(self) -> bool:
        return any(c.writable and c.inflight < c.limit for c in self.consumers)

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.had_consumer = True
        if consumer.accepts is not None:
            self.selecting += 1

    def remove_consumer(self, consumer: Consumer) -> None:
        """Take ``consumer`` off; its groups lose their owner (they move on with their
        next message once their deliveries are settled: the caller dispatches).

        A group's ``unsettled`` is counted here, from the consumer's deliveries its
        session holds, not kept per delivery while the group has an owner: only an
        ownerless group needs it, and a count per delivery and per settle was a
        dictionary look-up a grouped message on the broker's busiest path."""
        consumer.writable = False
        consumer.removed = True
        self.consumers.remove(consumer)
        if consumer.accepts is not None:
            self.selecting -= 1
        if consumer.groups:
            groups = self.groups
            held = self._held_by_group(consumer)
            for gid in consumer.groups:
                group = groups.get(gid)
                if group is not None and group.owner is consumer:
                    group.owner = None
                    group.unsettled = held.get(gid, 0)
                    if group.unsettled <= 0:
                        self._free(gid)
            consumer.groups = None

    def _held_by_group(self, consumer: Consumer) -> dict[str, int]:
        """How many of ``consumer``'s deliveries from this queue are not settled yet,
        by group (a no-ack consumer's count none: they were settled when sent)."""
        held: dict[str, int] = {}
        if consumer.no_ack:
            return held
        for delivery in consumer.session.unsettled_of(consumer):
            if delivery._origin is self:
                gid = delivery.message.properties.get(GROUP_PROPERTY)
                if gid is not None:
                    held[gid] = held.get(gid, 0) + 1
        return held

    def _start_grouping(self) -> bool:
        """A grouped message arrived: keep its groups from now on (True), unless this
        is a peering queue, whose one consumer forwards messages as they are."""
        if not self.name.startswith(PEERING_QUEUE_PREFIX):
            self.grouped = True
        return self.grouped

    def group_settled(self, message: Message) -> None:
        """A delivery of ``message`` to an acknowledging consumer that has been
        removed was settled (a consumer still on the queue settles without this:
        see :meth:`remove_consumer`)."""
        gid: str | None = message.properties.get(GROUP_PROPERTY)
        group = self.groups.get(gid) if gid is not None else None
        if group is not None and gid is not None:
            group.unsettled -= 1
            if group.owner is None and group.unsettled <= 0:
                self._free(gid)

    def _free(self, gid: str) -> None:
        """Group ``gid`` has no owner and nothing unsettled: forget it."""
        del self.groups[gid]
        if self.journal is not None:
            self.journal.group_owner(self.vhost.name, self.name, gid, "")

    def reserve_group(self, gid: str, owner: str) -> None:
        """A journal record: group ``gid`` had ``owner`` (``""``: it was free) in a
        previous life of the broker: keep it for that consumer (:mod:`.groups`)."""
        if not owner:
            self.groups.pop(gid, None)
            return
        self._start_grouping()
        group = self.groups.get(gid)
        if group is None:
            group = self.groups[gid] = Group()
        group.reserved = owner
        group.until = INF

    def lapse_reservations(self, now: float) -> bool:
        """Release the reservations whose wait ended at ``now``; True when one did
        (the caller dispatches). The queue leaves the vhost's ``reserving`` set once
        no wait is running."""
        lapsed = waiting = False
        for group in self.groups.values():
            if group.reserved is not None and group.until != INF:
                if group.until <= now:
                    group.reserved = None
                    lapsed = True
                else:
                    waiting = True
        if not waiting:
            self.vhost.reserving.discard(self)
        return lapsed

    # --- messages in --------------------------------------------------------------

    def offer_run(self, messages: list[Message], now: float) -> None:
        """:meth:`offer` of each of ``messages`` (none with properties or an
        expiration), in order, their outcomes not returned: while the queue holds
        nothing ready and its one consumer has credit, the messages its credit
        covers go to it in one go (``Session._deliver_run``), the rest through
        :meth:`offer`.

        Why it exists beside :meth:`offer`: a run of publishes
        (``VirtualHost.publish_run`` on a subscriber's remote, into its peering
        queue) spent about a third of its time offering and delivering one message
        at a time (benchmarks/peering_core_micro.py subscribe);
        tests/server/test_peering_applier.py checks a run against the publish of
        each (the queue, the deliveries' tags, what the consumer is sent)."""
        taken = 0
        consumers = self.consumers
        if (
            len(consumers) == 1
            and not self.ready
            and self.backlog is None
            and self._ttl is None
            and not (self.grouped or self.selecting)
        ):
            # offer()'s direct delivery, for as many as the consumer has credit for
            one = consumers[0]
            if one.writable and one.inflight < one.limit:
                taken = min(one.limit - one.inflight, len(messages))
                if one.session._deliver_run(one, self, messages[:taken]):
                    self._rr = 1
                    self.stat_publish += taken
                else:
                    taken = 0
        offer = self.offer
        for message in messages[taken:] if taken else messages:
            offer(message, now, None)

    def offer(self, message: Message, now: float, expiration: int | None) -> bool:
        """Deliver or enqueue ``message``; False when the queue is full and rejects
        publishes (the message is then not in this queue)."""
        ttl = self._ttl
        if ttl is None and expiration is None:
            expires = INF
        else:
            expires = now + ttl if ttl is not None else INF
            if expiration is not None and now + expiration / 1000 < expires:
                expires = now + expiration / 1000
        ready = self.ready
        if (
            self.backlog is not None
            or (len(ready) >= HEAD and self._pages(message))
            or (len(ready) >= KEEP and self.vhost.paging.active)
        ):
            return self._offer_behind(message, now, expires)
        if (
            self.grouped
            or (GROUP_PROPERTY in message.properties and self._start_grouping())
            or self.selecting
        ):
            # Constrained: any consumer with credit has no ready message it may take
            # (dispatch runs whenever credit appears), so one that may take this
            # message takes it ahead of the ready ones without breaking its order.
            if (
                self.consumers
                and self._deliver_constrained(message, expires, False, now) is not None
            ):
                self.stat_publish += 1
                return True
        elif not ready and self.consumers:
            consumers = self.consumers
            if len(consumers) == 1:
                # next_consumer() of one consumer, inlined: a call a message saved
                # (about 2% of a broker's time per transient message);
                # tests/broker/test_consume.py checks both choose alike
                one = consumers[0]
                if one.writable and one.inflight < one.limit:
                    self._rr = 1
                    c: Consumer | None = one
                else:
                    c = None
            else:
                c = self.next_consumer()
            if c is not None:
                self.stat_publish += 1
                c.session._deliver(c, self, message, expires, False)
                return True
        if expires <= now:
            self.stat_publish += 1
            self._dead_letter(message, EXPIRED, now)
            return True
        if not ready:
            self._sorted = True
            self._earliest = INF
        size = len(message.body)
        max_length = self._max_length
        max_bytes = self._max_bytes
        if self._reject_publish and (
            (max_length is not None and len(ready) >= max_length)
            or (max_bytes is not None and self.ready_bytes + size > max_bytes)
        ):
            return False
        if expires != INF:
            if expires < self._earliest:
                self._earliest = expires
            if ready and expires < ready[-1][1]:
                self._sorted = False
        ready.append((message, expires, False))
        self.ready_bytes += size
        self.stat_publish += 1
        if max_length is not None or max_bytes is not None:
            self._drop_head(now)
        return True

    def _offer_behind(self, message: Message, now: float, expires: float) -> bool:
        """``offer`` for a queue with a backlog (or a full head): the message waits
        behind the others; consumers with credit get the head meanwhile."""
        if GROUP_PROPERTY in message.properties and not self.grouped:
            self._start_grouping()
        if expires <= now:
            self.stat_publish += 1
            self._dead_letter(message, EXPIRED, now)
            return True
        max_length = self._max_length
        max_bytes = self._max_bytes
        if self._reject_publish and (
            (max_length is not None and self.count() >= max_length)
            or (max_bytes is not None and self.waiting_bytes() + len(message.body) > max_bytes)
        ):
            return False
        if not self._to_backlog(message, expires, False):
            if expires != INF:
                if expires < self._earliest:
                    self._earliest = expires
                if self.ready and expires < self.ready[-1][1]:
                    self._sorted = False
            self.ready.append((message, expires, False))
            self.ready_bytes += len(message.body)
        self.stat_publish += 1
        if max_length is not None or max_bytes is not None:
            self._drop_head(now)
        if self.consumers and (
            not (self.selecting or self.grouped) or len(self.ready) < READ_AHEAD
        ):
            self.dispatch(now)
        return True

    def _pages(self, message: Message) -> bool:
        """Whether ``message`` can wait in a backlog by its journal id."""
        recorder = self.recorder
        return (
            message.journal_id != 0
            and recorder is not None
            and recorder.source is not None
            and type(message) is Message
        )

    def _drop_head(self, now: float) -> None:
        ready = self.ready
        max_length = self._max_length
        max_bytes = self._max_bytes
        while (
            (max_length is not None and self.count() > max_length)
            or (max_bytes is not None and self.waiting_bytes() > max_bytes)
        ) and self.has_ready():
            if not ready:
                self._refill()
                continue
            message = ready.popleft()[0]
            self.ready_bytes -= len(message.body)
            self._dead_letter(message, MAXLEN, now)

    def requeue(self, entries: list[Entry]) -> None:
        """Put messages given back at the head, in the given order."""
        ready = self.ready
        for entry in reversed(entries):
            message, expires, _ = entry
            ready.appendleft(entry)
            self.ready_bytes += len(message.body)
            if expires != INF:
                self._sorted = False
                if expires < self._earliest:
                    self._earliest = expires

    # --- applying journal records (recovery, a passive HA node) -------------------------

    def expiry(self, now: float, expiration: int | None) -> float:
        """When a message enqueued at ``now`` expires (queue TTL, message expiration)."""
        expires = INF if self._ttl is None else now + self._ttl
        if expiration is not None and now + expiration / 1000 < expires:
            expires = now + expiration / 1000
        return expires

    def restore(self, message: Message, expires: float) -> None:
        """Append a journaled message as ready, as it was: no limits, no dispatch."""
        if GROUP_PROPERTY in message.properties and not self.grouped:
            self._start_grouping()
        if not self._to_backlog(message, expires, False):
            self._append_ready(message, expires, False)

    def _append_ready(self, message: Message, expires: float, redelivered: bool) -> None:
        """Append to the ready head, keeping the expiry bookkeeping (``_earliest``,
        ``_sorted``) true."""
        ready = self.ready
        if not ready:
            self._sorted = True
            self._earliest = INF
        if expires != INF:
            if expires < self._earliest:
                self._earliest = expires
            if ready and expires < ready[-1][1]:
                self._sorted = False
        ready.append((message, expires, redelivered))
        self.ready_bytes += len(message.body)

    def _find(self, journal_id: int, start: int = 0) -> int:
        """The index of ready message ``journal_id`` (-1: not here), looking from ``start``
        on, then before it. A passive HA node applies ``message.delivered`` records
        mostly in queue order, so a hint just past the last one makes each find O(1)
        instead of a scan as deep as the consumers' prefetch. (Selector consumers
        take messages from the middle: then the order differs, and the second scan
        finds them; nothing here relies on the order.)"""
        ready = self.ready
        if start >= len(ready):
            start = 0
        elif ready[start][0].journal_id == journal_id:
            return start  # the usual case: an index hops over the deque's blocks, islice
            # walks every entry before ``start`` (as deep as the consumers' prefetch)
        for i, entry in enumerate(itertools.islice(ready, start, None), start):
            if entry[0].journal_id == journal_id:
                return i
        for i, entry in enumerate(itertools.islice(ready, 0, start)):
            if entry[0].journal_id == journal_id:
                return i
        return -1

    def mark_delivered(self, journal_id: int) -> None:
        """Flag the ready message ``journal_id`` redelivered (a journaled first delivery)."""
        i = self._find(journal_id, self._mark_hint)
        if i >= 0:
            message, expires, _ = self.ready[i]
            self.ready[i] = (message, expires, True)
            self._mark_hint = i + 1
        elif self.backlog is not None:
            self.backlog.mark(journal_id)

    def flag_redelivered(self) -> int:
        """Flag every ready message redelivered; how many were not yet."""
        ready = self.ready
        fresh = sum(1 for entry in ready if not entry[2])
        if fresh:
            self.ready = deque((message, expires, True) for message, expires, _ in ready)
        if self.backlog is not None:
            fresh += self.backlog.flag_all()
        return fresh

    def remove(self, journal_id: int) -> bool:
        """Drop the ready message ``journal_id`` (a journaled ack); False when not here."""
        i = self._find(journal_id)
        if i < 0:
            backlog = self.backlog
            if backlog is not None and backlog.remove(journal_id):
                if not backlog:
                    self.backlog = None
                return True
            return False
        message = self.ready[i][0]
        del self.ready[i]
        self.ready_bytes -= len(message.body)
        if i < self._mark_hint:
            self._mark_hint -= 1
        return True

    # --- messages out -------------------------------------------------------------

    def dispatch(self, now: float) -> None:
        """Push ready messages to consumers with credit until one side runs out."""
        if self.selecting or self.grouped:
            # only a queue with a selector consumer or groups goes there: a plain one
            # stays here
            self._dispatch_constrained(now)
            return
        ready = self.ready
        while True:
            if not ready:
                if self.backlog is None or not self._has_credit():
                    return
                self._refill()
                continue
            c = self.next_consumer()
            if c is None:
                return
            message, expires, redelivered = ready.popleft()
            self.ready_bytes -= len(message.body)
            if expires <= now:
                self._dead_letter(message, EXPIRED, now)
                continue
            c.session._deliver(c, self, message, expires, redelivered)

    def _deliver_constrained(
        self, message: Message, expires: float, redelivered: bool, now: float
    ) -> Consumer | None:
        """Deliver ``message`` to the consumer that may take it now and return that
        consumer: its group's owner, else (a group free to move, or no group) the
        next consumer with credit whose selector accepts it. None: it must wait."""
        gid = message.properties.get(GROUP_PROPERTY) if self.grouped else None
        if gid is None:
            c = self.next_selecting(message)
            if c is not None:
                c.session._deliver(c, self, message, expires, redelivered)
            return c
        group = self.groups.get(gid)
        if group is not None and group.owner is not None:
            c = group.owner
            if not (
                c.writable and c.inflight < c.limit and (c.accepts is None or c.accepts(message))
            ):
                return None
            c.session._deliver(c, self, message, expires, redelivered)
        else:
            if group is not None and group.unsettled > 0:
                return None  # its last consumer's deliveries are not all settled yet
            if group is not None and group.reserved is not None:
                found = self._reserved_for(group, message, now)
            else:
                found = self.next_selecting(message)
            if found is None:
                return None
            c = found
            if group is None:
                group = self.groups[gid] = Group()
            group.owner = c
            if c.groups is None:
                c.groups = set()
            c.groups.add(gid)
            first = GroupFirstMessage(message)
            if self.journal is not None:
                owner = identity(c.session.instance, c.tag)
                first.position = self.journal.group_owner(self.vhost.name, self.name, gid, owner)
            c.session._deliver(c, self, first, expires, redelivered)
        return c

    def _reserved_for(self, group: Group, message: Message, now: float) -> Consumer | None:
        """The consumer that may take ``message`` of the reserved ``group``: the one
        it is reserved for once it is back (while it cannot take the message, the
        group waits for it); while it is not back, any other once the wait for it
        (started now, if not yet) has ended. None: the group waits."""
        reserved = group.reserved
        for c in self.consumers if reserved != NO_RESUME else ():
            if identity(c.session.instance, c.tag) == reserved:
                able = c.writable and c.inflight < c.limit
                if not able or (c.accepts is not None and not c.accepts(message)):
                    return None  # it is back: the group waits for it, as for an owner
                group.reserved = None
                return c
        if group.until == INF:
            group.until = now + self.vhost.group_resume_timeout
            self.vhost.reserving.add(self)
        if now < group.until:
            return None
        group.reserved = None
        return self.next_selecting(message)

    def _dispatch_constrained(self, now: float) -> None:
        """Dispatch with selectors and groups: each ready message, in order, to the
        consumer that may take it (:meth:`_deliver_constrained`); the others stay,
        in order. Stops once no consumer has credit. A pass costs (ready messages
        looked at) x (consumers) selector runs, as a backlog nobody with credit
        wants is looked at again."""
        if self.backlog is not None and len(self.ready) < READ_AHEAD and self._has_credit():
            self._refill()
        ready = self.ready
        if not ready or not self._has_credit():
            return
        kept: list[Entry] = []
        while ready:
            entry = ready.popleft()
            message, expires, redelivered = entry
            if expires <= now:
                self.ready_bytes -= len(message.body)
                self._dead_letter(message, EXPIRED, now)
                continue
            c = self._deliver_constrained(message, expires, redelivered, now)
            if c is None:
                kept.append(entry)
                continue
            self.ready_bytes -= len(message.body)
            if not (c.writable and c.inflight < c.limit) and not self._has_credit():
                break
        if kept:
            ready.extendleft(reversed(kept))

    def take(self, now: float) -> Entry | None:
        """Pop the first unexpired ready entry (for a get), or None."""
        ready = self.ready
        while ready or self.backlog is not None:
            if not ready:
                self._refill()
                continue
            entry = ready.popleft()
            self.ready_bytes -= len(entry[0].body)
            if entry[1] > now:
                return entry
            self._dead_letter(entry[0], EXPIRED, now)
        return None

    def expire(self, now: float) -> int:
        """Remove (and dead-letter) the ready messages expired at ``now``; how many."""
        if not self.ready and self.backlog is not None and self.backlog.earliest() <= now:
            self._refill()
        if self._earliest > now:
            return 0
        ready = self.ready
        expired: list[Message] = []
        if self._sorted:
            while ready and ready[0][1] <= now:
                expired.append(ready.popleft()[0])
            self._earliest = ready[0][1] if ready else INF
        else:
            keep: deque[Entry] = deque()
            earliest = INF
            in_order = True
            last = -INF
            for entry in ready:
                expires = entry[1]
                if expires <= now:
                    expired.append(entry[0])
                    continue
                keep.append(entry)
                if expires < earliest:
                    earliest = expires
                if expires < last:
                    in_order = False
                last = expires
            self.ready = keep
            self._earliest = earliest
            self._sorted = in_order
        for message in expired:
            self.ready_bytes -= len(message.body)
            self._dead_letter(message, EXPIRED, now)
        return len(expired)

    def purge(self) -> int:
        """Drop every ready message (no dead-lettering); how many."""
        count = self.count()
        recorder = self.recorder
        if recorder is not None:
            for message, _, _ in self.ready:
                if message.journal_id:
                    recorder.ack(message.journal_id, self.name)
        if self.backlog is not None:
            for journal_id in self.backlog.clear(self.vhost.paging.pager):
                if recorder is not None:
                    recorder.ack(journal_id, self.name)
            self.backlog = None
        self.ready.clear()
        self.ready_bytes = 0
        self._earliest = INF
        self._sorted = True
        return count

    def _dead_letter(self, message: Message, reason: str, now: float) -> None:
        """``message`` leaves this queue for ``reason``: journal that, dead-letter it."""
        if message.journal_id:
            recorder = self.recorder
            if recorder is not None:
                recorder.ack(message.journal_id, self.name)
        if self.settings.dead_letter_exchange is not None:
            self.vhost.dead_letter(message, self, reason, now)

    def dead_letter_rejected(self, message: Message, now: float) -> None:
        self._dead_letter(message, REJECTED, now)
