"""``blocked`` / ``unblocked`` from the server: publishes wait, other calls go on."""

from __future__ import annotations

import trio
import trio.testing

import amqlite
from amqlite.errors import ConnectionClosed
from amqlite.protocol import events as ev

from .fakeserver import FakeBroker


async def test_publishes_wait_while_blocked(fake: FakeBroker, addr: str) -> None:
    seen: list[str] = []
    async with amqlite.connect(addr) as conn:
        conn.on_blocked = lambda reason: seen.append(f"blocked: {reason}")
        conn.on_unblocked = lambda: seen.append("unblocked")
        await conn.declare_queue("q")
        assert not conn.blocked and conn.blocked_reason == ""
        (session,) = fake.sessions
        session.send(ev.Blocked("low on memory"))
        await conn.status()  # a round trip: the blocked came before its reply
        assert conn.blocked and conn.blocked_reason == "low on memory"
        assert seen == ["blocked: low on memory"]

        published = trio.Event()

        async def publish() -> None:
            await conn.publish("", "q", b"held")
            await conn.publish("", "q", b"confirmed", confirm=True)
            published.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish)
            await conn.declare_queue("other")  # requests other than publish go on
            await conn.status()
            assert not published.is_set()
            assert fake.frames_of(ev.Publish) == []  # nothing was sent while blocked
            session.send(ev.Unblocked())
            with trio.fail_after(5):
                await published.wait()
        assert not conn.blocked and conn.blocked_reason == ""
        assert seen == ["blocked: low on memory", "unblocked"]
        assert [m.body for m in fake.queues["q"].messages] == [b"held", b"confirmed"]


async def test_a_blocked_publish_raises_when_the_connection_closes(
    fake: FakeBroker, addr: str
) -> None:
    async with amqlite.connect(addr) as conn:
        await conn.declare_queue("q")
        fake.sessions[0].send(ev.Blocked("low on disk"))
        await conn.status()
        assert conn.blocked_reason == "low on disk"
        raised: list[BaseException] = []

        async def publish() -> None:
            try:
                await conn.publish("", "q", b"x")
            except ConnectionClosed as exc:
                raised.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish)
            await trio.testing.wait_all_tasks_blocked()
            assert not raised
            await fake.close_all(code=530, text="go away")  # not worth a reconnect
        assert len(raised) == 1 and "go away" in str(raised[0])
        assert not conn.blocked
        assert fake.frames_of(ev.Publish) == []
