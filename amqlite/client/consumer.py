"""A consumer: deliveries for one consumer tag, read with ``async for``."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from itertools import repeat
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import trio

from amqlite.errors import AmqliteError

from .delivery import Delivery, PlainDelivery, RunDelivery
from .streams import OFFSET_ARGUMENT

if TYPE_CHECKING:
    from .settling import Settler

#: a buffered delivery of a run (push_run): its tag, body and (exchange, key,
#: the run's properties map or None)
RunItem = tuple[int, bytes, tuple[str, str, dict[str, Any] | None]]

#: The iterator lets the other tasks run after handing out this share of the
#: prefetch window from its buffer without waiting (see :class:`Consumer`).
YIELD_SHARE = 8
#: ... and after this many deliveries when the prefetch is unlimited (0).
YIELD_UNLIMITED = 256


class ConsumerHost(Protocol):
    """What a consumer needs of its connection (for ``async with``)."""

    @property
    def is_open(self) -> bool: ...
    @property
    def close_timeout(self) -> float: ...


class Consumer:
    """Deliveries pushed by the broker for one subscription.

    ``async for d in consumer`` returns buffered deliveries without waiting and
    only waits when the buffer is empty (the buffer is bounded by ``prefetch``),
    but after an eighth of the prefetch window (``1/YIELD_SHARE``) handed out in
    a row it lets the other tasks run once (a checkpoint): the connection's writer
    then sends the acks marked so far (a turn or two later), and the broker
    refills that part of the window while the application works through the
    rest. Without it every ack of a buffer goes out after the whole buffer is
    handled; the broker, whose consumer is out of credit when its queue holds
    messages, refills in one write exactly what an ack freed, so the buffers grow
    into one whole window and stay so: a stop-and-wait in which the broker waits
    while the client works through a window and the other way round (benchmarks/
    README.md, round 6). Iteration ends cleanly after :meth:`cancel` or when we close
    the connection; it raises ConnectionClosed when the connection is lost, and the
    broker's error (after the deliveries already received) when the broker cancels
    the consumer, e.g. because its queue was deleted.

    When the connection reconnects, the consumer is resumed on the new server under
    the same ``tag`` and iteration simply goes on. Deliveries buffered and not yet
    returned when the link broke are dropped (the server delivers them again,
    ``redelivered``), except for ``no_ack`` consumers, where nothing would come again.
    ``queue`` changes if it named a server-named queue that had to be re-created.

    A stream consumer resumes just after the last delivery it returned (or, for
    ``no_ack``, the last it kept buffered): as deliveries are returned, ``arguments``
    [``x-stream-offset``] becomes the next offset, so a reconnect neither repeats
    nor skips. Until its first delivery it resumes with the start it was given.

    Use it as ``async with await conn.consume(q) as consumer:`` to cancel on exit.

    ``active`` is False once cancelled (by us or by the broker) or the connection is
    gone. :meth:`push`, :meth:`drop_buffer`, :meth:`finish` and
    :meth:`resume_arguments` are the connection's side (its reader and reconnector).
    """

    __slots__ = (
        "_buffer",
        "_cancel",
        "_end",
        "_host",
        "_settler",
        "_streak",
        "_waiter",
        "_yield_after",
        "active",
        "arguments",
        "exclusive",
        "no_ack",
        "prefetch",
        "queue",
        "selector",
        "tag",
    )

    def __init__(
        self,
        host: ConsumerHost,
        cancel: Callable[[Consumer], Awaitable[None]],
        queue: str,
        *,
        tag: str,
        prefetch: int,
        no_ack: bool,
        exclusive: bool,
        arguments: dict[str, Any],
        selector: str = "",
        settler: Settler | None = None,
    ) -> None:
        self._host = host
        self._settler = settler  # the connection's: the deliveries built from maps get it
        self._cancel = cancel  # the connection's cancel of a consumer
        self.queue = queue
        self.tag = tag
        self.prefetch = prefetch
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        self.selector = selector
        # deliveries, or deliver maps (push_map) or (tag, body, route) tuples
        # (push_run) made into deliveries as handed out
        self._buffer: deque[Delivery | dict[str, Any] | RunItem] = deque()
        self._waiter: trio.Event | None = None
        self.active = True
        self._end: AmqliteError | None = None
        #: deliveries handed out since the iterator last waited or yielded
        self._streak = 0
        self._yield_after = max(1, prefetch // YIELD_SHARE) if prefetch > 0 else YIELD_UNLIMITED

    def __repr__(self) -> str:
        return f"Consumer(queue={self.queue!r}, tag={self.tag!r}, buffered={len(self._buffer)})"

    @property
    def buffered(self) -> int:
        """Deliveries received and not yet returned by the iterator."""
        return len(self._buffer)

    # --- fed by the connection's reader ---------------------------------------------

    def push(self, d: Delivery) -> None:
        self._buffer.append(d)
        w = self._waiter
        if w is not None:
            self._waiter = None
            w.set()

    def push_map(self, m: dict[str, Any], dtag: int) -> None:
        """Buffer a deliver map in its usual shape (a :class:`PlainDelivery`'s) whose
        delivery tag is ``dtag``: the delivery is built when the iterator hands it
        out, and reads exactly as one pushed built (the map's ``dtag`` becomes
        ``dtag``; the settler, tag and ``no_ack`` are the consumer's, which do not
        change; :meth:`materialize` runs before ``queue`` does).

        Why it exists: a delivery object is tracked by the garbage collector, a map
        of strings, ints and bytes is not. With thousands of deliveries buffered
        (ten consumers of a window of 1000 in one process, fanout-1to10), the
        buffered objects survived the young collections into the oldest
        generation, and full collections ran every ~45,000 deliveries: about 15%
        of such a client's time (benchmarks/README.md, round 7, the fanout client).
        tests/client/test_plain_delivery.py checks it against :meth:`push`."""
        m["dtag"] = dtag
        self._buffer.append(m)
        w = self._waiter
        if w is not None:
            self._waiter = None
            w.set()

    def push_run(
        self,
        dtags: list[int],
        bodies: list[bytes],
        route: tuple[str, str, dict[str, Any] | None],
    ) -> None:
        """Buffer a run of plain deliveries (``protocol.DeliverRun``: one route and
        properties ``(exchange, key, props)``, props None for none) whose delivery
        tags are ``dtags``, as one ``(dtag, body, route)`` tuple each: a
        :class:`RunDelivery` is built when the iterator hands it out, and reads
        exactly as the :class:`PlainDelivery` of the same message's map pushed with
        :meth:`push_map` (its properties its own copy of the run's map).

        Why it exists: the plain deliveries of a read come as runs; a tuple each,
        made in one ``extend``, costs less than a map and a call a message (and,
        as a map of atoms is never tracked by the garbage collector, a tuple of
        atoms stops being tracked once a collection saw it, so a full buffer does
        not feed full collections). tests/client/test_plain_delivery.py checks it
        against :meth:`push_map`."""
        self._buffer.extend(zip(dtags, bodies, repeat(route)))
        w = self._waiter
        if w is not None:
            self._waiter = None
            w.set()

    def materialize(self) -> None:
        """Build the deliveries of the buffered maps now (before ``queue`` changes,
        or to hand the buffer over)."""
        buf = self._buffer
        if any(type(d) is dict or type(d) is tuple for d in buf):
            self._buffer = deque(self._built(d) for d in buf)

    def _built(self, d: Delivery | dict[str, Any] | RunItem) -> Delivery:
        if type(d) is tuple:
            return RunDelivery(self._settler, d, self.tag, self.queue, self.no_ack)
        if type(d) is dict:
            return PlainDelivery(self._settler, d, d["dtag"], self.tag, self.queue, self.no_ack)
        return d  # type: ignore[return-value]

    def drop_buffer(self) -> int:
        """The link broke: forget what it delivered and we have not handed out (the
        server delivers it again); returns how many."""
        n = len(self._buffer)
        self._buffer.clear()
        return n

    def finish(self, error: AmqliteError | None, *, drop_buffer: bool) -> list[Delivery]:
        """End the subscription; returns the buffered deliveries it dropped."""
        dropped: list[Delivery] = []
        if drop_buffer:
            dropped = [self._built(d) for d in self._buffer]
            self._buffer.clear()
        if self.active:
            self.active = False
            self._end = error
        w = self._waiter
        if w is not None:
            self._waiter = None
            w.set()
        return dropped

    # --- the application's side -------------------------------------------------------

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Delivery:
        buf = self._buffer
        streak = self._streak + 1
        if streak > self._yield_after and buf:
            # a share of the window in a row: let the writer send its acks (see above)
            streak = 1
            await trio.lowlevel.checkpoint()
        while not buf:
            streak = 1
            if not self.active:
                self._streak = 0
                if self._end is not None:
                    raise self._end
                raise StopAsyncIteration
            w = self._waiter
            if w is None:
                w = self._waiter = trio.Event()
            await w.wait()
        self._streak = streak
        d = buf.popleft()
        if type(d) is tuple:  # (push_run) a plain delivery of a run: no offset
            return RunDelivery(self._settler, d, self.tag, self.queue, self.no_ack)
        if type(d) is dict:  # (push_map) a plain map: no offset
            return PlainDelivery(self._settler, d, d["dtag"], self.tag, self.queue, self.no_ack)
        offset = d.offset  # type: ignore[union-attr]
        if offset is not None:  # from a stream: resume after it
            self.arguments[OFFSET_ARGUMENT] = offset + 1
        return d  # type: ignore[return-value]

    def resume_arguments(self) -> dict[str, Any]:
        """The arguments to resume with on a new link: past the deliveries kept
        buffered across the cut (``no_ack``) too, as those are handed out later."""
        buf = self._buffer
        if buf:
            last = buf[-1]
            plain = type(last) is dict or type(last) is tuple
            offset = None if plain else last.offset  # type: ignore[union-attr]
            if offset is not None:
                self.arguments[OFFSET_ARGUMENT] = offset + 1
        return self.arguments

    async def cancel(self) -> None:
        """Stop the subscription. Deliveries buffered and not yet returned go back
        to the queue (nack with requeue); iteration then ends."""
        await self._cancel(self)

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.active or not self._host.is_open:
            return
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(self._host.close_timeout):
                await self.cancel()
        except AmqliteError:
            if exc is None:
                raise  # otherwise the block's own exception says more


class Subscriptions(dict[str, Consumer]):
    """A connection's consumers by tag (the reader looks them up as a plain dict),
    and the tags cancelled lately: a delivery the server sent after a cancel's ok is
    expected, not worth a warning (it stays unacked until the link closes, then the
    server requeues it, in order)."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: set[str] = set()

    def note_cancelled(self, tag: str) -> None:
        cancelled = self.cancelled
        if len(cancelled) >= 256:
            cancelled.clear()
        cancelled.add(tag)

    def drop_buffers(self) -> int:
        """The link broke: manual-ack consumers forget what it delivered and they have
        not handed out (the server delivers it again); returns how many."""
        return sum(c.drop_buffer() for c in self.values() if not c.no_ack)

    def rename_queue(self, old: str, new: str) -> None:
        """A server-named queue was declared again under a new name."""
        for c in self.values():
            if c.queue == old:
                c.materialize()  # the maps buffered came from the old queue
                c.queue = new

    def finish_all(self, error: AmqliteError | None) -> None:
        """The connection ended: end every consumer (quietly when ``error`` is None)."""
        for c in self.values():
            c.finish(error, drop_buffer=True)
