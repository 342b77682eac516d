"""The reader under a client connection, on an :class:`amqlite.link.FramedLink`.

The link does the rest (the writer and its one shared out-buffer, heartbeats,
closing the stream): see :mod:`amqlite.link`. The reader hands every batch of
events its protocol connection decodes to the connection in one call (a usual
``deliver`` as its map, plain ones in a row as one run: see
``Connection.events_with_deliver_runs``); on a
protocol error it tells the server why, then hangs up. Nothing here raises: a
failure is reported once through the link's ``on_lost``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from amqlite.errors import ConnectionClosed, ProtocolError, ReplyCode
from amqlite.link import FramedLink
from amqlite.log import get_logger
from amqlite.protocol import DeliverMap, DeliverRun, OkRun
from amqlite.protocol import events as ev

log = get_logger("amqlite.client")

#: Above this many unsent bytes, publishers wait for the writer.
HIGH_WATER = 1024 * 1024

EventsHandler = Callable[[list[ev.Event | DeliverMap | DeliverRun | OkRun]], None]


class Transport:
    """The reader task of one link (its writer and watchdog run in :meth:`run` too)."""

    def __init__(self, link: FramedLink, on_events: EventsHandler) -> None:
        self.link = link
        self._on_events = on_events

    async def run(self) -> None:
        """Run the link (reader, writer, heartbeats) until it ends or is aborted."""
        await self.link.run(self._read)

    async def _read(self) -> None:
        link = self.link
        proto = link.proto
        on_events = self._on_events
        ended = False  # the stream has ended: report it once the events are handed on
        try:
            while True:
                # the first pass takes what came with the welcome; a batch ends at a
                # state change (a close), so ask until there is nothing more
                while batch := proto.events_with_deliver_runs():
                    on_events(batch)
                    if link.dead or type(batch[-1]) is ev.EndOfStream:
                        break
                if link.dead:
                    return
                if ended:
                    link.fail(ConnectionClosed(f"{link.remote_address} closed the connection"))
                    return
                if not await link.receive():
                    if link.dead or link.closing:  # broke (reported) or we hung up
                        return
                    ended = True
        except ProtocolError as exc:
            # the server broke the protocol: tell it why, then hang up
            with contextlib.suppress(ProtocolError):
                link.send(ev.Close(code=exc.code, text=exc.text))
            link.fail(
                ConnectionClosed(f"protocol error from {link.remote_address}: {exc}", exc.code)
            )
            link.close()
        except Exception as exc:  # a bug: surface it as a dead connection, with the cause
            log.exception("client_reader_failed", remote=link.remote_address)
            err = ConnectionClosed(f"client reader failed: {exc!r}", ReplyCode.INTERNAL_ERROR)
            err.__cause__ = exc
            link.fail(err)
