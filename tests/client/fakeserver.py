"""A small fake broker for client tests, on ``amqlite.protocol.Connection(Role.SERVER)``.

It speaks the real wire protocol over any trio stream (a loopback socket on port
0, or an in-memory pair) and keeps a toy model: exchanges (direct, fanout, topic
by exact key), queues, bindings, consumers with prefetch, unacked deliveries. Knobs
let a test make it refuse, nack, stay silent or close. Every frame it receives is
recorded in ``frames`` so tests can assert what the client sent.
"""

from __future__ import annotations

import itertools
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.lowlevel

from amqlite.errors import ReplyCode
from amqlite.protocol import DEFAULT_MAX_FRAME, Connection, Role
from amqlite.protocol import events as ev


@dataclass
class FakeMessage:
    exchange: str
    key: str
    body: bytes
    headers: dict[str, Any]
    props: dict[str, Any]
    redelivered: bool = False


@dataclass
class FakeConsumer:
    session: FakeSession
    tag: str
    queue: str
    prefetch: int
    no_ack: bool
    in_flight: int = 0


@dataclass
class FakeQueue:
    name: str
    messages: deque[FakeMessage] = field(default_factory=deque)
    consumers: list[FakeConsumer] = field(default_factory=list)


class FakeSession:
    def __init__(self, broker: FakeBroker, stream: trio.abc.Stream) -> None:
        self.broker = broker
        self.stream = stream
        self.proto = Connection(Role.SERVER)
        self.out = bytearray()
        self.wake = trio.Event()
        self.next_dtag = 1
        self.unacked: dict[int, tuple[str, FakeMessage, FakeConsumer | None]] = {}
        self.consumers: dict[str, FakeConsumer] = {}
        self.open = False
        self.mute = False
        self.ending = False
        self.close_sent = False
        self.closed = trio.Event()
        self.client_hello: ev.Hello | None = None
        self.frames: list[ev.Event] = []  # what this session received

    def send(self, event: ev.Event) -> None:
        self.out += self.proto.send(event)
        self.wake.set()


class FakeBroker:
    """Knobs: ``refuse`` (code for ``refused``; with ``refuse_first`` only the first
    that many connections are refused, like a passive HA node that a few client
    votes promote), ``heartbeat`` (seconds offered; the client's smaller non-zero
    wish wins), ``silent`` (send nothing after the welcome, not even heartbeats),
    ``nack_publishes``, ``hold_confirms`` (keep confirms until
    :meth:`release_confirms`), ``ignore`` (request types recorded and never
    answered), ``locked`` (queue name -> how many declarations of it fail with 405
    RESOURCE_LOCKED first, as if another session still held it), ``max_frame``."""

    def __init__(
        self,
        *,
        refuse: int | None = None,
        refuse_first: int | None = None,
        ignore: tuple[type[ev.Event], ...] = (),
        locked: dict[str, int] | None = None,
        heartbeat: float = 0.0,
        silent: bool = False,
        nack_publishes: bool = False,
        hold_confirms: bool = False,
        max_frame: int = DEFAULT_MAX_FRAME,
        name: str = "fake",
    ) -> None:
        self.refuse = refuse
        self.refuse_first = refuse_first
        self.ignore = ignore
        self.locked = dict(locked or {})
        self.heartbeat = heartbeat
        self.silent = silent
        self.nack_publishes = nack_publishes
        self.hold_confirms = hold_confirms
        self.held: list[tuple[FakeSession, ev.Event]] = []
        self.max_frame = max_frame
        self.name = name
        self.exchanges: dict[str, str] = {
            "": "direct",
            "amq.direct": "direct",
            "amq.fanout": "fanout",
            "amq.topic": "topic",
        }
        self.bindings: dict[str, list[tuple[str, str]]] = {k: [] for k in self.exchanges}
        self.queues: dict[str, FakeQueue] = {}
        self.sessions: list[FakeSession] = []
        self.frames: list[ev.Event] = []
        self.port = 0
        self.connects = 0
        self._names = itertools.count(1)
        self._changed = trio.Event()

    # --- test helpers -----------------------------------------------------------------

    def frames_of(self, cls: type[ev.Event]) -> list[Any]:
        return [f for f in self.frames if type(f) is cls]

    async def wait_for(self, predicate: Any, limit: float = 5.0) -> None:
        """Wait (bounded) until ``predicate()`` holds; re-checked after every frame."""
        with trio.fail_after(limit):
            while not predicate():
                self._changed = trio.Event()
                await self._changed.wait()

    def release_confirms(self, n: int | None = None) -> None:
        """Send ``n`` (default all) of the confirms held back by ``hold_confirms``."""
        n = len(self.held) if n is None else n
        released, self.held = self.held[:n], self.held[n:]
        for s, reply in released:
            s.send(reply)

    def unacked_count(self) -> int:
        return sum(len(s.unacked) for s in self.sessions)

    async def drop_all(self) -> None:
        """Hang up on every client without a close handshake."""
        for s in self.sessions:
            await trio.aclose_forcefully(s.stream)

    async def close_all(self, code: int = ReplyCode.CONNECTION_FORCED, text: str = "bye") -> None:
        for s in self.sessions:
            if s.open and not s.close_sent:
                s.close_sent = True
                s.send(ev.Close(code=code, text=text))

    # --- serving ------------------------------------------------------------------------

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started(self.port)
            await trio.serve_listeners(self.handle_stream, listeners, handler_nursery=nursery)

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        self.connects += 1
        s = FakeSession(self, stream)
        self.sessions.append(s)
        try:
            async with trio.open_nursery() as nursery:
                writer_done = trio.Event()
                nursery.start_soon(self._writer, s, writer_done)
                if self.heartbeat and not self.silent:
                    nursery.start_soon(self._heartbeats, s)
                with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._reader(s)
                s.ending = True  # the writer sends what is queued, then stops
                s.wake.set()
                with trio.move_on_after(2):
                    await writer_done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._drop_session(s)
            s.closed.set()
            await trio.aclose_forcefully(stream)

    async def _writer(self, s: FakeSession, done: trio.Event) -> None:
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._write_loop(s)
        done.set()

    async def _write_loop(self, s: FakeSession) -> None:
        while True:
            if not s.out:
                if s.ending:
                    return
                await s.wake.wait()
                s.wake = trio.Event()
                continue
            data, s.out = s.out, bytearray()
            if not s.mute:
                await s.stream.send_all(data)
            if self.silent and s.open:
                s.mute = True  # the welcome went out; nothing else will

    async def _heartbeats(self, s: FakeSession) -> None:
        while True:
            await trio.sleep(self.heartbeat)
            if s.open:
                s.send(ev.Heartbeat())

    async def _reader(self, s: FakeSession) -> None:
        while True:
            data = await s.stream.receive_some(65536)
            s.proto.receive_data(data)
            while batch := s.proto.events():  # a batch ends at a state change
                for e in batch:
                    if type(e) is ev.EndOfStream:
                        return
                    self.frames.append(e)
                    s.frames.append(e)
                    if not self._handle(s, e):
                        # let the writer flush the last reply, then hang up
                        with trio.move_on_after(1):
                            while s.out:
                                await trio.lowlevel.checkpoint()
                        return
            self._dispatch()
            self._changed.set()
            if not data:
                return

    def _drop_session(self, s: FakeSession) -> None:
        for c in s.consumers.values():
            q = self.queues.get(c.queue)
            if q is not None and c in q.consumers:
                q.consumers.remove(c)
        for dtag in sorted(s.unacked, reverse=True):
            qname, msg, _ = s.unacked[dtag]
            q = self.queues.get(qname)
            if q is not None:
                msg.redelivered = True
                q.messages.appendleft(msg)
        s.unacked.clear()
        s.open = False
        self._changed.set()

    # --- the model ----------------------------------------------------------------------

    def _handle(self, s: FakeSession, e: ev.Event) -> bool:
        """Handle one frame; False ends the session."""
        t = type(e)
        if t is ev.Hello:
            assert isinstance(e, ev.Hello)
            s.client_hello = e
            if self.refuse is not None and (
                self.refuse_first is None or self.connects <= self.refuse_first
            ):
                s.send(ev.Refused(re=e.id, code=self.refuse, text=f"{self.name} refuses"))
                return False
            hb = self.heartbeat
            if e.heartbeat and hb:
                hb = min(hb, e.heartbeat)
            s.send(
                ev.Welcome(
                    re=e.id,
                    server=self.name,
                    version="0.0-fake",
                    heartbeat=hb,
                    max_frame=self.max_frame,
                )
            )
            s.open = True
            return True
        if t is ev.Heartbeat:
            return True
        if t is ev.Close:
            s.send(ev.CloseOk())
            return False
        if t is ev.CloseOk:
            return False
        if t is ev.BadRequest:
            assert isinstance(e, ev.BadRequest)
            s.send(ev.Error(re=e.id, code=e.code, text=e.text))
            return True
        if s.close_sent or type(e) in self.ignore:
            return True  # drop what the client sent before it saw our close
        rid = getattr(e, "id", None)
        try:
            self._operation(s, e)
        except _Fail as f:
            s.send(ev.Error(re=rid, code=f.code, text=f.text))
        return True

    def _queue(self, name: str) -> FakeQueue:
        q = self.queues.get(name)
        if q is None:
            raise _Fail(ReplyCode.NOT_FOUND, f"no queue {name!r} in vhost '/'")
        return q

    def _exchange(self, name: str) -> str:
        t = self.exchanges.get(name)
        if t is None:
            raise _Fail(ReplyCode.NOT_FOUND, f"no exchange {name!r} in vhost '/'")
        return t

    def _route(self, exchange: str, key: str) -> list[FakeQueue]:
        etype = self._exchange(exchange)
        if exchange == "":
            q = self.queues.get(key)
            return [q] if q is not None else []
        names = [qn for qn, k in self.bindings[exchange] if etype == "fanout" or k in (key, "#")]
        return [self.queues[n] for n in dict.fromkeys(names) if n in self.queues]

    def _operation(self, s: FakeSession, e: ev.Event) -> None:
        if isinstance(e, ev.Publish):
            targets = self._route(e.exchange, e.key)
            msg = FakeMessage(e.exchange, e.key, e.body, e.headers, e.props)
            for q in targets:
                q.messages.append(
                    FakeMessage(msg.exchange, msg.key, msg.body, msg.headers, msg.props)
                )
            if not targets and e.mandatory:
                s.send(ev.Returned(re=e.id, code=ReplyCode.NO_ROUTE, text="NO_ROUTE"))
            elif e.confirm:
                reply: ev.Event = ev.Ok(re=e.id)
                if self.nack_publishes:
                    reply = ev.Nacked(re=e.id, code=ReplyCode.PRECONDITION_FAILED, text="full")
                if self.hold_confirms:
                    self.held.append((s, reply))
                else:
                    s.send(reply)
        elif isinstance(e, ev.Ack):
            self._settle(s, e.id, e.dtag, e.multiple, requeue=None)
        elif isinstance(e, ev.Nack):
            self._settle(s, e.id, e.dtag, e.multiple, requeue=e.requeue)
        elif isinstance(e, ev.Reject):
            self._settle(s, e.id, e.dtag, False, requeue=e.requeue)
        elif isinstance(e, ev.ExchangeDeclare):
            have = self.exchanges.get(e.exchange)
            if e.passive:
                self._exchange(e.exchange)
            elif have is not None and have != e.type:
                raise _Fail(ReplyCode.PRECONDITION_FAILED, f"exchange {e.exchange!r} is {have}")
            elif have is None:
                if e.type not in ("direct", "fanout", "topic", "headers"):
                    raise _Fail(ReplyCode.COMMAND_INVALID, f"unknown exchange type {e.type!r}")
                self.exchanges[e.exchange] = e.type
                self.bindings[e.exchange] = []
            s.send(ev.Ok(re=e.id))
        elif isinstance(e, ev.ExchangeDelete):
            self._exchange(e.exchange)
            del self.exchanges[e.exchange]
            del self.bindings[e.exchange]
            s.send(ev.Ok(re=e.id))
        elif isinstance(e, ev.QueueDeclare):
            if self.locked.get(e.queue, 0) > 0:
                self.locked[e.queue] -= 1
                raise _Fail(ReplyCode.RESOURCE_LOCKED, f"queue {e.queue!r} is locked")
            name = e.queue or f"amq.gen-{next(self._names)}"
            q = self.queues.get(name)
            if q is None:
                if e.passive:
                    raise _Fail(ReplyCode.NOT_FOUND, f"no queue {name!r} in vhost '/'")
                q = self.queues[name] = FakeQueue(name)
            info = {"queue": name, "messages": len(q.messages), "consumers": len(q.consumers)}
            s.send(ev.Ok(re=e.id, info=info))
        elif isinstance(e, ev.QueueDelete):
            q = self._queue(e.queue)
            n = len(q.messages)
            del self.queues[e.queue]
            for c in q.consumers:
                c.session.consumers.pop(c.tag, None)
                c.session.send(ev.Cancelled(tag=c.tag, code=404, text="queue deleted"))
            s.send(ev.Ok(re=e.id, info={"messages": n}))
        elif isinstance(e, ev.QueuePurge):
            q = self._queue(e.queue)
            n = len(q.messages)
            q.messages.clear()
            s.send(ev.Ok(re=e.id, info={"messages": n}))
        elif isinstance(e, ev.QueueBind):
            self._queue(e.queue)
            self._exchange(e.exchange)
            self.bindings[e.exchange].append((e.queue, e.key))
            s.send(ev.Ok(re=e.id))
        elif isinstance(e, ev.QueueUnbind):
            self._exchange(e.exchange)
            binding = (e.queue, e.key)
            if binding in self.bindings[e.exchange]:
                self.bindings[e.exchange].remove(binding)
            s.send(ev.Ok(re=e.id))
        elif isinstance(e, ev.Consume):
            q = self._queue(e.queue)
            tag = e.tag or f"ctag-{next(self._names)}"
            c = FakeConsumer(s, tag, e.queue, e.prefetch, e.no_ack)
            s.consumers[tag] = c
            q.consumers.append(c)
            s.send(ev.Ok(re=e.id, info={"tag": tag}))
        elif isinstance(e, ev.Cancel):
            c2 = s.consumers.pop(e.tag, None)
            if c2 is not None:
                q2 = self.queues.get(c2.queue)
                if q2 is not None and c2 in q2.consumers:
                    q2.consumers.remove(c2)
            s.send(ev.Ok(re=e.id))
        elif isinstance(e, ev.Get):
            q = self._queue(e.queue)
            if not q.messages:
                s.send(ev.GetEmpty(re=e.id))
                return
            m = q.messages.popleft()
            dtag = s.next_dtag
            s.next_dtag += 1
            if not e.no_ack:
                s.unacked[dtag] = (q.name, m, None)
            s.send(
                ev.GetOk(
                    re=e.id,
                    dtag=dtag,
                    exchange=m.exchange,
                    key=m.key,
                    body=m.body,
                    headers=m.headers,
                    props=m.props,
                    redelivered=m.redelivered,
                    remaining=len(q.messages),
                    queue=q.name,
                )
            )
        elif isinstance(e, ev.Status):
            s.send(ev.Ok(re=e.id, info=self.status()))
        else:  # pragma: no cover
            raise _Fail(ReplyCode.NOT_IMPLEMENTED, f"fake broker: no {e.METHOD}")

    def _settle(
        self, s: FakeSession, rid: int, dtag: int, multiple: bool, requeue: bool | None
    ) -> None:
        if multiple:
            tags = [t for t in s.unacked if t <= dtag]
        elif dtag in s.unacked:
            tags = [dtag]
        else:
            tags = []
        if not tags:
            raise _Fail(ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {dtag}")
        for t in sorted(tags):
            qname, m, c = s.unacked.pop(t)
            if c is not None:
                c.in_flight -= 1
            if requeue:
                q = self.queues.get(qname)
                if q is not None:
                    m.redelivered = True
                    q.messages.appendleft(m)

    def _dispatch(self) -> None:
        for q in self.queues.values():
            while q.messages:
                ready = [
                    c
                    for c in q.consumers
                    if c.session.open and (c.no_ack or not c.prefetch or c.in_flight < c.prefetch)
                ]
                if not ready:
                    break
                for c in ready:
                    if not q.messages:
                        break
                    if not c.no_ack and c.prefetch and c.in_flight >= c.prefetch:
                        continue
                    m = q.messages.popleft()
                    s = c.session
                    dtag = s.next_dtag
                    s.next_dtag += 1
                    if not c.no_ack:
                        s.unacked[dtag] = (q.name, m, c)
                        c.in_flight += 1
                    s.send(
                        ev.Deliver(
                            c.tag,
                            dtag,
                            m.exchange,
                            m.key,
                            m.body,
                            m.headers,
                            m.props,
                            m.redelivered,
                            q.name,
                        )
                    )

    def status(self) -> dict[str, Any]:
        return {
            "node_id": self.name,
            "version": "0.0-fake",
            "uptime_s": 1.5,
            "state": "standalone",
            "vhosts": [
                {
                    "name": "/",
                    "exchanges": [
                        {
                            "name": name,
                            "type": etype,
                            "durable": False,
                            "auto_delete": False,
                            "internal": False,
                            "bindings": [
                                {"queue": q, "key": k, "arguments": {}}
                                for q, k in self.bindings[name]
                            ],
                        }
                        for name, etype in self.exchanges.items()
                    ],
                    "queues": [
                        {
                            "vhost": "/",
                            "name": q.name,
                            "messages": len(q.messages),
                            "unacked": sum(
                                1
                                for s in self.sessions
                                for n, _, _ in s.unacked.values()
                                if n == q.name
                            ),
                            "consumers": len(q.consumers),
                            "durable": False,
                            "exclusive": False,
                            "auto_delete": False,
                            "type": "classic",
                            "arguments": {},
                        }
                        for q in self.queues.values()
                    ],
                }
            ],
            "connections": [
                {
                    "remote": "127.0.0.1:1",
                    "user": "guest",
                    "vhost": "/",
                    "client": s.client_hello.client if s.client_hello else "",
                    "since_s": 0.5,
                }
                for s in self.sessions
                if s.open
            ],
        }


class _Fail(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
