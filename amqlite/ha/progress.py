"""What the passive node holds, as the active node learns it from ``ha.synced``.

The active node's shell owns one :class:`ReplicaProgress` (beside its journal). While
a passive node is being replicated to, it answers two questions for the shell:

- *may this reply go?* :meth:`ReplicaProgress.releasable`: a reply that waits for the
  journal (a persistent confirm, a durable ok) also waits until the passive node has
  committed its records (``ha.synced``);
- *may this push go?* :meth:`ReplicaProgress.replicated` and
  :meth:`ReplicaProgress.stream_replicated`: a journaled message, or a stream offset,
  goes to a consumer only once the passive node holds it (``ha.synced
  {applied}``), so that no consumer sees a message the node taking over lacks.

Positions are the active journal's. Only the messages and stream offsets appended
while replicating are tracked, and only until the passive node has applied them.
Sans-IO: the shell tells it what was appended and what the peer acknowledged.
"""

from __future__ import annotations

from collections import deque


class ReplicaProgress:
    """The passive node's progress through the active journal (see the module)."""

    __slots__ = (
        "_awaited",
        "_messages",
        "_order",
        "_released",
        "_streams",
        "alone_ok",
        "applied",
        "upto",
    )

    def __init__(self) -> None:
        #: the passive node has committed everything up to here; None while no
        #: passive node is being replicated to (replies wait for the local commit only)
        self.upto: int | None = None
        #: the passive node has applied everything up to here (pushes may go)
        self.applied = 0
        #: journal id -> position of its ``message.enqueue``, until the peer applied it
        self._messages: dict[int, int] = {}
        self._order: deque[tuple[int, int]] = deque()  # (position, journal id)
        #: (vhost, stream) -> (offset, position) of its appends not yet applied, in order
        self._streams: dict[tuple[str, str], deque[tuple[int, int]]] = {}
        #: whether replies may go on the local commit alone while no passive node is
        #: replicated to (the HA promise: ``HaMachine.may_confirm_alone``); when not,
        #: nothing past what was already released goes until a passive node holds it
        self.alone_ok = True
        self._released = 0
        #: the highest position a push waits for through :meth:`holds` (0: none)
        self._awaited = 0

    @property
    def required(self) -> bool:
        """Whether replies and pushes wait for the passive node."""
        return self.upto is not None

    def start(self) -> None:
        """A passive node (re)joins: it holds nothing until it acknowledges."""
        self.upto = 0
        self.applied = 0

    def stop(self) -> None:
        """Replication stopped (the peer is silent or the link is down): replies and
        pushes stop waiting for it."""
        self.upto = None
        self.applied = 0
        self._messages.clear()
        self._order.clear()
        self._streams.clear()
        self._awaited = 0

    # --- what the active node appends (only while required) -----------------------------

    def message_appended(self, journal_id: int, position: int) -> None:
        """A ``message.enqueue`` of ``journal_id`` was journaled at ``position``."""
        self._messages[journal_id] = position
        self._order.append((position, journal_id))

    def offset_appended(self, vhost: str, queue: str, offset: int, position: int) -> None:
        """A ``stream.append`` at ``offset`` of stream ``queue`` was journaled at
        ``position``."""
        key = (vhost, queue)
        appends = self._streams.get(key)
        if appends is None:
            appends = self._streams[key] = deque()
        appends.append((offset, position))

    # --- what the passive node acknowledges ----------------------------------------------

    def peer_applied(self, upto: int) -> bool:
        """``ha.synced {applied}``: the passive node holds (has applied) everything up to
        ``upto``. True when held pushes may go now."""
        if self.upto is None or upto <= self.applied:
            return False
        self.applied = upto
        return self._forget(upto)

    def peer_synced(self, upto: int) -> bool:
        """``ha.synced``: the passive node has committed everything up to ``upto``
        (and so applied it). True when held pushes may go now."""
        if self.upto is None:
            return False
        self.upto = max(self.upto, upto)
        self.applied = max(self.applied, upto)
        return self._forget(self.applied)

    def _forget(self, upto: int) -> bool:
        awaited = self._awaited != 0  # a push waits for a position: let it look again
        if awaited and upto >= self._awaited:
            self._awaited = 0
        messages, streams = self._messages, self._streams
        if not messages and not streams:
            return awaited
        order = self._order
        while order and order[0][0] <= upto:
            messages.pop(order.popleft()[1], None)
        for key, appends in list(streams.items()):
            while appends and appends[0][1] <= upto:
                appends.popleft()
            if not appends:
                del streams[key]
        return True

    # --- the questions -------------------------------------------------------------------

    def releasable(self, committed: int) -> int:
        """The journal position up to which held replies may go, given that the local
        journal has committed up to ``committed``: with a passive node replicated to,
        what it has committed too; without one, ``committed`` if ``alone_ok``, else
        no further than already released."""
        upto = self.upto
        if upto is None:
            if not self.alone_ok:
                return self._released  # held: the peer and the promise are both missing
            self._released = max(self._released, committed)
            return committed
        released = committed if upto >= committed else upto
        self._released = max(self._released, released)
        return released

    def replicated(self, journal_id: int) -> bool:
        """Whether the passive node holds message ``journal_id`` (True when no passive
        node is replicated to, or when the message was journaled before it joined:
        then it came in the snapshot, or was confirmed without it)."""
        if self.upto is None:
            return True
        position = self._messages.get(journal_id)
        return position is None or position <= self.applied

    def holds(self, position: int) -> bool:
        """Whether the passive node holds the record at ``position`` (True
        when no passive node is replicated to): a message group's new owner
        (``group.owner``) must reach it before the group's first delivery goes."""
        if self.upto is None or position <= self.applied:
            return True
        self._awaited = max(self._awaited, position)
        return False

    def stream_unreplicated(self, vhost: str, queue: str) -> int | None:
        """The first offset of stream ``queue`` the passive node does not hold yet;
        None when it holds every one (or no passive node is replicated to)."""
        if self.upto is None:
            return None
        appends = self._streams.get((vhost, queue))
        return appends[0][0] if appends else None

    def stream_replicated(self, vhost: str, queue: str, offset: int) -> bool:
        """:meth:`replicated` for the message at ``offset`` of stream ``queue``."""
        if self.upto is None:
            return True
        appends = self._streams.get((vhost, queue))
        return not appends or offset < appends[0][0]
