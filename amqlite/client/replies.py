"""Outstanding requests, keyed by id, resolved by the reader with the reply event."""

from __future__ import annotations

from collections.abc import Callable

import trio

from amqlite.errors import AmqliteError, error_for
from amqlite.protocol import events as ev

ReplyHook = Callable[[ev.Event], None]


class PendingReply:
    """One request waiting for its ``re``.

    ``hook`` runs in the reader, in frame order, before anything after the reply
    is processed (a ``consume`` registers its consumer there, so deliveries that
    follow the ``ok`` in the same batch find it).

    ``request`` is the request itself when it may be sent again on a new link after
    a reconnect (the application's requests); None marks the reconnect's own
    requests, which fail with the link that carried them.
    """

    __slots__ = ("_done", "_error", "_reply", "abandoned", "hook", "request")

    def __init__(self, hook: ReplyHook | None = None, request: ev.Event | None = None) -> None:
        self.abandoned = False  # the caller stopped waiting (cancelled)
        self._done = trio.Event()
        self._reply: ev.Event | None = None
        self._error: AmqliteError | None = None
        self.hook = hook
        self.request = request

    def resolve(self, reply: ev.Event) -> None:
        if self._done.is_set():
            return
        if self.hook is not None:
            self.hook(reply)
        if type(reply) is ev.Error:
            self._error = error_for(reply.code, reply.text)
        else:
            self._reply = reply
        self._done.set()

    def fail(self, exc: AmqliteError) -> None:
        if not self._done.is_set():
            self._error = exc
            self._done.set()

    async def wait(self) -> ev.Event:
        """The reply; raises the broker's error (``error`` frame) or ConnectionClosed."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._reply is not None
        return self._reply


class PendingRequests(dict[int, PendingReply]):
    """A connection's requests waiting for their reply, by id (the reader pops them
    as a plain dict)."""

    __slots__ = ()

    def fail_all(self, exc: AmqliteError) -> None:
        """The connection ended: every request raises ``exc``."""
        pending = list(self.values())
        self.clear()
        for p in pending:
            p.fail(exc)

    def link_lost(self, exc: AmqliteError) -> None:
        """The link broke, the connection reconnects: the reconnect's own requests
        and those nobody waits for any more fail with it, a ``cancel`` is done (the
        consumer went with the link); the application's other requests stay, to be
        sent again."""
        for rid, p in list(self.items()):
            if p.request is None or p.abandoned:
                del self[rid]
                p.fail(exc)
            elif type(p.request) is ev.Cancel:
                del self[rid]
                p.resolve(ev.Ok(rid))

    def to_resend(self) -> list[tuple[int, ev.Event]]:
        """The requests to send again on a new link, as ``(id, request)``."""
        return [(rid, p.request) for rid, p in self.items() if p.request is not None]
