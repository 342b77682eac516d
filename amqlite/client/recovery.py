"""Reconnecting: what lets a :class:`~amqlite.client.Connection` survive losing its
server. A connection with a reconnect policy owns one :class:`Reconnector`.

When a link breaks and the connection has a :class:`~amqlite.client.ReconnectPolicy`:

1. **Suspend** (at once, in the reader): the link's generation ends, so anything its
   tasks still report is ignored; its delivery tags become stale (acks for them are
   dropped: the server requeues those messages and delivers them again with
   ``redelivered``); deliveries buffered for manual-ack consumers are dropped for the
   same reason; pending ``cancel`` requests are done (the consumer died with the
   link); the application's other requests and every unconfirmed confirmed publish
   are kept. New calls wait.
2. **Dial** the server list again, primary first, with jittered exponential backoff
   between passes, until ``give_up_after`` seconds after the loss.
3. **Restore** on the new link: declare again what was declared (a server-named
   queue the server will not re-create under its old name gets a new one), resume
   each consumer under its tag (a stream consumer after the last delivery it
   kept), then send again, in their original order, the requests still unanswered
   and the confirmed publishes still unconfirmed.
4. **Open** again: waiting calls go on; ``on_reconnect`` is called.

If the new link breaks while restoring, or an exclusive queue or consumer of ours
is still held by the server's half-dead session of the old link (405, or 403 for
an exclusive consumer), the restore starts over from step 2.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import trio

from amqlite.errors import AmqliteError, ConnectionClosed, ConnectionRefused, ReplyCode
from amqlite.log import get_logger
from amqlite.protocol import events as ev

from .link import Disconnected, LinkEvent, Reconnected
from .replies import PendingReply

if TYPE_CHECKING:
    from .addresses import Address
    from .consumer import Subscriptions
    from .dial import Dialed, Dialer
    from .policy import ReconnectPolicy
    from .publisher import ConfirmWindow
    from .replies import PendingRequests
    from .settling import Settler
    from .topology import Topology

log = get_logger("amqlite.client")

#: How long a retired link may take to send what it owes (a close-ok).
_RETIRE_GRACE = 1.0


class ReconnectHost(Protocol):
    """The facts of its connection the reconnector reads (its public ones)."""

    address: Address
    max_frame: int
    reconnects: int
    on_disconnect: Callable[[Disconnected], object] | None
    on_reconnect: Callable[[Reconnected], object] | None

    @property
    def server_name(self) -> str: ...
    @property
    def is_open(self) -> bool: ...
    @property
    def connected(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ConnectionParts:
    """What the connection hands its reconnector: the parts it owns (each with its
    own methods) and the three steps only the connection takes itself."""

    settler: Settler
    requests: PendingRequests
    confirms: ConfirmWindow
    consumers: Subscriptions
    topology: Topology
    #: Make a dialed link the current one and start it.
    attach: Callable[[Dialed], object]
    #: Fire a link-state event (the table is :data:`.link.TRANSITIONS`).
    fire: Callable[[LinkEvent], None]
    #: End the connection: everything still waiting raises this error.
    finish: Callable[[AmqliteError], None]


class _Retry(Exception):
    """The restore hit something that time should fix: drop this link, dial again."""

    def __init__(self, error: AmqliteError) -> None:
        super().__init__(error.text)
        self.error = error


class Reconnector:
    """Suspend, dial, restore (see the module docstring) for one connection. Its
    task, :meth:`run`, lives as long as the connection."""

    def __init__(
        self,
        host: ReconnectHost,
        parts: ConnectionParts,
        policy: ReconnectPolicy,
        dialer: Dialer,
    ) -> None:
        self._host = host
        self._parts = parts
        self.policy = policy
        self._dialer = dialer
        self._wake = trio.Event()  # a link was lost (or the connection ended)
        #: Set while no reconnect is under way; calls made meanwhile wait on it.
        self.restored = trio.Event()
        self.restored.set()
        self._scope: trio.CancelScope | None = None
        self._lost_at = 0.0
        self._lost_address: Address | None = None
        self._deadline = math.inf
        self._last_error: AmqliteError | None = None
        self._random = random.Random()

    # --- 1. suspend (in the reader: no awaiting) -------------------------------------

    def suspend(self, exc: AmqliteError) -> None:
        """The current link broke (or failed its restore): void it, keep the rest."""
        c, parts = self._host, self._parts
        opening_outage = c.connected
        parts.fire(LinkEvent.LOST)
        parts.settler.next_link()
        parts.consumers.cancelled.clear()
        parts.requests.link_lost(exc)
        dropped = parts.consumers.drop_buffers()
        self._last_error = exc
        if opening_outage:
            self._lost_at = trio.current_time()
            self._lost_address = c.address
            self._deadline = self.policy.deadline(self._lost_at)
            self.restored = trio.Event()
            log.info(
                "client_connection_lost",
                peer=str(c.address),
                error=exc.text,
                code=int(exc.code),
                unconfirmed=len(parts.confirms),
                requests=len(parts.requests),
                dropped_deliveries=dropped,
            )
            self._notify(c.on_disconnect, Disconnected(c.address, exc))
        else:
            log.info("client_restore_interrupted", peer=str(c.address), error=exc.text)
        self._wake.set()

    def stop(self) -> None:
        """The connection ended: release waiters and stop reconnecting."""
        self.restored.set()
        self._wake.set()
        if self._scope is not None:
            self._scope.cancel()

    # --- 2. dial -------------------------------------------------------------------

    async def run(self) -> None:
        """The reconnector's task: never raises (a bug ends the connection)."""
        c = self._host
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if not c.is_open:  # closing or closed
                return
            if c.connected:
                continue  # a loss during a restore that has since succeeded
            with trio.CancelScope() as scope:
                self._scope = scope
                try:
                    await self._recover()
                except Exception as exc:
                    log.exception("client_reconnect_failed")
                    err = ConnectionClosed(
                        f"reconnecting failed: {exc!r}", ReplyCode.INTERNAL_ERROR
                    )
                    err.__cause__ = exc
                    self._parts.finish(err)
            self._scope = None

    async def _recover(self) -> None:
        c, parts = self._host, self._parts
        settler = parts.settler
        attempt = 0
        with trio.move_on_at(self._deadline):
            while True:
                await self._retire()
                if attempt:
                    delay = self.policy.delay(attempt, self._random.random())
                    log.debug(
                        "client_reconnect_backoff",
                        attempt=attempt,
                        delay_s=round(delay, 3),
                        error=self._last_error.text if self._last_error else "",
                    )
                    await trio.sleep(delay)
                attempt += 1
                try:
                    dialed = await self._dialer.dial()
                except ConnectionRefused as exc:
                    if exc.code != ReplyCode.NOT_ACTIVE:  # a bad login is final
                        text = f"cannot reconnect: {exc.text}"
                        self._give_up(ConnectionClosed(text, exc.code), attempt)
                        return
                    self._last_error = exc
                    continue
                except ConnectionClosed as exc:
                    self._last_error = exc
                    continue
                parts.attach(dialed)
                gen = settler.gen
                try:
                    resent, renamed = await self._restore()
                except _Retry as retry:
                    if settler.gen == gen:
                        self.suspend(retry.error)
                    continue
                except AmqliteError as exc:  # the new link broke: suspend has run
                    if settler.gen == gen:  # pragma: no cover - a reply we did not expect
                        self.suspend(exc)
                    continue
                if not c.is_open or c.connected:
                    return  # closed meanwhile (the last steps do not checkpoint)
                parts.fire(LinkEvent.RESTORED)
                c.reconnects += 1
                self.restored.set()
                self._reconnected(attempt, resent, renamed)
                return
        await self._retire()  # the deadline passed
        self._give_up(None, attempt)

    async def _retire(self) -> None:
        """Close the current link (a dead one, or one that failed its restore)."""
        link = self._parts.settler.link
        with trio.move_on_after(_RETIRE_GRACE):
            await link.wait_flushed()
        await link.aclose()

    def _give_up(self, error: AmqliteError | None, attempts: int) -> None:
        if error is None:
            why = self._last_error.text if self._last_error else "no server answered"
            error = ConnectionClosed(
                f"gave up reconnecting after {self.policy.give_up_after:g}s "
                f"({attempts} attempt{'s' if attempts != 1 else ''}): {why}"
            )
        log.warning(
            "client_reconnect_gave_up",
            error=error.text,
            attempts=attempts,
            unconfirmed=len(self._parts.confirms),
        )
        self._parts.finish(error)

    def _reconnected(self, attempts: int, resent: int, renamed: dict[str, str]) -> None:
        c = self._host
        downtime = trio.current_time() - self._lost_at
        previous = self._lost_address or c.address
        log.info(
            "client_reconnected",
            peer=str(c.address),
            previous=str(previous),
            server=c.server_name,
            downtime_s=round(downtime, 3),
            attempts=attempts,
            resent=resent,
            consumers=len(self._parts.consumers),
            renamed_queues=renamed or None,
        )
        self._notify(
            c.on_reconnect,
            Reconnected(
                address=c.address,
                previous=previous,
                downtime=downtime,
                attempts=attempts,
                reconnects=c.reconnects,
                resent=resent,
                renamed_queues=renamed,
            ),
        )

    @staticmethod
    def _notify(callback: Callable[[Any], object] | None, event: Any) -> None:
        if callback is None:
            return
        try:
            callback(event)
        except Exception:
            log.exception("client_callback_failed", callback=repr(callback))

    # --- 3. restore ---------------------------------------------------------------

    async def _internal(self, event: Any) -> ev.Event:
        """A request of the restore itself: fails with the link that carries it."""
        parts = self._parts
        pending = PendingReply()
        parts.requests[event.id] = pending
        parts.settler.send(event)
        return await pending.wait()

    async def _restore(self) -> tuple[int, dict[str, str]]:
        renamed = await self._redeclare()
        await self._resume_consumers()
        return self._resend(), renamed

    async def _redeclare(self) -> dict[str, str]:
        parts = self._parts
        new_id = parts.settler.new_id
        renamed: dict[str, str] = {}
        topology = parts.topology
        i = 0
        while i < len(topology):  # by index: a rename rewrites the entries after it
            entry = topology[i]
            i += 1
            e = entry.event
            try:
                await self._internal(replace(e, id=new_id()))
                continue
            except ConnectionClosed:
                raise
            except AmqliteError as exc:
                error = exc
            if (
                type(e) is ev.QueueDeclare
                and entry.server_named
                and error.code in (ReplyCode.ACCESS_REFUSED, ReplyCode.RESOURCE_LOCKED)
            ):
                # the server keeps ``amq.`` names for itself: ask for a fresh one
                try:
                    reply = await self._internal(replace(e, id=new_id(), queue=""))
                except ConnectionClosed:
                    raise
                except AmqliteError as exc:
                    error = exc
                else:
                    info = reply.info if isinstance(reply, ev.Ok) else {}
                    new = str(info.get("queue", ""))
                    if new:
                        topology.renamed(e.queue, new)
                        parts.consumers.rename_queue(e.queue, new)
                        renamed[e.queue] = new
                        log.info("client_queue_renamed", old=e.queue, new=new)
                        continue
            if error.code == ReplyCode.RESOURCE_LOCKED:
                raise _Retry(error)  # our old session still holds it: wait for the server
            log.warning("client_redeclare_failed", request=e.METHOD, error=str(error))
        return renamed

    async def _resume_consumers(self) -> None:
        consumers = self._parts.consumers
        settler = self._parts.settler
        resumed: set[str] = set()
        for consumer in list(consumers.values()):
            if not consumer.active:
                continue
            req = ev.Consume(
                settler.new_id(),
                consumer.queue,
                consumer.tag,
                consumer.prefetch,
                consumer.no_ack,
                consumer.exclusive,
                consumer.resume_arguments(),
                consumer.selector,
            )
            try:
                await self._internal(req)
            except ConnectionClosed:
                raise
            except AmqliteError as exc:
                if consumer.exclusive and exc.code == ReplyCode.ACCESS_REFUSED:
                    raise _Retry(exc) from None  # probably our own consumer, not yet reaped
                log.warning(
                    "client_consumer_not_resumed",
                    tag=consumer.tag,
                    queue=consumer.queue,
                    error=str(exc),
                )
                if consumers.get(consumer.tag) is consumer:
                    del consumers[consumer.tag]
                consumer.finish(exc, drop_buffer=False)
                continue
            resumed.add(consumer.tag)
        for tag, consumer in list(consumers.items()):
            if not consumer.active:  # cancelled by the application while we were restoring
                del consumers[tag]
                if tag in resumed:
                    settler.send(ev.Cancel(settler.new_id(), tag))

    def _resend(self) -> int:
        """Send again what the application is still waiting for, in its first order."""
        c, parts = self._host, self._parts
        link = parts.settler.link
        confirms = parts.confirms
        proto = link.proto
        items = [(rid, proto.send(request)) for rid, request in parts.requests.to_resend()]
        too_large: list[int] = []
        for rid, p in confirms.outstanding.items():
            if p.frame is None:
                continue
            if len(p.frame) - 4 > c.max_frame:  # the new server takes smaller frames
                too_large.append(rid)
            else:
                items.append((rid, p.frame))
        for rid in too_large:
            text = f"message too large for {c.address} (frames of at most {c.max_frame} bytes)"
            confirms.resolve(rid, ev.Error(rid, ReplyCode.CONTENT_TOO_LARGE, text))
        items.sort(key=lambda item: item[0])
        for _, data in items:
            link.out += data
        if items:
            link.kick()
        return len(items)
