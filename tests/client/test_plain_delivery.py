"""A PlainDelivery (read from a deliver map in its usual shape) reads and settles as
the Delivery of the event the checked decoder makes from the same map."""

from __future__ import annotations

from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st

from amqlite.client.consumer import Consumer, Subscriptions
from amqlite.client.delivery import Delivery, PlainDelivery, RunDelivery
from amqlite.protocol import ConnState, codec
from amqlite.protocol import events as ev

from ..protocol.wire import client_in, frame

FIELDS = ("body", "exchange", "routing_key", "headers", "properties", "redelivered", "offset")
FIELDS += ("delivery_tag", "consumer_tag", "queue", "settled", "stale")

MAPS = st.fixed_dictionaries(
    {
        "m": st.just("deliver"),
        "ctag": st.text(max_size=8),
        "dtag": st.integers(1, 2**63 - 1),
        "exchange": st.text(max_size=8),
        "key": st.text(max_size=8),
        "body": st.binary(max_size=64),
    },
    optional={  # a grouped message's map carries its properties
        "props": st.fixed_dictionaries(
            {}, optional={"group_id": st.text(max_size=8), "priority": st.integers(0, 9)}
        )
    },
)


class Recorder:
    """Stands in for the connection's Settler: records what a delivery asks of it."""

    tag_base = 0

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def ack_one(self, dtag: int) -> None:
        self.calls.append(("ack", dtag))

    def settle(self, dtag: int, *, requeue: bool, reject: bool) -> None:
        self.calls.append(("settle", dtag, requeue, reject))


def both(m: dict[str, Any], settler: Any, no_ack: bool) -> tuple[Delivery, Delivery]:
    conn = client_in(ConnState.OPEN)
    conn.receive_data(frame(m))
    assert conn.events_with_deliver_maps() == [m]  # the usual shape: handed on as it is
    event = codec.event_from_map(ev.Deliver, m)
    plain = PlainDelivery(settler, m, m["dtag"] + 7, "c1", "q", no_ack)
    general = Delivery(settler, event, m["dtag"] + 7, "c1", "q", no_ack)
    return plain, general


@given(m=MAPS, no_ack=st.booleans())
def test_a_plain_delivery_reads_as_the_checked_one(m: dict[str, Any], no_ack: bool) -> None:
    plain, general = both(m, None, no_ack)
    for name in FIELDS:
        assert getattr(plain, name) == getattr(general, name), name
    assert plain.text("latin-1") == general.text("latin-1")
    assert repr(plain) == repr(general)
    # the headers and properties are the application's own, as on a Delivery
    plain.headers["x"] = 1
    assert plain.headers == {"x": 1} and PlainDelivery(None, m, 1, "", "", True).headers == {}


@given(m=MAPS, how=st.sampled_from(["ack", "nack", "nack-drop", "reject"]), no_ack=st.booleans())
def test_a_plain_delivery_settles_as_the_checked_one(
    m: dict[str, Any], how: str, no_ack: bool
) -> None:
    seen = []
    for i in range(2):
        recorder = Recorder()
        d = both(m, recorder, no_ack)[i]
        settle = {
            "ack": d.ack,
            "nack": d.nack,
            "nack-drop": lambda d=d: d.nack(requeue=False),
            "reject": d.reject,
        }[how]
        trio.run(settle)
        trio.run(settle)  # a second settle is a no-op
        seen.append((recorder.calls, d.settled))
    assert seen[0] == seen[1]
    assert seen[0][1] is True and (seen[0][0] == [] if no_ack else len(seen[0][0]) == 1)


class _Host:
    is_open = True
    close_timeout = 1.0


async def _no_cancel(c: Consumer) -> None:
    return None


def _consumer(settler: Any, no_ack: bool) -> Consumer:
    return Consumer(
        _Host(), _no_cancel, "q", tag="c1", prefetch=0, no_ack=no_ack, exclusive=False,
        arguments={}, settler=settler,
    )  # fmt: skip


@given(
    maps=st.lists(MAPS, max_size=6),
    no_ack=st.booleans(),
    handed=st.integers(0, 6),
    rename_at=st.integers(0, 6),
    base=st.integers(0, 1000),
)
def test_a_consumer_hands_out_a_pushed_map_as_the_pushed_delivery(
    maps: list[dict[str, Any]], no_ack: bool, handed: int, rename_at: int, base: int
) -> None:
    """Consumer.push_map (the reader's per-message path: the delivery built when
    handed out) against push of the PlainDelivery built at once: the same
    deliveries, in order, before and after a queue rename, and the same dropped
    buffer on finish."""
    settler = Recorder()
    settler.tag_base = base // 2
    lazy, eager = _consumer(settler, no_ack), _consumer(settler, no_ack)
    subs = Subscriptions()
    subs["c1"] = lazy
    eager_subs = Subscriptions()
    eager_subs["c1"] = eager
    got: list[list[Delivery]] = [[], []]

    async def main() -> None:
        for i, m in enumerate(maps):
            if i == rename_at:
                subs.rename_queue("q", "q2")
                eager_subs.rename_queue("q", "q2")
            dtag = m["dtag"] + base
            lazy.push_map(dict(m), dtag)
            eager.push(PlainDelivery(settler, dict(m), dtag, eager.tag, eager.queue, no_ack))
        for _ in range(min(handed, len(maps))):
            got[0].append(await lazy.__anext__())
            got[1].append(await eager.__anext__())

    trio.run(main)
    assert lazy.buffered == eager.buffered
    got[0] += lazy.finish(None, drop_buffer=True)
    got[1] += eager.finish(None, drop_buffer=True)
    assert len(got[0]) == len(got[1]) == len(maps)
    for a, b in zip(got[0], got[1], strict=True):
        assert type(a) is type(b) is PlainDelivery
        for name in FIELDS:
            assert getattr(a, name) == getattr(b, name), name
        assert repr(a) == repr(b)


RUN_MAPS = st.lists(
    st.fixed_dictionaries({"dtag": st.integers(1, 2**32), "body": st.binary(max_size=16)}),
    max_size=6,
)


@given(
    runs=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    ("", "q", None),
                    ("ex", "k", None),
                    ("", "q", {"persistent": True}),
                    ("ex", "k", {"group_id": "g", "priority": 3}),
                ]
            ),
            RUN_MAPS,
        ),
        max_size=4,
    ),
    no_ack=st.booleans(),
    handed=st.integers(0, 20),
    rename_at=st.integers(0, 4),
    base=st.integers(0, 1000),
    how=st.sampled_from(["ack", "nack", "reject"]),
)
def test_a_consumer_hands_out_a_pushed_run_as_the_pushed_maps(
    runs: list[tuple[tuple[str, str, dict[str, Any] | None], list[dict[str, Any]]]],
    no_ack: bool,
    handed: int,
    rename_at: int,
    base: int,
    how: str,
) -> None:
    """Consumer.push_run (a protocol DeliverRun: the reader's per-message path) against
    push_map of each of its maps: the same deliveries (RunDelivery reads as
    PlainDelivery), in order, before and after a queue rename, settling alike, and
    the same dropped buffer on finish."""
    settlers = [Recorder(), Recorder()]
    for s in settlers:
        s.tag_base = base // 2
    by_run, by_map = _consumer(settlers[0], no_ack), _consumer(settlers[1], no_ack)
    subs = [Subscriptions(), Subscriptions()]
    subs[0]["c1"], subs[1]["c1"] = by_run, by_map
    got: list[list[Delivery]] = [[], []]
    total = sum(len(maps) for _, maps in runs)
    kept: list[tuple[dict[str, Any], dict[str, Any]]] = []  # a run's map, as given

    async def main() -> None:
        for i, ((exchange, key, props), maps) in enumerate(runs):
            if i == rename_at:
                for s in subs:
                    s.rename_queue("q", "q2")
            tags = [m["dtag"] + base for m in maps]
            # (a copy: the run's map must stay as it was, whatever the application does)
            shared = None if props is None else dict(props)
            by_run.push_run(tags, [m["body"] for m in maps], (exchange, key, shared))
            for m, dtag in zip(maps, tags, strict=True):
                full = {"m": "deliver", "ctag": "c1", "dtag": m["dtag"]}
                full.update(exchange=exchange, key=key, body=m["body"])
                if props is not None:
                    full["props"] = dict(props)
                by_map.push_map(full, dtag)
            if shared is not None:
                kept.append((shared, props))
        for _ in range(min(handed, total)):
            for i, c in enumerate((by_run, by_map)):
                d = await c.__anext__()
                got[i].append(d)
                await {"ack": d.ack, "nack": d.nack, "reject": d.reject}[how]()

    trio.run(main)
    assert by_run.buffered == by_map.buffered
    assert settlers[0].calls == settlers[1].calls
    got[0] += by_run.finish(None, drop_buffer=True)
    got[1] += by_map.finish(None, drop_buffer=True)
    assert len(got[0]) == len(got[1]) == total
    for a, b in zip(got[0], got[1], strict=True):
        assert type(a) is RunDelivery and type(b) is PlainDelivery
        for name in FIELDS:
            assert getattr(a, name) == getattr(b, name), name
        assert repr(a) == repr(b)
        before = dict(a.properties)
        a.headers["x"] = 1  # the application's own, as on a PlainDelivery
        a.properties["y"] = 2
        assert a.headers == {"x": 1} and a.properties == {**before, "y": 2}
    assert all(shared == props for shared, props in kept)  # each delivery had its own
