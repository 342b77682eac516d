"""The witness's rules, one test per rule: the ledger the witness keeps, and a node
that asks it (takeover, renewal, confirms alone, fencing by the witness), with the
promise of each ``on_peer_silence`` mode."""

from __future__ import annotations

import contextlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.ha import (
    AskWitness,
    BecameActive,
    BecamePassive,
    CloseClients,
    FrameReader,
    HaEvent,
    HaMachine,
    HaRole,
    LeaseExpired,
    LeaseRequest,
    PersistEpoch,
    Promise,
    Verdict,
    WitnessHeard,
    WitnessLedger,
    WitnessProtocolError,
    WitnessSilent,
)
from amqlite.ha import (
    HaState as HS,
)
from amqlite.ha.witness import LeaseAnswer, encode_frame

from .support import INTERVAL, TIMEOUT, B, P, asks, exchange, grant, hb, hear, machine, refuse

S, E, W = Promise.SERVE, HaEvent, Promise.WITNESS


def req(
    node: str, epoch: int, *, alone: bool = False, ttl: float = 1.0, id: int = 1
) -> LeaseRequest:
    return LeaseRequest(id, node, epoch, ttl, alone)


# --- the ledger (what the witness decides) -------------------------------------------


def test_a_free_lease_is_granted_and_its_holder_renews_it() -> None:
    ledger = WitnessLedger()
    answer = ledger.request(req("p", 1), 0.0)
    assert (answer.granted, answer.holder, answer.epoch) == (True, "p", 1)
    assert ledger.request(req("p", 1), 0.5).granted  # a renewal, before expiry
    assert ledger.request(req("p", 3), 0.6).granted  # its own higher epoch
    assert not ledger.request(req("p", 1), 0.7).granted  # but never back
    assert ledger.durable == ("p", 3, False)


def test_another_node_waits_for_expiry_and_needs_a_higher_epoch() -> None:
    ledger = WitnessLedger()
    ledger.request(req("p", 1, ttl=1.0), 0.0)
    held = ledger.request(req("b", 2), 0.99)
    assert (held.granted, held.holder, held.epoch) == (False, "p", 1)
    assert "holds the lease" in held.text
    assert not ledger.request(req("b", 1), 1.5).granted  # not a higher epoch
    granted = ledger.request(req("b", 2), 1.0)
    assert (granted.granted, granted.holder, granted.epoch) == (True, "b", 2)
    superseded = ledger.request(req("p", 1), 1.1)
    assert (superseded.granted, superseded.holder, superseded.epoch) == (False, "b", 2)


def test_no_takeover_while_the_holder_confirms_alone() -> None:
    """``alone``: the holder confirmed what the other node lacks; a takeover would
    lose it, however long the holder stays silent. Its renewal in sync clears it."""
    ledger = WitnessLedger()
    ledger.request(req("p", 1, alone=True), 0.0)
    refused = ledger.request(req("b", 2), 100.0)
    assert (refused.granted, refused.stale) == (False, True)
    assert "would lose them" in refused.text
    ledger.request(req("p", 1, alone=False), 100.5)  # the backup caught up
    assert ledger.request(req("b", 2), 101.5).granted


def test_a_restarted_witness_keeps_the_lease_held_for_one_ttl() -> None:
    ledger = WitnessLedger("p", 5, False, now=50.0, restart_ttl=1.0)
    assert not ledger.request(req("b", 6), 50.9).granted
    assert ledger.request(req("p", 5), 50.9).granted  # the holder renews at once
    fresh = WitnessLedger("p", 5, False, now=50.0, restart_ttl=1.0)
    assert fresh.request(req("b", 6), 51.0).granted


def test_frames_round_trip_and_bad_frames_are_refused() -> None:
    reader = FrameReader()
    data = encode_frame(req("p", 3, alone=True).to_map()) + encode_frame({"m": "x"})
    reader.feed(data[:5])
    assert reader.maps() == []
    reader.feed(data[5:])
    first, second = reader.maps()
    assert LeaseRequest.from_map(first) == req("p", 3, alone=True)
    assert second == {"m": "x"}
    answer = LeaseAnswer(7, False, None, 0, False, "why")
    assert LeaseAnswer.from_map(answer.to_map()) == answer
    with pytest.raises(WitnessProtocolError, match="ttl_ms"):
        LeaseRequest.from_map({**first, "ttl_ms": 0})
    with pytest.raises(WitnessProtocolError, match="'epoch'"):
        LeaseRequest.from_map({**first, "epoch": "1"})
    bad = FrameReader()
    bad.feed(b"\xff\xff\xff\xff")
    with pytest.raises(WitnessProtocolError, match="too big"):
        bad.maps()
    for payload, words in ((b"\x83\x01\x02\x03", "must be a CBOR map"), (b"\xff", "not CBOR")):
        bad = FrameReader()
        bad.feed(len(payload).to_bytes(4, "big") + payload)
        with pytest.raises(WitnessProtocolError, match=words):
            bad.maps()


def started(now: float = 0.0) -> tuple[HaMachine, HaMachine]:
    """A witnessed pair started together: the primary asks the witness, which
    grants epoch 1; the backup follows."""
    p, b = machine(P, promise=W), machine(B, promise=W)
    hear(b, p, now)
    (ask,) = asks(hear(p, b, now))
    assert (ask.request.node, ask.request.epoch, ask.request.alone) == ("p", 1, False)
    assert p.state is HS.PRIMARY  # not before the grant
    grant(p, ask, now)
    exchange(p, b, now)
    assert (p.state, b.state) == (HS.ACTIVE, HS.PASSIVE)
    return p, b


# --- the promise of each mode ----------------------------------------------------------


@pytest.mark.parametrize(("promise", "alone"), [(Promise.SERVE, True), (Promise.HOLD, False)])
def test_without_a_witness_the_mode_decides_confirms_alone(promise: Promise, alone: bool) -> None:
    p, b = machine(P, promise=promise), machine(B, promise=promise)
    exchange(p, b, 0.1)
    assert p.may_confirm_alone(0.1) is alone
    assert p.may_confirm_alone(100.0) is alone  # the peer's silence changes nothing here
    assert p.status(0.1)["promise"] == promise.value
    # hold changes no transition: the backup still takes over on a client's vote
    assert b.on_client_request(0.1 + TIMEOUT).accepted


def test_with_a_witness_confirms_alone_need_a_lease_granted_for_it() -> None:
    p, _b = started(0.0)
    assert p.may_confirm_alone(0.1) is False
    renewal = asks(p.tick(0.1 + INTERVAL))
    assert len(renewal) == 1 and renewal[0].request.alone is False  # replicating: in sync
    grant(p, renewal[0], 0.1)
    assert p.lease_held(0.2) and not p.may_confirm_alone(0.2)  # held, but not for alone
    (alone,) = asks(p.set_alone(True, 0.3))  # the peer went silent: ask at once
    assert alone.request.alone is True and alone.request.epoch == p.epoch
    assert not p.may_confirm_alone(0.3)  # not before the witness says so
    grant(p, alone, 0.35)
    assert p.may_confirm_alone(0.35)
    assert p.status(0.35)["witness"]["lease_alone"] is True
    # the lease runs from the request's send time: over at 0.3 + ttl, not 0.35 + ttl
    assert not p.may_confirm_alone(0.3 + TIMEOUT)
    actions = p.tick(0.3 + TIMEOUT)
    assert LeaseExpired(p.epoch) in actions
    assert p.state.value == "active"  # losing the lease demotes nobody
    # back in sync: the next request says so, and alone stops at once
    (in_sync,) = asks(p.set_alone(False, 2.0))
    assert in_sync.request.alone is False


def test_the_master_renews_every_heartbeat_interval() -> None:
    p, _ = started(0.0)
    times = []
    now = 0.0
    while now < 1.0:
        now = p.next_deadline()
        if asks(p.tick(now)):
            times.append(round(now, 6))
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert gaps and all(g == pytest.approx(INTERVAL) for g in gaps)


def test_a_silent_peers_node_takes_over_only_on_a_granted_new_epoch() -> None:
    _p, b = started(0.0)
    early = b.on_client_request(0.5)  # the peer is alive: refused, nothing asked
    assert early.verdict is Verdict.REFUSE and not asks(early.actions)
    decision = b.on_client_request(TIMEOUT)  # silent: hold, and ask the witness
    assert decision.verdict is Verdict.HOLD and decision.retry_at is not None
    (ask,) = asks(decision.actions)
    assert (ask.request.node, ask.request.epoch, ask.request.alone) == ("b", 2, False)
    assert not asks(b.on_client_request(TIMEOUT + 0.01).actions)  # asks are paced
    refused = refuse(b, ask, TIMEOUT + 0.05, "p", 1)
    assert b.state.value == "passive" and not any(isinstance(a, BecameActive) for a in refused)
    again = b.on_client_request(TIMEOUT + INTERVAL)
    (ask2,) = asks(again.actions)
    actions = grant(b, ask2, TIMEOUT + INTERVAL + 0.01)
    assert actions[-2:] == [PersistEpoch(2), BecameActive(HS.PASSIVE, E.LEASE_GRANTED, 2)]
    assert b.lease_held(TIMEOUT + INTERVAL + 0.02)
    assert b.on_client_request(TIMEOUT + INTERVAL + 0.02).accepted


def test_a_grant_for_an_epoch_overtaken_is_ignored() -> None:
    p, b = started(0.0)
    (ask,) = asks(b.on_client_request(TIMEOUT).actions)
    b.on_heartbeat(hb(P, p.state, epoch=3), TIMEOUT + 0.01)  # a newer epoch heard...
    b.tick(TIMEOUT * 3)  # ...then silence again
    assert grant(b, ask, TIMEOUT * 3) == [
        WitnessHeard("b", 2)
    ]  # epoch 2 is no longer what we would mint
    assert b.state is HS.PASSIVE


def test_the_witness_naming_a_higher_epoch_fences_the_master() -> None:
    p, _ = started(0.0)
    (renewal,) = asks(p.tick(INTERVAL))
    actions = refuse(p, renewal, 0.3, "b", 4)
    assert (
        isinstance(actions[0], CloseClients)
        and "witness granted node 'b' epoch 4" in actions[0].reason
    )
    assert PersistEpoch(4) in actions
    assert actions[-1] == BecamePassive(HS.ACTIVE, E.LEASE_REFUSED, 4, "b")
    assert not p.accepting_clients and not p.may_confirm_alone(0.1)


def test_a_refusal_naming_an_older_epoch_keeps_the_master() -> None:
    p, _ = started(0.0)
    (renewal,) = asks(p.tick(INTERVAL))
    assert not any(isinstance(a, CloseClients) for a in refuse(p, renewal, 0.3, "b", 0))
    assert p.accepting_clients


def test_the_witness_silence_is_reported_once_and_heard_again() -> None:
    p = machine(P, promise=W)
    silent = [a for a in p.tick(TIMEOUT) if isinstance(a, WitnessSilent)]
    assert silent == [WitnessSilent(None, TIMEOUT)]
    assert not [a for a in p.tick(TIMEOUT + 0.5) if isinstance(a, WitnessSilent)]
    heard = p.on_lease(LeaseAnswer(99, False, "b", 2, False), 2.0)  # an unknown id: heard only
    assert heard == [WitnessHeard("b", 2)]
    assert p.status(2.0)["witness"]["heard"] is True
    assert p.epoch == 0  # an answer to no request of ours teaches nothing


def test_without_a_witness_nothing_is_asked() -> None:
    p, b = machine(P), machine(B)
    exchange(p, b, 0.0)
    now = 0.0
    for _ in range(20):
        now = p.next_deadline()
        assert not [
            a for a in p.tick(now) if isinstance(a, AskWitness | LeaseExpired | WitnessSilent)
        ]
    assert "witness" not in p.status(now)
    assert p.set_alone(True, now) == []


def test_a_starting_node_asks_for_itself_only_after_two_failover_timeouts() -> None:
    """A restarted node that hears its peer passive (the witness refuses the peer:
    this node confirmed alone last) asks for a new epoch itself, but only after two
    failover timeouts: on a plain restart the peer, which asks at once, wins."""
    b = machine(B, now=0.0, promise=W, epoch=2)
    assert not asks(b.on_heartbeat(hb(P, HS.PASSIVE, epoch=2), TIMEOUT))
    assert not asks(b.on_heartbeat(hb(P, HS.PASSIVE, epoch=2), 2 * TIMEOUT - 0.01))
    (ask,) = asks(b.on_heartbeat(hb(P, HS.PASSIVE, epoch=2), 2 * TIMEOUT))
    assert (ask.request.epoch, ask.request.alone) == (4, False)
    grant(b, ask, 2 * TIMEOUT)
    assert b.state is HS.ACTIVE and b.epoch == 4


@pytest.mark.parametrize("role", [P, B])
def test_a_restarted_node_does_not_follow_a_stale_master(role: HaRole) -> None:
    """A node that persisted epoch ``mine`` (it was master, perhaps confirming
    alone) and hears an active peer of an older epoch (cut off from the witness, not
    yet fenced) stays starting: following it would replace its journal with the stale
    master's snapshot. Once the witness fences that master, the node asks for itself
    and takes over. An active peer of its epoch or a newer one, it follows; and
    without a witness it follows any active peer, as before."""
    other = role.other
    mine = 2 if role is B else 3
    stale = mine - 1
    node = machine(role, now=0.0, promise=W, epoch=mine)
    node.on_heartbeat(hb(other, HS.ACTIVE, epoch=stale), 0.1)
    assert node.state is role.starting_state and node.epoch == mine
    assert not node.accepting_clients
    # the witness refused the stale master's renewal: it is passive in our epoch
    (ask,) = asks(node.on_heartbeat(hb(other, HS.PASSIVE, epoch=mine), 2 * TIMEOUT))
    assert ask.request.epoch == mine + 2
    assert BecameActive(role.starting_state, E.LEASE_GRANTED, mine + 2) in grant(
        node, ask, 2 * TIMEOUT
    )
    for epoch in (mine, mine + 1):
        current = machine(role, now=0.0, promise=W, epoch=mine)
        current.on_heartbeat(hb(other, HS.ACTIVE, epoch=epoch), 0.1)
        assert current.state is HS.PASSIVE
    for promise in (S, Promise.HOLD):
        unwitnessed = machine(role, now=0.0, promise=promise, epoch=mine)
        unwitnessed.on_heartbeat(hb(other, HS.ACTIVE, epoch=stale), 0.1)
        assert unwitnessed.state is HS.PASSIVE


def test_both_starting_only_the_primary_asks() -> None:
    """The normal start keeps its preference: the primary asks when it hears the
    backup starting; the backup, hearing the primary starting, waits."""
    p, b = machine(P, promise=W), machine(B, promise=W)
    assert not asks(b.on_heartbeat(p.heartbeat(), 0.1))
    assert asks(p.on_heartbeat(b.heartbeat(), 0.1))


@settings(max_examples=400, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=64),
        st.builds(
            lambda frame, at, byte: frame[:at] + bytes([byte]) + frame[at + 1 :],
            st.sampled_from(
                [
                    encode_frame(req("p", 3, alone=True).to_map()),
                    encode_frame(LeaseAnswer(7, True, "p", 3, True, "").to_map()),
                ]
            ),
            st.integers(0, 60),
            st.integers(0, 255),
        ),
    ),
    cut=st.integers(0, 64),
)
def test_the_witness_decoders_raise_only_their_protocol_error(data: bytes, cut: int) -> None:
    """Garbage, cut or flipped frames: a map, nothing yet, or WitnessProtocolError
    (which drops that connection), never another exception."""
    reader = FrameReader()
    try:
        reader.feed(data[:cut])
        reader.feed(data[cut:])
        for found in reader.maps():
            for decode in (LeaseRequest.from_map, LeaseAnswer.from_map):
                with contextlib.suppress(WitnessProtocolError):
                    decode(found)
    except WitnessProtocolError:
        pass
