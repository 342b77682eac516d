"""Every (state, event) pair of the link table, and the link methods that fire them.

The expected table is written out here independently of the code: a pair listed
must move to exactly that state, any other pair must raise LinkStateError.
"""

from __future__ import annotations

import itertools
import random

import pytest

from amqlite.peering import (
    TRANSITIONS,
    Address,
    Connect,
    Disconnect,
    Hello,
    LinkEvent,
    LinkSettings,
    LinkState,
    LinkStateError,
    PeeredExchange,
    PeeringLink,
    PeeringMode,
    Refused,
    Send,
    StateChanged,
    next_state,
)

S, E = LinkState, LinkEvent

EXPECTED = {
    (S.IDLE, E.START): S.CONNECTING,
    (S.IDLE, E.ATTACHED): S.UP,
    (S.IDLE, E.CLOSE): S.CLOSED,
    (S.CONNECTING, E.CONNECTED): S.SYNCING,
    (S.CONNECTING, E.LOST): S.BACKOFF,
    (S.CONNECTING, E.CLOSE): S.CLOSED,
    (S.SYNCING, E.HANDSHAKE_DONE): S.UP,
    (S.SYNCING, E.REFUSED): S.BACKOFF,
    (S.SYNCING, E.LOST): S.BACKOFF,
    (S.SYNCING, E.CLOSE): S.CLOSED,
    (S.UP, E.LOST): S.BACKOFF,
    (S.UP, E.ATTACHED): S.UP,
    (S.UP, E.DETACHED): S.WAITING,
    (S.UP, E.CLOSE): S.CLOSED,
    (S.BACKOFF, E.RETRY_DUE): S.CONNECTING,
    (S.BACKOFF, E.CLOSE): S.CLOSED,
    (S.WAITING, E.ATTACHED): S.UP,
    (S.WAITING, E.CLOSE): S.CLOSED,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, E)))
def test_every_pair(state: LinkState, event: LinkEvent) -> None:
    expected = EXPECTED.get((state, event))
    if expected is None:
        with pytest.raises(LinkStateError):
            next_state(state, event)
    else:
        assert next_state(state, event) is expected


def test_the_table_is_the_expected_one() -> None:
    assert TRANSITIONS == EXPECTED
    assert not any(state is S.CLOSED for state, _ in TRANSITIONS)  # final


def test_every_state_but_idle_is_reachable_and_every_live_state_can_close() -> None:
    reached = {S.IDLE}
    frontier = [S.IDLE]
    while frontier:
        state = frontier.pop()
        for (s, _), new in TRANSITIONS.items():
            if s is state and new not in reached:
                reached.add(new)
                frontier.append(new)
    assert reached == set(S)
    assert {s for s, e in TRANSITIONS if e is E.CLOSE} == set(S) - {S.CLOSED}


# --- the link methods drive the table -------------------------------------------------

NOW = 100.0
REMOTE = Address("remote", 5555)


def _exchange(node: str = "A") -> PeeredExchange:
    return PeeredExchange(
        node_id=node, epoch=1, exchange="x", exchange_type="topic", rand=random.Random(0).random
    )


def _dialer(mode: PeeringMode = PeeringMode.PUBLISH) -> PeeringLink:
    settings = LinkSettings(name="l", mode=mode, addresses=(REMOTE, Address("backup", 6666)))
    return _exchange().add_link(settings)


def _their_hello(mode: PeeringMode = PeeringMode.PUBLISH, node: str = "B") -> Hello:
    return Hello(node, "l", "/", "x", "topic", mode, epoch=7)


def _states(actions: list[object]) -> list[tuple[LinkState, LinkState]]:
    return [(a.old, a.new) for a in actions if isinstance(a, StateChanged)]


def _dialer_in(state: LinkState) -> PeeringLink:
    link = _dialer()
    steps = {
        S.IDLE: [],
        S.CONNECTING: [lambda: link.start(NOW)],
        S.SYNCING: [lambda: link.start(NOW), lambda: link.connected(NOW)],
        S.UP: [
            lambda: link.start(NOW),
            lambda: link.connected(NOW),
            lambda: link.receive(_their_hello().to_map(), NOW),
        ],
        S.BACKOFF: [lambda: link.start(NOW), lambda: link.connection_lost(NOW)],
        S.CLOSED: [lambda: link.close(NOW)],
    }[state]
    for step in steps:
        step()
    assert link.state is state
    return link


def test_dialer_walks_the_happy_path() -> None:
    link = _dialer()
    actions = link.start(NOW)
    assert _states(actions) == [(S.IDLE, S.CONNECTING)]
    assert Connect("l", REMOTE) in actions
    actions = link.connected(NOW)
    assert _states(actions) == [(S.CONNECTING, S.SYNCING)]
    hello = [a.message for a in actions if isinstance(a, Send)]
    assert isinstance(hello[0], Hello) and hello[0].node == "A" and hello[0].epoch == 1
    actions = link.receive(_their_hello().to_map(), NOW)
    assert _states(actions) == [(S.SYNCING, S.UP)]
    assert link.remote_node == "B"


@pytest.mark.parametrize("state", [S.IDLE, S.CONNECTING, S.SYNCING, S.UP, S.BACKOFF, S.CLOSED])
def test_dialer_methods_in_each_state(state: LinkState) -> None:
    """start/connected are legal only where the table says; connection_lost is a
    no-op without a connection; close is idempotent."""
    for method, legal in (("start", {S.IDLE}), ("connected", {S.CONNECTING})):
        link = _dialer_in(state)
        if state in legal:
            getattr(link, method)(NOW)
        else:
            with pytest.raises(LinkStateError):
                getattr(link, method)(NOW)
    link = _dialer_in(state)
    actions = link.connection_lost(NOW)
    if state in (S.CONNECTING, S.SYNCING, S.UP):
        assert link.state is S.BACKOFF and _states(actions) == [(state, S.BACKOFF)]
    else:
        assert actions == [] and link.state is state
    link = _dialer_in(state)
    actions = link.close(NOW)
    assert link.state is S.CLOSED
    if state is S.CLOSED:
        assert actions == []
    elif state in (S.CONNECTING, S.SYNCING, S.UP):
        assert isinstance(actions[0], Disconnect)


def test_refused_and_mismatched_hellos_back_off() -> None:
    link = _dialer_in(S.SYNCING)
    actions = link.receive({"type": "peer.refused", "code": 406, "text": "no"}, NOW)
    assert link.state is S.BACKOFF and isinstance(actions[0], Disconnect)
    assert "406 no" in link.last_error
    for hello in (
        _their_hello(PeeringMode.SUBSCRIBE),
        _their_hello(node="A"),
        Hello("B", "other", "/", "x", "topic", PeeringMode.PUBLISH, 1),
        Hello("B", "l", "/", "x", "direct", PeeringMode.PUBLISH, 1),
    ):
        link = _dialer_in(S.SYNCING)
        actions = link.receive(hello, NOW)
        assert link.state is S.BACKOFF and isinstance(actions[0], Disconnect)
        assert link.last_error.startswith("refused")


def test_acceptor_attach_detach_reattach() -> None:
    px = _exchange("B")
    link, actions = px.attach(
        Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 3).to_map(), NOW
    )
    assert link is not None and link.id == "A/l" and link.state is S.UP
    assert _states(actions) == [(S.IDLE, S.UP)]
    assert link.connection_lost(NOW) and link.state is S.WAITING
    assert link.connection_lost(NOW) == []  # no connection: no-op
    with pytest.raises(LinkStateError):
        link.start(NOW)
    link2, actions = px.attach(Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 3), NOW)
    assert link2 is link and _states(actions) == [(S.WAITING, S.UP)]
    _, actions = px.attach(Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 3), NOW)
    assert _states(actions) == [(S.UP, S.UP)]  # the dialer came back on a new connection
    assert link.close(NOW) and link.state is S.CLOSED


def test_acceptor_refuses_what_does_not_fit() -> None:
    px = _exchange("B")
    for hello in (
        Hello("A", "l", "/", "y", "topic", PeeringMode.PUBLISH, 3),
        Hello("A", "l", "/other", "x", "topic", PeeringMode.PUBLISH, 3),
        Hello("A", "l", "/", "x", "fanout", PeeringMode.PUBLISH, 3),
        Hello("B", "l", "/", "x", "topic", PeeringMode.PUBLISH, 3),
    ):
        link, actions = px.attach(hello, NOW)
        assert link is None
        assert [type(a) for a in actions] == [Send, Disconnect]
    assert px.links == {}


@pytest.mark.parametrize("version", [1, 2, 4, 0])
def test_a_hello_of_another_version_is_refused_clearly(version: object) -> None:
    """An older amqlite (version 1: no ``peer.forwards``) gets a ``peer.refused``
    that says why, not forwards it cannot read."""
    px = _exchange("B")
    hello = Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 3).to_map()
    hello["version"] = version
    link, actions = px.attach(hello, NOW)
    assert link is None and px.links == {}
    send, disconnect = actions
    assert isinstance(send, Send) and isinstance(send.message, Refused)
    assert f"unsupported version {version} (we speak 3)" in send.message.text
    assert isinstance(disconnect, Disconnect) and send.link == disconnect.link == "A/l"
