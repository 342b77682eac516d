"""What the broker tells its journal: one store record per durable change.

The broker core stays sans-IO: it hands records (``amqlite.store.records``) to a
``sink`` callable the shell gives it, and the shell appends them to the journal
(and, on an HA pair, streams them to the passive node). What is recorded follows
the journal's contract (``docs/storage.md``, "The fold and the caller's contract"):

- durable exchanges other than the predeclared ones; durable, non-exclusive queues;
  bindings whose queue is recorded and whose exchange is durable;
- persistent messages, naming only the recorded queues they reached, each under a
  journal id the recorder assigns (``Message.journal_id``; 0 = not recorded);
- ``group.owner`` when a message group of a recorded queue gets an owner or is
  free again (:mod:`.groups`);
- ``message.delivered`` the first time a recorded message is handed out from a
  queue, ``message.ack`` when it leaves that queue for good (acked, rejected,
  expired, dropped, dead-lettered, purged; a no-ack delivery is an ack at once).
  With :meth:`Recorder.gather_marks` (every node with a journal) these two are gathered
  instead and written as one ``message.marks`` per queue when the shell calls
  :meth:`Recorder.flush_marks`, just before each commit: the commit that would
  have carried them carries them, at a fraction of the cost.

While ``paused`` (the broker is applying records: a restart's recovery or a
passive HA node following its master) nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from amqlite.store.records import (
    ExchangeDeclare,
    ExchangeDelete,
    GroupOwner,
    MessageAck,
    MessageDelivered,
    MessageMarks,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueueUnbind,
    Record,
    StreamAppend,
    StreamTrack,
    StreamTruncate,
    new_message_enqueue,
)

from .message import PEERING_QUEUE_PREFIX

if TYPE_CHECKING:
    from .backlog import MessageSource
    from .exchange import Exchange
    from .message import Message
    from .queue import Queue

#: The shell's journal: appends one record and returns its journal position (an
#: int >= 1), or None when it does not number records (tests collecting them).
Sink = Callable[[Record], int | None]

#: A publish key learned from replayed records (a restart's recovery, a passive HA
#: node's replication) has no known position in this node's journal: a request
#: that depends on it waits for everything appended so far.
ALL_APPENDED = -1


class Recorder:
    """Turns durable changes into records for ``sink``; one per broker.

    ``last_journal_id`` is the highest journal id handed out (a restarted node continues
    above the journal's); ``wall_offset`` turns the shell's monotonic ``now`` into
    wall-clock seconds for ``message.enqueue``'s ``at`` (the shell sets it: the core
    never reads a clock).

    **The span of a request.** A session call whose reply promises durability
    starts a span (:meth:`start_span`); every record made until the next one widens
    it: ``span_first`` and ``span_last`` are the journal positions (as the sink
    returned them) of the first and the last. The reply may go once the journal has
    committed ``span_last``; a message among ``span_first..span_last`` that the disk
    dropped refuses it. 0 / 0: the request recorded nothing and waits for nothing.
    """

    __slots__ = (
        "_marks",
        "_wake",
        "last_journal_id",
        "paused",
        "sink",
        "source",
        "span_first",
        "span_last",
        "wall_offset",
    )

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        #: The shell's reader of journaled messages, for queues whose backlog keeps
        #: them by journal id (None: every message stays in memory).
        self.source: MessageSource | None = None
        self.last_journal_id = 0
        self.wall_offset = 0.0
        self.paused = False
        self.span_first = 0
        self.span_last = 0
        #: gathered marks per queue: (delivered ids, acked ids); None: recorded at once
        self._marks: dict[str, tuple[dict[int, None], list[int]]] | None = None
        self._wake: Callable[[], None] = _nothing

    def gather_marks(self, wake: Callable[[], None]) -> None:
        """Gather delivery marks and acks for :meth:`flush_marks` instead of
        recording each at once; ``wake`` is called when a first mark waits (the
        shell's committer then runs soon and flushes them before it commits).

        Why: two records a message (``message.delivered``, ``message.ack``) were a
        third of a persistent message's journal work; gathered, a commit writes one
        ``message.marks`` per queue, and a message delivered and acked between two
        commits costs one id in a list. What is durable when is unchanged: the marks
        reach the journal before the commit that would have carried them. (On an HA
        pair too: a passive node that takes over without them flags every ready
        message ``redelivered``, docs/ha.md.)"""
        self._marks = {}
        self._wake = wake

    @property
    def marks_waiting(self) -> bool:
        """Whether gathered marks wait for :meth:`flush_marks`."""
        return bool(self._marks)

    def flush_marks(self, *, span: bool = False) -> None:
        """Record the gathered marks: one ``message.marks`` per queue. With ``span``
        they widen the current request's span (a reply that vouches for acks:
        ``tx.commit``); otherwise they are part of no request."""
        marks = self._marks
        if not marks:
            return
        self._marks = {}
        put = self._put if span else self.sink
        for queue, (delivered, acked) in marks.items():
            if delivered or acked:
                put(MessageMarks(queue=queue, delivered=tuple(delivered), acked=tuple(acked)))

    def start_span(self) -> None:
        """A new request begins: forget the positions the last one recorded."""
        self.span_first = self.span_last = 0

    def depend_on(self, position: int) -> None:
        """The reply to this request also vouches for the record at ``position``
        (a publish sent again vouches for its first copy); ``ALL_APPENDED`` for one
        whose position this journal does not know."""
        last = self.span_last
        if last != ALL_APPENDED and (position == ALL_APPENDED or position > last):
            self.span_last = position
        if not self.span_first:
            self.span_first = position

    def append(self, record: Record) -> None:
        """Journal a record the shell makes as part of the current request (exchange
        peering's sending log): it widens the request's span like the broker's own."""
        self._put(record)

    def _put(self, record: Record) -> None:
        position = self.sink(record)
        if position:
            if self.span_last != ALL_APPENDED:
                self.span_last = position
            if not self.span_first:
                self.span_first = position

    # --- topology ------------------------------------------------------------------

    def exchange_declared(self, vhost: str, exchange: Exchange) -> None:
        if not self.paused:
            self._put(
                ExchangeDeclare(
                    vhost=vhost,
                    name=exchange.name,
                    type=exchange.kind,
                    auto_delete=exchange.auto_delete,
                    internal=exchange.internal,
                    arguments=dict(exchange.arguments),
                )
            )

    def exchange_deleted(self, vhost: str, name: str) -> None:
        if not self.paused:
            self._put(ExchangeDelete(vhost=vhost, name=name))

    def queue_declared(self, vhost: str, queue: Queue) -> None:
        if not self.paused:
            self._put(
                QueueDeclare(
                    vhost=vhost,
                    name=queue.name,
                    auto_delete=queue.auto_delete,
                    arguments=dict(queue.arguments),
                )
            )

    def queue_deleted(self, vhost: str, name: str) -> None:
        if not self.paused:
            self._put(QueueDelete(vhost=vhost, name=name))

    def bound(self, vhost: str, queue: str, exchange: str, key: str, args: dict[str, Any]) -> None:
        if not self.paused:
            self._put(
                QueueBind(vhost=vhost, queue=queue, exchange=exchange, key=key, arguments=args)
            )

    def unbound(
        self, vhost: str, queue: str, exchange: str, key: str, args: dict[str, Any]
    ) -> None:
        if not self.paused:
            self._put(
                QueueUnbind(vhost=vhost, queue=queue, exchange=exchange, key=key, arguments=args)
            )

    # --- messages ------------------------------------------------------------------

    def enqueue(self, vhost: str, message: Message, queues: Iterable[Queue], now: float) -> None:
        """Record a persistent message routed to ``queues`` (the classic ones recorded)
        and give it an id; does nothing when none of them is recorded. (Streams
        record what they take themselves.)"""
        if type(queues) is tuple and len(queues) == 1:  # the default exchange's one queue
            names: tuple[str, ...] = (queues[0].name,) if queues[0].recorder is not None else ()
        else:
            names = tuple(q.name for q in queues if q.recorder is not None)
        if not names or self.paused:
            return
        self.last_journal_id = journal_id = self.last_journal_id + 1
        message.journal_id = journal_id
        self._put(
            new_message_enqueue(  # MessageEnqueue(...), cheaper (see there)
                journal_id,
                vhost,
                names,
                message.exchange,
                message.routing_key,
                message.body,
                message.headers,
                message.properties,
                now + self.wall_offset,
                message.deaths,
                message.publish_key,
                _mesh_of(message, names) if message.mesh is not None else {},
            )
        )

    def stream_append(
        self, vhost: str, queue: str, offset: int, message: Message, at: float
    ) -> None:
        if not self.paused:
            self._put(
                StreamAppend(
                    vhost=vhost,
                    queue=queue,
                    offset=offset,
                    exchange=message.exchange,
                    routing_key=message.routing_key,
                    body=message.body,
                    headers=message.headers,
                    props=message.properties,
                    enqueued_at=at,
                    publish_key=message.publish_key,
                )
            )

    def stream_truncate(self, vhost: str, queue: str, before: int) -> None:
        if not self.paused:
            self._put(StreamTruncate(vhost=vhost, queue=queue, before=before))

    def stream_track(self, vhost: str, queue: str, name: str, offset: int) -> None:
        if not self.paused:
            self._put(StreamTrack(vhost=vhost, queue=queue, name=name, offset=offset))

    def delivered(self, journal_id: int, queue: str) -> None:
        if self.paused:
            return
        marks = self._marks
        if marks is None:
            self._put(MessageDelivered(id=journal_id, queue=queue))
            return
        gathered = marks.get(queue)
        if gathered is None:
            gathered = marks[queue] = ({}, [])
            self._wake()
        gathered[0][journal_id] = None

    def acked_ids(self, journal_ids: list[int], queue: str) -> None:
        """:meth:`ack` of each of ``journal_ids`` (none 0), in order, in one call
        (``Session._settle_acked``'s run of acked deliveries: a client's multiple ack).

        Why beside :meth:`ack`: a call an acked persistent message, on a busy node
        nearly all of them (benchmarks/settle_core.py). tests/broker/test_recorder_runs.py
        checks with hypothesis that the records and marks are those of one call an id."""
        if self.paused or not journal_ids:
            return
        marks = self._marks
        if marks is None:
            for journal_id in journal_ids:
                self._put(MessageAck(id=journal_id, queue=queue))
            return
        gathered = marks.get(queue)
        if gathered is None:
            gathered = marks[queue] = ({}, [])
            self._wake()
        delivered = gathered[0]
        if delivered:  # the acks say more (an HA pair's active node: flushed already)
            pop = delivered.pop
            for journal_id in journal_ids:
                pop(journal_id, None)
        gathered[1].extend(journal_ids)

    def ack(self, journal_id: int, queue: str) -> None:
        if self.paused:
            return
        marks = self._marks
        if marks is None:
            self._put(MessageAck(id=journal_id, queue=queue))
            return
        gathered = marks.get(queue)
        if gathered is None:
            gathered = marks[queue] = ({}, [])
            self._wake()
        delivered = gathered[0]
        if journal_id in delivered:
            del delivered[journal_id]  # the ack says more
        gathered[1].append(journal_id)

    def group_owner(self, vhost: str, queue: str, group: str, owner: str) -> int:
        """Record a group's new owner (``""``: free); its journal position (0: none).
        Not part of the current request's span: a delivery waits for it instead."""
        if self.paused:
            return 0
        return self.sink(GroupOwner(vhost=vhost, queue=queue, group=group, owner=owner)) or 0


def _nothing() -> None:
    pass


def is_persistent(message: Message) -> bool:
    properties = message.properties
    return bool(properties) and properties.get("persistent") is True


def _mesh_of(message: Message, queues: tuple[str, ...]) -> dict[str, Any]:
    """The peering identity to journal: only for a message in a peering queue."""
    mesh = message.mesh
    if mesh is None or not any(q.startswith(PEERING_QUEUE_PREFIX) for q in queues):
        return {}
    if isinstance(mesh, dict):
        return mesh
    plain: dict[str, Any] = mesh.mesh_map()
    return plain
