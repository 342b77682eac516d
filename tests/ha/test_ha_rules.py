"""The Binary Star rules, epoch fencing and the heartbeat schedule, one test per
rule, with two machines wired by hand."""

from __future__ import annotations

import pytest

from amqlite.errors import ReplyCode
from amqlite.ha import (
    BecameActive,
    BecamePassive,
    CloseClients,
    HaConfigError,
    HaError,
    HaEvent,
    HaMachine,
    HaRole,
    HaState,
    PeerHeard,
    PeerSilent,
    PersistEpoch,
    RefusedHeartbeat,
    SendHeartbeat,
    Verdict,
    minted_by,
    next_epoch,
)

from .support import INTERVAL, TIMEOUT, B, P, exchange, hb, hear, machine

S, E = HaState, HaEvent


def started_pair(now: float = 0.0) -> tuple[HaMachine, HaMachine]:
    """A primary and a backup started together: primary active, backup passive."""
    p, b = machine(P, now), machine(B, now)
    exchange(p, b, now)
    assert (p.state, b.state) == (S.ACTIVE, S.PASSIVE)
    return p, b


# --- starting ------------------------------------------------------------------------


def test_normal_start_primary_active_backup_passive() -> None:
    p, b = machine(P), machine(B)
    assert hear(b, p, 0.1) == [PeerHeard("p", S.PRIMARY, 0)]  # waits for the primary
    assert b.state is S.BACKUP
    actions = hear(p, b, 0.1)
    assert actions == [
        PeerHeard("b", S.BACKUP, 0),
        PersistEpoch(1),
        BecameActive(S.PRIMARY, E.PEER_BACKUP, 1),
    ]
    actions = hear(b, p, 0.2)
    assert actions == [PersistEpoch(1), BecamePassive(S.BACKUP, E.PEER_ACTIVE, 1, "p")]
    assert (p.state, p.epoch, b.state, b.epoch) == (S.ACTIVE, 1, S.PASSIVE, 1)


def test_returning_primary_stays_passive() -> None:
    p, b = started_pair()
    # the primary dies; a client votes at the backup once the primary is silent
    decision = b.on_client_request(0.0 + TIMEOUT)
    assert decision.accepted
    assert b.state is S.ACTIVE
    assert b.epoch == 2
    # the primary comes back and hears the active backup: it stays slave
    p2 = machine(P, now=5.0, epoch=p.epoch)
    hear(b, p2, 5.1)
    assert b.state is S.ACTIVE  # hearing the primary restart changes nothing
    actions = hear(p2, b, 5.1)
    assert actions[-1] == BecamePassive(S.PRIMARY, E.PEER_ACTIVE, 2, "b")
    assert (p2.state, p2.epoch) == (S.PASSIVE, 2)
    exchange(p2, b, 5.2)
    assert (p2.state, b.state) == (S.PASSIVE, S.ACTIVE)


def test_restarting_the_backup_resets_the_pair() -> None:
    p, b = started_pair()
    assert b.on_client_request(TIMEOUT).accepted  # failover to the backup
    p = machine(P, now=5.0, epoch=p.epoch)
    exchange(p, b, 5.0)
    assert (p.state, b.state) == (S.PASSIVE, S.ACTIVE)
    # restart the backup: the passive primary hears it starting and takes over
    b = machine(B, now=8.0, epoch=b.epoch)
    actions = hear(p, b, 8.0)
    assert actions[-2:] == [PersistEpoch(3), BecameActive(S.PASSIVE, E.PEER_BACKUP, 3)]
    hear(b, p, 8.1)
    assert (p.state, b.state) == (S.ACTIVE, S.PASSIVE)
    assert (p.epoch, b.epoch) == (3, 3)


@pytest.mark.parametrize("restarting", [P, B])
def test_passive_takes_over_when_the_master_restarts(restarting: HaRole) -> None:
    p, b = started_pair()
    if restarting is B:  # make the backup the master first
        assert b.on_client_request(TIMEOUT).accepted
        p = machine(P, now=2.0, epoch=p.epoch)
        exchange(p, b, 2.0)
    master, slave = (p, b) if restarting is P else (b, p)
    assert (master.state, slave.state) == (S.ACTIVE, S.PASSIVE)
    restarted = machine(restarting, now=3.0, epoch=master.epoch)
    hear(slave, restarted, 3.0)
    assert slave.state is S.ACTIVE
    assert slave.epoch > master.epoch
    hear(restarted, slave, 3.0)
    assert restarted.state is S.PASSIVE


def test_starting_node_that_hears_a_passive_peer_waits_for_it_to_take_over() -> None:
    p, b = started_pair()
    p = machine(P, now=0.3, epoch=p.epoch)  # a quick restart: the backup is still passive
    hear(p, b, 0.35)
    assert (p.state, b.state) == (S.PRIMARY, S.PASSIVE)
    assert p.on_client_request(0.4).verdict is Verdict.HOLD
    hear(b, p, 0.4)
    hear(p, b, 0.45)
    assert (p.state, b.state) == (S.PASSIVE, S.ACTIVE)


def test_dual_passive_the_primary_takes_over() -> None:
    p = machine(P)
    p.on_heartbeat(hb(B, S.ACTIVE, epoch=2), 0.0)
    b = machine(B)
    b.on_heartbeat(hb(P, S.ACTIVE, epoch=1), 0.0)
    assert (p.state, b.state) == (S.PASSIVE, S.PASSIVE)
    hear(b, p, 0.1)
    assert b.state is S.PASSIVE
    hear(p, b, 0.1)
    assert p.state is S.ACTIVE
    assert p.epoch == 3
    hear(b, p, 0.2)
    assert b.state is S.PASSIVE


# --- holding clients while starting --------------------------------------------------


@pytest.mark.parametrize("role", [P, B])
def test_starting_node_holds_clients_for_a_failover_timeout(role: HaRole) -> None:
    m = machine(role, now=10.0)
    decision = m.on_client_request(10.5)
    assert decision.verdict is Verdict.HOLD
    assert not decision.accepted
    assert decision.code == ReplyCode.NOT_ACTIVE
    assert decision.retry_at == 10.0 + TIMEOUT
    assert decision.actions == ()
    assert m.state is role.starting_state
    assert not m.accepting_clients
    # alone for a whole failover timeout: the client's request makes it active
    decision = m.on_client_request(10.0 + TIMEOUT)
    assert decision.accepted
    assert decision.code is None
    epoch = next_epoch(role, 0)
    assert decision.actions == (
        PersistEpoch(epoch),
        BecameActive(role.starting_state, E.CLIENT_REQUEST, epoch),
    )
    assert m.accepting_clients


def test_hold_extends_while_the_peer_is_heard() -> None:
    p = machine(P, now=0.0)
    p.on_heartbeat(hb(B, S.PASSIVE, epoch=1), 0.8)
    decision = p.on_client_request(1.2)  # a timeout since start, but the peer is alive
    assert decision.verdict is Verdict.HOLD
    assert decision.retry_at == 0.8 + TIMEOUT


def test_silence_alone_promotes_nobody() -> None:
    p = machine(P, now=0.0)
    for step in range(1, 40):
        p.tick(step * 0.1)
    assert p.state is S.PRIMARY
    _, b = started_pair()
    for step in range(1, 40):
        b.tick(step * 0.1)
    assert b.state is S.PASSIVE


# --- the client vote -----------------------------------------------------------------


def test_passive_refuses_clients_while_its_peer_is_alive() -> None:
    _, b = started_pair()
    decision = b.on_client_request(TIMEOUT - 0.01)
    assert decision.verdict is Verdict.REFUSE
    assert decision.code == ReplyCode.NOT_ACTIVE
    assert "passive" in decision.text
    assert "'p'" in decision.text
    assert decision.actions == ()
    assert b.state is S.PASSIVE


def test_passive_takes_over_when_peer_silent_and_a_client_asks() -> None:
    _, b = started_pair(now=0.0)
    b.on_heartbeat(hb(P, S.ACTIVE, epoch=1), 2.0)
    assert not b.on_client_request(2.0 + TIMEOUT - 0.001).accepted
    decision = b.on_client_request(2.0 + TIMEOUT)
    assert decision.accepted
    assert decision.actions == (PersistEpoch(2), BecameActive(S.PASSIVE, E.CLIENT_REQUEST, 2))
    assert b.on_client_request(2.0 + TIMEOUT + 0.1).accepted  # and stays so


# --- epochs and fencing --------------------------------------------------------------


def test_epochs_are_minted_odd_by_the_primary_and_even_by_the_backup() -> None:
    assert [next_epoch(P, n) for n in range(6)] == [1, 3, 3, 5, 5, 7]
    assert [next_epoch(B, n) for n in range(6)] == [2, 2, 4, 4, 6, 6]
    assert [minted_by(n) for n in range(4)] == [None, P, B, P]


def test_every_promotion_mints_a_higher_epoch() -> None:
    p, b = started_pair()
    epochs = [p.epoch]
    now = 0.0
    for _ in range(4):  # fail over back and forth
        now += 2 * TIMEOUT
        master, slave = (p, b) if p.state is S.ACTIVE else (b, p)
        assert slave.on_client_request(now).accepted
        restarted = machine(master.role, now=now, epoch=master.epoch)
        exchange(restarted, slave, now)
        assert restarted.state is S.PASSIVE
        p, b = (restarted, slave) if master is p else (slave, restarted)
        epochs.append(slave.epoch)
    assert epochs == sorted(set(epochs))


def test_a_double_partition_cannot_mint_the_same_epoch_twice() -> None:
    """Without role-split epochs this run ends with both nodes active in epoch 2."""
    p, b = started_pair()
    assert b.on_client_request(TIMEOUT).accepted  # partition: the backup takes over
    p = machine(P, now=3.0, epoch=p.epoch)  # the primary restarts, still cut off
    assert p.on_client_request(3.0 + TIMEOUT).accepted
    assert (p.state, b.state) == (S.ACTIVE, S.ACTIVE)
    assert p.epoch != b.epoch
    assert (p.epoch, b.epoch) == (3, 2)
    # the link heals: the higher epoch fences the lower
    hear(b, p, 5.0)
    hear(p, b, 5.0)
    assert (p.state, b.state) == (S.ACTIVE, S.PASSIVE)


def test_active_node_hearing_a_higher_active_epoch_is_fenced() -> None:
    p, _ = started_pair()
    actions = p.on_heartbeat(hb(B, S.ACTIVE, epoch=4), 0.5)
    assert actions == [
        CloseClients(
            "fenced: peer 'b' is active with a higher epoch (4 > 1); this node is now passive"
        ),
        PersistEpoch(4),
        BecamePassive(S.ACTIVE, E.PEER_ACTIVE, 4, "b"),
    ]
    assert (p.state, p.epoch) == (S.PASSIVE, 4)
    assert not p.accepting_clients


def test_active_node_hearing_a_lower_active_epoch_stays_active() -> None:
    p = machine(P)
    p.on_heartbeat(hb(B, S.PASSIVE, epoch=4), 0.0)
    assert p.on_client_request(0.0 + TIMEOUT).accepted  # peer silent: a lone promotion
    assert p.epoch == 5
    assert p.on_heartbeat(hb(B, S.ACTIVE, epoch=2), 1.5) == []
    assert (p.state, p.epoch) == (S.ACTIVE, 5)


def test_equal_epochs_both_active_the_primary_wins() -> None:
    p, _ = started_pair()
    assert p.on_heartbeat(hb(B, S.ACTIVE, epoch=p.epoch), 0.5) == []
    assert p.state is S.ACTIVE
    b = machine(B)
    b.on_heartbeat(hb(P, S.ACTIVE, epoch=1), 0.0)
    assert b.on_client_request(TIMEOUT).accepted
    assert b.epoch == 2
    actions = b.on_heartbeat(hb(P, S.ACTIVE, epoch=2), 1.5)
    assert isinstance(actions[0], CloseClients)
    assert "same epoch (2) and it is the primary" in actions[0].reason
    assert actions[-1] == BecamePassive(S.ACTIVE, E.PEER_ACTIVE, 2, "p")
    assert b.state is S.PASSIVE


def test_active_node_keeps_its_term_whatever_a_non_active_peer_says() -> None:
    p, _ = started_pair()
    actions = p.on_heartbeat(hb(B, S.PASSIVE, epoch=8), 0.5)
    assert actions == []
    assert p.epoch == 1
    assert p.heartbeat().epoch == 1


def test_non_active_nodes_adopt_the_highest_epoch_heard() -> None:
    b = machine(B, epoch=3)
    assert b.on_heartbeat(hb(P, epoch=7), 0.0) == [PeerHeard("p", S.PRIMARY, 7), PersistEpoch(7)]
    assert b.epoch == 7
    assert b.on_heartbeat(hb(P, epoch=5), 0.1) == []
    assert b.epoch == 7
    assert b.on_client_request(0.1 + TIMEOUT).actions[0] == PersistEpoch(8)


def test_restart_keeps_the_persisted_epoch() -> None:
    m = machine(P, epoch=41)
    assert m.epoch == 41
    assert m.heartbeat().epoch == 41
    assert m.on_client_request(TIMEOUT).actions[0] == PersistEpoch(43)


# --- refused and fatal heartbeats ----------------------------------------------------


@pytest.mark.parametrize("state", [S.PRIMARY, S.ACTIVE, S.PASSIVE])
def test_heartbeat_from_another_vhost_is_refused(state: HaState) -> None:
    m = machine(P, vhost="/prod")
    if state is S.ACTIVE:
        m.on_heartbeat(hb(B, vhost="/prod"), 0.0)
    elif state is S.PASSIVE:
        m.on_heartbeat(hb(B, S.ACTIVE, epoch=2, vhost="/prod"), 0.0)
    heard, epoch = m.peer_last_heard, m.epoch
    stray = hb(B, S.ACTIVE, epoch=10, vhost="/test")
    actions = m.on_heartbeat(stray, 0.5)
    assert len(actions) == 1
    refused = actions[0]
    assert isinstance(refused, RefusedHeartbeat)
    assert refused.heartbeat == stray
    assert "'/test'" in refused.text
    assert "'/prod'" in refused.text
    assert "vhost" in refused.text
    assert (m.state, m.epoch, m.peer_last_heard) == (state, epoch, heard)


def test_heartbeat_with_our_own_node_id_is_refused() -> None:
    m = machine(P)
    actions = m.on_heartbeat(hb(B, node="p"), 0.5)
    assert len(actions) == 1
    assert isinstance(actions[0], RefusedHeartbeat)
    assert "own node id" in actions[0].text
    assert m.peer_last_heard is None
    assert m.state is S.PRIMARY


@pytest.mark.parametrize("state", [S.PRIMARY, S.ACTIVE, S.PASSIVE])
@pytest.mark.parametrize("peer_state", list(HaState))
def test_a_peer_of_our_own_role_is_a_fatal_config_error(
    state: HaState, peer_state: HaState
) -> None:
    if peer_state is S.BACKUP:
        return  # a backup's heartbeat: not our own role
    m = machine(P)
    if state is S.ACTIVE:
        m.on_heartbeat(hb(B), 0.0)
    elif state is S.PASSIVE:
        m.on_heartbeat(hb(B, S.ACTIVE, epoch=2), 0.0)
    with pytest.raises(HaConfigError) as caught:
        m.on_heartbeat(hb(P, peer_state, epoch=1, node="p2"), 0.5)
    assert "'p2' is also configured as the primary" in str(caught.value)
    assert m.state is state


# --- heartbeats and silence ----------------------------------------------------------


def _sent_at(m: HaMachine, peer: HaMachine | None, until: float) -> list[float]:
    """Drive ``m`` as a shell would (tick at its deadline), with extra ticks every
    0.07 s and ``peer``'s heartbeats every 0.15 s; return when ``m`` sent heartbeats."""
    sent = []
    extra_at, peer_at = 0.07, 0.0 if peer is not None else float("inf")
    while (now := min(m.next_deadline(), extra_at, peer_at)) <= until:
        if now == peer_at:
            assert peer is not None
            hear(m, peer, now)
            peer_at += 0.15
        if now == extra_at:
            extra_at += 0.07
        for action in m.tick(now):
            if isinstance(action, SendHeartbeat):
                assert action.heartbeat == m.heartbeat()
                sent.append(now)
    return sent


@pytest.mark.parametrize(
    "peer_state", [None, S.BACKUP, S.ACTIVE, S.PASSIVE], ids=lambda s: s.name if s else "silent"
)
def test_heartbeats_are_due_every_interval_whatever_the_peer(peer_state: HaState | None) -> None:
    m = machine(P)
    peer = None
    if peer_state is not None:
        peer = machine(B)
        if peer_state is S.ACTIVE:
            peer.on_client_request(TIMEOUT)
            peer = machine(B, epoch=peer.epoch)
            peer.on_client_request(TIMEOUT)
        elif peer_state is S.PASSIVE:
            peer.on_heartbeat(hb(P, S.ACTIVE, epoch=1, node="old"), 0.0)
        assert peer.state is peer_state
    sent = _sent_at(m, peer, until=3.0 + INTERVAL / 2)
    assert sent == pytest.approx([i * INTERVAL for i in range(16)])


def test_next_deadline_names_the_next_heartbeat_and_the_peer_expiry() -> None:
    m = machine(P, now=100.0)
    assert m.next_deadline() == 100.0  # the first heartbeat is due at once
    m.tick(100.0)
    assert m.next_deadline() == pytest.approx(100.0 + INTERVAL)
    m.on_heartbeat(hb(B, S.ACTIVE, epoch=2), 100.1)
    while m.next_deadline() < 101.05:
        assert m.tick(m.next_deadline())  # heartbeats
    assert m.next_deadline() == pytest.approx(100.1 + TIMEOUT)  # the expiry comes first
    actions = m.tick(100.1 + TIMEOUT)
    assert actions == [PeerSilent("b", 100.1, 100.1 + TIMEOUT)]
    assert m.next_deadline() == pytest.approx(101.2)  # silence reported: heartbeats only


def test_a_late_shell_gets_one_heartbeat_not_a_burst() -> None:
    m = machine(P)
    m.tick(0.0)
    late = [a for a in m.tick(5.0) if isinstance(a, SendHeartbeat)]
    assert len(late) == 1
    assert m.next_deadline() == pytest.approx(5.0 + INTERVAL)
    assert [a for a in m.tick(5.1) if isinstance(a, SendHeartbeat)] == []


def test_peer_silent_is_reported_once_per_silence_and_heard_again_after() -> None:
    m = machine(B)
    assert [a for a in m.tick(TIMEOUT) if isinstance(a, PeerSilent)] == [
        PeerSilent(None, None, TIMEOUT)
    ]
    assert [a for a in m.tick(TIMEOUT + 0.5) if isinstance(a, PeerSilent)] == []
    assert m.on_heartbeat(hb(P), 2.0) == [PeerHeard("p", S.PRIMARY, 0)]
    assert m.on_heartbeat(hb(P), 2.1) == []
    silent = [a for a in m.tick(2.1 + TIMEOUT) if isinstance(a, PeerSilent)]
    assert silent == [PeerSilent("p", 2.1, 2.1 + TIMEOUT)]
    assert m.on_heartbeat(hb(P), 4.0)[0] == PeerHeard("p", S.PRIMARY, 0)


# --- status and construction ---------------------------------------------------------


def test_status_in_words() -> None:
    p = machine(P, now=0.0)
    assert p.status(0.5) == {
        "node_id": "p",
        "role": "primary",
        "state": "primary",
        "epoch": 0,
        "accepting_clients": False,
        "peer_id": None,
        "peer_state": None,
        "peer_epoch": None,
        "peer_alive": False,
        "last_heartbeat_age": None,
        "promise": "serve",
        "confirms_alone": True,
    }
    p.on_heartbeat(hb(B), 1.0)
    status = p.status(1.25)
    assert status["state"] == "active"
    assert status["epoch"] == 1
    assert status["accepting_clients"] is True
    assert (status["peer_id"], status["peer_state"], status["peer_epoch"]) == ("b", "backup", 0)
    assert status["peer_alive"] is True
    assert status["last_heartbeat_age"] == pytest.approx(0.25)
    assert p.status(1.0 + TIMEOUT)["peer_alive"] is False
    b = machine(B)
    b.on_heartbeat(p.heartbeat(), 1.0)
    assert b.status(1.0)["state"] == "passive"


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"role": "primary"}, "role"),
        ({"node_id": ""}, "node id"),
        ({"vhost": ""}, "vhost"),
        ({"epoch": -1}, "epoch"),
        ({"epoch": True}, "epoch"),
        ({"heartbeat": 0.0}, "heartbeat interval must be positive"),
        ({"heartbeat": 1.0, "failover_timeout": 1.0}, "must be longer than the heartbeat"),
    ],
)
def test_construction_is_validated(kwargs: dict[str, object], words: str) -> None:
    args: dict[str, object] = {"role": P, "node_id": "p", "vhost": "/", "now": 0.0}
    args.update(kwargs)
    with pytest.raises(HaError, match=words):
        HaMachine(**args)  # type: ignore[arg-type]


def test_defaults_are_200ms_heartbeats_and_a_1s_failover_timeout() -> None:
    m = HaMachine(P, "p", "/", now=0.0)
    assert (m.heartbeat_interval, m.failover_timeout) == (0.2, 1.0)
    assert (m.role, m.node_id, m.vhost, m.state, m.epoch) == (P, "p", "/", S.PRIMARY, 0)
