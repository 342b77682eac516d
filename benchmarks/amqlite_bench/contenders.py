"""The systems one bench run measures: whose server, which clients, which scenarios.

A :class:`Contender` is one row name in the results (``amqlite``,
``amqlite-fsync-batch``, ``raw-trio``, ``rabbitmq``, ...) with the address of its
server, the pid to measure, the client driver that talks to it, and the
scenarios it takes part in. :class:`Lineup` starts what the options ask for and
stops all of it, by pid, when the bench ends; a system that cannot be had is
reported in one line and left out. ``amqlite-pair`` takes part in ``failover``
only and has no server here: the scenario starts (and kills) its own HA pair.

``amqlite-amqp`` is amqlite's own broker reached over AMQP 0-9-1: the brokers
the bench starts for amqlite get ``--amqp-port 0`` as well, and its rows
(``amqlite-amqp``, and ``amqlite-amqp-fsync-batch`` / ``-always`` for the
persistent run) use the pika clients RabbitMQ's use, so the two compare like
with like.

``amqlite-tls`` is a second broker started like ``amqlite``'s but with a TLS-only
native listener (``--tls``, a throwaway CA and certificate made by trustme in a
temporary directory, :mod:`amqlite_bench.tlscerts`); its clients are
``amqlite``'s, dialing ``amqlites://`` and verifying the broker against that CA.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from .errors import BenchError
from .failover import PAIR_SYSTEM
from .peers import NATS, RABBITMQ, Peer, PeerUnavailable, missing_client, start_peer, stop_peer
from .procs import ServerExited, ServerProcess, baseline_argv, broker_argv
from .scenarios import AMQLITE_ONLY, FAILOVER, PERSISTENT
from .systems import AMQLITE, AMQLITE_AMQP, AMQLITE_TLS, PIKA, RAW_TRIO
from .tlscerts import TrustmeMissing, make_certificates

#: The fsync policies ``1to1-persistent-confirm`` runs amqlite with.
FSYNC_MODES: tuple[str, ...] = ("batch", "always")
#: Why a system other than amqlite-pair sits ``failover`` out.
PAIR_ONLY = f"it kills an HA pair's master; {PAIR_SYSTEM} only"


def fsync_system(mode: str, system: str = AMQLITE) -> str:
    return f"{system}-fsync-{mode}"


def is_amqlite(system: str) -> bool:
    return system == AMQLITE or system.startswith(f"{AMQLITE}-")


Say = Callable[[str], None]


@dataclass(slots=True)
class Contender:
    system: str
    driver: str
    address: str
    auth: dict[str, str] = field(default_factory=dict)
    pid: int | None = None
    server: ServerProcess | None = None
    #: scenarios this one takes part in (None: every scenario not in ``skip``)
    only: frozenset[str] | None = None
    #: scenario -> why this one does not take part (said once, when it comes up)
    skip: dict[str, str] = field(default_factory=dict)
    #: set when its server died: no further runs
    dead: str | None = None

    def runs(self, scenario: str) -> bool:
        if self.dead is not None or scenario in self.skip:
            return False
        return self.only is None or scenario in self.only

    def check_alive(self) -> None:
        if self.server is not None:
            self.server.check_alive()


class Lineup:
    """What one bench run starts, and stops at its end."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.contenders: list[Contender] = []
        self._servers: list[ServerProcess] = []
        self._peers: list[Peer] = []
        self._dirs: list[str] = []

    async def start(
        self,
        nursery: trio.Nursery,
        *,
        systems: tuple[str, ...],
        peers: tuple[str, ...],
        scenarios: tuple[str, ...],
        servers: str | None,
        auth: dict[str, str],
    ) -> list[Contender]:
        if FAILOVER in scenarios and AMQLITE in systems:
            if servers is not None:
                self.say(
                    f"{PAIR_SYSTEM}: {FAILOVER} not run: it starts and kills an HA pair of its "
                    "own, not a broker named with -s"
                )
            else:
                self.contenders.append(
                    Contender(PAIR_SYSTEM, PAIR_SYSTEM, "", dict(auth), only=frozenset({FAILOVER}))
                )
        if not any(s != FAILOVER for s in scenarios):  # start nothing the pair does not need
            for name in (*(s for s in systems if s != AMQLITE), *peers):  # amqlite-amqp too
                self.say(f"{name}: {FAILOVER} not run: {PAIR_ONLY}")
            return self.contenders
        await self._start_others(nursery, systems, peers, scenarios, servers, auth)
        for c in self.contenders:  # selectors and groups: the native client's options
            if c.driver != AMQLITE and c.system != PAIR_SYSTEM:
                for name in AMQLITE_ONLY:
                    c.skip[name] = "selectors and message groups are measured on amqlite"
        if FAILOVER in scenarios:
            for c in self.contenders:
                if c.system in (AMQLITE, AMQLITE_AMQP):
                    c.skip[FAILOVER] = f"run on {PAIR_SYSTEM} (an HA pair of its own)"
                elif c.system != PAIR_SYSTEM and c.only is None:
                    c.skip[FAILOVER] = PAIR_ONLY
        return self.contenders

    async def _start_others(
        self,
        nursery: trio.Nursery,
        systems: tuple[str, ...],
        peers: tuple[str, ...],
        scenarios: tuple[str, ...],
        servers: str | None,
        auth: dict[str, str],
    ) -> None:
        if RAW_TRIO in systems:
            relay = await self._server(
                nursery, "raw-trio relay", baseline_argv(), "baseline_listening"
            )
            self.contenders.append(
                Contender(
                    RAW_TRIO,
                    RAW_TRIO,
                    relay.address,
                    pid=relay.pid,
                    server=relay,
                    skip={PERSISTENT: "the relay has no queues, disk or confirms"},
                )
            )
        native = AMQLITE in systems
        amqp = AMQLITE_AMQP in systems
        if amqp:
            why = missing_client(RABBITMQ)  # the same pika clients
            if why is None and servers is not None:
                why = "-s names a broker's native port, not its AMQP one"
            if why is not None:
                self.say(f"{AMQLITE_AMQP}: unavailable, left out: {why}")
                amqp = False
        if native or amqp:
            await self._start_amqlite(nursery, scenarios, servers, auth, native=native, amqp=amqp)
        if AMQLITE_TLS in systems:
            await self._start_amqlite_tls(nursery, servers, auth)
        for name in peers:
            try:
                peer = await start_peer(name)
            except PeerUnavailable as exc:
                self.say(f"{name}: unavailable, left out: {exc}")
                continue
            self._peers.append(peer)
            c = Contender(name, peer.driver or name, peer.address, pid=peer.pid)
            if name == NATS:
                c.skip[PERSISTENT] = nats_persistent_reason(peer)
            self.contenders.append(c)

    async def _start_amqlite(
        self,
        nursery: trio.Nursery,
        scenarios: tuple[str, ...],
        servers: str | None,
        auth: dict[str, str],
        *,
        native: bool = True,
        amqp: bool = False,
    ) -> None:
        """amqlite's brokers; ``native``: rows for amqlite's own protocol and client,
        ``amqp``: rows for its AMQP 0-9-1 listener with pika (the same brokers)."""
        if servers is not None:  # a broker someone else runs: every scenario on it
            self.contenders.append(Contender(AMQLITE, AMQLITE, servers, dict(auth)))
            return
        amqp_flag = ("--amqp-port", "0") if amqp else ()
        # a data dir of its own, so the broker writes nothing where the bench was started
        data_dir = tempfile.mkdtemp(prefix="amqlite-bench-")
        self._dirs.append(data_dir)
        argv = broker_argv("--data-dir", data_dir, *amqp_flag)
        broker = await self._server(nursery, "amqlite broker", argv, "server_listening")
        plain: list[Contender] = []
        if native:
            plain.append(
                Contender(AMQLITE, AMQLITE, broker.address, dict(auth), broker.pid, broker)
            )
        if amqp:
            plain.append(self._amqp_contender(AMQLITE_AMQP, broker, auth))
        self.contenders.extend(plain)
        if PERSISTENT not in scenarios:
            return
        for mode in FSYNC_MODES:
            data_dir = tempfile.mkdtemp(prefix=f"amqlite-bench-fsync-{mode}-")
            self._dirs.append(data_dir)
            argv = broker_argv("--data-dir", data_dir, "--fsync", mode, *amqp_flag)
            try:
                server = await self._server(
                    nursery, f"amqlite broker (fsync {mode})", argv, "server_listening"
                )
            except BenchError as exc:
                if isinstance(exc, ServerExited) and exc.rejected_flag("--fsync"):
                    why = "this `amqlite server` has no --fsync flag yet (exit 2: unknown flag)"
                else:
                    why = str(exc).splitlines()[0]
                for c in plain:
                    c.skip[PERSISTENT] = (
                        f"unavailable: {why}; no {fsync_system('*', c.system)} broker could start"
                    )
                return
            for c in plain:
                c.skip[PERSISTENT] = (
                    f"run on {fsync_system('*', c.system)} (brokers with a data dir)"
                )
            only = frozenset({PERSISTENT})
            if native:
                self.contenders.append(
                    Contender(
                        fsync_system(mode),
                        AMQLITE,
                        server.address,
                        dict(auth),
                        server.pid,
                        server,
                        only=only,
                    )
                )
            if amqp:
                c = self._amqp_contender(fsync_system(mode, AMQLITE_AMQP), server, auth)
                c.only = only
                self.contenders.append(c)

    async def _start_amqlite_tls(
        self, nursery: trio.Nursery, servers: str | None, auth: dict[str, str]
    ) -> None:
        """A broker like ``amqlite``'s with a TLS-only native listener, and its
        contender (the amqlite clients over ``amqlites://``, verifying it)."""
        if servers is not None:
            self.say(
                f"{AMQLITE_TLS}: unavailable, left out: it starts a TLS broker of its own, "
                "not one named with -s"
            )
            return
        certs_dir = tempfile.mkdtemp(prefix="amqlite-bench-tls-certs-")
        self._dirs.append(certs_dir)
        try:
            certs = make_certificates(Path(certs_dir))
        except TrustmeMissing as exc:
            self.say(f"{AMQLITE_TLS}: unavailable, left out: {exc}")
            return
        data_dir = tempfile.mkdtemp(prefix="amqlite-bench-tls-")
        self._dirs.append(data_dir)
        argv = broker_argv("--data-dir", data_dir, *certs.server_flags())
        broker = await self._server(nursery, "amqlite broker (TLS)", argv, "server_listening")
        self.contenders.append(
            Contender(
                AMQLITE_TLS,
                AMQLITE,
                f"amqlites://{broker.address}",
                {**auth, "ca": str(certs.ca)},
                broker.pid,
                broker,
                skip={
                    PERSISTENT: f"TLS is compared with plain amqlite; {PERSISTENT} runs on "
                    f"{fsync_system('*')} only"
                },
            )
        )

    @staticmethod
    def _amqp_contender(system: str, server: ServerProcess, auth: dict[str, str]) -> Contender:
        address = server.amqp_address
        if address is None:
            raise BenchError(f"the {server.name} did not say where its AMQP listener is")
        return Contender(system, PIKA, address, dict(auth), server.pid, server)

    async def _server(
        self, nursery: trio.Nursery, name: str, argv: list[str], ready_event: str
    ) -> ServerProcess:
        server = await ServerProcess.start(nursery, name, argv, ready_event)
        self._servers.append(server)
        return server

    async def stop(self) -> None:
        """Stop every server this lineup started (peers only if it started them)."""
        with trio.CancelScope(shield=True):
            for server in reversed(self._servers):
                await server.stop()
            for peer in reversed(self._peers):
                await stop_peer(peer)
            for d in self._dirs:
                shutil.rmtree(d, ignore_errors=True)


def nats_persistent_reason(peer: Peer) -> str:
    if not peer.fsyncs_every_write():
        return (
            "JetStream here acknowledges a publish before it is fsynced (nats-server "
            "before 2.10 has no `sync_interval: always`; it syncs every 2 min), so its "
            "confirms promise less than amqlite's or RabbitMQ's: not comparable"
        )
    return "the bench's NATS clients drive core NATS only, not JetStream"
