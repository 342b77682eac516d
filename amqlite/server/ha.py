"""The HA pair's trio shell: heartbeats, the state machine, fencing, replication.

Each node of a pair dials the other (the *peer link*, a
:class:`~amqlite.link.FramedLink` opened by :func:`~amqlite.link.dial` with
``hello`` {role: "ha-peer"}; when it ends, the node backs off and dials again)
and sends on it a heartbeat every interval, whatever it thinks of its peer; it
hears its peer's heartbeats on the connection the peer opened to it. The sans-IO
:class:`~amqlite.ha.HaMachine` turns heartbeats, client hellos and time into
actions, applied here in order. ``PersistEpoch`` (an fsync)
runs in a worker thread; the actions after it wait for it, and no client is
admitted meanwhile, so a node never serves in an epoch that is not on disk.

Replication is the sans-IO :class:`~amqlite.ha.Replicator` (this node active: a
snapshot, then the journal's tail within a window) and
:class:`~amqlite.ha.Follower` (this node passive: apply, journal, acknowledge);
this shell moves their bytes, runs the journal and applies their actions. What the
passive node holds is kept by the journal's shell (``NodeStorage.replica``), which
holds replies and pushes until the passive node has them (docs/ha.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog
import trio

from amqlite.config import ClusterConfig
from amqlite.errors import AmqliteError, ReplyCode
from amqlite.ha import (
    AckAfterCommit,
    Action,
    ApplySync,
    AskWitness,
    BecameActive,
    BecamePassive,
    CloseClients,
    Follower,
    FollowerAction,
    HaMachine,
    HaRole,
    HaState,
    Heartbeat,
    LeaseAnswer,
    LeaseExpired,
    PeerHeard,
    PeerSilent,
    PersistEpoch,
    Promise,
    RefusedHeartbeat,
    ReplicaApplied,
    ReplicaSynced,
    ReplicationStarted,
    ReplicationStopped,
    Replicator,
    ReplicatorAction,
    SendHeartbeat,
    SendSync,
    SendSynced,
    Verdict,
    WitnessHeard,
    WitnessProtocolError,
    WitnessSilent,
    replication_wanted,
)
from amqlite.ha.errors import HeartbeatError
from amqlite.ha.witness import FrameReader, encode_frame, hello_map
from amqlite.link import DialFailed, FramedLink, dial
from amqlite.protocol import events as ev
from amqlite.store.codec import EnqueueScan
from amqlite.store.durable_file import read_if_present, write_durably
from amqlite.store.recover import ReplicaFrames
from amqlite.store.segment import frame_record, parse_scanned
from amqlite.tls import describe_tls_error, node_client_context

if TYPE_CHECKING:
    from .context import HaNode, HaPeerEnd

log = structlog.get_logger("amqlite.ha")

EPOCH_FILE = "HA_EPOCH"
LINK_BACKOFF = (0.05, 1.0)
#: a passive node folds the syncs it journaled once they reach this many bytes (and
#: before it takes over): the bound on the fold a takeover waits for (docs/ha.md).
#: An enqueue acked in the same fold costs nearly nothing, one acked in a later fold
#: builds an entry and removes it; with the consumer ~450 messages behind (a pair's
#: 1to1 run), 512 KiB (~1,700 messages) kept a quarter of them, 1 MiB an eighth:
#: 33.2k -> 28.6k instructions a message in benchmarks/ha_passive_micro.py
#: (benchmarks/README.md, round 13, the passive node); the fold itself costs ~40 %
#: less a message since round 13, so the takeover's wait stays where 512 KiB put it
FOLD_AFTER_BYTES = 1 << 20
#: ... and once no sync has come for this long (s): how long an idle passive node's
#: state and broker may lag what it journaled. Well above the time between syncs of
#: a busy pair on a loaded machine (~70 ms apart on the 2-core VM): at 50 ms it
#: folded between most syncs, so an enqueue and its ack a sync later rarely met in
#: one fold and cancelled (37-51 % of messages instead of ~75 %), and each fold
#: cost a timer wake-up (benchmarks/README.md, round 12, the passive node)
FOLD_IDLE = 1.0
#: The least time a dial of the peer link may take (else the failover timeout).
LINK_DIAL_TIMEOUT = 1.0


class _WitnessRefused(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


async def _read_map(stream: trio.abc.Stream, reader: FrameReader) -> dict[Any, Any]:
    while True:
        data = reader.next_map()
        if data is not None:
            return data
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise EOFError("the witness closed the link")
        reader.feed(chunk)


class HaService:
    """One node's side of an HA pair; see the module docstring."""

    def __init__(self, node: HaNode, config: ClusterConfig) -> None:
        self.node = node
        self.config = config
        self.role = HaRole.PRIMARY if config.role == "primary" else HaRole.BACKUP
        self.machine: HaMachine | None = None
        self._wake = trio.Event()
        self._link: FramedLink | None = None  # the peer link we dialed, while it is up
        # the peer's native listener speaks TLS when ours does (one file, two nodes):
        # the peer's certificate is verified against [tls] ca and the dialed host
        self._tls = node_client_context(node.config.tls) if node.config.server.tls else None
        #: the last dial's TLS failure ("" when none), logged once per change
        self.tls_error = ""
        self.link_up = False
        # the machine's actions not applied yet: those after a PersistEpoch wait for it
        self._backlog: deque[Action] = deque()
        self._persisting = False  # an epoch is being written (in a worker thread)
        # the epoch of the state this node shows (node.state): the machine's epoch
        # once it is on disk; status reports this one, so that a snapshot never pairs
        # a state not yet left with an epoch not yet stored (a demoted master read as
        # "active" in the new master's epoch while its fence is being written)
        self._shown_epoch = 0
        # this node active: to the passive peer (coalescing: see Replicator)
        self.replicator = Replicator(coalesce=True)
        self._sender_wake = trio.Event()
        self.follower = Follower()  # this node passive: from the active peer
        # the follower's actions not applied yet: those after a snapshot being applied
        self._follow_queue: deque[tuple[FollowerAction, HaPeerEnd]] = deque()
        self._applying = False  # a snapshot is being applied a chunk at a time
        self._scan = EnqueueScan()  # reads replicated enqueues without decoding them
        self._frames = ReplicaFrames(self._scan)  # checks the syncs' frames
        # syncs journaled unfolded (_apply_chunk): how many, and the idle fold's wake-up
        self._chunks_unfolded = 0
        self._unfolded_wake = trio.Event()
        self.inbound_links = 0  # ha-peer connections the peer opened to us
        self.handing_over = False
        # the witness (docs/ha.md, "The witness"): its link, and the promise in force
        self.promise = Promise.WITNESS if config.witness else Promise(config.on_peer_silence)
        self.witness_link_up = False
        self._witness_out: trio.MemorySendChannel[bytes] | None = None
        self._snapshot_at = 0  # the journal position of the replica's snapshot
        self.held_failed = 0  # held confirms failed after hold_timeout_ms
        self._nursery: trio.Nursery | None = None
        self._progress = trio.Event()  # set (and replaced) on every change of state or ack

    @property
    def replicating(self) -> bool:
        return self.replicator.replicating

    @property
    def synced_upto(self) -> int:
        """This node active: the passive peer has committed its journal up to here."""
        return self.replicator.synced_upto

    @property
    def syncs_received(self) -> int:
        """This node passive: the ``ha.sync`` frames received from the active peer."""
        return self.follower.syncs_received

    # --- start ---------------------------------------------------------------------------

    def _epoch_path(self) -> str | None:
        storage = self.node.storage
        return os.path.join(storage.directory, EPOCH_FILE) if storage is not None else None

    def _load_epoch(self) -> int:
        path = self._epoch_path()
        if path is None:
            return 0
        try:
            data = read_if_present(path)
            return int(data.strip() or 0) if data is not None else 0
        except (OSError, ValueError) as exc:
            raise AmqliteError(f"cannot read the HA epoch from {path}: {exc}") from exc

    def _persist_epoch(self, epoch: int) -> None:
        """Blocks on the disk: run in a worker thread."""
        path = self._epoch_path()
        if path is not None:
            write_durably(path, f"{epoch}\n".encode("ascii"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        epoch = await trio.to_thread.run_sync(self._load_epoch)
        self._shown_epoch = epoch
        async with trio.open_nursery() as nursery:
            self._nursery = nursery  # before the machine: its actions may need it
            self.machine = HaMachine(
                self.role,
                self.node.node_id,
                cfg.vhost,
                now=trio.current_time(),
                epoch=epoch,
                heartbeat=cfg.heartbeat_ms / 1000,
                failover_timeout=cfg.failover_timeout_ms / 1000,
                promise=self.promise,
            )
            self.node.state = self.machine.state.value
            self.node.cluster_addresses = cfg.addresses
            log.info(
                "ha_starting",
                role=self.role.value,
                peer=cfg.peer,
                epoch=self.machine.epoch,
                heartbeat_ms=cfg.heartbeat_ms,
                failover_timeout_ms=cfg.failover_timeout_ms,
                promise=self.promise.value,
                witness=cfg.witness or None,
            )
            self._update_promise()
            nursery.start_soon(self._ticker)
            if cfg.witness:
                nursery.start_soon(self._witness_loop)
            if self.promise is not Promise.SERVE:
                nursery.start_soon(self._hold_watch)
            nursery.start_soon(self._link_loop)
            nursery.start_soon(self._sender)
            nursery.start_soon(self._fold_when_idle)
            task_status.started()

    # --- the machine ---------------------------------------------------------------------

    async def _ticker(self) -> None:
        while True:
            machine = self.machine  # replaced by a switchover
            assert machine is not None
            with trio.move_on_at(machine.next_deadline()):
                await self._wake.wait()
            self._wake = trio.Event()
            machine = self.machine  # a switchover may have replaced it meanwhile
            assert machine is not None
            # the loop takes the new deadline itself: waking it again would spin
            self.apply(machine.tick(trio.current_time()), wake_ticker=False)

    def apply(self, actions: Sequence[Action], *, wake_ticker: bool = True) -> None:
        """Carry out the machine's actions, in order; ``wake_ticker`` makes the ticker
        take the machine's next deadline (an event may have moved it).

        A ``PersistEpoch`` is written in a worker thread (an fsync must not stall the
        event loop); the actions after it, and any applied meanwhile, wait for it,
        and :meth:`admit` admits no client meanwhile: a promotion is on disk before
        this node acts as the new epoch's master. A ``BecameActive`` also waits for
        a snapshot being applied to be whole."""
        self._backlog.extend(actions)
        self._drain()
        if wake_ticker:
            self._wake.set()

    def _drain(self) -> None:
        """Apply the backlog up to the next ``PersistEpoch`` (a task writes it, then
        drains the rest), or up to a ``BecameActive`` while a snapshot is being
        applied (the task applying it drains the rest)."""
        backlog = self._backlog
        while backlog and not self._persisting:
            if self._applying and isinstance(backlog[0], BecameActive):
                break
            action = backlog.popleft()
            if isinstance(action, PersistEpoch):
                assert self._nursery is not None
                self._persisting = True
                self._nursery.start_soon(self._persist_then_drain, action.epoch)
            else:
                self._apply_one(action)
        machine = self.machine
        assert machine is not None
        if machine.state is HaState.ACTIVE:
            self._start_replication()
        if self.node.peering is not None:
            self.node.peering.ha_state_changed()
        self._update_promise()
        self._signal_progress()

    def _update_promise(self) -> None:
        """Tell the machine whether our confirms would go without the peer holding
        them (no passive node replicated to, or it has not caught up with the
        snapshot yet), and tell the journal's barrier whether that is allowed now."""
        machine = self.machine
        storage = self.node.storage
        if machine is None:
            return
        now = trio.current_time()
        replicator = self.replicator
        in_sync = replicator.replicating and replicator.synced_upto >= self._snapshot_at
        actions = machine.set_alone(not in_sync, now)
        if actions:
            self.apply(actions)  # an ask for the witness: sends, then comes back here
            return
        if storage is not None:
            allowed = machine.may_confirm_alone(now)
            if allowed != storage.replica.alone_ok:
                log.warning(
                    "ha_confirms_alone" if allowed else "ha_confirms_held",
                    promise=self.promise.value,
                    state=machine.state.value,
                    epoch=machine.epoch,
                )
            storage.confirm_alone(allowed)

    async def _persist_then_drain(self, epoch: int) -> None:
        try:
            await trio.to_thread.run_sync(self._persist_epoch, epoch)
        except OSError as exc:
            # fatal: a node that cannot store its epoch cannot be fenced safely
            log.critical("ha_epoch_write_failed", epoch=epoch, error=str(exc))
            raise
        self._persisting = False
        self._shown_epoch = epoch
        self._drain()

    def _apply_one(self, action: Action) -> None:
        if isinstance(action, SendHeartbeat):
            self._send_link(ev.HaHeartbeat(**action.heartbeat.to_map()))
        elif isinstance(action, BecameActive):
            # a node that followed a master: a passive one, or a starting backup that
            # took the master's snapshot before it heard the master active (the master
            # replicates as soon as it hears a backup) and then won a client's vote
            followed = action.previous is HaState.PASSIVE or self.follower.holds_upto > 0
            if followed:
                self.fold_replica()  # the syncs journaled unfolded, before anything reads
            # a planned handover whose every record we hold: we know each delivery
            handed_over = followed and self.follower.handed_over
            self.node.state = HaState.ACTIVE.value
            self.follower.stop(action.epoch)
            if followed:
                # the broker followed the topology only: queue the messages the
                # journal's state holds, as a restart would
                self._reset_broker(keep_publish_keys=True)
            flagged = 0
            if followed and not handed_over:
                # a failover, or the master back from a quick restart (it announces
                # itself starting): its last deliveries may not be here (their marks
                # are gathered until a commit, docs/storage.md), so any ready
                # message may have been seen
                flagged = self.node.broker.flag_redelivered()
            log.warning(
                "ha_became_active",
                previous=action.previous.value,
                trigger=action.event.value,
                epoch=action.epoch,
                handed_over=handed_over,
                flagged_redelivered=flagged,
            )
            self._start_replication()
        elif isinstance(action, BecamePassive):
            was_active = action.previous is HaState.ACTIVE
            self.node.state = HaState.PASSIVE.value
            log.warning(
                "ha_became_passive",
                previous=action.previous.value,
                trigger=action.event.value,
                epoch=action.epoch,
                peer=action.peer_id,
            )
            self._stop_replication()
            if was_active:
                storage = self.node.storage
                if storage is not None:
                    storage.fail_held(
                        float("inf"),
                        "not confirmed: this node was fenced (another node is master in "
                        f"epoch {action.epoch}); publish again to the master",
                    )
                self._reset_broker()
        elif isinstance(action, CloseClients):
            log.warning("ha_closing_clients", reason=action.reason)
            self.node.close_clients(ReplyCode.CONNECTION_FORCED, action.reason)
        elif isinstance(action, RefusedHeartbeat):
            log.warning("ha_heartbeat_refused", text=action.text)
        elif isinstance(action, PeerSilent):
            log.warning("ha_peer_silent", peer=action.peer_id, since=action.since)
            self._stop_replication()
        elif isinstance(action, PeerHeard):
            log.info(
                "ha_peer_heard",
                peer=action.peer_id,
                state=action.state.value,
                epoch=action.epoch,
            )
        elif isinstance(action, AskWitness):
            out = self._witness_out
            if out is not None:
                with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                    out.send_nowait(encode_frame(action.request.to_map()))
        elif isinstance(action, LeaseExpired):
            log.warning("ha_lease_expired", epoch=action.epoch, witness=self.config.witness)
        elif isinstance(action, WitnessSilent):
            log.warning("ha_witness_silent", witness=self.config.witness, since=action.since)
        elif isinstance(action, WitnessHeard):
            log.info(
                "ha_witness_heard",
                witness=self.config.witness,
                holder=action.holder,
                epoch=action.epoch,
            )

    def _signal_progress(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def _wait_until(self, predicate: Any) -> None:
        """Wait until ``predicate()`` holds, checking after every change (the caller
        bounds the wait)."""
        while not predicate():
            await self._progress.wait()

    def on_peer_heartbeat(self, hb: ev.HaHeartbeat) -> None:
        machine = self.machine
        if machine is None:
            return
        try:
            heartbeat = Heartbeat.from_map(
                {"node": hb.node, "role": hb.role, "state": hb.state, "epoch": hb.epoch,
                 "vhost": hb.vhost}
            )  # fmt: skip
        except HeartbeatError as exc:
            log.warning("ha_heartbeat_malformed", error=str(exc))
            return
        self.apply(machine.on_heartbeat(heartbeat, trio.current_time()))

    async def admit(self, deadline: float) -> tuple[bool, str]:
        """A client said hello: may it be served? Holds while starting (until the
        machine decides or ``deadline``)."""
        machine = self.machine
        if machine is None:
            return False, "the node is starting"
        if self.handing_over:
            return False, "it is handing mastership over to its peer"
        while True:
            # a promotion is not ours until its epoch is stored (and its state whole)
            await self._wait_until(lambda: not self._persisting and not self._backlog)
            machine = self.machine
            assert machine is not None
            decision = machine.on_client_request(trio.current_time())
            self.apply(decision.actions)
            if self._persisting or self._backlog:
                continue  # this very request promoted us: serve once that is done
            if decision.verdict is Verdict.ACCEPT:
                return True, ""
            if decision.verdict is Verdict.REFUSE:
                # A passive node whose peer has already missed heartbeats keeps the
                # client until the failover timeout runs out and asks again: the
                # first client after a crash is served by the new master.
                last = machine.peer_last_heard
                now = trio.current_time()
                expires = machine.peer_expires_at
                peer_gone = not self.link_up and not self.inbound_links
                if (
                    machine.state is HaState.PASSIVE
                    and last is not None
                    and (peer_gone or now - last > 2 * machine.heartbeat_interval)
                    and expires < deadline
                ):
                    with trio.move_on_at(expires + machine.heartbeat_interval / 4):
                        await trio.sleep_forever()
                    continue
                return False, decision.text
            retry_at = decision.retry_at if decision.retry_at is not None else deadline
            if trio.current_time() >= deadline:
                return False, decision.text
            with trio.move_on_at(min(retry_at, deadline)):
                await trio.sleep_forever()

    # --- planned switchover ----------------------------------------------------------

    def start_switchover(self, request: ev.HaSwitchover, reply: Any) -> None:
        if self._nursery is None:
            reply(ev.Error(request.id, ReplyCode.NOT_ALLOWED, "the HA service is not running"))
            return
        self._nursery.start_soon(self._switchover, request, reply)

    async def _switchover(self, request: ev.HaSwitchover, reply: Any) -> None:
        """Drain, sync, swap: refuse and close clients, wait until the passive peer
        holds every record, then restart our HA state so the peer takes over."""
        machine = self.machine
        storage = self.node.storage

        def fail(text: str) -> None:
            log.warning("ha_switchover_failed", reason=text)
            reply(ev.Error(request.id, ReplyCode.NOT_ALLOWED, f"switchover failed: {text}"))

        if machine is None or machine.state is not HaState.ACTIVE:
            fail(f"this node is {self.node.state}, not active")
            return
        if not self.replicating or storage is None:
            fail("no passive peer is attached and in sync")
            return
        log.warning("ha_switchover_started", peer=self.config.peer)
        self.handing_over = True
        try:
            self.node.close_clients(
                ReplyCode.CONNECTION_FORCED, "switchover: the other node of the pair takes over"
            )
            recorder = self.node.broker.recorder
            if recorder is not None:  # the acks gathered for the next commit go too
                recorder.flush_marks()
            target = storage.appended
            self._sender_wake.set()
            with trio.move_on_after(request.timeout / 2):
                await self._wait_until(lambda: self.synced_upto >= target or not self.replicating)
            if self.synced_upto < target or not self.replicating:
                fail(f"the peer did not catch up (holds {self.synced_upto} of {target})")
                return
            # the peer knows every delivery we made (our clients are closed, their
            # marks journaled and held there): it need not flag what it takes over
            self._send_link(ev.HaHandover(upto=storage.appended, epoch=machine.epoch))
            # Restart our side as a starting node: the peer hears PRIMARY/BACKUP from
            # its master and takes over; we then hear it active and go passive.
            epoch = machine.epoch
            self.machine = HaMachine(
                self.role,
                self.node.node_id,
                self.config.vhost,
                now=trio.current_time(),
                epoch=epoch,
                heartbeat=self.config.heartbeat_ms / 1000,
                failover_timeout=self.config.failover_timeout_ms / 1000,
                promise=self.promise,
            )
            self.node.state = self.machine.state.value
            # after the swap: the old machine must not tell the witness it confirms
            # alone now (that would keep the peer from taking over)
            self._stop_replication()
            self._wake.set()  # the ticker announces us as starting at once
            machine = self.machine
            with trio.move_on_after(request.timeout / 2):
                await self._wait_until(lambda: machine.state is HaState.PASSIVE)
            if machine.state is not HaState.PASSIVE:
                fail("the peer did not take over in time")
                return
            log.warning("ha_switchover_done", active=self.machine.peer_id)
            reply(ev.Ok(request.id, {"active": self.machine.peer_id, "passive": self.node.node_id}))
        finally:
            self.handing_over = False

    def _reset_broker(self, *, keep_publish_keys: bool = False) -> None:
        """A new broker rebuilt from the journal's durable state: when demoted (the
        new active node's snapshot replaces it), and when taking over from the
        passive state (its broker followed the topology and the publish keys only:
        ``keep_publish_keys``)."""
        node = self.node
        old = node.broker
        node.broker = node.new_broker()
        node.broker.wall_offset = old.wall_offset
        storage = node.storage
        if storage is not None and storage.journal is not None:
            broker, now = node.broker, trio.current_time()
            storage.journal.with_refs(lambda refs: broker.apply(refs, now))
        if keep_publish_keys:
            node.broker.adopt_publish_keys(old)

    def heartbeat_event(self) -> ev.HaHeartbeat | None:
        """This node's heartbeat, as its peer link carries it (None before start)."""
        machine = self.machine
        if machine is None:
            return None
        return ev.HaHeartbeat(**machine.heartbeat().to_map())

    # --- the outbound link ---------------------------------------------------------------

    def _send_link(self, event: ev.Event) -> None:
        link = self._link
        if link is None:
            return
        with contextlib.suppress(AmqliteError):
            link.send(event)

    async def _link_loop(self) -> None:
        delay = LINK_BACKOFF[0]
        while True:
            host, _, port = self.config.peer.rpartition(":")
            try:
                await self._run_link(host, int(port))
                delay = LINK_BACKOFF[0]
                self.tls_error = ""
            except AmqliteError as exc:  # the dial failed, or the peer broke the protocol
                if "TLS: " in exc.text and exc.text != self.tls_error:
                    # a certificate problem does not heal by retrying: say it (once)
                    log.error("ha_link_tls_failed", peer=self.config.peer, error=exc.text)
                else:
                    log.debug("ha_link_failed", peer=self.config.peer, error=exc.text)
                self.tls_error = exc.text if "TLS: " in exc.text else ""

            finally:
                if self.link_up:
                    log.warning("ha_link_down", peer=self.config.peer)
                self.link_up = False
                self._link = None
                self._stop_replication()
            await trio.sleep(delay * random.uniform(0.5, 1.0))
            # never back off past a heartbeat: a restarting peer must hear us
            # well within its failover timeout
            delay = min(delay * 2, LINK_BACKOFF[1], self.config.heartbeat_ms / 1000)

    async def _run_link(self, host: str, port: int) -> None:
        """Dial the peer and run the peer link until it ends (DialFailed when it
        does not open; a refusal is logged and waited out here)."""
        cfg = self.config
        hello = ev.Hello(
            1,
            vhost=cfg.vhost,
            login=cfg.login,
            password=cfg.password,
            client=self.node.node_id,
            role="ha-peer",
        )
        try:
            link, welcome = await dial(
                host,
                port,
                hello,
                max_frame_size=self.node.config.server.max_frame_bytes,
                timeout=max(cfg.failover_timeout_ms / 1000, LINK_DIAL_TIMEOUT),
                ssl_context=self._tls,
            )
        except DialFailed as exc:
            if not exc.refused:
                raise
            log.error("ha_link_refused", peer=cfg.peer, code=exc.code, text=exc.text)
            await trio.sleep(1.0)
            return
        # no start_heartbeat: the HA machine's own heartbeats go both ways
        self._link = link
        self.link_up = True
        log.info("ha_link_up", peer=cfg.peer, peer_node=welcome.server)
        self._start_replication()
        await link.run(functools.partial(self._read_link, link))

    async def _read_link(self, link: FramedLink) -> None:
        """The peer link's reader: the peer's acknowledgements and heartbeats."""
        events = link.proto.events
        while True:
            # the acknowledgements of one read are taken as one (they are cumulative):
            # a busy pair's passive node acknowledges every sync twice, and each
            # acknowledgement costs a release of held replies and pushes here
            applied = synced = 0
            for event in events():
                if isinstance(event, ev.HaSynced):
                    if event.applied:
                        applied = max(applied, event.upto)
                    else:
                        synced = max(synced, event.upto)
                    continue
                if applied or synced:  # in order with what follows
                    self._on_synced(applied, synced)
                    applied = synced = 0
                if isinstance(event, ev.HaHeartbeat):
                    self.on_peer_heartbeat(event)
                elif isinstance(event, ev.Close | ev.EndOfStream):
                    return
            if applied or synced:
                self._on_synced(applied, synced)
            if not await link.receive() and link.dead:  # broke (EOF: its event comes next)
                return

    # --- the witness -------------------------------------------------------------------

    async def _witness_loop(self) -> None:
        """Keep a link to the witness open: log in, then send the machine's lease
        requests and hand it the answers. Redial after a pause when it drops."""
        cfg = self.config
        host, _, port = cfg.witness.rpartition(":")
        refused = ""
        while True:
            try:
                await self._run_witness_link(host, int(port))
                refused = ""
            except _WitnessRefused as exc:
                if exc.text != refused:
                    log.error("ha_witness_refused", witness=cfg.witness, text=exc.text)
                refused = exc.text
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, EOFError) as exc:
                # a failed TLS handshake comes as BrokenResourceError from its SSLError
                tls = cfg.witness_tls and isinstance(exc, trio.BrokenResourceError)
                text = describe_tls_error(exc) if tls else ""
                if text and text != refused:
                    log.error("ha_witness_tls_failed", witness=cfg.witness, error=text)
                    refused = text
                log.debug("ha_witness_link_failed", witness=cfg.witness, error=str(exc))
            except WitnessProtocolError as exc:
                log.warning("ha_witness_protocol_error", witness=cfg.witness, error=exc.text)
            finally:
                if self.witness_link_up:
                    log.warning("ha_witness_link_down", witness=cfg.witness)
                self.witness_link_up = False
                self._witness_out = None
            await trio.sleep(cfg.heartbeat_ms / 1000 * random.uniform(0.5, 1.0))

    async def _run_witness_link(self, host: str, port: int) -> None:
        cfg = self.config
        timeout = cfg.failover_timeout_ms / 1000
        stream: trio.abc.Stream
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            if cfg.witness_tls:  # the cluster password must not cross in clear
                stream = trio.SSLStream(
                    stream, node_client_context(self.node.config.tls), server_hostname=host
                )
                await stream.do_handshake()
        reader = FrameReader()
        async with stream:
            with trio.fail_after(timeout):
                await stream.send_all(
                    encode_frame(hello_map(cfg.login, cfg.password, self.node.node_id))
                )
                answer = await _read_map(stream, reader)
            if answer.get("m") == "refused":
                raise _WitnessRefused(str(answer.get("text", "refused")))
            if answer.get("m") != "welcome":
                raise WitnessProtocolError(f"the witness answered {answer.get('m')!r} to hello")
            send, receive = trio.open_memory_channel[bytes](64)
            self._witness_out = send
            self.witness_link_up = True
            log.info("ha_witness_link_up", witness=cfg.witness)
            broken: BaseException | None = None
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._witness_writer, stream, receive)
                    self._wake.set()  # the ticker asks at once if a renewal is due
                    await self._read_witness(stream, reader)
            except* (trio.BrokenResourceError, OSError, EOFError, WitnessProtocolError) as group:
                broken = group.exceptions[0]
            if broken is not None:  # one error, not a group, for _witness_loop
                raise broken

    async def _read_witness(self, stream: trio.abc.Stream, reader: FrameReader) -> None:
        while True:
            data = await _read_map(stream, reader)
            if data.get("m") != "lease":
                text = str(data.get("text", data.get("m")))
                raise WitnessProtocolError(f"the witness says: {text}")
            machine = self.machine
            if machine is not None:
                self.apply(machine.on_lease(LeaseAnswer.from_map(data), trio.current_time()))

    async def _witness_writer(
        self, stream: trio.abc.Stream, receive: trio.MemoryReceiveChannel[bytes]
    ) -> None:
        async for frame in receive:
            await stream.send_all(frame)

    async def _hold_watch(self) -> None:
        """Fail the confirms the promise has held back for longer than
        ``hold_timeout_ms`` (506, with the reason), so publishers are not stuck."""
        bound = self.config.hold_timeout_ms / 1000
        text = (
            "not confirmed: the HA peer is silent and "
            + (
                "the witness lease is not held"
                if self.promise is Promise.WITNESS
                else 'on_peer_silence = "hold"'
            )
            + f"; held {bound:g} s (hold_timeout_ms), the message may or may not be kept"
        )
        while True:
            await trio.sleep(min(0.25, bound / 4))
            storage = self.node.storage
            if storage is not None and storage.holding:
                failed = storage.fail_held(trio.current_time() - bound, text)
                if failed:
                    self.held_failed += failed
                    log.warning("ha_held_confirms_failed", count=failed, hold_timeout_s=bound)

    # --- replication: the active side ----------------------------------------------------

    def _start_replication(self) -> None:
        machine = self.machine
        storage = self.node.storage
        if (
            self.replicator.replicating
            or self.node.state != HaState.ACTIVE.value  # BecameActive not applied yet
            or machine is None
            or storage is None
            or storage.journal is None
            or not replication_wanted(machine, link_up=self.link_up, now=trio.current_time())
        ):
            return
        journal = storage.journal
        snapshot = [frame_record(r) for r in journal.snapshot()]
        self._apply_replication(self.replicator.start(machine.epoch, snapshot, journal.appended))

    def _stop_replication(self) -> None:
        self._apply_replication(self.replicator.stop())

    def _apply_replication(self, actions: Sequence[ReplicatorAction]) -> None:
        storage = self.node.storage
        for action in actions:
            if isinstance(action, SendSync):
                self._send_link(
                    ev.HaSync(
                        upto=action.upto, data=action.data, reset=action.reset, epoch=action.epoch
                    )
                )
                if storage is not None:
                    storage.replica.sent(action.upto, action.last_id)
                    # a confirm waits for this node's commit and the peer's, which
                    # starts as the sync arrives: start ours now, beside it, not
                    # after the batch wait (NodeStorage.run)
                    storage.commit_now()
            elif isinstance(action, ReplicaSynced):
                if storage is not None:
                    storage.replica_progress(action.upto)
                if self.promise is Promise.WITNESS:
                    self._update_promise()  # caught up: the witness may hear "in sync"
                self._signal_progress()
            elif isinstance(action, ReplicaApplied):
                if storage is not None:
                    storage.replica_applied(action.upto)
            elif isinstance(action, ReplicationStarted):
                self._snapshot_at = action.position
                if storage is not None:
                    # the replicator itself: it says when the sender has work
                    storage.tee_to = self.replicator  # (its appended, inline)
                    storage.tee_wake = self._wake_sender
                    storage.tee_turn = self._tee_turn
                    storage.replica_required(True)
                log.info(
                    "ha_replication_started",
                    snapshot_records=action.records,
                    position=action.position,
                )
            elif isinstance(action, ReplicationStopped):
                if storage is not None:
                    storage.tee = storage.tee_to = None
                    storage.tee_turn = None
                    storage.replica_required(False)
                log.warning("ha_replication_stopped", synced_upto=action.synced_upto)
                self._update_promise()
                self._signal_progress()

    def _wake_sender(self) -> None:
        """The tee appended a record the sender can send now (``Replicator.appended``
        returned True; else the ack that lets it go wakes the sender)."""
        self._sender_wake.set()

    def _tee_turn(self, opened: bool) -> None:
        if opened:
            self.replicator.hold()
        else:
            self.replicator.release()
            self._sender_wake.set()

    async def _sender(self) -> None:
        """Send what the replicator has for the peer. Woken by appends and acks; what
        accumulates until it runs goes in one chunk."""
        while True:
            # (wait() yields even when the event is set already: no checkpoint after)
            await self._sender_wake.wait()
            self._sender_wake = trio.Event()
            self._apply_replication(self.replicator.take())

    def _on_synced(self, applied: int, synced: int) -> None:
        """``ha.synced``: the passive node committed up to ``synced`` and applied up to
        ``applied`` (0: not said)."""
        replicator = self.replicator
        if synced:
            self._apply_replication(replicator.synced(synced))
        if applied > synced:
            self._apply_replication(replicator.applied(applied))
        if replicator.sendable:  # the window may have room again, the tail may go
            self._sender_wake.set()

    # --- replication: the passive side ---------------------------------------------------

    def on_handover(self, handover: ev.HaHandover) -> None:
        """``ha.handover`` from the active peer (its planned switchover)."""
        log.info("ha_handover_heard", upto=handover.upto, epoch=handover.epoch)
        self.follower.on_handover(handover.upto, handover.epoch)

    def on_sync(self, sync: ev.HaSync, conn: HaPeerEnd) -> None:
        machine = self.machine
        if machine is None or machine.state is HaState.ACTIVE:
            log.warning("ha_sync_ignored", reason="this node is active", epoch=sync.epoch)
            return
        actions = self.follower.on_sync(conn, sync.data, sync.upto, sync.reset, sync.epoch)
        self._follow_queue.extend((action, conn) for action in actions)
        self._drain_follow()

    def _drain_follow(self) -> None:
        """Apply the follower's actions in order. A snapshot of several chunks is
        applied by a task, a chunk at a time (the loop runs between: heartbeats go
        on); what follows waits for it, and so does a promotion (see :meth:`_drain`)."""
        queue = self._follow_queue
        while queue and not self._applying:
            action, conn = queue.popleft()
            if isinstance(action, ApplySync) and len(action.chunks) > 1:
                assert self._nursery is not None
                self._applying = True
                self._nursery.start_soon(self._apply_in_chunks, action.chunks)
            else:
                self._apply_follower([action], conn)

    async def _apply_in_chunks(self, chunks: tuple[bytes, ...]) -> None:
        storage = self.node.storage
        if storage is not None:
            storage.hold()  # the snapshot reaches the files whole
        try:
            for chunk in chunks:
                self._apply_chunk(chunk)
                await trio.lowlevel.checkpoint()
        finally:
            if storage is not None:
                storage.release()
        self._applying = False
        self._drain_follow()
        self._drain()

    def _apply_chunk(self, chunk: bytes) -> None:
        """Journal the framed records in ``chunk`` as they came (checked, not encoded
        again), in one entry (one sync is one or more whole turns of the master's
        journal: a commit never writes half of it). Their fold into the journal's
        state and the broker waits (:meth:`fold_replica`), for at most
        ``FOLD_AFTER_BYTES`` of them, or ``FOLD_IDLE`` once syncs stop. A node
        without a journal folds at once."""
        node = self.node
        storage = node.storage
        journal = storage.journal if storage is not None else None
        if journal is None:
            # the broker follows the topology only (Broker.follow)
            framed = parse_scanned(chunk, self._scan.scan)
            node.broker.follow([record for record, _ in framed], trio.current_time())
            return
        self._frames.check(chunk)
        journal.append_unfolded(chunk)
        self._chunks_unfolded += 1
        if journal.unfolded_bytes >= FOLD_AFTER_BYTES or journal.followed_waiting:
            self.fold_replica()
        elif not self._unfolded_wake.is_set():
            self._unfolded_wake.set()

    async def _fold_when_idle(self) -> None:
        """Fold what :meth:`_apply_chunk` left once no sync has come for ``FOLD_IDLE``."""
        while True:
            await self._unfolded_wake.wait()
            self._unfolded_wake = trio.Event()
            seen = -1
            while seen != self._chunks_unfolded:
                seen = self._chunks_unfolded
                await trio.sleep(FOLD_IDLE)
            self.fold_replica()

    def fold_replica(self) -> None:
        """Fold what this node journaled unfolded (a passive node's syncs,
        :meth:`_apply_chunk`) into the journal's state and the broker (the topology and
        the publish keys it follows). Done when the unfolded tail reaches
        ``FOLD_AFTER_BYTES``, when no sync has come for ``FOLD_IDLE``, before this
        node takes over, and before its status is read; the journal folds by itself
        for anything that reads its state."""
        storage = self.node.storage
        journal = storage.journal if storage is not None else None
        if journal is None:
            return
        journal.fold()
        followed = journal.take_followed()
        if followed:
            broker, now = self.node.broker, trio.current_time()
            for records in followed:
                broker.follow(records, now)

    def _apply_follower(self, actions: Sequence[FollowerAction], conn: HaPeerEnd) -> None:
        storage = self.node.storage
        for action in actions:
            if isinstance(action, ApplySync):
                for chunk in action.chunks:
                    self._apply_chunk(chunk)
            elif isinstance(action, SendSynced):
                conn.send_reply(ev.HaSynced(upto=action.upto, applied=action.applied))
            elif isinstance(action, AckAfterCommit):
                upto = action.upto

                def committed(upto: int = upto) -> None:
                    self._apply_follower(self.follower.committed(upto), conn)

                if storage is not None and storage.journal is not None:
                    storage.after_commit(committed)
                else:
                    committed()

    # --- status --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        machine = self.machine
        if machine is None:
            return {"role": self.role.value}
        now = trio.current_time()
        status = machine.status(now)
        status["state"] = self.node.state  # the state applied, with its stored epoch:
        status["epoch"] = self._shown_epoch  # one snapshot (see __init__)
        storage = self.node.storage
        appended = storage.appended if storage is not None else 0
        replicator = self.replicator
        status.update(
            {
                "peer_address": self.config.peer,
                "link_up": self.link_up,
                "tls": self._tls is not None,  # the peer link dials over TLS
                "replicating": replicator.replicating,
                "replication_lag_records": replicator.lag(appended),
                "replication_in_flight_bytes": replicator.in_flight,
                "applied_upto": self.follower.synced_upto,
                "witness_address": self.config.witness or None,
                "witness_link_up": self.witness_link_up,
                "confirms_held": storage.holding if storage is not None else False,
                "held_confirms_failed": self.held_failed,
            }
        )
        return status
