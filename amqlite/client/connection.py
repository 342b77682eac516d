"""The client connection: requests and replies, publishing, consuming, closing.

Requests carry an ``id`` and wait for the reply with that ``re``. Publishes
without ``confirm`` and acks get no reply unless they fail; such a failure (an
``error`` whose ``re`` is nobody's request) is kept and raised by the next
publish or ``wait_for_confirms``, or when the connection's context exits.
"""

from __future__ import annotations

import logging
from contextlib import suppress
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
from amqlite.protocol import DEFAULT_MAX_FRAME, check_headers, check_props
from amqlite.protocol import codec as wire
from amqlite.protocol import events as ev

from .acks import AckCoalescer
from .addresses import Address
from .consumer import Consumer
from .declarations import Declarations
from .delivery import Delivery
from .dial import HELLO_ID, Dialed
from .framing import Item
from .publisher import ConfirmWindow, PendingConfirm
from .replies import PendingReply, ReplyHook
from .transport import HIGH_WATER, Transport

log = logging.getLogger("amqlite.client")

#: Publishes between two scheduler checkpoints (lets the writer and reader run).
PUBLISH_BATCH = 64

_REPLY_TYPES = (ev.Ok, ev.Error, ev.Returned, ev.Nacked, ev.GetOk, ev.GetEmpty)


class Connection(Declarations):
    """An open connection to one broker. Make one with :func:`connect`."""

    def __init__(self, dialed: Dialed, *, max_in_flight: int, close_timeout: float) -> None:
        self.address: Address = dialed.address
        self.welcome: ev.Welcome = dialed.welcome
        self.max_frame: int = dialed.welcome.max_frame or DEFAULT_MAX_FRAME
        self.close_timeout = close_timeout
        self._proto = dialed.proto
        self._transport = Transport(
            dialed.stream,
            dialed.proto,
            heartbeat=dialed.welcome.heartbeat,
            on_events=self._on_events,
            on_lost=self._on_lost,
            before_flush=self._emit_acks,
            peer=str(dialed.address),
        )
        self._next_id = HELLO_ID + 1
        self._requests: dict[int, PendingReply] = {}
        self._confirms = ConfirmWindow(max_in_flight)
        self._consumers: dict[str, Consumer] = {}
        self._acks = AckCoalescer()
        self._ack_marks = self._acks.marks
        # what we declared, in order: a reconnect after failover replays it
        self._topology: list[ev.Event] = []
        self._unreported: AmqliteError | None = None
        self._closing = False
        self._closed: AmqliteError | None = None
        self._close_done = trio.Event()
        self._published = 0
        #: Mandatory publishes without confirm that came back unroutable.
        self.returned_count = 0
        #: Publishes without confirm the broker nacked.
        self.nacked_count = 0

    def __repr__(self) -> str:
        state = "open" if self.is_open else "closed"
        return f"<amqlite.Connection to {self.address} ({self.server_name}, {state})>"

    # --- facts about the connection --------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._closed is None and not self._closing

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
    def unconfirmed(self) -> int:
        """Confirmed publishes sent and not answered yet."""
        return len(self._confirms)

    # --- plumbing -----------------------------------------------------------------------

    def _start(self, nursery: trio.Nursery) -> None:
        self._transport.start(nursery)

    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1
        return rid

    def _check_open(self) -> None:
        if self._closed is not None:
            raise self._closed
        if self._closing:
            raise ConnectionClosed("the connection is closing")

    def _raise_unreported(self) -> None:
        err = self._unreported
        if err is not None:
            self._unreported = None
            raise err

    def _send(self, event: ev.Event) -> None:
        """Queue a control frame; acks marked before it go first (wire order = call order)."""
        if self._acks.pending:
            self._emit_acks()
        self._transport.write(self._proto.send(event))

    async def _call(self, event: Any, hook: ReplyHook | None = None) -> ev.Event:
        """Send request ``event`` (its ``id`` fresh from _new_id) and await the reply."""
        self._check_open()
        pending = PendingReply(hook)
        self._requests[event.id] = pending
        self._send(event)
        try:
            return await pending.wait()
        except trio.Cancelled:
            pending.abandoned = True
            raise

    # --- the reader's side ----------------------------------------------------------

    def _on_events(self, events: list[Item]) -> None:
        consumers = self._consumers
        delivered = self._acks.delivered
        confirm = self._confirms.confirm
        for e in events:
            if type(e) is dict:  # a checked deliver map (see framing)
                c = consumers.get(e["ctag"])
                if c is None or c._ended:
                    self._stray(e, c)
                    continue
                no_ack = c.no_ack
                dtag = e["dtag"]
                if not no_ack:
                    delivered(dtag)
                c._push(Delivery(self, e, dtag, c.tag, c.queue, no_ack))
            elif type(e) is int:  # a bare ok: a confirm, or a request without info
                if not confirm(e):
                    self._on_control(ev.Ok(e))
            elif type(e) is ev.Deliver:
                assert isinstance(e, ev.Deliver)
                self._on_events([_deliver_map(e)])
            else:
                assert isinstance(e, ev.Event)
                self._on_control(e)

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
                c._finish(error_for(code, text), drop_buffer=False)
        elif t is ev.Close:
            assert isinstance(e, ev.Close)
            self._on_server_close(e)
        elif t is ev.CloseOk:
            self._close_done.set()
        else:
            log.warning("unexpected_frame method=%s", e.METHOD)

    def _stray(self, e: dict[str, Any], c: Consumer | None) -> None:
        """A delivery for a consumer we cancelled: give it back to the queue."""
        if c is not None and not c.no_ack and self._closed is None and not self._closing:
            self._acks.delivered(e["dtag"])
            self._settle(e["dtag"], requeue=True, reject=False)
        elif c is None:
            log.warning("delivery_for_unknown_consumer ctag=%r", e["ctag"])

    def _unmatched(self, e: ev.Event) -> None:
        """A reply nobody waits for: the failure of a publish or ack sent earlier."""
        t = type(e)
        if t is ev.Error:
            assert isinstance(e, ev.Error)
            err = error_for(e.code, e.text)
            log.debug("unmatched_error re=%s error=%s", e.re, err)
            if self._unreported is None:
                self._unreported = err
        elif t is ev.Returned:
            self.returned_count += 1
        elif t is ev.Nacked:
            self.nacked_count += 1

    def _on_server_close(self, e: ev.Close) -> None:
        if self._closed is None:
            with suppress(AmqliteError):  # both sides closing at once is fine
                self._send(ev.CloseOk())
        if e.code == ReplyCode.CONNECTION_FORCED:
            text = f"the server closed the connection: {e.text or 'shutting down'}"
        else:
            text = f"the server closed the connection: {e.code} {code_name(e.code)}: {e.text}"
        self._finish(ConnectionClosed(text, e.code or ReplyCode.CONNECTION_FORCED), ours=False)
        self._close_done.set()
        self._transport.shutdown_after_flush()

    def _on_lost(self, exc: AmqliteError) -> None:
        self._finish(exc, ours=self._closing)
        self._close_done.set()

    def _finish(self, exc: AmqliteError, *, ours: bool) -> None:
        """Fail everything still waiting; end consumers (quietly when we closed)."""
        if self._closed is not None:
            return
        self._closed = exc
        requests, self._requests = self._requests, {}
        for req in requests.values():
            req.fail(exc)
        self._confirms.fail_all(exc)
        for c in self._consumers.values():
            c._finish(None if ours else exc, drop_buffer=True)
        self._acks.forget()

    # --- acks ---------------------------------------------------------------------------

    def _emit_acks(self) -> None:
        """Turn marked acks into frames (the writer calls this before each flush)."""
        if not self._acks.pending:
            return
        out = self._transport.out
        for dtag, multiple in self._acks.take():
            wire.append_ack(out, self._new_id(), dtag, multiple)

    def _ack_one(self, dtag: int) -> None:
        """Mark an unsettled delivery's tag for the next coalesced ack."""
        if self._closed is not None:
            raise self._closed
        self._ack_marks.add(dtag)
        t = self._transport
        if not t.kicked:
            t.kick()

    def _settle(self, dtag: int, *, requeue: bool, reject: bool, multiple: bool = False) -> None:
        if self._closed is not None:
            raise self._closed
        self._emit_acks()  # earlier acks first: a nack must not overtake them
        rid = self._new_id()
        if reject:
            self._send(ev.Reject(rid, dtag, requeue))
        else:
            self._send(ev.Nack(rid, dtag, multiple, requeue))
        self._acks.settle(dtag, multiple)

    async def ack(self, delivery_tag: int, *, multiple: bool = False) -> None:
        """Acknowledge by tag (with ``multiple``, every delivery up to it). Coalesced."""
        self._check_open()
        self._acks.ack(delivery_tag, multiple)
        self._transport.kick()

    async def nack(
        self, delivery_tag: int, *, multiple: bool = False, requeue: bool = True
    ) -> None:
        self._check_open()
        self._settle(delivery_tag, requeue=requeue, reject=False, multiple=multiple)

    async def reject(self, delivery_tag: int, *, requeue: bool = True) -> None:
        self._check_open()
        self._settle(delivery_tag, requeue=requeue, reject=True)

    # --- publishing ---------------------------------------------------------------------

    def _append_publish(
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
    ) -> None:
        if type(body) is not bytes:
            body = body.encode() if isinstance(body, str) else bytes(body)
        if persistent:
            properties = {**(properties or {}), "persistent": True}
        if headers and (why := check_headers(headers)) is not None:
            raise ValueError(f"publish headers: {why}")
        if properties and (why := check_props(properties)) is not None:
            raise ValueError(f"publish properties: {why}")
        out = self._transport.out
        start = len(out)
        size = wire.append_publish(
            out, rid, exchange, routing_key, body, headers, properties, mandatory, confirm
        )
        if size > self.max_frame:
            del out[start:]
            raise BrokerError(
                f"message of {len(body)} bytes is too large: the server takes frames of "
                f"at most {self.max_frame} bytes",
                ReplyCode.CONTENT_TOO_LARGE,
            )
        t = self._transport
        if not t.kicked:
            t.kick()

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
        if self._closed is not None or self._closing or self._unreported is not None:
            self._check_open()
            self._raise_unreported()
        rid = self._next_id
        self._next_id = rid + 1
        self._append_publish(
            rid, exchange, routing_key, body, headers, properties, persistent, mandatory, False
        )
        n = self._published = self._published + 1
        if len(self._transport.out) >= HIGH_WATER:
            await self._transport.wait_writable()
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

        Blocks only while ``max_in_flight`` confirms are outstanding. ``await
        pending.wait()`` raises like :meth:`publish`.
        """
        if self._closed is not None or self._closing or self._unreported is not None:
            self._check_open()
            self._raise_unreported()
        confirms = self._confirms
        if len(confirms.outstanding) >= confirms.limit:
            await confirms.wait_for_room()
            self._check_open()
        rid = self._next_id
        self._next_id = rid + 1
        self._append_publish(
            rid, exchange, routing_key, body, headers, properties, persistent, mandatory, True
        )
        pending = PendingConfirm(rid)
        self._confirms.outstanding[rid] = pending
        n = self._published = self._published + 1
        if len(self._transport.out) >= HIGH_WATER:
            await self._transport.wait_writable()
        elif n % PUBLISH_BATCH == 0:
            await trio.lowlevel.checkpoint()
        return pending

    async def wait_for_confirms(self) -> None:
        """Wait until every confirmed publish is settled; raise the first failure
        not already raised by its ``PendingConfirm.wait()``."""
        await self._transport.wait_flushed()
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
    ) -> Consumer:
        """Subscribe to ``queue``; iterate the returned :class:`Consumer`."""
        args = dict(arguments or {})
        consumer = Consumer(
            self,
            queue,
            tag=tag,
            prefetch=prefetch,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=args,
        )
        req = ev.Consume(self._new_id(), queue, tag, prefetch, no_ack, exclusive, args)
        pending: PendingReply | None = None

        def registered(reply: ev.Event) -> None:
            if not isinstance(reply, ev.Ok):
                return
            consumer.tag = str(reply.info.get("tag", tag))
            self._consumers[consumer.tag] = consumer
            if pending is not None and pending.abandoned:  # the caller gave up waiting
                consumer._finish(None, drop_buffer=True)
                self._send_cancel(consumer)

        self._check_open()
        pending = PendingReply(registered)
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

        rid = self._new_id()
        pending = PendingReply(gone)
        self._requests[rid] = pending
        self._send(ev.Cancel(rid, tag))
        return pending

    async def _cancel_consumer(self, consumer: Consumer) -> None:
        if not consumer.active:
            return
        self._check_open()
        dropped = consumer._finish(None, drop_buffer=True)
        if not consumer.no_ack:
            for d in dropped:
                self._settle(d.delivery_tag, requeue=True, reject=False)
        await self._send_cancel(consumer).wait()

    async def get(self, queue: str, *, no_ack: bool = False) -> Delivery | None:
        """One message from ``queue``, or None when it is empty."""

        def track(reply: ev.Event) -> None:
            if type(reply) is ev.GetOk and not no_ack:
                assert isinstance(reply, ev.GetOk)
                self._acks.delivered(reply.dtag)

        reply = await self._call(ev.Get(self._new_id(), queue, no_ack), track)
        if not isinstance(reply, ev.GetOk):
            return None
        frame = {
            "body": reply.body,
            "exchange": reply.exchange,
            "key": reply.key,
            "headers": reply.headers,
            "props": reply.props,
            "redelivered": reply.redelivered,
        }
        return Delivery(self, frame, reply.dtag, "", reply.queue or queue, no_ack)

    # --- closing --------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close politely: send ``close``, wait (at most ``close_timeout``) for
        ``close-ok``, then close the stream. Pending calls raise ConnectionClosed;
        consumers stop iterating."""
        if self._closed is None and not self._closing:
            self._closing = True
            with trio.move_on_after(self.close_timeout):
                self._emit_acks()
                with suppress(AmqliteError):
                    self._send(ev.Close(code=200, text="client closing"))
                await self._close_done.wait()
            self._finish(ConnectionClosed("the connection was closed by the client"), ours=True)
        with trio.move_on_after(self.close_timeout):
            await self._transport.wait_flushed()  # e.g. our close-ok to the server's close
        await self._transport.aclose()

    close = aclose


def _deliver_map(e: ev.Deliver) -> dict[str, Any]:
    return {
        "ctag": e.ctag,
        "dtag": e.dtag,
        "exchange": e.exchange,
        "key": e.key,
        "body": e.body,
        "headers": e.headers,
        "props": e.props,
        "redelivered": e.redelivered,
        "queue": e.queue,
    }
