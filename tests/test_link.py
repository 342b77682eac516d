"""amqlite.link over in-memory streams, on trio's mock clock: the handshake and its
failures, heartbeats both ways, a silent peer, the writer's drain and flow control."""

from __future__ import annotations

import errno

import pytest
import trio
import trio.testing

from amqlite.errors import AmqliteError, ReplyCode
from amqlite.link import DialFailed, FramedLink, dial, open_link
from amqlite.protocol import NEED_DATA, Connection, ConnState, Role
from amqlite.protocol import events as ev

HELLO = ev.Hello(1, heartbeat=1.0)


class Peer:
    """The server end of a memory stream, driven by hand through its own protocol
    connection."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.proto = Connection(Role.SERVER)
        self.events: list[ev.Event] = []

    async def send(self, event: ev.Event) -> None:
        await self.stream.send_all(self.proto.send(event))

    async def next(self) -> ev.Event:
        """The next event that is not a heartbeat (recorded with the rest)."""
        while True:
            event = self.proto.next_event()
            if event is NEED_DATA:
                self.proto.receive_data(await self.stream.receive_some(65536))
                continue
            assert isinstance(event, ev.Event)
            self.events.append(event)
            if type(event) is not ev.Heartbeat:
                return event

    async def read_all(self) -> None:
        """Read (and record) until the end of the stream."""
        while type(await self.next()) is not ev.EndOfStream:
            pass

    def heartbeats(self) -> int:
        return sum(type(e) is ev.Heartbeat for e in self.events)


async def _opened(nursery: trio.Nursery, **link_args: object) -> tuple[FramedLink, Peer]:
    """A client link past its handshake, and the peer at the other end."""
    ours, theirs = trio.testing.memory_stream_pair()
    peer = Peer(theirs)

    async def welcome() -> None:
        assert await peer.next() == HELLO
        await peer.send(ev.Welcome(1, heartbeat=1.0))

    nursery.start_soon(welcome)
    link, welcome_event = await open_link(ours, HELLO, remote_address="memory")
    assert welcome_event.heartbeat == 1.0
    for name, value in link_args.items():
        setattr(link, name, value)
    return link, peer


async def _read_until_end(link: FramedLink) -> None:
    while await link.receive():
        link.proto.events()


# --- the handshake ------------------------------------------------------------------------


async def test_refused_raises_with_the_servers_code_and_text() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    peer = Peer(theirs)

    async def refuse() -> None:
        await peer.next()
        await peer.send(ev.Refused(1, ReplyCode.ACCESS_REFUSED, "bad login"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(refuse)
        with pytest.raises(DialFailed) as info:
            await open_link(ours, HELLO)
    assert info.value.refused
    assert (info.value.code, info.value.text) == (ReplyCode.ACCESS_REFUSED, "bad login")


async def test_end_of_stream_during_the_handshake_raises() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    peer = Peer(theirs)

    async def hang_up() -> None:
        await peer.next()
        await theirs.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hang_up)
        with pytest.raises(DialFailed, match="closed the connection during the handshake") as info:
            await open_link(ours, HELLO)
    assert not info.value.refused
    assert info.value.code == ReplyCode.CONNECTION_FORCED


async def test_a_close_or_garbage_during_the_handshake_raises() -> None:
    for reply, match in ((ev.Close(530, "go away"), "go away"), (None, "protocol error")):
        ours, theirs = trio.testing.memory_stream_pair()
        peer = Peer(theirs)

        async def answer(peer: Peer = peer, reply: ev.Event | None = reply) -> None:
            await peer.next()
            if reply is None:
                await peer.stream.send_all(b"\x00\x00\x00\x01\x01")  # not a map
            else:
                await peer.send(reply)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer)
            with pytest.raises(DialFailed, match=match):
                await open_link(ours, HELLO)


async def test_dial_times_out_and_closes_the_stream(autojump_clock: trio.testing.MockClock) -> None:
    ours, _theirs = trio.testing.memory_stream_pair()

    async def open_stream(host: str, port: int) -> trio.abc.Stream:
        return ours

    start = trio.current_time()
    with pytest.raises(DialFailed, match=r"no answer within 2s"):
        await dial("h", 1, HELLO, timeout=2.0, open_stream=open_stream)
    assert trio.current_time() - start == pytest.approx(2.0)
    with pytest.raises(trio.ClosedResourceError):
        await ours.send_all(b"x")


async def test_dial_reports_an_unreachable_address() -> None:
    async def open_stream(host: str, port: int) -> trio.abc.Stream:
        raise OSError(errno.ECONNREFUSED, "Connection refused")

    with pytest.raises(DialFailed, match="connection refused"):
        await dial("h", 1, HELLO, open_stream=open_stream)


async def test_dial_keeps_what_came_after_the_welcome() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    peer = Peer(theirs)

    async def welcome_and_more() -> None:
        await peer.next()
        data = peer.proto.send(ev.Welcome(1)) + peer.proto.send(ev.Ok(7))
        await theirs.send_all(data)

    async def open_stream(host: str, port: int) -> trio.abc.Stream:
        return ours

    async with trio.open_nursery() as nursery:
        nursery.start_soon(welcome_and_more)
        link, _ = await dial("h", 1, HELLO, open_stream=open_stream)
    assert link.proto.state is ConnState.OPEN
    assert link.proto.events() == [ev.Ok(7)]
    assert link.remote_address == "h:1"


# --- heartbeats ---------------------------------------------------------------------------


async def test_heartbeats_go_out_when_quiet(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        link, peer = await _opened(nursery)
        link.start_heartbeat(1.0, misses=100)
        nursery.start_soon(link.run, lambda: _read_until_end(link))
        nursery.start_soon(peer.read_all)
        await trio.sleep(5.5)
        assert peer.heartbeats() == 5
        link.send(ev.Status(2))  # sending resets the quiet interval
        await trio.sleep(0.9)
        assert peer.heartbeats() == 5
        await trio.sleep(0.2)
        assert peer.heartbeats() == 6
        nursery.cancel_scope.cancel()


async def test_a_silent_peer_is_declared_dead(autojump_clock: trio.testing.MockClock) -> None:
    lost: list[AmqliteError] = []
    async with trio.open_nursery() as nursery:
        link, peer = await _opened(nursery, on_lost=lost.append)
        link.start_heartbeat(1.0, misses=3)
        start = trio.current_time()
        nursery.start_soon(peer.read_all)  # reads, never answers
        await link.run(lambda: _read_until_end(link))
        assert trio.current_time() - start == pytest.approx(3.0)
    assert link.dead and link.error is not None
    assert "sent nothing for 3s (heartbeat timeout)" in link.error.text
    assert lost == [link.error]
    assert peer.heartbeats() == 2  # at 1s and 2s


async def test_a_talking_peer_stays_alive(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        link, peer = await _opened(nursery)
        link.start_heartbeat(1.0, misses=3)
        nursery.start_soon(link.run, lambda: _read_until_end(link))
        nursery.start_soon(peer.read_all)
        for _ in range(10):
            await trio.sleep(0.9)
            await peer.send(ev.Heartbeat())
        assert not link.dead
        nursery.cancel_scope.cancel()


async def test_no_handshake_in_time_fails_the_link(autojump_clock: trio.testing.MockClock) -> None:
    ours, _theirs = trio.testing.memory_stream_pair()
    link = FramedLink(ours, Connection(Role.SERVER), remote_address="p", handshake_timeout=10.0)
    await link.run(lambda: _read_until_end(link))
    assert link.error is not None and "no handshake from p within 10s" in link.error.text
    assert trio.current_time() == pytest.approx(10.0)


# --- writing and closing ------------------------------------------------------------------


async def test_the_writer_drains_when_the_reader_ends() -> None:
    async with trio.open_nursery() as nursery:
        link, peer = await _opened(nursery)
        for i in range(100):
            link.send(ev.Status(i + 2))

        async def reader() -> None:
            pass  # ends at once: run drains the writer and closes the stream

        await link.run(reader)
        await peer.read_all()
    assert [e for e in peer.events if type(e) is ev.Status] == [
        ev.Status(i + 2) for i in range(100)
    ]
    assert peer.events[-1] == ev.EndOfStream()
    assert link.flushed


async def test_close_sends_what_is_queued_then_ends_the_reader() -> None:
    async with trio.open_nursery() as nursery:
        link, peer = await _opened(nursery)
        nursery.start_soon(peer.read_all)

        async def reader() -> None:
            link.send(ev.Close(200, "bye"))
            link.close()
            await _read_until_end(link)

        await link.run(reader)
    assert peer.events[-2:] == [ev.Close(200, "bye"), ev.EndOfStream()]
    assert link.error is None  # closing is not a failure


async def test_before_flush_runs_before_each_send() -> None:
    async with trio.open_nursery() as nursery:
        link, peer = await _opened(nursery)
        added: list[int] = []

        def add_status() -> None:  # what the client does with its marked acks
            if not added:
                added.append(1)
                link.out += link.proto.send(ev.Status(99))

        link.before_flush = add_status
        nursery.start_soon(link.run, lambda: _read_until_end(link))
        link.kick()
        with trio.fail_after(5):
            assert await peer.next() == ev.Status(99)
        nursery.cancel_scope.cancel()


async def test_flow_control_with_a_slow_reader() -> None:
    """Above high_water a publisher waits; on_drained says when the queue is low."""
    ours, theirs = trio.testing.lockstep_stream_pair()
    proto = Connection(Role.CLIENT)
    proto._state = ConnState.OPEN  # the handshake is tested above
    drained: list[int] = []
    link = FramedLink(ours, proto, high_water=1000, low_water=100)
    link.on_drained = lambda: drained.append(link.pending)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run, lambda: _read_until_end(link))
        for _ in range(3):
            link.send_bytes(b"x" * 600)
            await trio.testing.wait_all_tasks_blocked()  # the writer takes the first 600
        assert link.pending == 1800 and len(link.out) == 1200
        waited = False

        async def publisher() -> None:
            nonlocal waited
            await link.wait_writable()
            waited = True

        nursery.start_soon(publisher)
        await trio.testing.wait_all_tasks_blocked()
        assert not waited
        received = 0
        while received < 1800:
            received += len(await theirs.receive_some(10000))
        await trio.testing.wait_all_tasks_blocked()
        assert waited and link.flushed
        assert drained and drained[-1] == 0
        await link.wait_flushed()
        nursery.cancel_scope.cancel()


async def test_a_broken_stream_fails_the_link_once() -> None:
    lost: list[AmqliteError] = []
    async with trio.open_nursery() as nursery:
        link, peer = await _opened(nursery, on_lost=lost.append)
        await peer.stream.aclose()

        async def reader() -> None:
            link.send(ev.Status(2))  # the writer finds the stream broken
            await trio.sleep_forever()  # aborted with the link

        with trio.fail_after(5):
            await link.run(reader)
    assert link.dead and link.error is not None
    assert link.error.text.startswith("connection to memory lost")
    assert lost == [link.error]


async def test_the_end_of_the_stream_is_the_readers_to_report() -> None:
    lost: list[AmqliteError] = []
    async with trio.open_nursery() as nursery:
        link, peer = await _opened(nursery, on_lost=lost.append)
        await peer.stream.aclose()
        await link.run(lambda: _read_until_end(link))
    assert link.error is None and lost == []
    assert link.proto.events() == [ev.EndOfStream()]


async def test_abort_before_run_closes_the_stream() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    link = FramedLink(ours, Connection(Role.CLIENT))
    link.abort()
    await link.run(lambda: _read_until_end(link))
    assert await theirs.receive_some(10) == b""
