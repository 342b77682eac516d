"""Stream queues on the client: where a consumer starts, and named offsets.

A stream consumer chooses its start with the consume argument ``x-stream-offset``
(:func:`offset_argument` checks and converts what the application gives). Its
:class:`~amqlite.client.Consumer` keeps that argument pointing just after the last
delivery handed to the application, so a reconnect resumes the stream there (see
``docs/client.md``). ``store_offset`` / ``query_offset`` keep a reader's position on
the server under a name (the ``offset.store`` / ``offset.query`` requests).
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from amqlite.errors import NotFound, RemoteProtocolError
from amqlite.protocol import events as ev

from .replies import ReplyHook

#: The consume argument that places a stream consumer's cursor.
OFFSET_ARGUMENT = "x-stream-offset"

#: What ``consume(offset=...)`` takes: ``"first"``, ``"last"``, ``"next"``, an
#: offset, a Unix time (float), a datetime or ISO-8601 text.
StreamOffset = str | int | float | datetime.datetime

_NAMED = ("first", "last", "next")

#: The text of the server's 404 for a name nothing was stored under (a missing
#: queue is a 404 too, with another text).
_NOTHING_STORED = "no offset stored"


def offset_argument(offset: StreamOffset) -> str | int | float:
    """``offset`` as the wire value of ``x-stream-offset``.

    Names, non-negative ints and finite floats (Unix times) go as they are; ISO-8601
    text is checked and sent as it is (no zone means UTC, as the server reads it);
    a datetime becomes its ISO text, so a naive one is UTC too. Raises TypeError or
    ValueError for anything else.
    """
    if isinstance(offset, bool):
        raise TypeError("a stream offset is not a bool")
    if isinstance(offset, int):
        if offset < 0:
            raise ValueError(f"a stream offset must not be negative, got {offset}")
        return int(offset)
    if isinstance(offset, float):
        if not math.isfinite(offset):
            raise ValueError(f"a stream start time must be finite, got {offset}")
        return float(offset)
    if isinstance(offset, datetime.datetime):
        return offset.isoformat()
    if isinstance(offset, str):
        if offset in _NAMED:
            return offset
        try:
            datetime.datetime.fromisoformat(offset)
        except ValueError:
            raise ValueError(
                "a stream offset is 'first', 'last', 'next', an offset, a Unix time, "
                f"a datetime or ISO-8601 text, got {offset!r}"
            ) from None
        return offset
    raise TypeError(f"a stream offset cannot be a {type(offset).__name__}")


class StreamRequests:
    """``offset.store`` and ``offset.query``: mixed into the Connection."""

    def _new_id(self) -> int:  # pragma: no cover - provided by Connection
        raise NotImplementedError

    async def _call(
        self, event: Any, hook: ReplyHook | None = None
    ) -> ev.Event:  # pragma: no cover
        raise NotImplementedError

    async def store_offset(self, queue: str, name: str, offset: int) -> None:
        """Keep ``offset`` (usually the last one processed) under ``name`` in stream
        ``queue``, on the server (and in its journal, when it has one: this returns
        once it is on disk). Raises 404 (no such queue) or 406 (not a stream)."""
        await self._call(ev.OffsetStore(self._new_id(), queue, name, offset))

    async def query_offset(self, queue: str, name: str) -> int | None:
        """The offset stored under ``name`` in stream ``queue``; None when nothing
        is. Other failures raise (NotFound when the queue does not exist)."""
        try:
            reply = await self._call(ev.OffsetQuery(self._new_id(), queue, name))
        except NotFound as exc:
            if _NOTHING_STORED in exc.text:
                return None
            raise
        offset = reply.info.get("offset") if isinstance(reply, ev.Ok) else None
        if type(offset) is not int:
            raise RemoteProtocolError(f"offset.query: the reply has no integer offset: {reply}")
        return offset
