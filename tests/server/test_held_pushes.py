"""While an HA pair replicates, the client endpoint holds a plain journaled message's
delivery unencoded and encodes a run of released ones in one ``append_deliveries``
(``ClientEndpoint._push_gated``). This checks, with hypothesis, that what goes out,
and when, is what the general rule gives: every push encoded at once with
``send_deliver``, its frame held until the passive node holds what it waits for
(its journal id, stream offset or group record), nothing overtaking a held push."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqlite.broker import Delivery, Message
from amqlite.broker.groups import GroupFirstMessage
from amqlite.protocol import ConnState
from amqlite.protocol import events as ev
from amqlite.server.endpoints.client import ClientEndpoint
from tests.protocol.wire import server_in

CHECKS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class _Replica:
    held_id: int = 0


@dataclass
class _Storage:
    """What the gate asks of NodeStorage: the passive node holds journal ids up to
    ``replica.held_id``, stream offsets below ``stream_upto``, positions up to
    ``applied``."""

    replica: _Replica = field(default_factory=_Replica)
    replica_upto: int | None = 0
    stream_upto: int = 0
    applied: int = 0
    waiters: set[Any] = field(default_factory=set)

    def stream_replicated(self, vhost: str, queue: str, offset: int) -> bool:
        return offset < self.stream_upto

    def position_replicated(self, position: int) -> bool:
        return position <= self.applied

    def when_replicated(self, callback: Any) -> None:
        self.waiters.add(callback)

    def discard_waiter(self, callback: Any) -> None:
        self.waiters.discard(callback)


class _Link:
    def __init__(self) -> None:
        self.proto = server_in(ConnState.OPEN)
        self.out = bytearray()
        self.remote_address = "test"

    def kick(self) -> None:
        pass


class _Session:
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.cancellations: list[tuple[str, int, str]] = []

    def take_deliveries(self) -> list[Delivery]:
        taken, self.deliveries = self.deliveries, []
        return taken

    def take_cancellations(self) -> list[tuple[str, int, str]]:
        taken, self.cancellations = self.cancellations, []
        return taken

    def set_writable(self, writable: bool) -> None:
        pass


class _Dispatcher:
    max_reply_bytes = 0
    stream_visible: Any = None


class _Node:
    def __init__(self, storage: _Storage) -> None:
        self.storage = storage


class _Model:
    """The general rule: encode every push at once, hold frames in order."""

    def __init__(self, storage: _Storage) -> None:
        self.storage = storage
        self.proto = server_in(ConnState.OPEN)
        self.out = bytearray()
        self.held: deque[tuple[int, str, int, int, bytes]] = deque()

    def push(self, deliveries: list[Delivery], cancellations: list[tuple[str, int, str]]) -> None:
        s, held = self.storage, self.held
        for d in deliveries:
            m = d.message
            frame = self.proto.send_deliver(d.ctag, d.dtag, d.redelivered, m, d.offset)
            if d.offset is not None:
                if held or not s.stream_replicated("/", d.queue, d.offset):
                    held.append((0, d.queue, d.offset, 0, frame))
                    continue
            else:
                position = m.position if isinstance(m, GroupFirstMessage) else 0
                if (
                    held
                    or m.journal_id > s.replica.held_id
                    or (position and not s.position_replicated(position))
                ):
                    held.append((m.journal_id, "", 0, position, frame))
                    continue
            self.out += frame
        for tag, code, text in cancellations:
            frame = self.proto.send(ev.Cancelled(tag, code, text))
            if held:
                held.append((0, "", 0, 0, frame))
            else:
                self.out += frame

    def release(self) -> None:
        s, held = self.storage, self.held
        while held:
            journal_id, stream, offset, position, _ = held[0]
            if (
                journal_id > s.replica.held_id
                or (stream and not s.stream_replicated("/", stream, offset))
                or (position and not s.position_replicated(position))
            ):
                break
            self.out += held.popleft()[4]


#: one delivery: (kind, redelivered, ctag, body); kinds: a plain journaled message,
#: a transient one (journal id 0), one from a stream, a group's first delivery
DELIVERY = st.tuples(
    st.sampled_from(["plain", "plain", "plain", "transient", "stream", "group"]),
    st.booleans(),
    st.sampled_from(["c1", "c2"]),
    st.binary(max_size=20),
)


def _endpoint(storage: _Storage, link: _Link, session: _Session) -> ClientEndpoint:
    return ClientEndpoint(
        _Node(storage),  # type: ignore[arg-type]
        link,  # type: ignore[arg-type]
        session,  # type: ignore[arg-type]
        _Dispatcher(),  # type: ignore[arg-type]
        user="u",
        vhost="/",
        client="t",
        connected_at=0.0,
    )


STEP = st.one_of(
    st.tuples(st.just("push"), st.lists(DELIVERY, max_size=6), st.booleans()),
    st.tuples(st.just("held_id"), st.integers(0, 8)),  # ids past the last handed out
    st.tuples(st.just("stream"), st.integers(0, 4)),
    st.tuples(st.just("applied"), st.integers(0, 6)),
)


@CHECKS
@given(steps=st.lists(STEP, max_size=25))
def test_held_pushes_go_as_encoding_each_at_once_would_send_them(steps: list[Any]) -> None:
    storage = _Storage()
    link = _Link()
    session = _Session()
    endpoint = _endpoint(storage, link, session)
    model = _Model(storage)
    journal_id = offset = position = dtag = 0
    for step in steps:
        if step[0] == "push":
            deliveries = []
            for kind, redelivered, ctag, body in step[1]:
                dtag += 1
                message = Message("", "q", body, {}, {"persistent": True})
                d_offset = None
                if kind in ("plain", "group"):
                    journal_id += 1
                    message.journal_id = journal_id
                if kind == "group":
                    position += 1
                    first = GroupFirstMessage(message)
                    first.position = position
                    message = first
                elif kind == "stream":
                    d_offset = offset
                    offset += 1
                deliveries.append(Delivery(ctag, dtag, redelivered, message, "s", offset=d_offset))
            cancellations = [("c9", 320, "gone")] if step[2] else []
            model.push(deliveries, cancellations)
            session.deliveries, session.cancellations = list(deliveries), cancellations
            endpoint.push()
        else:
            if step[0] == "held_id":
                storage.replica.held_id = max(storage.replica.held_id, journal_id - step[1])
            elif step[0] == "stream":
                storage.stream_upto = max(storage.stream_upto, offset - step[1])
            else:
                storage.applied = max(storage.applied, position - step[1])
            model.release()
            for callback in list(storage.waiters):
                callback()
        assert bytes(link.out) == bytes(model.out)
        assert bool(storage.waiters) == bool(model.held)


def test_held_deliveries_are_dropped_once_the_connection_closes() -> None:
    """Encoded when released: a connection closing meanwhile sends none of them (the
    session requeues what it handed out) and stops waiting for the passive node."""
    storage = _Storage()
    link = _Link()
    session = _Session()
    endpoint = _endpoint(storage, link, session)
    message = Message("", "q", b"m", {}, {"persistent": True})
    message.journal_id = 1
    session.deliveries = [Delivery("c", 1, False, message, "q")]
    endpoint.push()
    assert link.out == b"" and storage.waiters
    link.proto = server_in(ConnState.CLOSED)  # closed meanwhile (the client said close)
    storage.replica.held_id = 1
    for callback in list(storage.waiters):
        callback()
    assert link.out == b"" and not storage.waiters
