"""The browser session endpoint: a client session reached over a WebSocket or HTTP
long polling (docs/browser.md), on the same broker session, dispatcher and
durability barrier as a native client's (:class:`~.client.ClientEndpoint`).

What differs is the way out: replies and deliveries become JSON frames
(:mod:`amqlite.browser.codec`) in the session's bounded :class:`~amqlite.browser.Outbox`,
which the channel (the WebSocket's writer, or the page's next poll) empties. The
outbox drops the oldest deliveries of consumers without acks whose message the
journal does not hold (counted, and said to the page); when it is still full the
session stops taking pushes until the page catches up. A consumer with acks
always has a credit (``prefetch``, at most ``MAX_PREFETCH``). While an HA pair
replicates, a journaled message is pushed only once the passive node holds it,
as for every client.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import structlog
import trio

from amqlite.broker import group_record_position
from amqlite.browser import Outbox, codec
from amqlite.errors import AmqliteError, ReplyCode
from amqlite.protocol import events as ev

from .client import DURABLE_REQUESTS

if TYPE_CHECKING:
    from amqlite.broker import Delivery, Session

    from ..context import NodeView
    from ..dispatch import RequestDispatcher
    from ..storage import NodeStorage

__all__ = ["DEFAULT_PREFETCH", "MAX_PREFETCH", "BrowserChannel", "BrowserEndpoint"]

#: credit of a consumer with acks that asked for none (0 = unlimited elsewhere)
DEFAULT_PREFETCH = 100
MAX_PREFETCH = 1000

log = structlog.get_logger("amqlite.server")


class BrowserChannel(Protocol):
    """The channel under a browser session, as the endpoint sees it."""

    remote_address: str
    tls: bool
    #: "ws" or "poll"
    kind: str

    def wake(self) -> None:
        """Frames wait in the outbox."""


class BrowserEndpoint:
    """One page's broker session over a browser channel."""

    role = "client"

    def __init__(
        self,
        node: NodeView,
        channel: BrowserChannel,
        session: Session,
        dispatcher: RequestDispatcher,
        outbox: Outbox,
        *,
        user: str,
        vhost: str,
        client: str,
        connected_at: float,
    ) -> None:
        self.node = node
        self.channel = channel
        self.session: Session | None = session
        self.dispatcher = dispatcher
        self.outbox = outbox
        self.user = user
        self.vhost = vhost
        self.client_name = client
        self.connected_at = connected_at
        self._paused = False
        self._released = False
        self._no_ack: dict[str, bool] = {}  # consumer tag -> consumes without acks
        # HA: (journal id, stream, offset, frame, droppable, ctag), as ClientEndpoint's
        self._held: deque[tuple[int, str, int, int, str, bool, str]] = deque()

    # --- requests ----------------------------------------------------------------------

    def handle(self, event: ev.Event, now: float) -> None:
        t = type(event)
        if t is ev.Consume:
            event = _with_credit(event)  # type: ignore[arg-type]
        elif t is ev.Publish and self.node.alarms_raised:
            names = ", ".join(sorted(r.value for r in self.node.alarms_raised))
            text = f"publishing is blocked: an alarm is raised ({names})"
            self.send(ev.Nacked(event.id, ReplyCode.RESOURCE_ERROR, text))  # type: ignore[attr-defined]
            return
        reply = self.dispatcher.handle(event, now)
        if t is ev.Cancel:
            self.push()  # the consumer's last deliveries go before its cancel-ok
            self._no_ack.pop(event.tag, None)  # type: ignore[attr-defined]
        if reply is None:
            return
        rt = type(reply)
        if rt is ev.Ok:
            assert isinstance(reply, ev.Ok)
            if t is ev.Consume:
                self._no_ack[reply.info["tag"]] = event.no_ack  # type: ignore[attr-defined]
            elif t in DURABLE_REQUESTS:
                storage = self.node.storage
                session = self.session
                if storage is not None and session is not None:
                    first, last = session.journal_span
                    if last:
                        callback = functools.partial(self._durable_reply, event, reply)
                        storage.when_durable(first, last, callback)
                        return
        elif rt is ev.GetOk:
            got, storage = self.dispatcher.got_id, self.node.storage
            if storage is not None and storage.hold_get(got, self._held, self._push_replicated):
                # HA: as in the AMQP channel (endpoints/client.py ``_hold_get``)
                self._held.append((got, "", 0, 0, codec.encode(reply), False, ""))
                return
        elif rt is ev.Error:
            assert isinstance(reply, ev.Error)
            log.info(
                "request_failed",
                remote=self.channel.remote_address,
                method=event.METHOD,
                code=reply.code,
                text=reply.text,
            )
        self.send(reply)

    def _durable_reply(self, request: ev.Event, reply: ev.Event, lost: str | None) -> None:
        if self._released:
            return
        if lost is not None:
            rid = getattr(request, "id", None)
            if isinstance(request, ev.Publish):
                reply = ev.Nacked(request.id, ReplyCode.RESOURCE_ERROR, lost)
            else:
                reply = ev.Error(rid, ReplyCode.RESOURCE_ERROR, lost)
        self.send(reply)

    def send(self, event: ev.Event) -> None:
        """Queue one reply for the page."""
        if self._released:
            return
        self.outbox.add(codec.encode(event))
        self._flow()

    def send_text(self, text: str) -> None:
        """Queue one frame already in JSON (a channel's error frame)."""
        if self._released:
            return
        self.outbox.add(text)
        self._flow()

    # --- pushes ------------------------------------------------------------------------

    def _frame(self, d: Delivery) -> tuple[str, bool]:
        m = d.message
        text = codec.deliver_frame(
            d.ctag, d.dtag, d.redelivered, m.exchange, m.routing_key, m.body,
            m.headers, m.properties, d.queue,
        )  # fmt: skip
        droppable = self._no_ack.get(d.ctag, False) and not m.journal_id and d.offset is None
        return text, droppable

    def push(self) -> None:
        """Frame the deliveries and cancellations the broker has for this session."""
        session = self.session
        if session is None:
            return
        storage = self.node.storage
        if storage is not None and storage.replica_upto is not None:
            self._push_gated(session, storage)
            return
        add = self.outbox.add
        for d in session.take_deliveries():
            text, droppable = self._frame(d)
            add(text, droppable=droppable, ctag=d.ctag)
        for tag, code, text in session.take_cancellations():
            add(codec.encode(ev.Cancelled(tag, code, text)))
        self._flow()

    def _push_gated(self, session: Session, storage: NodeStorage) -> None:
        """``push`` while HA replicates: a journaled message goes out only once the
        passive node holds it, and nothing overtakes a held push."""
        held = self._held
        was_holding = bool(held)
        add = self.outbox.add
        for d in session.take_deliveries():
            text, droppable = self._frame(d)
            journal_id, offset = d.message.journal_id, d.offset
            if offset is not None:
                if held or not storage.stream_replicated(self.vhost, d.queue, offset):
                    held.append((0, d.queue, offset, 0, text, droppable, d.ctag))
                    continue
            else:
                position = group_record_position(d.message)
                if (
                    held
                    or (journal_id and not storage.replicated(journal_id))
                    or (position and not storage.position_replicated(position))
                ):
                    held.append((journal_id, "", 0, position, text, droppable, d.ctag))
                    continue
            add(text, droppable=droppable, ctag=d.ctag)
        for tag, code, reason in session.take_cancellations():
            frame = codec.encode(ev.Cancelled(tag, code, reason))
            if held:
                held.append((0, "", 0, 0, frame, False, ""))
            else:
                add(frame)
        if held and not was_holding:
            storage.when_replicated(self._push_replicated)
        self._flow()

    def _push_replicated(self) -> None:
        held = self._held
        storage = self.node.storage
        while held:
            journal_id, stream, offset, position, text, droppable, ctag = held[0]
            if storage is not None and (
                (journal_id and not storage.replicated(journal_id))
                or (stream and not storage.stream_replicated(self.vhost, stream, offset))
                or (position and not storage.position_replicated(position))
            ):
                break
            held.popleft()
            self.outbox.add(text, droppable=droppable, ctag=ctag)
        if not held and storage is not None:
            storage.discard_waiter(self._push_replicated)
        self._flow()

    def _flow(self) -> None:
        """Wake the channel; past the outbox's bound stop the session's pushes."""
        if len(self.outbox):
            self.channel.wake()
        if self.outbox.over and not self._paused and self.session is not None:
            self._paused = True
            self.session.set_writable(False)

    def taken(self) -> None:
        """The channel took frames from the outbox: pushes may go on."""
        if self._paused and self.outbox.resumable and self.session is not None:
            self._paused = False
            self.session.set_writable(True)
            self.node.pump()

    # --- the end -----------------------------------------------------------------------

    def closed(self, now: float) -> None:
        if self._released:
            return
        self._released = True
        if self._held:
            self._held.clear()  # unacked in the session, which requeues them
            if self.node.storage is not None:
                self.node.storage.discard_waiter(self._push_replicated)
        if self.session is not None:
            with contextlib.suppress(AmqliteError):
                self.session.close(now)
            self.session = None
            self.node.pump()
            log.info(
                "browser_session_closed",
                remote=self.channel.remote_address,
                channel=self.channel.kind,
                user=self.user,
                vhost=self.vhost,
                dropped=self.outbox.dropped_total,
            )

    def info(self) -> dict[str, Any] | None:
        if self.session is None:
            return None
        return {
            "remote": self.channel.remote_address,
            "user": self.user,
            "vhost": self.vhost,
            "client": self.client_name,
            "tls": self.channel.tls,
            "since_s": round(trio.current_time() - self.connected_at, 3),
            "protocol": f"browser-{self.channel.kind}",
            "dropped": self.outbox.dropped_total,
        }


def _with_credit(consume: ev.Consume) -> ev.Consume:
    """A consumer with acks always has a credit, at most MAX_PREFETCH."""
    if consume.no_ack or 0 < consume.prefetch <= MAX_PREFETCH:
        return consume
    prefetch = DEFAULT_PREFETCH if consume.prefetch == 0 else MAX_PREFETCH
    return dataclasses.replace(consume, prefetch=prefetch)
