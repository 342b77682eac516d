"""The HA pair's trio shell: heartbeats, the state machine, fencing, replication.

Each node of a pair dials the other (the *peer link*, a connection opened with
``hello`` {role: "ha-peer"}) and sends on it a heartbeat every interval, whatever
it thinks of its peer; it hears its peer's heartbeats on the connection the peer
opened to it. The sans-IO :class:`~amqlite.ha.HaMachine` turns heartbeats, client
hellos and time into actions, applied here in order.

Replication: while this node is ACTIVE and its link is up, it streams its journal
to the peer with ``ha.sync``: first a snapshot of the durable state (``reset``),
then every record appended since. The passive node applies them to its broker,
appends them to its own journal and answers ``ha.synced`` once committed. While
a passive peer is attached, a reply that waits for the disk (a persistent
confirm, a durable declaration) also waits until the peer holds its records;
when the peer goes silent or the link drops, replies wait for the local commit
only. Transient messages and non-durable queues are not replicated.
"""

from __future__ import annotations

import os
import random
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog
import trio

from amqlite.config import ClusterConfig
from amqlite.errors import AmqliteError, ReplyCode
from amqlite.ha import (
    BecameActive,
    BecamePassive,
    CloseClients,
    HaEvent,
    HaMachine,
    HaRole,
    HaState,
    Heartbeat,
    PeerHeard,
    PeerSilent,
    PersistEpoch,
    RefusedHeartbeat,
    SendHeartbeat,
    Verdict,
)
from amqlite.ha.errors import HeartbeatError
from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev
from amqlite.store.segment import frame_record, parse_framed

if TYPE_CHECKING:
    from .node import BrokerNode

log = structlog.get_logger("amqlite.ha")

EPOCH_FILE = "HA_EPOCH"
SYNC_CHUNK = 512 * 1024  # bytes of records per ha.sync frame
SYNC_WINDOW = 8 * 1024 * 1024  # bytes sent and not yet acknowledged
LINK_BACKOFF = (0.05, 1.0)
_LINK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, AmqliteError)


class HaService:
    """One node's side of an HA pair; see the module docstring."""

    def __init__(self, node: BrokerNode, config: ClusterConfig) -> None:
        self.node = node
        self.config = config
        self.role = HaRole.PRIMARY if config.role == "primary" else HaRole.BACKUP
        self.machine: HaMachine | None = None
        self._wake = trio.Event()
        self._link_out: Connection | None = None
        self._link_stream: trio.SocketStream | None = None
        self._link_buffer = bytearray()
        self._link_wake = trio.Event()
        self.link_up = False
        # replication, active side
        self.replicating = False
        self._pending: deque[tuple[int, bytes]] = deque()
        self._in_flight = 0  # bytes sent, not yet acknowledged
        self._unacked: deque[tuple[int, int]] = deque()  # (upto, bytes) sent
        self._replicator_wake = trio.Event()
        self._sent_upto = 0
        self.synced_upto = 0
        self._snapshot_sent = False
        # replication, passive side
        self.applied_upto = 0
        self.syncs_received = 0
        self.inbound_links = 0  # peer-link connections the peer opened to us
        self.handing_over = False
        self._nursery: trio.Nursery | None = None
        self._progress = trio.Event()  # set (and replaced) on every change of state or ack

    # --- start ---------------------------------------------------------------------------

    def _epoch_path(self) -> str | None:
        storage = self.node.storage
        return os.path.join(storage.directory, EPOCH_FILE) if storage is not None else None

    def _load_epoch(self) -> int:
        path = self._epoch_path()
        if path is None:
            return 0
        try:
            with open(path, encoding="ascii") as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            raise AmqliteError(f"cannot read the HA epoch from {path}: {exc}") from exc

    def _persist_epoch(self, epoch: int) -> None:
        path = self._epoch_path()
        if path is None:
            return
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(f"{epoch}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        self.machine = HaMachine(
            self.role,
            self.node.node_id,
            cfg.vhost,
            now=trio.current_time(),
            epoch=self._load_epoch(),
            heartbeat=cfg.heartbeat_ms / 1000,
            failover_timeout=cfg.failover_timeout_ms / 1000,
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
        )
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._ticker)
            nursery.start_soon(self._link_loop)
            nursery.start_soon(self._replicator)
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

    def apply(self, actions: Any, *, wake_ticker: bool = True) -> None:
        """Carry out the machine's actions; ``wake_ticker`` makes the ticker take the
        machine's next deadline (an event may have moved it)."""
        machine = self.machine
        assert machine is not None
        for action in actions:
            if isinstance(action, SendHeartbeat):
                self._send_link(ev.HaHeartbeat(**action.heartbeat.to_map()))
            elif isinstance(action, PersistEpoch):
                self._persist_epoch(action.epoch)
            elif isinstance(action, BecameActive):
                self.node.state = HaState.ACTIVE.value
                flagged = 0
                if action.previous is HaState.PASSIVE and action.event is HaEvent.CLIENT_REQUEST:
                    # a failover: the dead master's last deliveries may not be here
                    flagged = self.node.broker.flag_redelivered()
                log.warning(
                    "ha_became_active",
                    previous=action.previous.value,
                    trigger=action.event.value,
                    epoch=action.epoch,
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
        if machine.state is HaState.ACTIVE:
            self._start_replication()
        if self.node.peering is not None:
            self.node.peering.ha_state_changed()
        if wake_ticker:
            self._wake.set()
        self._signal_progress()

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
            machine = self.machine
            assert machine is not None
            decision = machine.on_client_request(trio.current_time())
            self.apply(decision.actions)
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
            target = storage.appended
            self._wake_replicator()
            with trio.move_on_after(request.timeout / 2):
                await self._wait_until(lambda: self.synced_upto >= target or not self.replicating)
            if self.synced_upto < target or not self.replicating:
                fail(f"the peer did not catch up (holds {self.synced_upto} of {target})")
                return
            # Restart our side as a starting node: the peer hears PRIMARY/BACKUP from
            # its master and takes over; we then hear it active and go passive.
            epoch = machine.epoch
            self._stop_replication()
            self.machine = HaMachine(
                self.role,
                self.node.node_id,
                self.config.vhost,
                now=trio.current_time(),
                epoch=epoch,
                heartbeat=self.config.heartbeat_ms / 1000,
                failover_timeout=self.config.failover_timeout_ms / 1000,
            )
            self.node.state = self.machine.state.value
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

    def _reset_broker(self) -> None:
        """Demoted: start again from the journal's durable state; the new active
        node's snapshot replaces it."""
        node = self.node
        old = node.broker
        node.broker = node.new_broker()
        node.broker.wall_offset = old.wall_offset
        storage = node.storage
        if storage is not None and storage.journal is not None:
            node.broker.apply(storage.journal.state.snapshot(), trio.current_time())

    def heartbeat_event(self) -> ev.HaHeartbeat | None:
        """This node's heartbeat, as its peer link carries it (None before start)."""
        machine = self.machine
        if machine is None:
            return None
        return ev.HaHeartbeat(**machine.heartbeat().to_map())

    # --- the outbound link ---------------------------------------------------------------

    def _send_link(self, event: ev.Event) -> None:
        proto = self._link_out
        if proto is None:
            return
        try:
            self._link_buffer += proto.send(event)
        except AmqliteError:
            return
        self._link_wake.set()

    async def _link_loop(self) -> None:
        delay = LINK_BACKOFF[0]
        while True:
            host, _, port = self.config.peer.rpartition(":")
            try:
                try:
                    await self._run_link(host, int(port))
                    delay = LINK_BACKOFF[0]
                except* _LINK_ERRORS as group:  # the link's own nursery groups them
                    log.debug("ha_link_failed", peer=self.config.peer, error=repr(group))
            finally:
                if self.link_up:
                    log.warning("ha_link_down", peer=self.config.peer)
                self.link_up = False
                self._link_out = None
                self._link_buffer = bytearray()
                self._stop_replication()
            await trio.sleep(delay * random.uniform(0.5, 1.0))
            # never back off past a heartbeat: a restarting peer must hear us
            # well within its failover timeout
            delay = min(delay * 2, LINK_BACKOFF[1], self.config.heartbeat_ms / 1000)

    async def _run_link(self, host: str, port: int) -> None:
        cfg = self.config
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            proto = Connection(Role.CLIENT, max_frame_size=self.node.config.server.max_frame_bytes)
            hello = ev.Hello(
                1,
                vhost=cfg.vhost,
                login=cfg.login,
                password=cfg.password,
                client=self.node.node_id,
                role="ha-peer",
            )
            await stream.send_all(proto.send(hello))
            reply = await self._receive(stream, proto)
            if isinstance(reply, ev.Refused):
                log.error("ha_link_refused", peer=cfg.peer, code=reply.code, text=reply.text)
                await trio.sleep(1.0)
                return
            if not isinstance(reply, ev.Welcome):
                return
            self._link_out = proto
            self._link_stream = stream
            self.link_up = True
            log.info("ha_link_up", peer=cfg.peer, peer_node=reply.server)
            self._start_replication()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._link_writer, stream)
                while True:
                    event = await self._receive(stream, proto)
                    if isinstance(event, ev.HaSynced):
                        if event.applied:
                            if self.node.storage is not None:
                                self.node.storage.replica_applied(event.upto)
                        else:
                            self._on_synced(event.upto)
                    elif isinstance(event, ev.HaHeartbeat):
                        self.on_peer_heartbeat(event)
                    elif isinstance(event, ev.Close | ev.EndOfStream):
                        nursery.cancel_scope.cancel()
                        return

    async def _receive(self, stream: trio.SocketStream, proto: Connection) -> ev.Event:
        while True:
            event = proto.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, ev.Event)
                if isinstance(event, ev.Heartbeat):
                    continue
                return event
            data = await stream.receive_some(256 * 1024)
            proto.receive_data(data)

    async def _link_writer(self, stream: trio.SocketStream) -> None:
        while True:
            if not self._link_buffer:
                self._link_wake = trio.Event()
                await self._link_wake.wait()
                continue
            data, self._link_buffer = self._link_buffer, bytearray()
            await stream.send_all(data)

    # --- replication: the active side ----------------------------------------------------

    def _start_replication(self) -> None:
        machine = self.machine
        storage = self.node.storage
        if (
            self.replicating
            or machine is None
            or machine.state is not HaState.ACTIVE
            or not self.link_up
            or storage is None
            or storage.journal is None
            or machine.peer_state is HaState.ACTIVE
            or machine.peer_silent(trio.current_time())  # a dead peer holds up no confirm
        ):
            return
        journal = storage.journal
        self.replicating = True
        self._pending.clear()
        self._unacked.clear()
        self._in_flight = 0
        self.synced_upto = 0
        snapshot_at = journal.appended
        frames = [frame_record(r) for r in journal.state.snapshot()]
        storage.tee = self._tee
        storage.replica_required(True)
        first = True
        chunk: list[bytes] = []
        size = 0
        for f in frames:
            chunk.append(f)
            size += len(f)
            if size >= SYNC_CHUNK:
                self._send_sync(b"".join(chunk), 0, reset=first)
                first, chunk, size = False, [], 0
        self._send_sync(b"".join(chunk), snapshot_at, reset=first)
        self._sent_upto = snapshot_at
        log.info("ha_replication_started", snapshot_records=len(frames), position=snapshot_at)

    def _stop_replication(self) -> None:
        if not self.replicating:
            return
        self.replicating = False
        self._pending.clear()
        storage = self.node.storage
        if storage is not None:
            storage.tee = None
            storage.replica_required(False)
        log.warning("ha_replication_stopped", synced_upto=self.synced_upto)

    def _tee(self, position: int, frame: bytes) -> None:
        self._pending.append((position, frame))
        self._wake_replicator()

    def _wake_replicator(self) -> None:
        self._replicator_wake.set()

    async def _replicator(self) -> None:
        while True:
            await self._replicator_wake.wait()
            self._replicator_wake = trio.Event()
            while self.replicating and self._pending and self._in_flight < SYNC_WINDOW:
                parts: list[bytes] = []
                size = 0
                upto = 0
                while self._pending and size < SYNC_CHUNK:
                    upto, frame = self._pending.popleft()
                    parts.append(frame)
                    size += len(frame)
                self._send_sync(b"".join(parts), upto)
                self._sent_upto = upto
            await trio.lowlevel.checkpoint()

    def _send_sync(self, data: bytes, upto: int, *, reset: bool = False) -> None:
        machine = self.machine
        epoch = machine.epoch if machine is not None else 0
        self._in_flight += len(data)
        self._unacked.append((upto, len(data)))
        self._send_link(ev.HaSync(upto=upto, data=data, reset=reset, epoch=epoch))

    def _on_synced(self, upto: int) -> None:
        if not self.replicating:
            return
        unacked = self._unacked
        while unacked and unacked[0][0] <= upto:
            self._in_flight -= unacked.popleft()[1]
        self.synced_upto = max(self.synced_upto, upto)
        self._signal_progress()
        storage = self.node.storage
        if storage is not None:
            storage.replica_progress(self.synced_upto)
        self._wake_replicator()

    # --- replication: the passive side ---------------------------------------------------

    def on_sync(self, sync: ev.HaSync, conn: Any) -> None:
        machine = self.machine
        if machine is None or machine.state is HaState.ACTIVE:
            log.warning("ha_sync_ignored", reason="this node is active", epoch=sync.epoch)
            return
        framed = parse_framed(sync.data)
        node = self.node
        storage = node.storage
        node.broker.apply([record for record, _ in framed], trio.current_time())
        self.syncs_received += 1
        if storage is not None and storage.journal is not None:
            journal = storage.journal
            for record, frame in framed:  # journaled as they came: not encoded again
                journal.append_framed(record, frame)
        if not sync.upto:
            return
        upto = sync.upto
        conn.send_reply(ev.HaSynced(upto=upto, applied=True))  # pushes may go

        def synced() -> None:
            self.applied_upto = upto
            conn.send_reply(ev.HaSynced(upto=upto))

        if storage is not None and storage.journal is not None:
            storage.after_commit(synced)
        else:
            synced()

    # --- status --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        machine = self.machine
        if machine is None:
            return {"role": self.role.value}
        now = trio.current_time()
        status = machine.status(now)
        storage = self.node.storage
        appended = storage.appended if storage is not None else 0
        status.update(
            {
                "peer_address": self.config.peer,
                "link_up": self.link_up,
                "replicating": self.replicating,
                "replication_lag_records": (appended - self.synced_upto)
                if self.replicating
                else None,
                "replication_in_flight_bytes": self._in_flight if self.replicating else 0,
                "applied_upto": self.applied_upto,
            }
        )
        return status
