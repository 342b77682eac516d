"""``RequestDispatcher.publish`` (the client endpoint's direct call for a publish)
gives what ``RequestDispatcher.handle`` gives for the same publish: the same replies
(none, ``ok``, ``returned``, ``nacked``, ``error`` with the request's id) and the same
messages in the same queues; and ``publish_run`` of a run of plain publishes gives
what ``handle`` of each gives, or declines (then ``publish`` of each does)."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqlite.auth import AuthenticatedUser, Permissions
from amqlite.broker import Broker, Session
from amqlite.broker.limits import BrokerLimits
from amqlite.errors import AmqliteError
from amqlite.protocol import PublishRun
from amqlite.protocol import events as ev
from amqlite.server.dispatch import RequestDispatcher

EXCHANGES = ["", "fan", "inside", "missing", "closed"]
KEYS = ["q", "full", "nowhere", ""]

_publish = st.builds(
    ev.Publish,
    id=st.integers(0, 2**40),
    exchange=st.sampled_from(EXCHANGES),
    key=st.sampled_from(KEYS),
    body=st.binary(max_size=40),
    headers=st.just({}),
    props=st.one_of(st.just({}), st.just({"persistent": True}), st.just({"priority": 3})),
    mandatory=st.booleans(),
    confirm=st.booleans(),
)


def _setup(write: str) -> tuple[Broker, RequestDispatcher]:
    broker = Broker(limits=BrokerLimits(max_message_size=30))
    s = broker.open_session("/")
    s.declare_queue("q")
    s.declare_queue("full", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    s.declare_exchange("fan", "fanout")
    s.bind("q", "fan")
    s.bind("full", "fan")
    s.declare_exchange("inside", "direct", internal=True)
    s.declare_exchange("closed", "direct")  # write refused to it below
    user = AuthenticatedUser("u", Permissions(".*", write, ".*"))
    return broker, RequestDispatcher(s, user, "/", lambda: {}, instance="i")


def _queues(broker: Broker) -> dict[str, Any]:
    host = broker.vhost("/")
    assert host is not None
    return {
        name: [(m.exchange, m.routing_key, m.body, m.properties) for m, _, _ in q.ready]
        for name, q in host.queues.items()
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(publishes=st.lists(_publish, max_size=12), write=st.sampled_from([".*", "^(?!closed)"]))
def test_publish_replies_and_routes_as_handle_does(publishes: list[ev.Publish], write: str) -> None:
    general, d1 = _setup(write)
    direct, d2 = _setup(write)
    for i, p in enumerate(publishes):
        assert d2.publish(p, float(i)) == d1.handle(p, float(i))
    assert _queues(direct) == _queues(general)


def test_a_refused_publish_is_an_error_naming_its_request() -> None:
    _, d = _setup(".*")
    reply = d.publish(ev.Publish(7, "missing", "q", b"x"), 0.0)
    assert isinstance(reply, ev.Error) and reply.re == 7 and reply.code == 404


# --- runs of plain publishes (RequestDispatcher.publish_run) ------------------------

RUN_EXCHANGES = ["", "", "", "fan", "fan", "topic", "hdr", "inside", "missing", "closed"]
RUN_KEYS = ["q", "a.b", "drop", "nowhere", ""]


def _setup_runs(write: str, limit: int) -> tuple[Broker, RequestDispatcher, Session]:
    broker = Broker(limits=BrokerLimits(max_message_size=limit))
    s = broker.open_session("/")
    s.declare_queue("q")
    s.declare_queue("full", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    s.declare_exchange("dlx", "fanout")
    s.declare_queue("dead")
    s.bind("dead", "dlx")
    s.declare_queue("drop", arguments={"x-max-length": 1, "x-dead-letter-exchange": "dlx"})
    s.declare_exchange("fan", "fanout")
    for name in ("q", "full", "drop"):
        s.bind(name, "fan")
    s.declare_exchange("topic", "topic")
    s.bind("q", "topic", "a.*")
    s.bind("drop", "topic", "#")
    s.declare_exchange("hdr", "headers")
    s.bind("q", "hdr", arguments={"x-match": "all"})
    s.declare_exchange("inside", "direct", internal=True)
    s.declare_exchange("closed", "direct")
    consumer = broker.open_session("/")
    consumer.consume("q", tag="c", prefetch=3, now=0.0)
    user = AuthenticatedUser("u", Permissions(".*", write, ".*"))
    return broker, RequestDispatcher(s, user, "/", lambda: {}, instance="i"), consumer


def _state(broker: Broker, consumer: Session) -> tuple[Any, ...]:
    delivered = [
        (d.ctag, d.dtag, d.message.exchange, d.message.routing_key, d.message.body)
        for d in consumer.take_deliveries()
    ]
    return _queues(broker), delivered


_run = st.builds(
    PublishRun,
    first_id=st.integers(0, 2**40),
    exchange=st.sampled_from(RUN_EXCHANGES),
    key=st.sampled_from(RUN_KEYS),
    bodies=st.lists(st.one_of(st.binary(max_size=30), st.just(b"z" * 31)), min_size=1, max_size=6),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(st.one_of(_run, st.integers(1, 4)), max_size=16),
    write=st.sampled_from([".*", "^(?!closed)"]),
    limit=st.sampled_from([0, 30]),
)
def test_a_publish_run_routes_as_its_publishes_do_one_by_one(
    steps: list[PublishRun | int], write: str, limit: int
) -> None:
    """publish_run of a run (and, where it declines, publish of each) leaves the
    queues, the consumer's deliveries and the replies as handle of each publish
    does: runs to the default exchange, fanout, topic, headers, internal, missing
    and refused exchanges, bodies over the size limit, a reject-publish queue, a
    drop-head queue dead-lettering; between runs the consumer acks (credit)."""
    general, d1, c1 = _setup_runs(write, limit)
    runs, d2, c2 = _setup_runs(write, limit)
    for i, step in enumerate(steps):
        now = float(i)
        if isinstance(step, int):  # the consumer acks all it has
            for c in (c1, c2):
                c.take_deliveries()
                with contextlib.suppress(AmqliteError):
                    c.ack(0, multiple=True, now=now)
            continue
        expected = [d1.handle(p, now) for p in step.publishes()]
        if d2.publish_run(step, now):
            assert expected == [None] * len(step.bodies)
        else:
            assert [d2.publish(p, now) for p in step.publishes()] == expected
        assert _state(runs, c2) == _state(general, c1)


def test_a_run_to_a_known_exchange_is_taken_in_one_go() -> None:
    """The first run to an exchange finds its write permission unknown (declined:
    the general path learns it); later ones go in one go."""
    broker, d, consumer = _setup_runs(".*", 30)
    run = PublishRun(5, "", "q", [b"a", b"b"])
    assert not d.publish_run(run, 0.0)
    assert d.publish(ev.Publish(7, "", "q", b"c"), 0.0) is None
    assert d.publish_run(PublishRun(8, "", "q", [b"d", b"e", b"f", b"g"]), 0.0)
    assert d.publish_run(PublishRun(12, "fan", "", [b"h"]), 0.0) is False  # not yet known
    assert d.publish(ev.Publish(13, "fan", "", b"i"), 0.0) is None
    assert d.publish_run(PublishRun(14, "fan", "", [b"j"]), 0.0)
    assert d.publish_run(PublishRun(15, "", "q", [b"x" * 31]), 0.0) is False  # over the limit
    queues, delivered = _state(broker, consumer)
    assert [body for *_, body in delivered] == [b"c", b"d", b"e"]
    assert [m[2] for m in queues["q"]] == [b"f", b"g", b"i", b"j"]
