"""A consumer: deliveries for one consumer tag, read with ``async for``."""

from __future__ import annotations

from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Any

import trio

from amqlite.errors import AmqliteError

from .delivery import Delivery
from .streams import OFFSET_ARGUMENT

if TYPE_CHECKING:
    from .connection import Connection


class Consumer:
    """Deliveries pushed by the broker for one subscription.

    ``async for d in consumer`` returns buffered deliveries without yielding to
    the scheduler and only waits when the buffer is empty (the buffer is bounded
    by ``prefetch``). Iteration ends cleanly after :meth:`cancel` or when we close
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
    """

    __slots__ = (
        "_buffer",
        "_conn",
        "_end",
        "_ended",
        "_waiter",
        "arguments",
        "exclusive",
        "no_ack",
        "prefetch",
        "queue",
        "tag",
    )

    def __init__(
        self,
        conn: Connection,
        queue: str,
        *,
        tag: str,
        prefetch: int,
        no_ack: bool,
        exclusive: bool,
        arguments: dict[str, Any],
    ) -> None:
        self._conn = conn
        self.queue = queue
        self.tag = tag
        self.prefetch = prefetch
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        self._buffer: deque[Delivery] = deque()
        self._waiter: trio.Event | None = None
        self._ended = False
        self._end: AmqliteError | None = None

    def __repr__(self) -> str:
        return f"Consumer(queue={self.queue!r}, tag={self.tag!r}, buffered={len(self._buffer)})"

    @property
    def active(self) -> bool:
        """False once cancelled (by us or by the broker) or the connection is gone."""
        return not self._ended

    @property
    def buffered(self) -> int:
        """Deliveries received and not yet returned by the iterator."""
        return len(self._buffer)

    # --- fed by the connection's reader ---------------------------------------------

    def _push(self, d: Delivery) -> None:
        self._buffer.append(d)
        w = self._waiter
        if w is not None:
            self._waiter = None
            w.set()

    def _drop_buffer(self) -> int:
        """The link broke: forget what it delivered and we have not handed out (the
        server delivers it again); returns how many."""
        n = len(self._buffer)
        self._buffer.clear()
        return n

    def _finish(self, error: AmqliteError | None, *, drop_buffer: bool) -> list[Delivery]:
        """End the subscription; returns the buffered deliveries it dropped."""
        dropped: list[Delivery] = []
        if drop_buffer:
            dropped = list(self._buffer)
            self._buffer.clear()
        if not self._ended:
            self._ended = True
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
        while not buf:
            if self._ended:
                if self._end is not None:
                    raise self._end
                raise StopAsyncIteration
            w = self._waiter
            if w is None:
                w = self._waiter = trio.Event()
            await w.wait()
        d = buf.popleft()
        offset = d.offset
        if offset is not None:  # from a stream: resume after it
            self.arguments[OFFSET_ARGUMENT] = offset + 1
        return d

    def _resume_arguments(self) -> dict[str, Any]:
        """The arguments to resume with on a new link: past the deliveries kept
        buffered across the cut (``no_ack``) too, as those are handed out later."""
        buf = self._buffer
        if buf:
            offset = buf[-1].offset
            if offset is not None:
                self.arguments[OFFSET_ARGUMENT] = offset + 1
        return self.arguments

    async def cancel(self) -> None:
        """Stop the subscription. Deliveries buffered and not yet returned go back
        to the queue (nack with requeue); iteration then ends."""
        await self._conn._cancel_consumer(self)

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ended or not self._conn.is_open:
            return
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(self._conn.close_timeout):
                await self.cancel()
        except AmqliteError:
            if exc is None:
                raise  # otherwise the block's own exception says more
