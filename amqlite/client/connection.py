"""The client connection: requests and replies, publishing, consuming, closing.

Requests carry an ``id`` and wait for the reply with that ``re``. Publishes
without ``confirm`` and acks get no reply unless they fail; such a failure (an
``error`` whose ``re`` is nobody's request) is kept and raised by the next
publish or ``wait_for_confirms``, or when the connection's context exits.

A connection outlives its links when it reconnects (see :mod:`.recovery`). The
connection owns its parts and hands each what it needs, so that no part imports it:
the current link, its generation and delivery-tag space and the coalesced acks
(:class:`.settling.Settler`, which each delivery holds), the requests waiting for a
reply (:class:`.replies.PendingRequests`), the confirm window
(:class:`.publisher.ConfirmWindow`), the consumers
(:class:`.consumer.Subscriptions`) and the declared topology; its reconnector gets
them as :class:`.recovery.ConnectionParts`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import trio

from amqlite.errors import (
    AmqliteError,
    BrokerError,
    ConnectionClosed,
    ReplyCode,
    code_name,
    error_for,
)
from amqlite.link import FramedLink
from amqlite.log import get_logger
from amqlite.protocol import (
    DEFAULT_MAX_FRAME,
    ConnState,
    DeliverMap,
    DeliverRun,
    OkRun,
    check_headers,
    check_props,
)
from amqlite.protocol import events as ev
from amqlite.protocol.codec import EMPTY

from .addresses import Address
from .bulk import BulkRequests
from .consumer import Consumer, Subscriptions
from .declarations import Declarations
from .delivery import Delivery
from .dial import HELLO_ID, Dialed, Dialer
from .link import Disconnected, LinkEvent, LinkState, Reconnected, next_state
from .policy import ReconnectPolicy
from .publisher import ConfirmWindow, PendingConfirm
from .recovery import ConnectionParts, Reconnector
from .replies import PendingReply, PendingRequests, ReplyHook
from .settling import Settler
from .streams import OFFSET_ARGUMENT, StreamOffset, StreamRequests, offset_argument
from .topology import Topology
from .transport import HIGH_WATER, Transport

log = get_logger("amqlite.client")

#: Publishes between two scheduler checkpoints (lets the writer and reader run).
PUBLISH_BATCH = 64
#: a persistent publish's properties when it has no others (never mutated)
_PERSISTENT_ONLY: dict[str, Any] = {"persistent": True}

_REPLY_TYPES = (ev.Ok, ev.Error, ev.Returned, ev.Nacked, ev.GetOk, ev.GetEmpty, ev.StreamRecords)

#: A server ``close`` with one of these codes is worth a reconnect (shutdown, HA
#: fencing or demotion, a server-side fault); others mean we broke something.
_RECOVERABLE_CLOSE = frozenset(
    {
        ReplyCode.CONNECTION_FORCED,
        ReplyCode.NOT_ACTIVE,
        ReplyCode.RESOURCE_ERROR,
        ReplyCode.INTERNAL_ERROR,
    }
)


class Connection(Declarations, StreamRequests, BulkRequests):
    """A connection to a broker, or to the first willing server of a list. Make one
    with :func:`connect`.

    With a reconnect policy (see :func:`connect`) the connection survives losing its
    server: it dials the list again (primary first, with backoff), declares again
    what it declared, resumes its consumers under the same tags and sends again the
    requests and confirmed publishes still unanswered. Meanwhile calls wait; they
    raise ConnectionClosed only when the connection gives up.
    """

    def __init__(
        self,
        dialed: Dialed,
        *,
        max_in_flight: int,
        close_timeout: float,
        dialer: Dialer | None = None,
        policy: ReconnectPolicy | None = None,
        on_disconnect: Callable[[Disconnected], object] | None = None,
        on_reconnect: Callable[[Reconnected], object] | None = None,
    ) -> None:
        self.close_timeout = close_timeout
        self._dialer = dialer
        #: None: a lost link ends the connection.
        self.reconnect_policy: ReconnectPolicy | None = policy if dialer is not None else None
        self._state = LinkState.OPEN
        self._ready = True  # state is OPEN: the hot paths test this one flag
        self._nursery: trio.Nursery | None = None
        self._next_id = HELLO_ID + 1
        self._settler = Settler(dialed.link, self._new_id)
        self._requests = PendingRequests()
        self._confirms = ConfirmWindow(max_in_flight)
        self._consumers = Subscriptions()
        self._requeue_after_cancel: dict[str, list[int]] = {}  # ctag -> dtags
        self._topology = Topology()
        self._unreported: AmqliteError | None = None
        self._close_done = trio.Event()
        self._published = 0
        #: Mandatory publishes without confirm that came back unroutable.
        self.returned_count = 0
        #: Publishes without confirm the broker nacked.
        self.nacked_count = 0
        #: Successful reconnects so far.
        self.reconnects = 0
        #: Called (in the connection's task, must not block) when the link breaks
        #: and the connection starts reconnecting.
        self.on_disconnect = on_disconnect
        #: Called once the connection is back, topology and consumers restored.
        self.on_reconnect = on_reconnect
        #: Called (in the connection's task, must not block) with the reason when
        #: the server blocks this connection's publishes (an alarm; see :attr:`blocked`).
        self.on_blocked: Callable[[str], object] | None = None
        #: Called when the server unblocks it.
        self.on_unblocked: Callable[[], object] | None = None
        self._blocked_reason = ""
        self._blocked = False
        self._unblocked = trio.Event()
        self._unblocked.set()
        self._reconnector: Reconnector | None = None
        if self.reconnect_policy is not None and dialer is not None:
            parts = ConnectionParts(
                settler=self._settler,
                requests=self._requests,
                confirms=self._confirms,
                consumers=self._consumers,
                topology=self._topology,
                attach=self._attach,
                fire=self._fire,
                finish=self._end,
            )
            self._reconnector = Reconnector(self, parts, self.reconnect_policy, dialer)
        self._attach(dialed)

    def __repr__(self) -> str:
        return f"<amqlite.Connection to {self.address} ({self.server_name}, {self._state.value})>"

    # --- facts about the connection --------------------------------------------------

    @property
    def is_open(self) -> bool:
        """True until the connection is closed or gives up (also while reconnecting)."""
        return self._state is LinkState.OPEN or self._state is LinkState.RECONNECTING

    @property
    def connected(self) -> bool:
        """True while a link is up and usable (False while reconnecting)."""
        return self._state is LinkState.OPEN

    @property
    def state(self) -> str:
        """``open``, ``reconnecting``, ``closing`` or ``closed``."""
        return self._state.value

    @property
    def server_name(self) -> str:
        return self.welcome.server

    @property
    def server_state(self) -> str:
        """The node's state from the welcome: ``standalone``, ``active``..."""
        return self.welcome.state

    @property
    def cluster(self) -> list[str]:
        """Addresses of the cluster's nodes, as the server announced them."""
        return list(self.welcome.cluster)

    @property
    def consumers(self) -> list[Consumer]:
        return [c for c in self._consumers.values() if c.active]

    @property
    def blocked(self) -> bool:
        """True while the server has blocked this connection (a memory or disk alarm,
        docs/protocol.md "Alarms"): publishes wait until it unblocks us; other calls
        go on. A new link (after a reconnect) starts unblocked."""
        return self._blocked

    @property
    def blocked_reason(self) -> str:
        """Why the server blocked us (``"low on memory"``, ``"low on disk"``), or ``""``."""
        return self._blocked_reason

    @property
    def _closed(self) -> AmqliteError | None:
        """Why the connection ended (None while it has not)."""
        return self._settler.closed

    @property
    def unconfirmed(self) -> int:
        """Confirmed publishes sent and not answered yet."""
        return len(self._confirms)

    # --- plumbing -----------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Connection]:
        """Run the connection's tasks for the block, then close it (what
        :func:`connect` does; not for the application). Raises the body's
        exception, else a failure nothing has reported yet."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._transport.run)
                if self._reconnector is not None:
                    nursery.start_soon(self._reconnector.run)
                try:
                    yield self
                finally:
                    with trio.CancelScope(shield=True):
                        await self.aclose()
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # our tasks never raise, so this is the body's one exception: unwrap it
            if len(group.exceptions) != 1:
                raise
            exc = group.exceptions[0]
            raise exc from exc.__cause__
        self._raise_unreported()

    def _attach(self, dialed: Dialed) -> Transport:
        """Make ``dialed`` the current link (of the settler's generation) and start it."""
        settler = self._settler
        gen = settler.gen
        self.address: Address = dialed.address
        self.welcome: ev.Welcome = dialed.welcome
        self.max_frame: int = dialed.welcome.max_frame or DEFAULT_MAX_FRAME
        link: FramedLink = dialed.link
        self._link = settler.link = link
        self._proto = link.proto
        self._close_done = trio.Event()  # this link's close handshake
        self._set_unblocked(quiet=True)  # a new link is not blocked

        def on_events(events: list[ev.Event | DeliverMap | DeliverRun | OkRun]) -> None:
            if settler.gen == gen:
                self._on_events(events)

        def on_lost(exc: AmqliteError) -> None:
            if settler.gen == gen:
                self._on_lost(exc)

        def before_flush() -> None:
            if settler.gen == gen:
                settler.emit_acks()

        link.remote_address = str(dialed.address)
        link.high_water = HIGH_WATER
        link.before_flush = before_flush
        link.on_lost = on_lost
        link.start_heartbeat(dialed.welcome.heartbeat)
        t = self._transport = Transport(link, on_events)
        if self._nursery is not None:
            self._nursery.start_soon(t.run)
        return t

    def _fire(self, event: LinkEvent) -> None:
        self._state = next_state(self._state, event)
        self._ready = self._state is LinkState.OPEN

    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1
        return rid

    def _new_ids(self, n: int) -> int:
        """``n`` consecutive request ids (a ``publish.batch``); the first."""
        rid = self._next_id
        self._next_id = rid + max(1, n)
        return rid

    @property
    def _receive_limit(self) -> int:
        """The largest frame this end takes."""
        return int(self._proto.max_frame_size)

    def _check_open(self) -> None:
        """Raise when the connection is closed or closing (not while reconnecting)."""
        if self._closed is not None:
            raise self._closed
        if self._state is LinkState.CLOSING:
            raise ConnectionClosed("the connection is closing")

    async def _wait_ready(self) -> None:
        """Return once a link is up (at once when it is); raise when there will be none."""
        while True:
            state = self._state
            if state is LinkState.OPEN:
                return
            if state is LinkState.RECONNECTING and self._reconnector is not None:
                await self._reconnector.restored.wait()
            else:
                self._check_open()
                raise ConnectionClosed("the connection is closed")  # pragma: no cover

    def _raise_unreported(self) -> None:
        err = self._unreported
        if err is not None:
            self._unreported = None
            raise err

    def _send(self, event: ev.Event) -> None:
        """Queue a control frame; acks marked before it go first (wire order = call order)."""
        self._settler.send(event)

    async def _call(self, event: Any, hook: ReplyHook | None = None) -> ev.Event:
        """Send request ``event`` (its ``id`` fresh from _new_id) and await the reply.

        While reconnecting this waits for the new link; a request in flight when the
        link breaks is sent again on the next one."""
        if not self._ready:
            await self._wait_ready()
        pending = PendingReply(hook, event)
        self._requests[event.id] = pending
        self._send(event)
        try:
            return await pending.wait()
        except trio.Cancelled:
            pending.abandoned = True
            raise

    async def _call_nowait(self, event: Any) -> PendingReply:
        """:meth:`_call` without waiting for the reply: the pending reply (sent
        again after a reconnect, like any request)."""
        if not self._ready:
            await self._wait_ready()
        pending = PendingReply(None, event)
        self._requests[event.id] = pending
        self._send(event)
        return pending

    # --- the reader's side ----------------------------------------------------------

    def _on_events(self, events: list[ev.Event | DeliverMap | DeliverRun | OkRun]) -> None:
        consumer_for = self._consumers.get  # bound once: a dict subclass looks up slower
        settler = self._settler
        delivered = settler.acks.delivered
        confirm = self._confirms.confirm
        confirm_run = self._confirms.confirm_run
        base = settler.tag_base
        last = 0  # the server's highest tag in this batch (tags only increase)
        for e in events:
            t = type(e)
            if t is DeliverRun:  # plain deliveries in a row (the per-message path)
                assert isinstance(e, DeliverRun)
                tags = e.dtags
                last = tags[-1]
                if base:
                    tags = [d + base for d in tags]
                c = consumer_for(e.ctag)
                if c is None or not c.active:
                    for dtag in tags:
                        self._stray(e.ctag, dtag, c)
                    continue
                if not c.no_ack:
                    settler.acks.delivered_many(tags)
                c.push_run(tags, e.bodies, (e.exchange, e.key, e.props))
            elif t is OkRun:  # bare oks in a row: a publisher's confirms, mostly
                assert isinstance(e, OkRun)
                res = e.res
                i = confirm_run(res)
                while i < len(res):  # an ok that is no confirm: a request's reply
                    if last:
                        settler.last_dtag = last
                        last = 0
                    gen = settler.gen
                    self._on_control(ev.Ok(res[i], EMPTY))
                    if settler.gen != gen:  # (as below)
                        return
                    i = confirm_run(res, i + 1)
            elif t is dict:  # a deliver map in its usual shape
                assert isinstance(e, dict)
                last = e["dtag"]
                dtag = last + base
                c = consumer_for(e["ctag"])
                if c is None or not c.active:
                    self._stray(e["ctag"], dtag, c)
                    continue
                no_ack = c.no_ack
                if not no_ack:
                    delivered(dtag)
                c.push_map(e, dtag)  # (its PlainDelivery built when handed out)
            elif t is ev.Deliver:  # one with headers, properties, an offset, ...
                assert isinstance(e, ev.Deliver)
                last = e.dtag
                dtag = last + base
                c = consumer_for(e.ctag)
                if c is None or not c.active:
                    self._stray(e.ctag, dtag, c)
                    continue
                no_ack = c.no_ack
                if not no_ack:
                    delivered(dtag)
                c.push(Delivery(settler, e, dtag, c.tag, c.queue, no_ack))
            elif t is ev.Ok and confirm(e.re):  # type: ignore[union-attr]
                continue  # a publish confirmed
            else:
                assert not isinstance(e, (dict, DeliverRun, OkRun))
                if last:
                    settler.last_dtag = last
                    last = 0
                gen = settler.gen
                self._on_control(e)
                if settler.gen != gen:  # that frame ended the link: the rest is void
                    return
        if last:
            settler.last_dtag = last

    def _on_control(self, e: ev.Event) -> None:
        t = type(e)
        if t in _REPLY_TYPES:
            rid = e.re  # type: ignore[attr-defined]
            if rid is not None:
                if self._confirms.resolve(rid, e):
                    return
                req = self._requests.pop(rid, None)
                if req is not None:
                    req.resolve(e)
                    return
            self._unmatched(e)
        elif t is ev.Heartbeat or t is ev.EndOfStream:
            pass
        elif t is ev.Cancelled:
            assert isinstance(e, ev.Cancelled)
            c = self._consumers.pop(e.tag, None)
            if c is not None:
                code = e.code or ReplyCode.NOT_FOUND
                text = e.text or f"consumer {e.tag!r} was cancelled by the server"
                c.finish(error_for(code, text), drop_buffer=False)
        elif t is ev.Blocked:
            assert isinstance(e, ev.Blocked)
            self._set_blocked(e.reason or "blocked by the server")
        elif t is ev.Unblocked:
            self._set_unblocked(quiet=False)
        elif t is ev.Close:
            assert isinstance(e, ev.Close)
            self._on_server_close(e)
        elif t is ev.CloseOk:
            self._close_done.set()
        else:
            log.warning("client_unexpected_frame", method=e.METHOD)

    def _set_blocked(self, reason: str) -> None:
        self._blocked_reason = reason
        if self._blocked:
            return
        self._blocked = True
        self._unblocked = trio.Event()
        log.warning("client_blocked", server=str(self.address), reason=reason)
        callback = self.on_blocked
        if callback is not None:
            try:
                callback(reason)
            except Exception:
                log.exception("client_callback_failed", callback=repr(callback))

    def _set_unblocked(self, *, quiet: bool) -> None:
        """Publishes may go again (the server said so, a new link, or the end)."""
        was = self._blocked
        self._blocked = False
        self._blocked_reason = ""
        self._unblocked.set()
        if was and not quiet:
            log.info("client_unblocked", server=str(self.address))
            callback = self.on_unblocked
            if callback is not None:
                try:
                    callback()
                except Exception:
                    log.exception("client_callback_failed", callback=repr(callback))

    def _stray(self, ctag: str, dtag: int, c: Consumer | None) -> None:
        """A delivery for a consumer we cancelled: give it back to the queue."""
        if c is not None and not c.no_ack and self.is_open:
            self._settler.acks.delivered(dtag)
            held = self._requeue_after_cancel.get(c.tag)
            if held is not None:  # cancelling: given back, in order, after the ok
                held.append(dtag)
            else:
                self._settler.settle(dtag, requeue=True, reject=False)
        elif c is None and ctag not in self._consumers.cancelled:
            log.warning("client_delivery_for_unknown_consumer", ctag=ctag)

    def _unmatched(self, e: ev.Event) -> None:
        """A reply nobody waits for: the failure of a publish or ack sent earlier."""
        t = type(e)
        if t is ev.Error:
            assert isinstance(e, ev.Error)
            err = error_for(e.code, e.text)
            if self._unreported is None:
                self._unreported = err
        elif t is ev.Returned:
            self.returned_count += 1
        elif t is ev.Nacked:
            self.nacked_count += 1

    def _on_server_close(self, e: ev.Close) -> None:
        link = self._link
        if self._closed is None:
            with suppress(AmqliteError):  # both sides closing at once is fine
                link.send(ev.CloseOk())
        if e.code == ReplyCode.CONNECTION_FORCED:
            text = f"the server closed the connection: {e.text or 'shutting down'}"
        else:
            text = f"the server closed the connection: {e.code} {code_name(e.code)}: {e.text}"
        err = ConnectionClosed(text, e.code or ReplyCode.CONNECTION_FORCED)
        self._link_lost(err, recoverable=e.code in _RECOVERABLE_CLOSE)
        self._close_done.set()
        link.close()  # after the close-ok

    def _on_lost(self, exc: AmqliteError) -> None:
        self._link_lost(exc, recoverable=True)
        self._close_done.set()

    def _link_lost(self, exc: AmqliteError, *, recoverable: bool) -> None:
        """The current link is gone: reconnect (policy and a recoverable cause) or end."""
        state = self._state
        if state is LinkState.CLOSED:
            return
        if state is LinkState.CLOSING:
            self._finish(exc, ours=True)
        elif recoverable and self._reconnector is not None:
            self._reconnector.suspend(exc)
        else:
            self._finish(exc, ours=False)

    def _end(self, exc: AmqliteError) -> None:
        """End the connection for a cause of the remote's (the reconnector's finish)."""
        self._finish(exc, ours=False)

    def _finish(self, exc: AmqliteError, *, ours: bool) -> None:
        """Fail everything still waiting; end consumers (quietly when we closed)."""
        if self._state is LinkState.CLOSED:
            return
        self._fire(LinkEvent.ENDED)
        self._settler.closed = exc
        self._requests.fail_all(exc)
        self._confirms.fail_all(exc)
        self._consumers.finish_all(None if ours else exc)
        self._settler.acks.forget()
        self._close_done.set()
        self._set_unblocked(quiet=True)  # blocked publishes raise now
        if self._reconnector is not None:
            self._reconnector.stop()

    # --- acks ---------------------------------------------------------------------------

    async def ack(self, delivery_tag: int, *, multiple: bool = False) -> None:
        """Acknowledge by tag (with ``multiple``, every delivery up to it). Coalesced.

        A tag received before a reconnect is ignored (see :attr:`Delivery.stale`)."""
        self._check_open()
        self._settler.ack(delivery_tag, multiple)

    async def nack(
        self, delivery_tag: int, *, multiple: bool = False, requeue: bool = True
    ) -> None:
        self._check_open()
        self._settler.settle(delivery_tag, requeue=requeue, reject=False, multiple=multiple)

    async def reject(self, delivery_tag: int, *, requeue: bool = True) -> None:
        self._check_open()
        self._settler.settle(delivery_tag, requeue=requeue, reject=True)

    # --- publishing ---------------------------------------------------------------------

    def _queue_publish(
        self,
        rid: int,
        exchange: str,
        routing_key: str,
        body: bytes | str,
        headers: dict[str, Any] | None,
        properties: dict[str, Any] | None,
        persistent: bool,
        mandatory: bool,
        confirm: bool,
    ) -> bytes:
        """Queue one publish frame on the link; returns the frame."""
        if type(body) is not bytes:
            body = body.encode() if isinstance(body, str) else bytes(body)
        if headers and (why := check_headers(headers)) is not None:
            raise ValueError(f"publish headers: {why}")
        if persistent and not properties:
            # the usual persistent publish: one shared, valid map instead of a new dict
            # checked per message (codec.encode_publish only reads it)
            properties = _PERSISTENT_ONLY
        else:
            if persistent:
                properties = {**(properties or {}), "persistent": True}
            if properties and (why := check_props(properties)) is not None:
                raise ValueError(f"publish properties: {why}")
        frame = self._proto.send_publish(
            rid, exchange, routing_key, body, headers, properties, mandatory, confirm
        )
        if len(frame) - 4 > self.max_frame:
            raise BrokerError(
                f"message of {len(body)} bytes is too large: the server takes frames of "
                f"at most {self.max_frame} bytes",
                ReplyCode.CONTENT_TOO_LARGE,
            )
        link = self._link
        link.out += frame
        if not link.kicked:
            link.kick()
        return frame

    async def _before_publish(self) -> None:
        """The slow path of the publish calls: wait while the server blocks us, wait
        out a reconnect, raise a closed connection or a failure nothing has
        reported yet."""
        while self._blocked:
            await self._unblocked.wait()
        await self._wait_ready()
        self._raise_unreported()

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | str,
        *,
        headers: dict[str, Any] | None = None,
        properties: dict[str, Any] | None = None,
        persistent: bool = False,
        mandatory: bool = False,
        confirm: bool = False,
    ) -> None:
        """Publish one message.

        Without ``confirm`` this returns once the message is queued for sending (it
        waits only when too much is unsent); a failure surfaces later. With
        ``confirm`` it waits for the broker and raises PublishReturned (312,
        mandatory and unroutable), PublishNacked, or the broker's error.

        While reconnecting this waits for the new link. A confirmed publish not
        confirmed when a link breaks is sent again on the next one, under the same
        publish key, so the broker (or the HA peer that took over) routes it once
        even if it held it already; one without ``confirm`` still in flight when a
        link breaks may be lost.
        """
        if confirm:
            pending = await self.publish_nowait(
                exchange,
                routing_key,
                body,
                headers=headers,
                properties=properties,
                persistent=persistent,
                mandatory=mandatory,
            )
            await pending.wait()
            return
        if not self._ready or self._unreported is not None or self._blocked:
            await self._before_publish()
        rid = self._next_id
        self._next_id = rid + 1
        link = self._link
        # a plain publish (bytes, no headers, properties, persistent or mandatory)
        # goes straight into the link's buffer: the bench's and the usual transient
        # send, per message; anything else, or a frame append_plain_publish leaves
        # (not OPEN, too large), takes _queue_publish, which checks and raises
        # a grouped publish (properties alone, one small valid entry) likewise,
        # through append_props_publish
        if (
            headers
            or persistent
            or mandatory
            or type(body) is not bytes
            or not (
                self._proto.append_props_publish(
                    link.out, rid, exchange, routing_key, body, properties, self.max_frame
                )
                if properties
                else self._proto.append_plain_publish(
                    link.out, rid, exchange, routing_key, body, self.max_frame
                )
            )
        ):
            self._queue_publish(
                rid, exchange, routing_key, body, headers, properties, persistent, mandatory, False
            )
        elif not link.kicked:
            link.kick()
        n = self._published = self._published + 1
        if len(link.out) >= HIGH_WATER:
            await link.wait_writable()
        elif n % PUBLISH_BATCH == 0:
            await trio.lowlevel.checkpoint()

    async def publish_nowait(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | str,
        *,
        headers: dict[str, Any] | None = None,
        properties: dict[str, Any] | None = None,
        persistent: bool = False,
        mandatory: bool = False,
    ) -> PendingConfirm:
        """Publish with ``confirm`` and return without waiting for the broker.

        Blocks only while ``max_in_flight`` confirms are outstanding (or while
        reconnecting). ``await pending.wait()`` raises like :meth:`publish`; across a
        reconnect it waits for the confirm of the new server.
        """
        confirms = self._confirms
        while True:
            if not self._ready or self._unreported is not None or self._blocked:
                await self._before_publish()
            if len(confirms.outstanding) < confirms.limit:
                break
            await confirms.wait_for_room()
        rid = self._next_id
        self._next_id = rid + 1
        # a confirmed publish without headers or properties (but persistent) is encoded
        # from remembered pieces (the persistent bench's per-message send); anything
        # else, or a frame that fast path leaves (not OPEN, too large), takes
        # _queue_publish, which checks and raises
        if (
            headers
            or properties
            or mandatory
            or type(body) is not bytes
            or (
                frame := self._proto.encode_confirm_publish(
                    rid, exchange, routing_key, body, persistent, self.max_frame
                )
            )
            is None
        ):
            frame = self._queue_publish(
                rid, exchange, routing_key, body, headers, properties, persistent, mandatory, True
            )
        else:
            link = self._link
            link.out += frame
            if not link.kicked:
                link.kick()
        # the frame is kept to be sent again after a reconnect
        pending = PendingConfirm(rid, frame if self.reconnect_policy is not None else None)
        confirms.outstanding[rid] = pending
        n = self._published = self._published + 1
        if len(self._link.out) >= HIGH_WATER:
            await self._link.wait_writable()
        elif n % PUBLISH_BATCH == 0:
            await trio.lowlevel.checkpoint()
        return pending

    async def wait_for_confirms(self) -> None:
        """Wait until every confirmed publish is settled (across reconnects); raise
        the first failure not already raised by its ``PendingConfirm.wait()``."""
        await self._link.wait_flushed()
        await self._confirms.wait_all()
        self._raise_unreported()

    # --- consuming ----------------------------------------------------------------------

    async def consume(
        self,
        queue: str,
        *,
        prefetch: int = 100,
        no_ack: bool = False,
        exclusive: bool = False,
        tag: str = "",
        arguments: dict[str, Any] | None = None,
        offset: StreamOffset | None = None,
        selector: str = "",
    ) -> Consumer:
        """Subscribe to ``queue``; iterate the returned :class:`Consumer`.

        ``selector`` (a JMS message selector, docs/selectors.md) limits the
        consumer to the messages it selects, e.g. ``"priority > 4 AND region =
        'eu'"``; the server refuses a bad one with 406 (PreconditionFailed) naming
        the position and the reason. It is kept for resuming after a reconnect.

        ``offset`` (stream queues) says where to start: ``"first"``, ``"last"``,
        ``"next"`` (the server's default), an offset, a Unix time (float), a
        datetime or ISO-8601 text (no zone: UTC). It sets the argument
        ``x-stream-offset``, which ``arguments`` may then not set too.
        """
        args = dict(arguments or {})
        if offset is not None:
            if OFFSET_ARGUMENT in args:
                raise ValueError(f"give either offset or arguments[{OFFSET_ARGUMENT!r}]")
            args[OFFSET_ARGUMENT] = offset_argument(offset)
        consumer = Consumer(
            self,
            self._cancel_consumer,
            queue,
            tag=tag,
            prefetch=prefetch,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=dict(args),  # its own: it follows a stream's deliveries
            selector=selector,
            settler=self._settler,
        )
        req = ev.Consume(self._new_id(), queue, tag, prefetch, no_ack, exclusive, args, selector)
        pending: PendingReply | None = None

        def registered(reply: ev.Event) -> None:
            if not isinstance(reply, ev.Ok):
                return
            consumer.tag = str(reply.info.get("tag", tag))
            self._consumers[consumer.tag] = consumer
            if pending is not None and pending.abandoned:  # the caller gave up waiting
                consumer.finish(None, drop_buffer=True)
                self._send_cancel(consumer)

        if not self._ready:
            await self._wait_ready()
        pending = PendingReply(registered, req)
        self._requests[req.id] = pending
        self._send(req)
        try:
            await pending.wait()
        except trio.Cancelled:
            pending.abandoned = True
            raise
        return consumer

    def _send_cancel(self, consumer: Consumer) -> PendingReply:
        tag = consumer.tag

        def gone(reply: ev.Event) -> None:
            if self._consumers.get(tag) is consumer:
                del self._consumers[tag]
                self._consumers.note_cancelled(tag)

        rid = self._new_id()
        request = ev.Cancel(rid, tag)
        pending = PendingReply(gone, request)
        self._requests[rid] = pending
        self._send(request)
        return pending

    async def _cancel_consumer(self, consumer: Consumer) -> None:
        if not consumer.active:
            return
        self._check_open()
        dropped = consumer.finish(None, drop_buffer=True)
        queue = consumer.queue
        if not any(c.queue == queue and c.active for c in self._consumers.values()):
            self._topology.queue_auto_deleted(queue)
        if self._state is LinkState.RECONNECTING:
            return  # nothing to tell a dead link; the restore cancels or skips it
        # Give back what the application never saw once the server has stopped
        # pushing, newest first: each nack requeues at the head of the queue, so the
        # queue gets them back in their original order (and not to this consumer).
        held = self._requeue_after_cancel[consumer.tag] = (
            [] if consumer.no_ack else [d.delivery_tag for d in dropped]
        )
        try:
            await self._send_cancel(consumer).wait()
        finally:
            self._requeue_after_cancel.pop(consumer.tag, None)
            if self.is_open and self.connected:
                for dtag in sorted(held, reverse=True):
                    self._settler.settle(dtag, requeue=True, reject=False)

    async def get(self, queue: str, *, no_ack: bool = False) -> Delivery | None:
        """One message from ``queue``, or None when it is empty."""

        tags: list[int] = []
        settler = self._settler

        def track(reply: ev.Event) -> None:
            if type(reply) is ev.GetOk:
                assert isinstance(reply, ev.GetOk)
                settler.last_dtag = reply.dtag
                tags.append(reply.dtag + settler.tag_base)  # the tag space of this link
                if not no_ack:
                    settler.acks.delivered(tags[-1])

        reply = await self._call(ev.Get(self._new_id(), queue, no_ack), track)
        if not isinstance(reply, ev.GetOk):
            return None
        queue = reply.queue or queue
        event = ev.Deliver(
            "",
            reply.dtag,
            reply.exchange,
            reply.key,
            reply.body,
            reply.headers,
            reply.props,
            reply.redelivered,
            queue,
        )
        return Delivery(settler, event, tags[-1], "", queue, no_ack)

    # --- closing --------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close politely: send ``close``, wait (at most ``close_timeout``) for
        ``close-ok``, then close the stream. Pending calls raise ConnectionClosed;
        consumers stop iterating. While reconnecting this stops reconnecting."""
        closed = ConnectionClosed("the connection was closed by the client")
        state = self._state
        if state is LinkState.OPEN or state is LinkState.RECONNECTING:
            self._fire(LinkEvent.CLOSE)
            if self._reconnector is not None:
                self._reconnector.stop()
            # a link being restored is closed politely too: acks made meanwhile count
            if not self._link.dead and self._proto.state is ConnState.OPEN:
                with trio.move_on_after(self.close_timeout):
                    self._settler.emit_acks()
                    with suppress(AmqliteError):
                        self._send(ev.Close(code=200, text="client closing"))
                    await self._close_done.wait()
            self._finish(closed, ours=True)
        with trio.move_on_after(self.close_timeout):
            await self._link.wait_flushed()  # e.g. our close-ok to the server's close
        await self._link.aclose()

    close = aclose
