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

Positions are the active journal's. Messages are not tracked one by one: journal ids
are handed out in journal order (``Recorder.enqueue`` numbers a message and appends
its record in one step), so each sync sent carries the highest journal id it brings
the passive node (``SendSync.last_id``) and a message is held once its id is at most
that of the last sync the passive node applied. (It kept a journal id -> position
map per message before: two dict and two deque operations a persistent message on
the active node, for the same answer.) Stream offsets appended while replicating are
tracked until the passive node has applied them. Sans-IO: the shell tells it what
was appended and sent and what the peer acknowledged.
"""

from __future__ import annotations

import sys
from collections import deque

#: ``ReplicaProgress.held_id`` while no passive node is replicated to: every journal
#: id is at most this
NO_PEER = sys.maxsize


class ReplicaProgress:
    """The passive node's progress through the active journal (see the module)."""

    __slots__ = (
        "_awaited",
        "_released",
        "_sent",
        "_streams",
        "alone_ok",
        "applied",
        "held_id",
        "upto",
    )

    def __init__(self) -> None:
        #: the passive node has committed everything up to here; None while no
        #: passive node is being replicated to (replies wait for the local commit only)
        self.upto: int | None = None
        #: the passive node has applied everything up to here (pushes may go)
        self.applied = 0
        #: the passive node holds every message with a journal id up to here (those
        #: journaled before it joined came in its snapshot, or were confirmed without
        #: it); NO_PEER while no passive node is replicated to: a push compares a
        #: message's journal id with it and nothing else
        self.held_id = NO_PEER
        #: (upto, last journal id) of the syncs sent and not yet applied, in order
        self._sent: deque[tuple[int, int]] = deque()
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

    def start(self, since_id: int = 0) -> None:
        """A passive node (re)joins: it holds nothing until it acknowledges. Messages
        with a journal id below ``since_id`` (the next id the recorder hands out)
        were journaled before: they come in the snapshot."""
        self.upto = 0
        self.applied = 0
        self.held_id = max(since_id - 1, 0)  # journal ids start at 1
        self._sent.clear()

    def stop(self) -> None:
        """Replication stopped (the peer is silent or the link is down): replies and
        pushes stop waiting for it."""
        self.upto = None
        self.applied = 0
        self.held_id = NO_PEER
        self._sent.clear()
        self._streams.clear()
        self._awaited = 0

    # --- what the active node appends (only while required) -----------------------------

    def sent(self, upto: int, last_id: int) -> None:
        """A sync went to the passive node with the records up to ``upto``, among
        them the ``message.enqueue`` records of every journal id up to ``last_id``
        appended since the start (``SendSync.last_id``)."""
        if self.upto is None or not upto:
            return
        sent = self._sent
        if last_id > (sent[-1][1] if sent else self.held_id):
            sent.append((upto, last_id))

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
        sent, streams = self._sent, self._streams
        if not sent and not streams:
            return awaited
        while sent and sent[0][0] <= upto:
            self.held_id = sent.popleft()[1]
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
        return journal_id <= self.held_id

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
