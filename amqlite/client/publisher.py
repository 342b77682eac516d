"""Publisher confirms: a window of outstanding confirmed publishes.

A confirmed publish is final on ``ok`` (the broker holds it), ``returned`` (312:
mandatory and unroutable; not followed by an ``ok``), ``nacked`` or ``error``.
"""

from __future__ import annotations

from collections import deque

import trio

from amqlite.errors import AmqliteError, PublishNacked, PublishReturned, error_for
from amqlite.protocol import events as ev


class PendingConfirm:
    """A confirmed publish the broker has not answered yet.

    ``await wait()`` returns once it is confirmed or raises why not
    (:class:`~amqlite.errors.PublishReturned`, :class:`~amqlite.errors.PublishNacked`,
    a :class:`~amqlite.errors.BrokerError` or ConnectionClosed). ``done`` and
    ``error`` can be polled without waiting.

    :meth:`settle`, ``waiter`` and ``observed`` are the :class:`ConfirmWindow`'s side.
    """

    __slots__ = ("done", "error", "frame", "id", "observed", "waiter")

    def __init__(self, rid: int, frame: bytes | None = None) -> None:
        self.id = rid
        self.done = False
        self.error: AmqliteError | None = None
        #: Made by the first :meth:`wait`, set when the broker answers.
        self.waiter: trio.Event | None = None
        #: True once the error was raised to someone (by wait or wait_all).
        self.observed = False
        #: The encoded publish, kept (when the connection reconnects) to send it
        #: again on a new link if the confirm has not come by then.
        self.frame = frame

    def __repr__(self) -> str:
        state = "pending" if not self.done else ("ok" if self.error is None else repr(self.error))
        return f"PendingConfirm(id={self.id}, {state})"

    def settle(self, error: AmqliteError | None) -> None:
        self.done = True
        self.error = error
        self.frame = None
        if self.waiter is not None:
            self.waiter.set()

    async def wait(self) -> None:
        if not self.done:
            if self.waiter is None:
                self.waiter = trio.Event()
            await self.waiter.wait()
        else:
            await trio.lowlevel.checkpoint()
        if self.error is not None:
            self.observed = True
            raise self.error


def confirm_error(reply: ev.Event) -> AmqliteError | None:
    """None for ``ok``; the error a ``returned``/``nacked``/``error`` reply means."""
    t = type(reply)
    if t is ev.Ok:
        return None
    if t is ev.Returned:
        assert isinstance(reply, ev.Returned)
        return PublishReturned(reply.text or "message returned (no route)", reply.code)
    if t is ev.Nacked:
        assert isinstance(reply, ev.Nacked)
        return PublishNacked(reply.text or "message nacked by the broker", reply.code)
    if t is ev.Error:
        assert isinstance(reply, ev.Error)
        return error_for(reply.code, reply.text)
    return error_for(505, f"unexpected reply {reply.METHOD!r} to a publish")


class ConfirmWindow:
    """Outstanding confirms by id, at most ``limit`` of them."""

    __slots__ = ("_failures", "_idle", "_room", "limit", "outstanding")

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.outstanding: dict[int, PendingConfirm] = {}
        self._failures: deque[PendingConfirm] = deque()
        self._room: trio.Event | None = None
        self._idle: trio.Event | None = None

    def __len__(self) -> int:
        return len(self.outstanding)

    @property
    def full(self) -> bool:
        return len(self.outstanding) >= self.limit

    async def wait_for_room(self) -> None:
        while len(self.outstanding) >= self.limit:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()

    def confirm(self, rid: int) -> bool:
        """Settle confirm ``rid`` as confirmed (a bare ``ok``); False when it is none."""
        p = self.outstanding.pop(rid, None)
        if p is None:
            return False
        p.done = True
        p.frame = None
        w = p.waiter
        if w is not None:
            w.set()
        if self._room is not None or self._idle is not None:
            self._after_settle()
        return True

    def confirm_run(self, res: list[int], start: int = 0) -> int:
        """:meth:`confirm` each of ``res[start:]`` in order until one that is no
        confirm; returns its index (``len(res)`` when every one was).

        Why it exists: a publisher's confirms come as runs of bare oks
        (``protocol.OkRun``), and a call and a room check a confirm were a
        measurable part of the persistent bench client's time per message; a
        run is settled in one loop and the waiters for room or for the end are
        woken once, after it (no task runs in between, so they see the same).
        tests/client/test_confirm_window.py checks it against :meth:`confirm`."""
        pop = self.outstanding.pop
        i = start
        for rid in res[start:] if start else res:
            p = pop(rid, None)
            if p is None:
                break
            p.done = True
            p.frame = None
            w = p.waiter
            if w is not None:
                w.set()
            i += 1
        if i > start and (self._room is not None or self._idle is not None):
            self._after_settle()
        return i

    def resolve(self, rid: int, reply: ev.Event) -> bool:
        """Settle confirm ``rid`` with ``reply``; False when ``rid`` is not a confirm."""
        p = self.outstanding.pop(rid, None)
        if p is None:
            return False
        err = confirm_error(reply)
        p.settle(err)
        if err is not None:
            self._note_failure(p)
        self._after_settle()
        return True

    def _after_settle(self) -> None:
        if self._room is not None and len(self.outstanding) < self.limit:
            self._room.set()
            self._room = None
        if self._idle is not None and not self.outstanding:
            self._idle.set()
            self._idle = None

    def fail_all(self, exc: AmqliteError) -> None:
        pending = list(self.outstanding.values())
        self.outstanding.clear()
        for p in pending:
            p.settle(exc)
            self._note_failure(p)
        self._after_settle()

    def _note_failure(self, p: PendingConfirm) -> None:
        failures = self._failures
        failures.append(p)
        if len(failures) > 1024:  # only the first unseen failure is ever raised
            unseen = [f for f in failures if not f.observed]
            self._failures = deque(unseen[:1])

    async def wait_all(self) -> None:
        """Until nothing is outstanding; then raise the first failure nobody has seen."""
        while self.outstanding:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()
        failures, self._failures = self._failures, deque()
        for p in failures:
            if not p.observed:
                p.observed = True
                assert p.error is not None
                raise p.error
