"""The client session endpoint: requests to the broker, durable replies, pushes.

A request runs against the broker session through the :class:`RequestDispatcher`
(permissions, broker call, reply event). A reply that promises durability (the
confirm of a persistent publish, the ok of a durable declaration) names the
journal span it depends on (``Session.journal_span``) and waits at the node's
one durability barrier (:meth:`NodeStorage.when_durable`); everything else goes
at once.

Pushes: the node's pump calls :meth:`ClientEndpoint.push`, which encodes the
session's deliveries and cancellations. While an HA pair replicates, a journaled
message is pushed only once the passive node holds it, and nothing overtakes a
held push. Flow control: past ``HIGH_WATER`` bytes waiting for a slow client the
session stops taking pushes until the writer drains below ``LOW_WATER``.
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog
import trio

from amqlite.broker import Message, group_record_position
from amqlite.errors import AmqliteError, ReplyCode
from amqlite.ha.progress import NO_PEER
from amqlite.protocol import PublishRun
from amqlite.protocol import events as ev

from ..dispatch import RequestDispatcher

if TYPE_CHECKING:
    from amqlite.broker import Delivery, Session

    from ..context import NodeView
    from ..storage import NodeStorage
    from .base import Link

HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 512 * 1024

log = structlog.get_logger("amqlite.server")

# Requests whose ok promises durability: they wait at the barrier for the journal
# span the broker call names (HTTP actions too). (A consume records first
# deliveries; its ok must not wait, or the pushes would overtake it.)
DURABLE_REQUESTS = frozenset(
    {
        ev.Publish,
        ev.PublishBatch,
        ev.PublishColumns,
        ev.ExchangeDeclare,
        ev.ExchangeDelete,
        ev.QueueDeclare,
        ev.QueueDelete,
        ev.QueuePurge,
        ev.QueueBind,
        ev.QueueUnbind,
        ev.OffsetStore,
    }
)


class ClientEndpoint:
    """One client's broker session on a native connection."""

    role = "client"

    def __init__(
        self,
        node: NodeView,
        link: Link,
        session: Session,
        dispatcher: RequestDispatcher,
        *,
        user: str,
        vhost: str,
        client: str,
        connected_at: float,
    ) -> None:
        self.node = node
        self.link = link
        self.session: Session | None = session
        self.dispatcher = dispatcher
        self.user = user
        self.vhost = vhost
        self.client_name = client
        self.connected_at = connected_at
        self._paused = False
        self._released = False
        # HA: pushes waiting until the passive node holds their message, in order.
        # A plain journaled message's delivery waits as the Delivery itself, encoded
        # when released (a run of them in one append_deliveries); any other push as
        # (journal id, stream, offset, group record position, frame), where a
        # journal id of 0 and no stream or position is a frame that only keeps its
        # place behind them (a transient message, a cancellation)
        self._held_pushes: deque[Delivery | tuple[int, str, int, int, bytes]] = deque()
        #: how many of ``_held_pushes`` are frames (tuples), not plain deliveries
        self._held_frames = 0
        dispatcher.max_reply_bytes = link.proto.max_frame_size
        dispatcher.stream_visible = self._stream_visible

    # --- requests ----------------------------------------------------------------------

    def opened(self) -> None:
        pass

    def handle(self, event: ev.Event, now: float) -> None:
        t = type(event)
        if t is ev.Publish:  # the per-message request: its handler directly
            reply = self.dispatcher.publish(event, now)  # type: ignore[arg-type]
            if reply is None:
                return
            if type(reply) is ev.Ok and not reply.info:  # a confirm
                storage = self.node.storage
                session = self.session
                if storage is not None and session is not None:
                    first, last = session.journal_span
                    if last:  # gathered with this connection's other confirms
                        storage.confirm_when_durable(first, last, self, reply.re, now)
                        return
                self.link.send(reply)
                return
        else:
            reply = self.dispatcher.handle(event, now)
            if t is ev.Cancel:
                self.push()  # the consumer's last deliveries go before its cancel-ok
            if reply is None:
                return
        rt = type(reply)
        if rt is ev.GetOk and self._hold_get(reply):
            return
        if rt is ev.Error:
            assert isinstance(reply, ev.Error)
            log.info(
                "request_failed",
                remote=self.link.remote_address,
                method=event.METHOD,
                code=reply.code,
                text=reply.text,
            )
        elif rt is ev.Ok and t in DURABLE_REQUESTS:
            storage = self.node.storage
            session = self.session
            if storage is not None and session is not None:
                first, last = session.journal_span
                if last:
                    callback = functools.partial(self._durable_reply, event, reply)
                    storage.when_durable(first, last, callback)
                    return
        self.link.send(reply)

    def handle_run(self, run: PublishRun, now: float) -> None:
        """:meth:`handle` of each of ``run``'s publishes, in order: in one go
        (``RequestDispatcher.publish_run``) when it can, else one by one."""
        if not self.dispatcher.publish_run(run, now):
            handle = self.handle
            for p in run.publishes():
                handle(p, now)

    def _stream_visible(self, vhost: str, queue: str) -> int | None:
        """HA: a ``stream.fetch`` reads only what the passive node holds."""
        storage = self.node.storage
        if storage is None or storage.replica_upto is None:
            return None
        return storage.replica.stream_unreplicated(vhost, queue)

    def _hold_get(self, reply: ev.Event) -> bool:
        """HA: a ``get``'s reply waits with the held pushes until the passive node
        holds its message, as a push would (True: held). Else a kill -9 could leave
        the client holding a message the node taking over lacks, which it would then
        get again, unflagged, when the publisher sends it again."""
        got, storage = self.dispatcher.got_id, self.node.storage
        held = self._held_pushes
        if storage is None or not storage.hold_get(got, held, self._push_replicated):
            return False
        try:
            frame = self.link.proto.send(reply)
        except AmqliteError:
            return True  # closing: as link.send would (the waiter finds nothing held)
        held.append((got, "", 0, 0, frame))
        self._held_frames += 1
        return True

    def _durable_reply(self, request: ev.Event, reply: ev.Event, lost: str | None) -> None:
        """The barrier released ``reply`` (or the disk lost what it promised)."""
        if self._released:
            return  # gone: its requests' fate is what the client could not observe
        if lost is None and type(reply) is ev.Ok and not reply.info:
            # a persistent publish's confirm, one per message: its frame by hand
            # (Connection.send_ok, which checks the state as send does)
            link = self.link
            try:
                frame = link.proto.send_ok(reply.re)
            except AmqliteError:
                return  # our protocol side is closing: as link.send would
            out = link.out
            out += frame
            link.kick()
            return
        if lost is not None:
            reply = _refusal(request, lost)
        with contextlib.suppress(AmqliteError):
            self.link.send(reply)

    def confirmed(self, ids: list[int]) -> None:
        """The barrier released the confirms of publishes ``ids``
        (:meth:`NodeStorage.confirm_when_durable`): their ``ok`` frames, one write."""
        if self._released:
            return  # gone: its requests' fate is what the client could not observe
        link = self.link
        try:
            frames = link.proto.send_oks(ids)
        except AmqliteError:
            return  # our protocol side is closing: as link.send would
        out = link.out
        out += frames
        link.kick()

    def refused(self, rid: int, text: str) -> None:
        """The disk dropped publish ``rid``'s message: it is nacked."""
        if self._released:
            return
        with contextlib.suppress(AmqliteError):
            self.link.send(ev.Nacked(rid, ReplyCode.RESOURCE_ERROR, text))

    # --- pushes ------------------------------------------------------------------------

    def push(self) -> int:
        """Encode the deliveries and cancellations the broker has for this session;
        the bytes the link now has waiting to be sent (0 when it wrote nothing:
        closed, closing, or deliveries held until the passive node has them)."""
        session = self.session
        if session is None:
            return 0
        link = self.link
        proto = link.proto
        out = link.out
        storage = self.node.storage
        if storage is not None and storage.replica_upto is not None:
            self._push_gated(session, storage)
            return 0
        try:
            deliveries = session.take_deliveries()
            if deliveries:
                proto.append_deliveries(out, deliveries)
            for tag, code, text in session.take_cancellations():
                out += proto.send(ev.Cancelled(tag, code, text))
        except AmqliteError:
            # Our protocol side is closing (the client said close): what was taken
            # stays unacked in the session, which requeues it when it closes. This
            # runs in whichever task pumped, so it must never raise there.
            return 0
        if out:
            self._flow()
        return len(out)

    def _push_gated(self, session: Session, storage: NodeStorage) -> None:
        """``push`` while HA replicates: a journaled message goes out only once the
        passive node holds it, and nothing overtakes a held push.

        Why a plain message's delivery is held unencoded: on a busy pair nearly every
        persistent delivery is held (its enqueue is on its way to the passive node
        when the pump runs), and encoding each one by itself (``send_deliver``), then
        keeping its frame, cost the active node more than the standalone broker's
        ``append_deliveries`` of the same deliveries (issue 16 item 3). A message is
        never changed once published and a delivery's fields are fixed when it is
        taken, so its frame is the same bytes later. tests/server/test_held_pushes.py
        checks with hypothesis that what goes out, and when, is what encoding each
        push at once and holding its frame gives."""
        link = self.link
        proto = link.proto
        out = link.out
        held = self._held_pushes
        was_holding = bool(held)
        # the passive node holds every message up to this journal id (compared here
        # rather than through storage.replicated: asked once per delivery)
        held_id = storage.replica.held_id
        try:
            deliveries = session.take_deliveries()
            if held and deliveries:
                # Fast path: something is held already, so every delivery waits
                # behind it; when they are all plain (what a busy pair's pump hands
                # over) the walk below would only append each one to ``held``.
                # tests/server/test_held_pushes.py checks with hypothesis that what
                # goes out, and when, is what the general rule gives (both paths).
                for d in deliveries:
                    if d.offset is not None or type(d.message) is not Message:
                        break
                else:
                    held.extend(deliveries)
                    deliveries = []
            if deliveries:
                vhost = self.vhost
                ready = 0  # deliveries[:ready] go now (once one is held, all after are)
                for d in deliveries:
                    message = d.message
                    offset = d.offset
                    if offset is not None:
                        if held or not storage.stream_replicated(vhost, d.queue, offset):
                            frame = proto.send_deliver(
                                d.ctag, d.dtag, d.redelivered, message, offset
                            )
                            held.append((0, d.queue, offset, 0, frame))
                            self._held_frames += 1
                            continue
                    elif type(message) is Message:  # no group record to wait for
                        if held or message.journal_id > held_id:
                            held.append(d)
                            continue
                    else:
                        position = group_record_position(message)
                        if (
                            held
                            or message.journal_id > held_id
                            or (position and not storage.position_replicated(position))
                        ):
                            frame = proto.send_deliver(d.ctag, d.dtag, d.redelivered, message)
                            held.append((message.journal_id, "", 0, position, frame))
                            self._held_frames += 1
                            continue
                    ready += 1
                if ready:
                    proto.append_deliveries(
                        out, deliveries if ready == len(deliveries) else deliveries[:ready]
                    )
            for tag, code, text in session.take_cancellations():
                frame = proto.send(ev.Cancelled(tag, code, text))
                if held:
                    held.append((0, "", 0, 0, frame))
                    self._held_frames += 1
                else:
                    out += frame
        except AmqliteError:
            return  # closing: see push
        if held and not was_holding:
            storage.when_replicated(self._push_replicated)
        self._flow()

    def _push_replicated(self) -> None:
        """The passive node holds more: send the held pushes it now holds."""
        held = self._held_pushes
        storage = self.node.storage
        link = self.link
        out = link.out
        held_id = storage.replica.held_id if storage is not None else NO_PEER
        run: list[Delivery] = []  # plain deliveries released, encoded as one run
        try:
            if held and not self._held_frames:
                # Fast path: only plain deliveries are held, so the walk below would
                # release as one run those up to the first whose message the passive
                # node does not hold yet; this counts them in a tighter loop (an ack
                # of a busy pair's passive node releases ~100 at a time).
                # tests/server/test_held_pushes.py checks with hypothesis that what
                # goes out is what encoding each push at once and holding its frame
                # gives (both paths).
                ready = 0
                for d in held:
                    if d.message.journal_id > held_id:  # type: ignore[union-attr]
                        break
                    ready += 1
                if ready == len(held):
                    link.proto.append_deliveries(out, held)  # type: ignore[arg-type]
                    held.clear()
                elif ready:
                    popleft = held.popleft
                    run = [popleft() for _ in range(ready)]  # type: ignore[misc]
            while held:
                entry = held[0]
                if not isinstance(entry, tuple):
                    if entry.message.journal_id > held_id:
                        break
                    run.append(entry)
                    held.popleft()
                    continue
                journal_id, stream, offset, position, frame = entry
                if storage is not None and (
                    journal_id > held_id
                    or (stream and not storage.stream_replicated(self.vhost, stream, offset))
                    or (position and not storage.position_replicated(position))
                ):
                    break
                if run:
                    link.proto.append_deliveries(out, run)
                    run = []
                out += frame
                held.popleft()
                self._held_frames -= 1
            if run:
                link.proto.append_deliveries(out, run)
        except AmqliteError:
            # our protocol side is closing: what was taken stays unacked in the
            # session, which requeues it when it closes (see push)
            held.clear()
            self._held_frames = 0
        if not held and storage is not None:
            storage.discard_waiter(self._push_replicated)
        self._flow()

    def _flow(self) -> None:
        """Wake the writer; past HIGH_WATER stop the session's pushes."""
        link = self.link
        if link.out:
            link.kick()
            if len(link.out) > HIGH_WATER and not self._paused:
                self._paused = True
                if self.session is not None:
                    self.session.set_writable(False)

    def drained(self, pending: int) -> None:
        if self._paused and pending < LOW_WATER and self.session is not None:
            self._paused = False
            self.session.set_writable(True)
            self.node.pump()

    # --- the end -----------------------------------------------------------------------

    def closed(self, now: float) -> None:
        self._released = True
        if self._held_pushes:
            self._held_pushes.clear()  # unacked in the session, which requeues them
            self._held_frames = 0
            if self.node.storage is not None:
                self.node.storage.discard_waiter(self._push_replicated)
        if self.session is not None:
            self.session.close(now)
            self.session = None
            self.node.pump()
            log.info(
                "connection_closed",
                remote=self.link.remote_address,
                user=self.user,
                vhost=self.vhost,
            )

    def info(self) -> dict[str, Any] | None:
        if self.session is None:
            return None
        return {
            "remote": self.link.remote_address,
            "user": self.user,
            "vhost": self.vhost,
            "client": self.client_name,
            "tls": self.link.tls,
            "since_s": round(trio.current_time() - self.connected_at, 3),
        }


def _refusal(request: ev.Event, text: str) -> ev.Event:
    """What a request gets instead of its ok when the disk dropped its message."""
    if isinstance(request, ev.Publish):  # (a publish.batch fails whole: error)
        return ev.Nacked(request.id, ReplyCode.RESOURCE_ERROR, text)
    return ev.Error(getattr(request, "id", None), ReplyCode.RESOURCE_ERROR, text)
