"""The broker: virtual hosts, sessions, and the broker-wide chores (expiry, status).

The broker never reads a clock; ``now`` arrives with requests and with
:meth:`Broker.tick`, and the latest value is kept for requests that carry none.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any, cast

from amqlite.errors import NotFound
from amqlite.store.records import MessageEnqueue, PeeringOut, Record, StreamAppend
from amqlite.store.state import MessageRef, MessageRun, ScannedEnqueue

from .backlog import Paging
from .limits import BrokerLimits
from .recording import Recorder, Sink
from .replay import PASSIVE_FOLLOWED, Replay
from .session import Session
from .stream import StreamQueue
from .trace import Tracer
from .vhost import VirtualHost

_MASK64 = (1 << 64) - 1


def _scramble(n: int) -> int:
    """A bijection on 64-bit integers (splitmix64's finaliser): distinct counters
    give distinct, random-looking numbers."""
    z = (n + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


#: The records that carry a publish key (``Broker.follow`` remembers them).
_KEYED = frozenset({MessageEnqueue, StreamAppend, PeeringOut})


class Broker:
    """The messaging model of one node; see docs/CONTRACTS.md, "Broker core"."""

    __slots__ = (
        "_generated",
        "_ready",
        "_seed",
        "_vhosts",
        "_wall_offset",
        "limits",
        "node_id",
        "now",
        "paging",
        "recorder",
        "tracer",
    )

    def __init__(
        self,
        vhosts: Iterable[str] = ("/",),
        node_id: str = "node-1",
        *,
        record: Sink | None = None,
        limits: BrokerLimits | None = None,
        group_resume_timeout: float = 10.0,
    ) -> None:
        self.node_id = node_id
        #: What client requests may not exceed (queues, consumers, message size);
        #: journal replay and the HA follower are not held to them.
        self.limits = limits if limits is not None else BrokerLimits()
        self.now = 0.0
        self._wall_offset = 0.0
        #: Journals durable changes into ``record`` (see :mod:`.recording`); None
        #: for a broker without a journal.
        self.recorder = Recorder(record) if record is not None else None
        #: Records publishes, deliveries and acks into ``amq.trace`` when set
        #: (:mod:`.trace`); None (the default) traces nothing.
        self.tracer: Tracer | None = None
        self._ready: list[Session] = []
        self._generated = 0
        self._seed = zlib.crc32(node_id.encode()) << 32
        self._vhosts: dict[str, VirtualHost] = {}
        #: Paging to disk while memory is short (:class:`~.backlog.Paging`): the shell
        #: gives it a pager and calls :meth:`page_out` / :meth:`stop_paging`.
        self.paging = Paging()
        for name in vhosts:
            host = VirtualHost(name, self._new_queue_name, self.recorder)
            host.max_queues = self.limits.max_queues_per_vhost
            host.group_resume_timeout = group_resume_timeout
            host.paging = self.paging
            self._vhosts[name] = host

    @property
    def vhosts(self) -> tuple[str, ...]:
        return tuple(self._vhosts)

    def _new_queue_name(self) -> str:
        """``amq.gen-`` and 16 hex digits: unique per node, the same on every run."""
        self._generated += 1
        return f"amq.gen-{_scramble(self._seed ^ self._generated):016x}"

    def open_session(
        self, vhost: str = "/", owner: object = None, *, holder: Session | None = None
    ) -> Session:
        """A session on ``vhost``. ``holder`` (a session of the same vhost) holds the
        exclusive queues this one declares, so they outlive it (AMQP's channels of
        one connection)."""
        host = self._vhosts.get(vhost)
        if host is None:
            raise NotFound(f"no vhost {vhost!r}")
        if holder is not None and holder.vhost != vhost:
            raise ValueError(f"holder session is on vhost {holder.vhost!r}, not {vhost!r}")
        return Session(self, host, owner, holder)

    def take_ready(self) -> list[Session]:
        """Open sessions that gained deliveries or cancellations since the last call."""
        ready = self._ready
        if not ready:
            return []
        self._ready = []
        out = []
        for session in ready:
            session._flagged = False
            if not session.closed:
                out.append(session)
        return out

    def page_out(self) -> int:
        """Memory is short: from now on messages past each queue's first
        :data:`~.backlog.KEEP` wait on disk (journaled ones by id, transient ones in
        the pager), and those waiting now are moved there; how many moved. Streams
        drop their kept fetch replies (:meth:`StreamQueue.drop_blocks`)."""
        for host in self._vhosts.values():
            for queue in host.queues.values():
                if isinstance(queue, StreamQueue):
                    queue.drop_blocks()  # a cache of encoded fetch replies: made again
        paging = self.paging
        if paging.pager is None:
            return 0
        paging.active = True
        moved = 0
        for host in self._vhosts.values():
            for queue in host.queues.values():
                if not queue.is_stream and not queue.deleted:
                    moved += queue.page_out()
        return moved

    def stop_paging(self) -> None:
        """Memory is back: new messages stay in memory again (what waits on disk
        comes back as consumers drain it)."""
        self.paging.active = False

    def tick(self, now: float, *, expire_queues: bool = True) -> None:
        """Remove (and dead-letter) messages whose TTL has passed at ``now``, and
        (``expire_queues``) delete queues unused past their ``x-expires``. A queue's
        unused time is measured in ticks: it is deleted at the first tick at least
        ``x-expires`` after the last tick that saw it in use. End the message-group
        reservations whose wait is over (:mod:`.groups`)."""
        self.now = now
        for host in self._vhosts.values():
            host.expire(now, queues=expire_queues)

    def apply(self, records: Iterable[Record | MessageRef | MessageRun], now: float) -> int:
        """Rebuild durable state from journal records (recovery after a restart, or a
        passive HA node following its master), without recording them again;
        ``now`` is the current time on the shell's clock. Records naming an unknown
        vhost are skipped: returns how many were."""
        recorder = self.recorder
        if recorder is not None:
            recorder.paused = True
        skipped = 0
        apply = Replay(self).apply
        try:
            for record in records:
                if not apply(record):
                    skipped += 1
        finally:
            if recorder is not None:
                recorder.paused = False
        self.now = max(self.now, now)
        return skipped

    def follow(self, records: Iterable[Record | ScannedEnqueue], now: float) -> None:
        """What a passive HA node's broker takes of replicated records: it applies
        the topology (:data:`~amqlite.broker.replay.PASSIVE_FOLLOWED`, which says
        why only that) and remembers the publish keys the others carry, so that
        once it takes over it knows the publishes it already holds (the keys of
        messages already acked too, which a rebuild from the journal's state does
        not know: :meth:`adopt_publish_keys`). A tuple is a ``message.enqueue``
        record's scanned fields (``amqlite.store.codec.EnqueueScan``)."""
        followed: list[Record] = []
        # each vhost's keys in order, added at the end with one add_many (which is
        # add of each: one call a sync rather than one a message)
        keys: dict[str, list[str]] = {}
        for record in records:
            if isinstance(record, tuple):
                key = record[5]
                if key:
                    got = keys.get(record[1])
                    if got is None:
                        got = keys[record[1]] = []
                    got.append(key)
                continue
            if type(record) in PASSIVE_FOLLOWED:
                followed.append(record)
                continue
            if type(record) in _KEYED:
                keyed = cast(MessageEnqueue | StreamAppend | PeeringOut, record)
                if keyed.publish_key:
                    keys.setdefault(keyed.vhost, []).append(keyed.publish_key)
        for vhost, batch in keys.items():
            host = self._vhosts.get(vhost)
            if host is not None:
                host.publish_keys.add_many(batch)
        if followed:
            self.apply(followed, now)

    def adopt_publish_keys(self, old: Broker) -> None:
        """Take over ``old``'s publish keys (a passive node's broker rebuilt from the
        journal when it takes over: the old one heard every key), ours after them."""
        for name, host in self._vhosts.items():
            before = old._vhosts.get(name)
            if before is not None:
                keys = before.publish_keys
                keys.add_many(host.publish_keys.known)
                host.publish_keys = keys

    @property
    def wall_offset(self) -> float:
        """Wall-clock seconds = ``now`` + this; the shell sets it (the core reads no
        clock). Streams time their messages with it, the journal its enqueues."""
        return self._wall_offset

    @wall_offset.setter
    def wall_offset(self, value: float) -> None:
        self._wall_offset = value
        if self.recorder is not None:
            self.recorder.wall_offset = value
        for host in self._vhosts.values():
            host.wall_offset = value

    def vhost(self, name: str) -> VirtualHost | None:
        return self._vhosts.get(name)

    def all_vhosts(self) -> list[VirtualHost]:
        return list(self._vhosts.values())

    def flag_redelivered(self) -> int:
        """Flag every ready message redelivered; returns how many were not yet.

        A passive HA node taking over from a master that died calls this: the
        master may have handed out messages whose ``message.delivered`` record
        never reached the passive node, so any message may have been seen before
        (AMQP's redelivered means exactly "may have been delivered before")."""
        return sum(
            queue.flag_redelivered()
            for host in self._vhosts.values()
            for queue in host.queues.values()
            if not queue.is_stream
        )

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot: node id, and per vhost its exchanges (with
        bindings) and queues (with counts)."""
        return {
            "node_id": self.node_id,
            "vhosts": [host.status() for host in self._vhosts.values()],
        }
