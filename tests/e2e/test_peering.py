"""Exchange peering with real broker processes on loopback: each mode between two
brokers, link cuts through a fault-injecting proxy under a message stream (0 lost,
0 duplicated, 0 reordered), a subscribe-mode outage, a ring of brokers with mode
publish both ways (every consumer gets every message exactly once), and interest
(messages nobody remote bound put no bytes on the link). The kill -9 tests of a
receiver and of a subscribe link's remote run over TLS too (every listener and link
speaks TLS, each link verifying its remote's certificate against the CA and the
host name it dials)."""

from __future__ import annotations

import contextlib
import random
import signal
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

import amqlite
from tests.faultproxy import FaultProxy

from ..ports import fixed_port
from ..tls_certs import TlsFiles
from ..waiting import wait_until
from .procs import ServerProcess, run_cli, start_server
from .test_ha_pair import _drain, ha_pair, serve_somewhere

pytestmark = pytest.mark.e2e

EXCHANGE = "x"


@dataclass
class Site:
    """One broker process and the ``[[cluster_mta]]`` entries of its config."""

    name: str
    port: int
    links: list[tuple[str, str]] = field(default_factory=list)  # (host, mode)
    proc: ServerProcess | None = None
    link_extra: str = ""  # more keys for each of its [[cluster_mta]] entries

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Sites:
    tmp: Path
    nursery: trio.Nursery
    sites: dict[str, Site] = field(default_factory=dict)
    #: every site's listener speaks TLS only and every link dials over TLS
    tls: TlsFiles | None = None

    def add(self, name: str) -> Site:
        site = self.sites[name] = Site(name, fixed_port())
        return site

    def __getitem__(self, name: str) -> Site:
        return self.sites[name]

    def url(self, name: str) -> str:
        """What a client dials to reach site ``name`` (``amqlites://`` over TLS)."""
        address = self.sites[name].address
        return f"amqlites://{address}" if self.tls is not None else address

    @property
    def ca(self) -> str | None:
        """The CA a client verifies the sites with (None: plain)."""
        return str(self.tls.ca) if self.tls is not None else None

    async def start(self, name: str) -> Site:
        site = self.sites[name]
        config = self.tmp / f"{name}.toml"
        tls = self.tls
        text = f'[server]\nnode_id = "{name}"\n'
        if tls is not None:
            text += f'tls = true\n[tls]\ncert = "{tls.cert}"\nkey = "{tls.key}"\nca = "{tls.ca}"\n'
        for host, mode in site.links:
            text += (
                f'\n[[cluster_mta]]\nname = "{EXCHANGE}"\nhost = "{host}"\nmode = "{mode}"\n'
                'login = "guest"\npassword = "guest"\ntype = "topic"\n'
            ) + site.link_extra
            if tls is not None:
                text += "tls = true\n"
        config.write_text(text)
        site.proc = await start_server(
            "--config", str(config), "--port", str(site.port),
            "--data-dir", str(self.tmp / f"data-{name}"),
        )  # fmt: skip
        self.nursery.start_soon(_drain, site.proc, self.tmp / f"{name}.log")
        if not site.links:  # an accepting-only site: the exchange must exist there
            async with amqlite.connect(self.url(name), ca=self.ca) as conn:
                await conn.declare_exchange(EXCHANGE, "topic", durable=True)
        return site

    async def links(self, name: str) -> list[dict[str, Any]]:
        async with amqlite.connect(
            self.url(name), ca=self.ca, role="monitor", reconnect=False
        ) as conn:
            status = await conn.status()
        links: list[dict[str, Any]] = status["links"]
        return links

    async def wait(
        self, name: str, predicate: Callable[[list[dict[str, Any]]], bool], deadline: float = 20
    ) -> list[dict[str, Any]]:
        """Poll ``name``'s links (another process) until ``predicate`` holds; return them."""
        links: list[dict[str, Any]] = []

        async def holds() -> bool:
            nonlocal links
            links = await self.links(name)
            return predicate(links)

        await wait_until(holds, f"site {name}'s links", deadline=deadline, every=0.05)
        return links

    async def wait_up(self, *names: str, deadline: float = 20) -> None:
        for name in names:
            await self.wait(
                name, lambda ls: bool(ls) and all(x["state"] == "up" for x in ls), deadline
            )


@asynccontextmanager
async def sites(tmp_path: Path, tls: TlsFiles | None = None) -> AsyncIterator[Sites]:
    async with trio.open_nursery() as nursery:
        group = Sites(tmp_path, nursery, tls=tls)
        try:
            yield group
        finally:
            for site in group.sites.values():
                if site.proc is not None and site.proc.proc.returncode is None:
                    site.proc.proc.send_signal(signal.SIGCONT)
                    site.proc.proc.kill()
                    await site.proc.proc.wait()
            nursery.cancel_scope.cancel()


def _dialer(links: list[dict[str, Any]]) -> dict[str, Any]:
    return next(x for x in links if x["role"] == "dialer")


def _acceptor(links: list[dict[str, Any]]) -> dict[str, Any]:
    return next(x for x in links if x["role"] == "acceptor")


class StreamChecker:
    """Per-producer sequence numbers in, lost / duplicated / reordered out."""

    def __init__(self) -> None:
        self.seen: dict[str, Counter[int]] = defaultdict(Counter)
        self.last: dict[str, int] = {}
        self.reordered = 0
        self.total = 0
        self._waiting: list[tuple[int, trio.Event]] = []

    def reached(self, total: int) -> trio.Event:
        """An event set once ``total`` messages were recorded."""
        event = trio.Event()
        if self.total >= total:
            event.set()
        else:
            self._waiting.append((total, event))
        return event

    def record(self, producer: str, seq: int) -> None:
        self.total += 1
        if self._waiting:
            for total, event in self._waiting:
                if self.total >= total:
                    event.set()
        if self.seen[producer][seq] == 0 and seq < self.last.get(producer, -1):
            self.reordered += 1
        self.seen[producer][seq] += 1
        self.last[producer] = max(seq, self.last.get(producer, -1))

    def report(self, expected: dict[str, int]) -> dict[str, int]:
        lost = sum(1 for p, n in expected.items() for s in range(n) if self.seen[p][s] == 0)
        duplicated = sum(c - 1 for counts in self.seen.values() for c in counts.values() if c > 1)
        return {"lost": lost, "duplicated": duplicated, "reordered": self.reordered}


async def _consume_into(
    address: str,
    key: str,
    checker: StreamChecker,
    done: trio.Event,
    total: int,
    durable: str = "",
    ca: str | None = None,
) -> None:
    """Consume ``total`` messages from a queue bound with ``key`` (an exclusive one,
    or the durable queue ``durable``) into ``checker`` (``ca``: over TLS)."""
    async with amqlite.connect(address, ca=ca) as conn:
        if durable:
            q = (await conn.declare_queue(durable, durable=True)).name
        else:
            q = (await conn.declare_queue("", exclusive=True)).name
        await conn.bind(q, EXCHANGE, key)
        consumer = await conn.consume(q, no_ack=True, prefetch=1000)
        done.set()  # bound: the interest is on its way
        async for d in consumer:
            checker.record(str(d.headers["p"]), int(d.headers["s"]))
            if checker.total >= total:
                return


async def _publish(
    address: str,
    producer: str,
    n: int,
    key: str = "k.a",
    size: int = 16,
    persistent: bool = False,
    ca: str | None = None,
) -> None:
    body = b"x" * size
    async with amqlite.connect(address, ca=ca) as conn:
        for seq in range(n):
            await conn.publish(
                EXCHANGE, key, body, headers={"p": producer, "s": seq}, persistent=persistent
            )
        await conn.publish(EXCHANGE, "sync", b"", confirm=True)


# --- each mode, positive and negative ----------------------------------------------


@pytest.mark.parametrize("mode", ["publish", "subscribe", "forward"])
async def test_each_mode_between_two_brokers(tmp_path: Path, mode: str) -> None:
    async with sites(tmp_path) as group:
        group.add("a")
        b = group.add("b")
        group["a"].links.append((b.address, mode))
        await group.start("b")
        await group.start("a")
        await group.wait_up("a", "b")
        # the side messages come from, and the side that receives them
        source, sink = ("b", "a") if mode == "subscribe" else ("a", "b")
        async with (
            amqlite.connect(group[source].address) as src,
            amqlite.connect(group[sink].address) as dst,
        ):
            wanted = (await dst.declare_queue("", exclusive=True)).name
            await dst.bind(wanted, EXCHANGE, "wanted.*")
            got = await dst.consume(wanted, no_ack=True)
            sender = "b" if mode == "subscribe" else "a"
            sender_end = _acceptor if mode == "subscribe" else _dialer
            await group.wait(sender, lambda ls: sender_end(ls)["interest_size"] == 1)
            local_taker = None
            if mode == "forward":  # a local queue takes "wanted.here": it stays here
                local_taker = (await src.declare_queue("", exclusive=True)).name
                await src.bind(local_taker, EXCHANGE, "wanted.here")
            for i in range(20):
                await src.publish(EXCHANGE, "wanted.one", b"w%d" % i)
                await src.publish(EXCHANGE, "unwanted.one", b"u%d" % i)  # negative: nobody bound
                if mode == "forward":
                    await src.publish(EXCHANGE, "wanted.here", b"h%d" % i)  # negative: local
            bodies = []
            with trio.fail_after(20):
                async for d in got:
                    bodies.append(d.body)
                    if len(bodies) == 20:
                        break
            assert bodies == [b"w%d" % i for i in range(20)]
            end = await group.wait(sender, lambda ls: sender_end(ls)["lag_messages"] == 0)
            skipped = sender_end(end)["skipped"]
            if mode == "subscribe":  # b's peering queue for a took only what a bound
                assert sender_end(end)["queue"].startswith("amq.peering.x.")
                assert (sender_end(end)["queued"], sender_end(end)["accepted"]) == (0, 20)
            else:  # the link judged every message by the remote's interest
                assert skipped["no-interest"] == 20
            assert sender_end(end)["forwarded"] == 20
            if mode == "forward":
                assert skipped["delivered-locally"] == 20
                assert local_taker is not None
                status = await src.status()
                (queue,) = [
                    q for v in status["vhosts"] for q in v["queues"] if q["name"] == local_taker
                ]
                assert queue["messages"] == 20
            if mode == "publish":  # publish mode carries nothing back
                await dst.publish(EXCHANGE, "wanted.back", b"back", confirm=True)
                links = await group.links("b")
                assert _acceptor(links)["forwarded"] == 0


# --- link cuts under a stream ------------------------------------------------------


async def _cut_at(proxy: FaultProxy, checker: StreamChecker, thresholds: list[int]) -> None:
    """Cut the link each time the receiving consumer passes a threshold: hold what
    the sender sends until some bytes are held, then reset the connection, so what
    was on the wire is lost and must be sent again."""
    accepted = 0  # connections accepted when the last cut was made
    for threshold in thresholds:
        await checker.reached(threshold).wait()
        while True:  # cut the link's current connection (a new one since the last cut)
            stats = await proxy.wait_for(lambda st, seen=accepted: st.accepted > seen)
            accepted = stats.accepted
            proxy.partition()
            held = await proxy.wait_for(
                lambda st, sent=stats.bytes_from_client: st.bytes_from_client > sent or st.open == 0
            )
            cut = proxy.cut()
            proxy.heal()
            if cut and held.open:
                break


async def _cut_stream(tmp_path: Path, total: int, producers: int, cuts: int) -> None:
    async with sites(tmp_path) as group:
        a, b = group.add("a"), group.add("b")
        proxy = FaultProxy(("127.0.0.1", b.port))
        await group.nursery.start(proxy.run)
        a.links.append((proxy.address, "publish"))
        await group.start("b")
        await group.start("a")
        await group.wait_up("a", "b")
        checker = StreamChecker()
        per_producer = total // producers
        expected = {f"p{i}": per_producer for i in range(producers)}
        bound = trio.Event()
        with trio.fail_after(60 + total / 500):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _consume_into, b.address, "k.*", checker, bound, per_producer * producers, "q"
                )
                await bound.wait()
                await group.wait("a", lambda ls: _dialer(ls)["interest_size"] == 1)
                rng = random.Random(5)
                thresholds = sorted(rng.sample(range(total // 20, total - total // 20), cuts))
                nursery.start_soon(_cut_at, proxy, checker, thresholds)
                async with trio.open_nursery() as publishers:
                    for producer in expected:
                        # persistent into a durable queue: the receiver acknowledges only
                        # after its journal commit
                        publishers.start_soon(
                            _publish, a.address, producer, per_producer, "k.a", 16, True
                        )
        report = checker.report(expected)
        assert report == {"lost": 0, "duplicated": 0, "reordered": 0}, report
        assert proxy.stats.cuts == cuts, proxy.stats
        links = await group.links("a")
        assert _dialer(links)["reconnects"] >= cuts
        b_links = await group.links("b")
        assert _acceptor(b_links)["received"] == total


async def test_random_link_cuts_lose_duplicate_and_reorder_nothing(tmp_path: Path) -> None:
    await _cut_stream(tmp_path, total=6000, producers=3, cuts=10)


@pytest.mark.soak
async def test_random_link_cuts_over_100k_messages(tmp_path: Path) -> None:
    await _cut_stream(tmp_path, total=100_000, producers=4, cuts=60)


# --- subscribe: an outage --------------------------------------------------------


async def test_subscribe_outage_what_was_published_remotely_arrives_after_reconnect(
    tmp_path: Path,
) -> None:
    async with sites(tmp_path) as group:
        a, b = group.add("a"), group.add("b")
        proxy = FaultProxy(("127.0.0.1", b.port))
        await group.nursery.start(proxy.run)
        a.links.append((proxy.address, "subscribe"))
        await group.start("b")
        await group.start("a")
        await group.wait_up("a", "b")
        checker = StreamChecker()
        bound = trio.Event()
        n = 500
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_consume_into, a.address, "k.*", checker, bound, 2 * n)
                await bound.wait()
                await group.wait("b", lambda ls: _acceptor(ls)["interest_size"] == 1)
                await _publish(b.address, "before", n)
                proxy.partition(refuse_new=True)
                proxy.cut()
                await group.wait("b", lambda ls: _acceptor(ls)["state"] == "waiting")
                await _publish(b.address, "during", n)
                during = await group.links("b")
                assert _acceptor(during)["lag_messages"] >= n  # held for the subscriber
                assert checker.seen["during"].total() == 0
                proxy.heal()
        report = checker.report({"before": n, "during": n})
        assert report == {"lost": 0, "duplicated": 0, "reordered": 0}, report
        links = await group.wait("b", lambda ls: _acceptor(ls)["lag_messages"] == 0)
        assert _acceptor(links)["state"] == "up"


async def _publish_confirmed(
    servers: str,
    producer: str,
    n: int,
    confirmed: set[int],
    reconnect: bool,
    halfway: trio.Event | None = None,
    ca: str | None = None,
) -> None:
    """Persistent messages ``0..n-1``, each confirmed before the next; ``confirmed``
    collects those the broker confirmed, and ``halfway`` is set once ``n // 2`` are.
    Without ``reconnect`` it stops at the first failure (the broker was killed)."""
    with contextlib.suppress(amqlite.AmqliteError, OSError):
        async with amqlite.connect(servers, reconnect=reconnect, ca=ca) as conn:
            for seq in range(n):
                await conn.publish(
                    EXCHANGE,
                    "k.a",
                    b"x" * 16,
                    headers={"p": producer, "s": seq},
                    persistent=True,
                    confirm=True,
                )
                confirmed.add(seq)
                if halfway is not None and len(confirmed) >= n // 2:
                    halfway.set()


def _check_subscriber(checker: StreamChecker, producer: str, confirmed: set[int]) -> None:
    """Every confirmed message arrived once; nothing arrived twice or out of order."""
    missing = sorted(s for s in confirmed if checker.seen[producer][s] == 0)
    dup = {s: c for s, c in checker.seen[producer].items() if c > 1}
    assert (missing[:10], dup, checker.reordered) == ([], {}, 0), (len(missing), len(dup))


#: a kill -9 test runs plain and with every listener and link over TLS
over_tls_too = pytest.mark.parametrize("tls", ["plain", "tls"], indirect=True)

#: how many persistent confirmed messages (each confirmed before the next) a kill -9
#: test publishes: enough that the kill lands mid-stream by default, and more
#: behind the soak marker
stream_lengths = pytest.mark.parametrize(
    "n", [600, pytest.param(1500, marks=pytest.mark.soak, id="1500")], ids=["600", "1500"]
)


@pytest.fixture
def tls(request: pytest.FixtureRequest) -> TlsFiles | None:
    """The certificates when the test is parametrized ``tls`` (None: ``plain``)."""
    if request.param == "tls":
        files: TlsFiles = request.getfixturevalue("tls_files")
        return files
    return None


def _assert_links_tls(links: list[dict[str, Any]], tls: TlsFiles | None) -> None:
    """Each link's status says whether it runs over TLS, as the sites were set up."""
    assert links and all(x["tls"] is (tls is not None) for x in links), links


@over_tls_too
@stream_lengths
async def test_subscribe_remote_killed_mid_stream_loses_and_duplicates_nothing(
    tmp_path: Path, tls: TlsFiles | None, n: int
) -> None:
    """A subscribes to B. B's peering queue for A is durable: B is killed with kill -9
    while it publishes persistent confirmed messages and started again; every message
    B confirmed reaches A's consumer once (what B had sent but A had not acknowledged
    comes again with its identity, and A drops the copy)."""
    async with sites(tmp_path, tls) as group:
        a, b = group.add("a"), group.add("b")
        a.links.append((b.address, "subscribe"))
        await group.start("b")
        await group.start("a")
        await group.wait_up("a", "b")
        checker = StreamChecker()
        bound = trio.Event()
        confirmed: set[int] = set()
        ca = group.ca
        with trio.fail_after(120):
            async with trio.open_nursery() as consumers:
                consumers.start_soon(
                    _consume_into, group.url("a"), "k.*", checker, bound, 10**9, "q", ca
                )
                await bound.wait()
                await group.wait("b", lambda ls: _acceptor(ls)["interest_size"] == 1)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        _publish_confirmed, group.url("b"), "p", n, confirmed, False, None, ca
                    )
                    await group.wait("a", lambda ls: _dialer(ls)["received"] >= n // 5)
                    assert b.proc is not None
                    b.proc.proc.kill()
                    await b.proc.proc.wait()
                killed_at = len(confirmed)
                assert 0 < killed_at < n
                await group.start("b")
                after: set[int] = set()
                await _publish_confirmed(group.url("b"), "after", 200, after, False, ca=ca)
                assert len(after) == 200
                await checker.reached(len(confirmed) + 200).wait()
                await group.wait("b", lambda ls: bool(ls) and _acceptor(ls)["lag_messages"] == 0)
                consumers.cancel_scope.cancel()
        _check_subscriber(checker, "p", confirmed)
        _check_subscriber(checker, "after", after)
        links = await group.links("a")
        assert _dialer(links)["reconnects"] >= 1
        _assert_links_tls(links + await group.links("b"), tls)


@stream_lengths
async def test_subscribe_to_an_ha_pair_whose_master_is_killed_loses_and_duplicates_nothing(
    tmp_path: Path, n: int
) -> None:
    """A subscribes to an HA pair (host = primary,backup). The pair's master is killed
    with kill -9 while a client publishes persistent confirmed messages on the pair:
    the peering queue is replicated with everything else, the link follows the pair to
    its backup, and every confirmed message reaches A once."""
    (tmp_path / "pair").mkdir()
    (tmp_path / "sites").mkdir()
    async with ha_pair(tmp_path / "pair") as pair, sites(tmp_path / "sites") as group:
        await pair.start("primary")
        await pair.start("backup")
        await pair.wait_states("active", "passive")
        async with amqlite.connect(pair.servers) as conn:
            await conn.declare_exchange(EXCHANGE, "topic", durable=True)
        a = group.add("a")
        a.links.append((pair.servers, "subscribe"))
        await group.start("a")
        await group.wait_up("a")
        checker = StreamChecker()
        bound = trio.Event()
        confirmed: set[int] = set()
        with trio.fail_after(120):
            async with trio.open_nursery() as consumers:
                consumers.start_soon(_consume_into, a.address, "k.*", checker, bound, 10**9, "q")
                await bound.wait()
                await group.wait("a", lambda ls: _dialer(ls)["state"] == "up")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_publish_confirmed, pair.servers, "p", n, confirmed, True)
                    await group.wait("a", lambda ls: _dialer(ls)["received"] >= n // 5)
                    await pair.kill("primary")
                assert len(confirmed) == n  # the client failed over and went on
                await checker.reached(n).wait()
                consumers.cancel_scope.cancel()
        _check_subscriber(checker, "p", confirmed)
        links = await group.links("a")
        assert _dialer(links)["remote_address"] == pair.address("backup")


# --- rings and meshes with mode publish both ways ---------------------------------


def _ring(n: int) -> list[tuple[int, int]]:
    edges = {(i, (i + 1) % n) for i in range(n)} | {((i + 1) % n, i) for i in range(n)}
    return sorted(edges)


def _mesh(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(n) if i != j]


async def _topology(tmp_path: Path, n: int, edges: list[tuple[int, int]], per_site: int) -> None:
    async with sites(tmp_path) as group:
        names = [f"s{i}" for i in range(n)]
        for name in names:
            group.add(name)
        for i, j in edges:
            group[names[i]].links.append((group[names[j]].address, "publish"))
        for name in names:
            await group.start(name)
        await group.wait_up(*names, deadline=30)
        checkers = {name: StreamChecker() for name in names}
        expected = {name: per_site for name in names}
        total = per_site * n
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                for name in names:
                    bound = trio.Event()
                    nursery.start_soon(
                        _consume_into, group[name].address, "k.*", checkers[name], bound, total
                    )
                    await bound.wait()
                for name in names:  # every dialer knows every remote binding
                    await group.wait(name, lambda ls: all(x["interest_size"] == 1 for x in ls), 30)
                async with trio.open_nursery() as publishers:
                    for name in names:
                        publishers.start_soon(_publish, group[name].address, name, per_site)
        for name in names:
            report = checkers[name].report(expected)
            assert report == {"lost": 0, "duplicated": 0, "reordered": 0}, (name, report)
            assert checkers[name].total == total


async def test_ring_of_3_with_mode_publish_both_ways_delivers_exactly_once(tmp_path: Path) -> None:
    await _topology(tmp_path, 3, _ring(3), per_site=300)


@pytest.mark.soak
@pytest.mark.parametrize(("n", "shape"), [(4, "ring"), (5, "ring"), (4, "mesh")])
async def test_larger_rings_and_a_mesh_deliver_exactly_once(
    tmp_path: Path, n: int, shape: str
) -> None:
    edges = _ring(n) if shape == "ring" else _mesh(n)
    await _topology(tmp_path, n, edges, per_site=500)


# --- a full link (overflow = block) --------------------------------------------------


async def test_a_full_block_link_delivers_every_message_once_in_order(tmp_path: Path) -> None:
    """A publisher faster than the link fills a ``block`` link's buffer (64 KiB:
    about 350 messages) again and again: every message reaches the remote once, in
    the order published. The link used to take later messages while those it had
    refused waited for room, and the remote, which takes a sender's messages in order
    within a window, dropped the overtaken ones as already seen (a benchmark of
    300,000 messages lost 40,881)."""
    n = 30_000
    async with sites(tmp_path) as group:
        a, b = group.add("a"), group.add("b")
        a.links.append((b.address, "publish"))
        a.link_extra = 'buffer_bytes = 65536\noverflow = "block"\n'
        await group.start("b")
        await group.start("a")
        await group.wait_up("a", "b")
        checker = StreamChecker()
        async with amqlite.connect(b.address) as dst, amqlite.connect(a.address) as src:
            await dst.declare_queue("q")
            await dst.bind("q", EXCHANGE, "k")
            consumer = await dst.consume("q", no_ack=True, prefetch=1000)
            await group.wait("a", lambda ls: _dialer(ls)["interest_size"] == 1)
            pad = b"." * 92
            for seq in range(n):  # no headers: the plain path, as a benchmark's
                await src.publish(EXCHANGE, "k", b"%08d" % seq + pad)
            end = await group.wait("a", lambda ls: _dialer(ls)["acked"] == n, deadline=60)
            received = _acceptor(await group.links("b"))["received"]
            with trio.fail_after(20):
                async for d in consumer:
                    checker.record("a", int(d.body[:8]))
                    if checker.total == received:
                        break
        assert _dialer(end)["overflow_blocked"] > 0  # the link was full (what is tested)
        assert checker.report({"a": n}) == {"lost": 0, "duplicated": 0, "reordered": 0}
        assert received == n


# --- interest ---------------------------------------------------------------------


async def test_messages_nobody_remote_bound_put_no_bytes_on_the_link(tmp_path: Path) -> None:
    async with sites(tmp_path) as group:
        a, b = group.add("a"), group.add("b")
        proxy = FaultProxy(("127.0.0.1", b.port))
        await group.nursery.start(proxy.run)
        a.links.append((proxy.address, "publish"))
        await group.start("b")
        await group.start("a")
        await group.wait_up("a", "b")
        async with amqlite.connect(b.address) as cb, amqlite.connect(a.address) as ca:
            q = (await cb.declare_queue("", exclusive=True)).name
            await cb.bind(q, EXCHANGE, "wanted")
            await group.wait("a", lambda ls: _dialer(ls)["interest_size"] == 1)
            before = proxy.stats.bytes_to_target
            body = b"u" * 4096
            for _ in range(500):
                await ca.publish(EXCHANGE, "unwanted", body)
            await ca.publish(EXCHANGE, "unwanted", body, confirm=True)
            links = await group.wait(
                "a", lambda ls: _dialer(ls)["skipped"].get("no-interest") == 501
            )
            sent = proxy.stats.bytes_to_target - before
            assert sent < len(body), f"{sent} bytes crossed the link for unwanted messages"
            assert _dialer(links)["forwarded"] == 0
            await ca.publish(EXCHANGE, "wanted", body, confirm=True)
            got = await cb.consume(q, no_ack=True)
            with trio.fail_after(20):
                async for d in got:
                    assert d.body == body
                    break
            # the proxy counts a chunk once its write returns, which may be after the
            # message has reached the consumer: wait for the count, bounded
            with trio.fail_after(10):
                await proxy.wait_for(lambda stats: stats.bytes_to_target - before > len(body))


# --- the receiver killed with kill -9 ------------------------------------------------


@over_tls_too
async def test_receiver_killed_mid_stream_gets_every_message_once(
    tmp_path: Path, tls: TlsFiles | None
) -> None:
    """Persistent messages into a durable queue on B; B is killed with kill -9 mid-
    stream and restarted: its journal has the peering marks of what it holds, so what
    A sends again is dropped, and what B had not made safe comes again."""
    async with sites(tmp_path, tls) as group:
        a, b = group.add("a"), group.add("b")
        a.links.append((b.address, "publish"))
        await group.start("b")
        async with amqlite.connect(group.url("b"), ca=group.ca) as cb:
            await cb.declare_queue("q", durable=True)
            await cb.bind("q", EXCHANGE, "k.*")
        await group.start("a")
        await group.wait_up("a", "b")
        await group.wait("a", lambda ls: _dialer(ls)["interest_size"] == 1)
        n = 4000
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_publish, group.url("a"), "p", n, "k.a", 16, True, group.ca)
                await group.wait("a", lambda ls: _dialer(ls)["acked"] >= n // 4)
                assert b.proc is not None
                b.proc.proc.kill()
                await b.proc.proc.wait()
            await group.start("b")
            links = await group.wait(
                "a",
                lambda ls: _dialer(ls)["accepted"] == n and _dialer(ls)["lag_messages"] == 0,
                60,
            )
        assert _dialer(links)["reconnects"] >= 1
        _assert_links_tls(links + await group.links("b"), tls)
        checker = StreamChecker()
        async with amqlite.connect(group.url("b"), ca=group.ca) as cb:
            status = await cb.status()
            (held,) = [
                q["messages"] for v in status["vhosts"] for q in v["queues"] if q["name"] == "q"
            ]
            consumer = await cb.consume("q", no_ack=True, prefetch=1000)
            with trio.fail_after(30):
                async for d in consumer:
                    checker.record(str(d.headers["p"]), int(d.headers["s"]))
                    if checker.total == held:
                        break
        assert held == n, f"the queue holds {held} messages for {n} published"
        report = checker.report({"p": n})
        assert report == {"lost": 0, "duplicated": 0, "reordered": 0}, report


# --- the remote is an HA pair ----------------------------------------------------------


async def test_remote_ha_master_killed_mid_stream_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    """A publishes persistent messages to an HA pair (host = primary,backup); the
    pair's master is killed with kill -9 mid-stream. The link follows the pair to
    its backup, which holds what the master confirmed and the marks that cover it."""
    (tmp_path / "pair").mkdir()
    (tmp_path / "sites").mkdir()
    async with ha_pair(tmp_path / "pair") as pair, sites(tmp_path / "sites") as group:
        await pair.start("primary")
        await pair.start("backup")
        await pair.wait_states("active", "passive")
        async with amqlite.connect(pair.servers) as conn:
            await conn.declare_exchange(EXCHANGE, "topic", durable=True)
            await conn.declare_queue("q", durable=True)
            await conn.bind("q", EXCHANGE, "k.*")
        a = group.add("a")
        a.links.append((pair.servers, "publish"))
        await group.start("a")
        await group.wait_up("a")
        await group.wait("a", lambda ls: _dialer(ls)["interest_size"] == 1)
        n = 3000
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_publish, a.address, "p", n, "k.a", 16, True)
                await group.wait("a", lambda ls: _dialer(ls)["acked"] >= n // 4)
                await pair.kill("primary")
            links = await group.wait(
                "a",
                lambda ls: _dialer(ls)["accepted"] == n and _dialer(ls)["lag_messages"] == 0,
                90,
            )
        assert _dialer(links)["remote_address"] == pair.address("backup")
        assert await pair.state("backup") == "active"
        checker = StreamChecker()
        async with amqlite.connect(pair.address("backup")) as conn:
            status = await conn.status()
            (held,) = [
                q["messages"] for v in status["vhosts"] for q in v["queues"] if q["name"] == "q"
            ]
            consumer = await conn.consume("q", no_ack=True, prefetch=1000)
            with trio.fail_after(30):
                async for d in consumer:
                    checker.record(str(d.headers["p"]), int(d.headers["s"]))
                    if checker.total == held:
                        break
        report = checker.report({"p": n})
        assert report == {"lost": 0, "duplicated": 0, "reordered": 0}, (report, held)


async def _start_dialing_pair(pair: Any, remote: str, host: str) -> None:
    """A queue ``q`` on the remote bound to ``k.*``, then the HA pair started with a
    ``[[cluster_mta]]`` link to ``host`` (the remote, or a proxy in front of it)."""
    async with amqlite.connect(remote) as cb:
        await cb.declare_queue("q", durable=True)
        await cb.bind("q", EXCHANGE, "k.*")
    pair.config.write_text(
        pair.config.read_text()
        + f'\n[[cluster_mta]]\nname = "{EXCHANGE}"\nhost = "{host}"\nmode = "publish"\n'
        'login = "guest"\npassword = "guest"\n'
    )
    await pair.start("primary")
    await pair.start("backup")
    await pair.wait_states("active", "passive")


async def test_a_dialing_ha_pair_peers_from_its_active_node_only(tmp_path: Path) -> None:
    """Site A is an HA pair with a [[cluster_mta]] link to B: only the active node
    dials; after its master is killed, the new master dials with a higher epoch and
    what is published on it reaches B (B's marks for the old log drop nothing)."""
    (tmp_path / "pair").mkdir()
    (tmp_path / "sites").mkdir()
    async with ha_pair(tmp_path / "pair") as pair, sites(tmp_path / "sites") as group:
        b = group.add("b")
        await group.start("b")
        await _start_dialing_pair(pair, b.address, b.address)

        async def links(side: str) -> list[dict[str, Any]]:
            status = await pair.status(side)
            assert status is not None
            found: list[dict[str, Any]] = status["links"]
            return found

        async def wait_links(side: str, predicate: Callable[[Any], bool]) -> list[Any]:
            found: list[dict[str, Any]] = []

            async def holds() -> bool:
                nonlocal found
                found = await links(side)
                return bool(predicate(found))

            await wait_until(holds, f"the {side}'s links", deadline=30, every=0.05)
            return found

        await wait_links("primary", lambda ls: ls and _dialer(ls)["interest_size"] == 1)
        assert await links("backup") == []  # a passive node does not peer
        n = 300
        await _publish(pair.servers, "before", n, "k.a", 16, True)
        await wait_links("primary", lambda ls: _dialer(ls)["lag_messages"] == 0)
        await pair.kill("primary")
        assert await serve_somewhere(pair.servers) == pair.address("backup")  # takes over
        # its link knows B's bindings before "after" (else its closing "sync" message,
        # which B does not want, would be sent too, and counted)
        await wait_links("backup", lambda ls: ls and _dialer(ls)["interest_size"] == 1)
        await _publish(pair.servers, "after", n, "k.a", 16, True)
        assert await pair.state("backup") == "active"
        await wait_links(
            "backup",
            lambda ls: ls and _dialer(ls)["accepted"] == n and _dialer(ls)["lag_messages"] == 0,
        )
        checker = StreamChecker()
        async with amqlite.connect(b.address) as cb:
            consumer = await cb.consume("q", no_ack=True, prefetch=1000)
            with trio.fail_after(30):
                async for d in consumer:
                    checker.record(str(d.headers["p"]), int(d.headers["s"]))
                    if checker.total == 2 * n:
                        break
        report = checker.report({"before": n, "after": n})
        assert report == {"lost": 0, "duplicated": 0, "reordered": 0}, report
        b_links = await group.links("b")
        acceptors = [x for x in b_links if x["role"] == "acceptor"]
        assert len(acceptors) == 1  # one broker to its peers: the pair's peering id
        assert acceptors[0]["remote_node"] == pair.servers


# --- the dialing side's durable sending log ------------------------------------------


async def _drain_queue(address: str, queue: str, checker: StreamChecker, total: int) -> None:
    async with amqlite.connect(address) as conn:
        consumer = await conn.consume(queue, no_ack=True, prefetch=1000)
        with trio.fail_after(60):
            async for d in consumer:
                checker.record(str(d.headers["p"]), int(d.headers["s"]))
                if checker.total >= total:
                    return


@stream_lengths
async def test_a_dialer_killed_with_a_backlog_sends_it_after_its_restart(
    tmp_path: Path, n: int
) -> None:
    """A publishes persistent confirmed messages on a publish link to B; the link is
    cut (B unreachable) so A's sending log fills, and A is killed with kill -9. The
    log is journaled (peering.out): restarted, A sends every confirmed message to B
    once, those B already had from before the cut included."""
    async with sites(tmp_path) as group:
        a, b = group.add("a"), group.add("b")
        proxy = FaultProxy(("127.0.0.1", b.port))
        await group.nursery.start(proxy.run)
        a.links.append((proxy.address, "publish"))
        await group.start("b")
        async with amqlite.connect(b.address) as cb:
            await cb.declare_queue("q", durable=True)
            await cb.bind("q", EXCHANGE, "k.*")
        await group.start("a")
        await group.wait_up("a", "b")
        await group.wait("a", lambda ls: _dialer(ls)["interest_size"] == 1)
        confirmed: set[int] = set()
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                halfway = trio.Event()
                nursery.start_soon(_publish_confirmed, a.address, "p", n, confirmed, False, halfway)
                await group.wait("b", lambda ls: _acceptor(ls)["received"] >= n // 6)
                proxy.partition(refuse_new=True)
                proxy.cut()
                with trio.fail_after(60):
                    await halfway.wait()
                assert a.proc is not None
                a.proc.proc.kill()
                await a.proc.proc.wait()
            assert n // 2 <= len(confirmed) < n
            await group.start("a")
            links = await group.links("a")
            assert _dialer(links)["restored"] > 0  # the journaled log came back
            proxy.heal()
            checker = StreamChecker()
            await _drain_queue(b.address, "q", checker, len(confirmed))
            await group.wait("a", lambda ls: _dialer(ls)["lag_messages"] == 0, 60)
        _check_subscriber(checker, "p", confirmed)


async def test_a_dialing_ha_pair_sends_its_backlog_from_the_new_master(tmp_path: Path) -> None:
    """Site A is an HA pair publishing to B through a link that is cut: the
    master's sending log holds persistent confirmed messages when it is killed with
    kill -9. The log is journaled and replicated, so the backup, taking over, sends
    them: B gets every confirmed message once."""
    (tmp_path / "pair").mkdir()
    (tmp_path / "sites").mkdir()
    async with ha_pair(tmp_path / "pair") as pair, sites(tmp_path / "sites") as group:
        b = group.add("b")
        await group.start("b")
        proxy = FaultProxy(("127.0.0.1", b.port))
        await group.nursery.start(proxy.run)
        await _start_dialing_pair(pair, b.address, proxy.address)
        n = 600
        confirmed: set[int] = set()
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                halfway = trio.Event()
                nursery.start_soon(
                    _publish_confirmed, pair.servers, "p", n, confirmed, True, halfway
                )
                await group.wait("b", lambda ls: bool(ls) and _acceptor(ls)["received"] >= n // 6)
                proxy.partition(refuse_new=True)
                proxy.cut()
                with trio.fail_after(60):
                    await halfway.wait()
                await pair.kill("primary")
            assert len(confirmed) == n  # the publisher failed over and went on
            proxy.heal()
            checker = StreamChecker()
            await _drain_queue(b.address, "q", checker, n)
        _check_subscriber(checker, "p", confirmed)
        status = await pair.status("backup")
        assert status is not None and _dialer(status["links"])["restored"] > 0


# --- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "key", "reason"),
    [
        ('name = "x"\nhost = "127.0.0.1:1"\nmode = 4', "cluster_mta[0].mode", "got 4"),
        ('name = "x"\nhost = "nohost"\nmode = 1', "cluster_mta[0].host", "host:port"),
        (
            'name = "x"\nhost = "127.0.0.1:1"\nmode = 2\noverflow = "x"',
            "cluster_mta[0].overflow",
            "'spill'",
        ),
        ('host = "127.0.0.1:1"\nmode = 2', "cluster_mta[0].name", "is required"),
    ],
)
def test_a_bad_cluster_mta_entry_stops_the_server_with_status_2(
    tmp_path: Path, entry: str, key: str, reason: str
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f"[[cluster_mta]]\n{entry}\n")
    done = run_cli("server", "--config", str(config), "--port", "0", timeout=30)
    assert done.returncode == 2
    assert done.stderr.startswith(f"config error: {key}: "), done.stderr
    assert reason in done.stderr
