"""Publishing: fire-and-forget, confirms, returns, nacks, errors and their correlation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import amqlite
from amqlite.errors import (
    BrokerError,
    ConnectionClosed,
    NotFound,
    PublishNacked,
    PublishReturned,
    ReplyCode,
)
from amqlite.protocol import events as ev

from .fakeserver import FakeBroker

PUBLISH_ARGS = st.fixed_dictionaries(
    {
        "body": st.one_of(
            st.binary(max_size=300),
            st.text(max_size=20),
            st.binary(max_size=20).map(bytearray),
        ),
        "headers": st.one_of(
            st.none(), st.just({}), st.fixed_dictionaries({"h": st.integers(0, 9)})
        ),
        "properties": st.one_of(
            st.none(), st.just({}), st.fixed_dictionaries({"message_id": st.text(max_size=5)})
        ),
        "persistent": st.booleans(),
        "mandatory": st.booleans(),
    }
)


#: half the calls plain (what the fast path takes), half anything
CALLS = st.one_of(st.fixed_dictionaries({"body": st.binary(max_size=300)}), PUBLISH_ARGS)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(CALLS, min_size=1, max_size=12), first_id=st.sampled_from([0, 65530]))
def test_plain_and_general_publishes_agree_in_order(
    calls: list[dict[str, Any]], first_id: int
) -> None:
    """publish() sends a plain publish (bytes, nothing optional) on a fast path
    (Connection.append_plain_publish) and everything else through _queue_publish:
    mixed, in any order and across the 16- to 32-bit id step, the broker gets each
    publish as asked, in order, under consecutive ids."""

    async def main() -> list[ev.Publish]:
        fake = FakeBroker()
        async with trio.open_nursery() as nursery:
            await nursery.start(fake.serve)
            async with amqlite.connect(f"127.0.0.1:{fake.port}") as conn:
                await conn.declare_queue("q")
                conn._next_id += first_id  # ids above 65,535 take the 32-bit lead
                for call in calls:
                    await conn.publish("", "q", **call)
                await conn.status()  # a round trip: every publish came before it
            nursery.cancel_scope.cancel()
        return fake.frames_of(ev.Publish)

    got = trio.run(main)
    want = []
    for call in calls:
        call = {"headers": None, "properties": None, "persistent": False, "mandatory": False} | call
        body = call["body"]
        props = dict(call["properties"] or {})
        if call["persistent"]:
            props["persistent"] = True
        want.append(
            ev.Publish(
                0,
                "",
                "q",
                body.encode() if isinstance(body, str) else bytes(body),
                call["headers"] or {},
                props,
                call["mandatory"],
                False,
            )
        )
    assert [p.id - got[0].id for p in got] == list(range(len(calls)))
    assert [dataclasses.replace(p, id=0) for p in got] == want


async def test_publish_without_confirm_arrives(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await conn.declare_queue("q")
        for i in range(500):
            await conn.publish("", "q", f"m{i}", headers={"i": i}, persistent=(i == 0))
        await fake.wait_for(lambda: len(fake.queues["q"].messages) == 500)
    msgs = list(fake.queues["q"].messages)
    assert [m.body for m in msgs[:2]] == [b"m0", b"m1"]
    assert msgs[0].props == {"persistent": True}
    assert msgs[499].headers == {"i": 499}
    publishes = fake.frames_of(ev.Publish)
    assert len({p.id for p in publishes}) == 500  # every request has its own id
    assert not any(p.confirm for p in publishes)


async def test_confirmed_publish(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await conn.declare_queue("q")
        await conn.publish("", "q", b"x", confirm=True, properties={"message_id": "a"})
        assert len(fake.queues["q"].messages) == 1  # the ok came after routing
        assert conn.unconfirmed == 0


async def test_mandatory_unroutable_is_returned(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        with pytest.raises(PublishReturned) as info:
            await conn.publish("amq.direct", "nowhere", b"x", mandatory=True, confirm=True)
        assert info.value.code == ReplyCode.NO_ROUTE
        # the connection is fine afterwards
        await conn.declare_queue("q")
        await conn.publish("", "q", b"y", mandatory=True, confirm=True)


async def test_mandatory_without_confirm_counts_returns(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        for _ in range(3):
            await conn.publish("amq.direct", "nowhere", b"x", mandatory=True)
        await conn.status()  # a round trip: the returns came before its reply
        assert conn.returned_count == 3


async def test_nacked_confirm(nursery: trio.Nursery) -> None:
    broker = FakeBroker(nack_publishes=True)
    await nursery.start(broker.serve)
    async with amqlite.connect(f"127.0.0.1:{broker.port}") as conn:
        await conn.declare_queue("q")
        with pytest.raises(PublishNacked, match="full"):
            await conn.publish("", "q", b"x", confirm=True)


async def test_error_with_confirm_is_raised_by_that_publish(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        with pytest.raises(NotFound, match="no exchange 'nope'"):
            await conn.publish("nope", "k", b"x", confirm=True)
        assert conn.is_open


async def test_error_without_confirm_surfaces_on_the_next_publish(
    fake: FakeBroker, addr: str
) -> None:
    async with amqlite.connect(addr) as conn:
        await conn.publish("nope", "k", b"x")
        await conn.status()  # round trip: the error has arrived
        with pytest.raises(NotFound, match="no exchange 'nope'"):
            await conn.publish("", "k", b"next")
        await conn.publish("", "k", b"after")  # reported once, then cleared
    assert [p.body for p in fake.frames_of(ev.Publish)] == [b"x", b"after"]


async def test_unreported_error_is_raised_when_the_block_exits(fake: FakeBroker, addr: str) -> None:
    with pytest.raises(NotFound, match="no exchange 'nope'"):
        async with amqlite.connect(addr) as conn:
            await conn.publish("nope", "k", b"x")
    assert not conn.is_open


async def test_failed_ack_surfaces_later(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await conn.ack(999)  # never delivered
        await conn.status()
        with pytest.raises(amqlite.PreconditionFailed, match="unknown delivery tag 999"):
            await conn.wait_for_confirms()


async def test_publish_nowait_window(nursery: trio.Nursery) -> None:
    broker = FakeBroker(hold_confirms=True)
    await nursery.start(broker.serve)
    async with amqlite.connect(f"127.0.0.1:{broker.port}", max_in_flight=3) as conn:
        await conn.declare_queue("q")
        pending = [await conn.publish_nowait("", "q", f"{i}") for i in range(3)]
        assert conn.unconfirmed == 3
        assert not any(p.done for p in pending)
        fourth_sent = trio.Event()

        async def fourth() -> None:
            pending.append(await conn.publish_nowait("", "q", "3"))
            fourth_sent.set()

        nursery.start_soon(fourth)
        await broker.wait_for(lambda: len(broker.held) == 3)
        await trio.testing.wait_all_tasks_blocked()
        assert not fourth_sent.is_set()  # the window is full
        broker.release_confirms(1)
        with trio.fail_after(5):
            await fourth_sent.wait()
        assert pending[0].done and pending[0].error is None
        await broker.wait_for(lambda: len(broker.held) == 3)
        broker.release_confirms()
        with trio.fail_after(5):
            await conn.wait_for_confirms()
        assert all(p.done and p.error is None for p in pending)
        await pending[3].wait()


async def test_wait_for_confirms_raises_first_unseen_failure(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        await conn.declare_queue("q")
        ok = await conn.publish_nowait("", "q", b"a")
        returned = await conn.publish_nowait("amq.direct", "none", b"b", mandatory=True)
        missing = await conn.publish_nowait("nope", "k", b"c")
        with pytest.raises(PublishReturned):
            await conn.wait_for_confirms()
        assert ok.error is None
        assert isinstance(returned.error, PublishReturned)
        assert isinstance(missing.error, NotFound)
        with pytest.raises(NotFound):
            await missing.wait()
        await conn.wait_for_confirms()  # failures are reported once


async def test_body_over_max_frame_fails_before_sending(nursery: trio.Nursery) -> None:
    broker = FakeBroker(max_frame=1000)
    await nursery.start(broker.serve)
    async with amqlite.connect(f"127.0.0.1:{broker.port}") as conn:
        await conn.declare_queue("q")
        with pytest.raises(BrokerError) as info:
            await conn.publish("", "q", b"x" * 1000)
        assert info.value.code == ReplyCode.CONTENT_TOO_LARGE
        with pytest.raises(BrokerError):
            await conn.publish_nowait("", "q", b"x" * 2000)
        await conn.publish("", "q", b"x" * 900, confirm=True)
        assert conn.unconfirmed == 0
    assert [len(p.body) for p in broker.frames_of(ev.Publish)] == [900]


async def test_bad_headers_are_refused_locally(fake: FakeBroker, addr: str) -> None:
    async with amqlite.connect(addr) as conn:
        with pytest.raises(ValueError, match="scalar"):
            await conn.publish("", "q", b"x", headers={"a": [1]})
        with pytest.raises(ValueError, match="unknown property"):
            await conn.publish("", "q", b"x", properties={"colour": "red"})


async def test_pending_confirms_fail_when_the_server_goes(nursery: trio.Nursery) -> None:
    broker = FakeBroker(hold_confirms=True)
    await nursery.start(broker.serve)
    async with amqlite.connect(f"127.0.0.1:{broker.port}") as conn:
        await conn.declare_queue("q")
        p = await conn.publish_nowait("", "q", b"x")
        await broker.wait_for(lambda: len(broker.held) == 1)
        await broker.close_all(320, "shutting down")
        with trio.fail_after(5), pytest.raises(ConnectionClosed, match="shutting down"):
            await p.wait()
        with pytest.raises(ConnectionClosed):
            await conn.publish("", "q", b"y")


async def test_many_publishes_do_not_starve_the_reader(fake: FakeBroker, addr: str) -> None:
    """A tight publish loop yields now and then: confirms keep flowing."""
    async with amqlite.connect(addr, max_in_flight=50) as conn:
        await conn.declare_queue("q")
        for i in range(2000):
            await conn.publish_nowait("", "q", b"%d" % i)
        with trio.fail_after(10):
            await conn.wait_for_confirms()
    assert len(fake.queues["q"].messages) == 2000
