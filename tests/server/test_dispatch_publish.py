"""``RequestDispatcher.publish`` (the client endpoint's direct call for a publish)
gives what ``RequestDispatcher.handle`` gives for the same publish: the same replies
(none, ``ok``, ``returned``, ``nacked``, ``error`` with the request's id) and the same
messages in the same queues."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqlite.auth import AuthenticatedUser, Permissions
from amqlite.broker import Broker
from amqlite.broker.limits import BrokerLimits
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
