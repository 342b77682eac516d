"""Reconnecting, on an in-memory network of fake brokers and a virtual clock:
backoff and address order, restoring topology, consumers and unanswered requests,
stale delivery tags, giving up, and the ways a reconnect does not happen."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import amqlite
from amqlite.client import Disconnected, Reconnected, ReconnectPolicy
from amqlite.errors import ConnectionClosed, ReplyCode
from amqlite.protocol import events as ev

from .fakeserver import FakeBroker
from .memnet import MemoryNetwork

PRIMARY, BACKUP, THIRD = 1, 2, 3
SERVERS = f"127.0.0.1:{PRIMARY},127.0.0.1:{BACKUP}"


@pytest.fixture
def net(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> MemoryNetwork:
    network = MemoryNetwork(nursery)
    network.install(monkeypatch)
    return network


def _broker(net: MemoryNetwork, port: int, **knobs: Any) -> FakeBroker:
    broker = FakeBroker(**knobs)
    net.node(port, broker)
    return broker


class _Reconnects:
    """Collects on_disconnect / on_reconnect notifications; ``await next()`` waits
    (bounded) for the next reconnect."""

    def __init__(self, conn: amqlite.Connection) -> None:
        self.events: list[Disconnected | Reconnected] = []
        self._back = trio.Event()
        conn.on_disconnect = self.events.append
        conn.on_reconnect = self._on_reconnect

    def _on_reconnect(self, event: Reconnected) -> None:
        self.events.append(event)
        self._back.set()

    async def next(self, limit: float = 30.0) -> Reconnected:
        with trio.fail_after(limit):
            await self._back.wait()
        self._back = trio.Event()
        last = self.events[-1]
        assert isinstance(last, Reconnected)
        return last


def _frames(broker: FakeBroker) -> list[tuple[Any, ...]]:
    """What the broker's latest session received, in short."""
    out: list[tuple[Any, ...]] = []
    for f in broker.sessions[-1].frames:
        if isinstance(f, ev.ExchangeDeclare):
            out.append(("exchange", f.exchange))
        elif isinstance(f, ev.QueueDeclare):
            out.append(("queue", f.queue, f.exclusive))
        elif isinstance(f, ev.QueueBind):
            out.append(("bind", f.queue, f.exchange, f.key))
        elif isinstance(f, ev.Consume):
            out.append(("consume", f.queue, f.tag, f.prefetch))
        elif isinstance(f, ev.Publish):
            out.append(("publish", f.id, f.body))
        elif not isinstance(f, ev.Hello | ev.Heartbeat):
            out.append((type(f).__name__,))
    return out


# --- dialling: order, backoff, giving up ------------------------------------------------


async def test_failover_dials_primary_first_with_jittered_backoff(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork
) -> None:
    _broker(net, PRIMARY, name="primary")
    # a passive backup: refuses (360) until four client votes have promoted it
    _broker(net, BACKUP, name="backup", refuse=ReplyCode.NOT_ACTIVE, refuse_first=4)
    async with amqlite.connect(SERVERS) as conn:
        assert conn.reconnect_policy == ReconnectPolicy()  # a list: on by default
        assert conn.server_name == "primary"
        seen = _Reconnects(conn)
        net.dials.clear()
        cut_at = trio.current_time()
        await net.cut(PRIMARY)
        back = await seen.next()
        assert conn.server_name == "backup" and conn.connected and conn.reconnects == 1
        assert [port for _, port in net.dials] == [PRIMARY, BACKUP] * 5
        starts = net.passes(PRIMARY)
        assert starts[0] == pytest.approx(cut_at, abs=1e-9)  # the first pass at once
        policy = ReconnectPolicy()
        for n in range(1, 5):
            gap = starts[n] - starts[n - 1]
            assert policy.cap(n) / 2 <= gap <= policy.cap(n), (n, gap)
        lost = seen.events[0]
        assert isinstance(lost, Disconnected) and lost.address.port == PRIMARY
        assert "closed the connection" in lost.error.text
        assert (back.address.port, back.previous.port) == (BACKUP, PRIMARY)
        assert (back.attempts, back.reconnects, back.resent) == (5, 1, 0)
        assert back.downtime == pytest.approx(starts[4] - cut_at, abs=1e-9)

        # the primary is back (and the backup goes): the first address is tried first
        _broker(net, PRIMARY, name="primary again")
        net.dials.clear()
        await net.cut(BACKUP)
        await seen.next()
        assert conn.server_name == "primary again"
        assert [port for _, port in net.dials] == [PRIMARY]


async def test_give_up_deadline_fails_everything_with_a_clear_error(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork, nursery: trio.Nursery
) -> None:
    primary = _broker(net, PRIMARY, hold_confirms=True)
    net.node(BACKUP, None)
    policy = ReconnectPolicy(give_up_after=5)
    async with amqlite.connect(SERVERS, reconnect=policy) as conn:
        await conn.declare_queue("q")
        consumer = await conn.consume("q")
        pending = await conn.publish_nowait("", "q", b"x")
        failed: list[BaseException] = []

        async def confirmed_publish() -> None:
            try:
                await conn.publish("", "q", b"y", confirm=True)
            except ConnectionClosed as exc:
                failed.append(exc)

        nursery.start_soon(confirmed_publish)
        await primary.wait_for(lambda: len(primary.held) == 2)
        cut_at = trio.current_time()
        await net.cut(PRIMARY)
        gave_up = (
            r"gave up reconnecting after 5s \(\d+ attempts\): cannot connect to "
            r"127\.0\.0\.1:1 \(connection refused\), 127\.0\.0\.1:2 \(connection refused\)"
        )
        with trio.fail_after(60), pytest.raises(ConnectionClosed, match=gave_up):
            await pending.wait()
        assert trio.current_time() - cut_at == pytest.approx(5.0, abs=1e-6)
        await trio.testing.wait_all_tasks_blocked()
        assert len(failed) == 1 and "gave up" in str(failed[0])
        with pytest.raises(ConnectionClosed, match="gave up"):
            await consumer.__anext__()
        with pytest.raises(ConnectionClosed, match="gave up"):
            await conn.publish("", "q", b"z")
        assert conn.state == "closed" and not conn.is_open
        dials = len(net.dials)
        await trio.sleep(10)  # virtual time: nothing dials any more
        assert len(net.dials) == dials


async def test_a_bad_login_on_reconnect_is_final(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork
) -> None:
    _broker(net, PRIMARY)
    _broker(net, BACKUP, refuse=ReplyCode.ACCESS_REFUSED)
    async with amqlite.connect(SERVERS) as conn:
        await net.cut(PRIMARY)
        with trio.fail_after(5), pytest.raises(ConnectionClosed, match="cannot reconnect") as info:
            await conn.status()
        assert info.value.code == ReplyCode.ACCESS_REFUSED
        assert len(net.passes(BACKUP)) == 1


# --- restoring -------------------------------------------------------------------------


async def test_reconnect_redeclares_resumes_and_resends(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork, nursery: trio.Nursery
) -> None:
    a = _broker(net, PRIMARY, name="a", hold_confirms=True)
    b = _broker(net, BACKUP, name="b")
    async with amqlite.connect(SERVERS) as conn:
        seen = _Reconnects(conn)
        await conn.declare_exchange("ev", "topic")
        await conn.declare_queue("jobs")
        tmp = (await conn.declare_queue("", exclusive=True)).name
        await conn.bind("jobs", "ev", "a.b")  # the fake matches topic keys exactly
        await conn.bind(tmp, "amq.fanout")
        await conn.declare_queue("gone")
        await conn.delete_queue("gone")
        await conn.bind("jobs", "amq.direct", "x")
        await conn.unbind("jobs", "amq.direct", "x")
        consumer = await conn.consume("jobs", prefetch=10)
        tag = consumer.tag
        pending = [await conn.publish_nowait("ev", "a.b", b"%d" % i) for i in range(3)]
        done = trio.Event()

        async def confirmed_publish() -> None:
            await conn.publish("ev", "a.b", b"3", confirm=True)  # waits across the cut
            done.set()

        nursery.start_soon(confirmed_publish)
        await a.wait_for(lambda: len(a.held) == 4)
        sent_ids = [p.id for p in a.frames_of(ev.Publish)]
        await net.cut(PRIMARY)
        back = await seen.next()
        with trio.fail_after(10):
            await conn.wait_for_confirms()
            await done.wait()
        assert all(p.done and p.error is None for p in pending)
        assert back.resent == 4
        # the same ids under the same instance token: a broker can tell them again
        hellos = [a.sessions[-1].client_hello, b.sessions[-1].client_hello]
        assert hellos[0] is not None and hellos[1] is not None
        assert len(hellos[0].instance) == 16 and hellos[0].instance == hellos[1].instance
        assert _frames(b) == [
            ("exchange", "ev"),
            ("queue", "jobs", False),
            ("queue", tmp, True),
            ("bind", "jobs", "ev", "a.b"),
            ("bind", tmp, "amq.fanout", ""),
            ("consume", "jobs", tag, 10),
            *[("publish", rid, b"%d" % i) for i, rid in enumerate(sent_ids)],
        ]
        got = []
        with trio.fail_after(10):
            async for d in consumer:
                got.append((d.body, d.consumer_tag, d.redelivered))
                await d.ack()
                if len(got) == 4:
                    break
        # A's deliveries were dropped with A; B delivers what was sent again
        assert got == [(b"%d" % i, tag, False) for i in range(4)]
        assert consumer.tag == tag and consumer.active


async def test_requests_in_flight_or_made_while_down_are_answered_after(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork, nursery: trio.Nursery
) -> None:
    a = _broker(net, PRIMARY, name="a", ignore=(ev.Status,))
    b = _broker(net, BACKUP, name="b", refuse=ReplyCode.NOT_ACTIVE, refuse_first=2)
    async with amqlite.connect(SERVERS) as conn:
        seen = _Reconnects(conn)
        answers: dict[str, Any] = {}
        answered = trio.Event()

        async def ask_status() -> None:
            answers["status"] = await conn.status()

        async def declare_while_down() -> None:
            await trio.testing.wait_all_tasks_blocked()
            assert conn.state == "reconnecting"
            answers["declared"] = await conn.declare_queue("late")
            answered.set()

        nursery.start_soon(ask_status)
        await a.wait_for(lambda: bool(a.frames_of(ev.Status)))
        asked = a.frames_of(ev.Status)[0].id
        await net.cut(PRIMARY)
        nursery.start_soon(declare_while_down)
        await seen.next()
        with trio.fail_after(10):
            await answered.wait()
        assert answers["status"]["node_id"] == "b"
        assert [f.id for f in b.frames_of(ev.Status)] == [asked]  # the same request, again
        assert answers["declared"].name == "late" and "late" in b.queues


async def test_stale_deliveries_are_never_acked_on_the_new_link(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork
) -> None:
    a = _broker(net, PRIMARY, name="a")
    net.node(BACKUP, None)
    async with amqlite.connect(SERVERS) as conn:
        seen = _Reconnects(conn)
        await conn.declare_queue("q")
        for i in (1, 2, 3):
            await conn.publish("", "q", b"m%d" % i)
        consumer = await conn.consume("q", prefetch=2)
        d1 = await consumer.__anext__()
        d2 = await consumer.__anext__()
        assert (d1.body, d1.delivery_tag, d2.body, d2.delivery_tag) == (b"m1", 1, b"m2", 2)
        await d1.ack()
        await conn.status()  # the ack went out, and m3 came (tag 3, still buffered)
        assert not d2.stale and consumer.buffered == 1
        await net.cut(PRIMARY, down=False)  # the same server takes us back at once
        await seen.next()
        # the new link delivers m2 again as its tag 1 and m3 as its tag 2: acking the
        # old m2 (tag 2) must not ack m3; the application sees tags 4 and 5
        assert d2.stale  # (and the old link's m3, still buffered, was dropped)
        await d2.ack()
        await conn.ack(2)
        await d2.nack()
        again = await consumer.__anext__()
        m3 = await consumer.__anext__()
        assert (again.body, again.redelivered, again.delivery_tag) == (b"m2", True, 4)
        assert (m3.body, m3.redelivered, m3.delivery_tag) == (b"m3", True, 5)
        assert not again.stale and not m3.stale
        await again.ack()
        await conn.status()
        settles = [f for f in a.sessions[-1].frames if isinstance(f, ev.Ack | ev.Nack)]
        assert [(type(f).__name__, f.dtag) for f in settles] == [("Ack", 1)]
        unacked = [m.body for s in a.sessions for _, m, _ in s.unacked.values()]
        assert unacked == [b"m3"]


async def test_a_restore_cut_short_starts_over(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork
) -> None:
    _broker(net, PRIMARY, name="a")
    b = _broker(net, BACKUP, name="b", ignore=(ev.Consume,))  # never resumes consumers
    c = _broker(net, THIRD, name="c")
    async with amqlite.connect(f"{SERVERS},127.0.0.1:{THIRD}") as conn:
        seen = _Reconnects(conn)
        await conn.declare_queue("q")
        consumer = await conn.consume("q")
        await net.cut(PRIMARY)
        await b.wait_for(lambda: bool(b.frames_of(ev.Consume)))
        assert conn.state == "reconnecting" and not conn.connected
        await net.cut(BACKUP)
        back = await seen.next()
        assert conn.server_name == "c" and back.previous.port == PRIMARY
        assert _frames(c) == [("queue", "q", False), ("consume", "q", consumer.tag, 100)]
        await conn.publish("", "q", b"x")
        with trio.fail_after(5):
            d = await consumer.__anext__()
        assert d.body == b"x" and conn.reconnects == 1


async def test_an_exclusive_queue_still_held_by_the_old_session_is_retried(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork
) -> None:
    _broker(net, PRIMARY, name="a")
    b = _broker(net, BACKUP, name="b", locked={"mine": 2})  # 405 twice, then free
    async with amqlite.connect(SERVERS) as conn:
        seen = _Reconnects(conn)
        await conn.declare_queue("mine", exclusive=True)
        await net.cut(PRIMARY)
        back = await seen.next()
        assert back.attempts == 3 and b.connects == 3
        assert ("queue", "mine", True) in _frames(b)


async def test_a_no_ack_consumer_keeps_what_it_buffered(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork
) -> None:
    a = _broker(net, PRIMARY, name="a")
    net.node(BACKUP, None)
    async with amqlite.connect(SERVERS) as conn:
        seen = _Reconnects(conn)
        await conn.declare_queue("q")
        consumer = await conn.consume("q", no_ack=True)
        for i in range(3):
            await conn.publish("", "q", b"%d" % i)
        await a.wait_for(lambda: not a.queues["q"].messages)
        await conn.status()
        assert consumer.buffered == 3
        await net.cut(PRIMARY, down=False)
        await seen.next()
        assert [(await consumer.__anext__()).body for _ in range(3)] == [b"0", b"1", b"2"]


async def test_server_shutdown_320_reconnects_a_frame_error_does_not(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork
) -> None:
    a = _broker(net, PRIMARY, name="a")
    net.node(BACKUP, None)
    async with amqlite.connect(SERVERS) as conn:
        seen = _Reconnects(conn)
        await conn.declare_queue("q")
        await a.close_all(ReplyCode.CONNECTION_FORCED, "server shutting down")
        back = await seen.next()
        assert back.address.port == PRIMARY
        assert any(isinstance(f, ev.CloseOk) for f in a.sessions[0].frames)  # answered
        await conn.status()
        await a.close_all(ReplyCode.FRAME_ERROR, "bad frame")
        with trio.fail_after(5), pytest.raises(ConnectionClosed, match="501 FRAME_ERROR"):
            await conn.status()
        assert conn.reconnects == 1 and conn.state == "closed"


# --- when there is no reconnect --------------------------------------------------------


async def test_one_address_or_reconnect_false_means_no_reconnect(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork
) -> None:
    _broker(net, PRIMARY)
    _broker(net, BACKUP)
    for servers, reconnect in ((f"127.0.0.1:{PRIMARY}", None), (SERVERS, False)):
        async with amqlite.connect(servers, reconnect=reconnect) as conn:
            assert conn.reconnect_policy is None
            await net.cut(PRIMARY, down=False)
            with trio.fail_after(5), pytest.raises(ConnectionClosed, match="closed the connection"):
                await conn.status()
            assert conn.state == "closed"


async def test_closing_while_reconnecting_stops_it(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork, nursery: trio.Nursery
) -> None:
    primary = _broker(net, PRIMARY, hold_confirms=True)
    net.node(BACKUP, None)
    async with amqlite.connect(SERVERS, reconnect=ReconnectPolicy(give_up_after=None)) as conn:
        await conn.declare_queue("q")
        pending = await conn.publish_nowait("", "q", b"x")
        await primary.wait_for(lambda: len(primary.held) == 1)
        await net.cut(PRIMARY)
        await trio.sleep(30)  # virtual time: it keeps trying, never gives up
        assert conn.state == "reconnecting" and conn.is_open and not pending.done
        await conn.aclose()
        assert conn.state == "closed"
        with pytest.raises(ConnectionClosed, match="closed by the client"):
            await pending.wait()
        dials = len(net.dials)
        await trio.sleep(30)
        assert len(net.dials) == dials


async def test_a_consumer_resumes_with_its_selector(
    autojump_clock: trio.testing.MockClock, net: MemoryNetwork
) -> None:
    a = _broker(net, PRIMARY, name="a")
    b = _broker(net, BACKUP, name="b")
    async with amqlite.connect(SERVERS) as conn:
        seen = _Reconnects(conn)
        await conn.declare_queue("q")
        consumer = await conn.consume("q", selector="region = 'eu'")
        [first] = a.frames_of(ev.Consume)
        assert first.selector == "region = 'eu'"
        await net.cut(PRIMARY)
        await seen.next()
        [resumed] = b.frames_of(ev.Consume)
        assert (resumed.tag, resumed.selector) == (consumer.tag, "region = 'eu'")
