"""The ``failover`` scenario's clients: a paced publisher of persistent confirmed
messages and an acking consumer, both given the pair's two addresses (so both
fail over by themselves), counting every message.

Each body is the message's sequence number, so the counts are exact: a message
is *confirmed* once the broker confirmed it and *delivered* once the consumer got
it (at least once; a duplicate is counted apart). The consumer keeps the arrival
time (``time.perf_counter()``) of every delivery, for the gaps around each kill.
A :class:`FailoverWatch` notes the first confirm and the first delivery that come
from another node than the one killed.

The publisher sends ``rate`` messages a second in small batches per tick, with at
most :data:`~amqlite_bench.scenarios.CONFIRM_WINDOW` confirms outstanding. While
the client reconnects its publishes wait; what fell due meanwhile is not sent in
a burst afterwards (a backlog of more than :data:`MAX_BACKLOG_S` is dropped from
the schedule), so the offered rate stays ``rate`` whenever a master serves.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from amqlite import Connection, Consumer, PendingConfirm, connect
from amqlite.client import Reconnected
from amqlite.errors import AmqliteError, ConnectionClosed

from .errors import BenchError
from .plan import TICK
from .scenarios import BODY_SIZE, CONFIRM_WINDOW
from .systems import PREFETCH

#: Seconds of schedule a publisher catches up after an outage; older sends are skipped.
MAX_BACKLOG_S = 0.1
#: A publish handed to the confirm watcher: its sequence number and its confirm.
Sent = tuple[int, PendingConfirm]


@dataclass(slots=True)
class FailoverWatch:
    """One kill: the node killed (its address) and when, and what came after from
    the other node (``time.perf_counter()`` values)."""

    killed: str
    killed_at: float
    publisher_back_at: float | None = None  # the publisher reconnected (and restored)
    first_confirm_at: float | None = None
    first_delivery_at: float | None = None
    confirmed: trio.Event = field(default_factory=trio.Event)
    delivered: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True, slots=True)
class LoadCounts:
    """What the clients counted by the end; ``lost`` is confirmed but never delivered."""

    sent: int
    confirmed: int
    refused: int
    delivered: int
    deliveries: int
    redelivered: int
    lost: int
    #: second (or later) deliveries of a message not flagged redelivered: the HA
    #: guarantee says there are none
    unflagged_duplicates: int = 0

    @property
    def duplicates(self) -> int:
        return self.deliveries - self.delivered

    @property
    def unconfirmed(self) -> int:
        return self.sent - self.confirmed - self.refused


class PairLoad:
    """The counts and the tasks; make one with :func:`run_load`."""

    def __init__(self, queue: str, rate: float) -> None:
        self.queue = queue
        self.rate = rate
        self.confirmed = bytearray()  # by sequence number: 1 once confirmed
        self.delivered = bytearray()  # by sequence number: deliveries, at most 255
        self.delivery_times = array("d")  # perf_counter of every delivery, in order
        self.sent = 0
        self.confirmed_count = 0
        self.delivered_count = 0  # distinct messages delivered
        self.both = 0  # messages confirmed and delivered
        self.deliveries = 0
        self.redelivered = 0
        self.unflagged_duplicates = 0
        self.refused = 0
        self.last_refusal = ""
        self.watched = 0  # confirms the watcher has settled (confirmed or refused)
        self.last_confirm_at = 0.0
        self.last_delivery_at = 0.0
        self.watch: FailoverWatch | None = None
        self._moved: trio.Event | None = None  # set at the next confirm or delivery
        self._stop = trio.Event()
        self._publisher_done = trio.Event()

    # --- what the scenario asks -------------------------------------------------------

    def watch_failover(self, killed: str, killed_at: float) -> FailoverWatch:
        """Start watching for the first confirm and delivery from a node other than
        ``killed`` (an address); replaces the previous watch."""
        self.watch = FailoverWatch(killed, killed_at)
        return self.watch

    async def wait_flowing(self, deadline_s: float) -> None:
        """Until a confirm and a delivery both arrive after now; BenchError after
        ``deadline_s``."""
        since = time.perf_counter()
        with trio.move_on_after(deadline_s):
            while self.last_confirm_at <= since or self.last_delivery_at <= since:
                await self._next_move()
            return
        raise BenchError(
            f"failover: no confirm and delivery within {deadline_s:g} s while the pair was "
            f"settled ({self.describe()})"
        )

    async def finish(self, stall_s: float) -> LoadCounts:
        """Stop publishing, wait for every confirm, then for every confirmed message
        to be delivered (until nothing moves for ``stall_s``); the final counts."""
        self._stop.set()
        with trio.move_on_after(stall_s):  # a publish waits for room or a reconnect
            await self._publisher_done.wait()
        await self._wait_moving(lambda: self.watched >= self.sent, stall_s)
        await self._wait_moving(lambda: self.both >= self.confirmed_count, stall_s)
        return LoadCounts(
            sent=self.sent,
            confirmed=self.confirmed_count,
            refused=self.refused,
            delivered=self.delivered_count,
            deliveries=self.deliveries,
            redelivered=self.redelivered,
            lost=self.confirmed_count - self.both,
            unflagged_duplicates=self.unflagged_duplicates,
        )

    async def _wait_moving(self, done: Callable[[], bool], stall_s: float) -> None:
        while not done():
            with trio.move_on_after(stall_s) as stalled:
                await self._next_move()
            if stalled.cancelled_caught:
                return

    async def _next_move(self) -> None:
        """Until the next confirm or delivery (or refusal)."""
        if self._moved is None:
            self._moved = trio.Event()
        await self._moved.wait()

    def _moving(self) -> None:
        moved = self._moved
        if moved is not None:
            self._moved = None
            moved.set()

    def describe(self) -> str:
        return (
            f"sent {self.sent:,}, confirmed {self.confirmed_count:,}, delivered "
            f"{self.delivered_count:,} ({self.deliveries:,} deliveries)"
        )

    # --- the tasks --------------------------------------------------------------------

    def publisher_back(self, event: Reconnected) -> None:
        watch = self.watch
        if watch is not None and watch.publisher_back_at is None:
            watch.publisher_back_at = time.perf_counter()

    async def publish(self, conn: Connection, send: trio.MemorySendChannel[Sent]) -> None:
        rate = self.rate
        queue = self.queue
        start = trio.current_time()
        base = self.sent
        try:
            while not self._stop.is_set():
                now = trio.current_time()
                due = base + int((now - start) * rate) + 1
                if due - self.sent > rate * MAX_BACKLOG_S:  # back from an outage
                    start, base, due = now, self.sent, self.sent + 1
                while self.sent < due and not self._stop.is_set():
                    seq = self.sent
                    self.confirmed.append(0)
                    self.delivered.append(0)
                    body = str(seq).rjust(BODY_SIZE).encode()
                    pending = await conn.publish_nowait("", queue, body, persistent=True)
                    self.sent = seq + 1
                    send.send_nowait((seq, pending))
                next_due = start + (self.sent - base) / rate
                await trio.sleep_until(max(next_due, trio.current_time() + TICK))
        finally:
            self._publisher_done.set()

    async def watch_confirms(
        self, conn: Connection, receive: trio.MemoryReceiveChannel[Sent]
    ) -> None:
        async for seq, pending in receive:
            try:
                await pending.wait()
            except ConnectionClosed as exc:
                raise BenchError(f"failover: the publisher gave up: {exc}") from None
            except AmqliteError as exc:  # nacked, returned: counted, never lost
                self.refused += 1
                self.last_refusal = str(exc)
                self.watched += 1
                self._moving()
                continue
            now = time.perf_counter()
            self.confirmed[seq] = 1
            self.confirmed_count += 1
            if self.delivered[seq]:
                self.both += 1
            self.watched += 1
            self.last_confirm_at = now
            self._moving()
            watch = self.watch
            if (
                watch is not None
                and watch.first_confirm_at is None
                and str(conn.address) != watch.killed
            ):
                watch.first_confirm_at = now
                watch.confirmed.set()

    async def consume(self, conn: Connection, consumer: Consumer) -> None:
        times = self.delivery_times
        delivered = self.delivered
        async for d in consumer:
            now = time.perf_counter()
            seq = int(d.body)
            times.append(now)
            self.deliveries += 1
            self.last_delivery_at = now
            seen = delivered[seq]
            if not seen:
                self.delivered_count += 1
                if self.confirmed[seq]:
                    self.both += 1
            if seen < 255:
                delivered[seq] = seen + 1
            if d.redelivered:
                self.redelivered += 1
            elif seen:
                self.unflagged_duplicates += 1
            self._moving()
            watch = self.watch
            if (
                watch is not None
                and watch.first_delivery_at is None
                and str(conn.address) != watch.killed
            ):
                watch.first_delivery_at = now
                watch.delivered.set()
            await d.ack()


_AUTH_DEFAULTS = (("vhost", "/"), ("login", "guest"), ("password", "guest"))


@asynccontextmanager
async def run_load(
    servers: str, queue: str, rate: float, auth: Mapping[str, str]
) -> AsyncIterator[PairLoad]:
    """Connect both clients to ``servers``, declare ``queue`` (durable), subscribe,
    and publish at ``rate``; the tasks run until the block ends."""
    load = PairLoad(queue, rate)
    vhost, login, password = (auth.get(k, d) for k, d in _AUTH_DEFAULTS)
    async with (
        connect(
            servers, vhost=vhost, login=login, password=password,
            client_name="bench-failover-publisher", max_in_flight=CONFIRM_WINDOW,
            on_reconnect=load.publisher_back,
        ) as pub,
        connect(
            servers, vhost=vhost, login=login, password=password,
            client_name="bench-failover-consumer",
        ) as sub,
    ):  # fmt: skip
        await pub.declare_queue(queue, durable=True)
        await sub.declare_queue(queue, durable=True)
        consumer = await sub.consume(queue, prefetch=PREFETCH)
        send, receive = trio.open_memory_channel[Sent](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(load.consume, sub, consumer)
            nursery.start_soon(load.watch_confirms, pub, receive)
            nursery.start_soon(load.publish, pub, send)
            try:
                yield load
            finally:
                nursery.cancel_scope.cancel()
