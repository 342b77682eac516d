"""``amqlite bench``: the machinery, with tiny counts (no wall-clock assertions).

The harness is ``amqlite_bench`` in benchmarks/ (its own distribution); pytest has
benchmarks/ on ``sys.path`` (``pythonpath`` in pyproject.toml), so these tests run
on this checkout's harness whether or not it is installed. Those needing pika,
nats-py or a RabbitMQ/NATS server skip, naming what is missing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from rich.console import Console

import amqlite
import amqlite_bench
from amqlite_bench import add_bench_arguments, contenders, peers, run_bench
from amqlite_bench.baseline import Relay
from amqlite_bench.childclients import run_in_child
from amqlite_bench.clientproc import client_spec
from amqlite_bench.errors import BenchError
from amqlite_bench.failover import PAIR_SYSTEM, REPLICATED, largest_gap, percentile
from amqlite_bench.peers import Peer, PeerUnavailable
from amqlite_bench.plan import (
    ClientReport,
    ConsumeTally,
    PublishPlan,
    PublishTally,
    Route,
    new_histogram,
)
from amqlite_bench.procs import baseline_argv, child_env
from amqlite_bench.relayclient import RelayPublisher
from amqlite_bench.relayclient import consume as relay_consume
from amqlite_bench.report import (
    amqp_rows,
    failover_lines,
    ha_rows,
    markdown_table,
    print_report,
    results_json,
    tls_rows,
)
from amqlite_bench.runner import options_from_args
from amqlite_bench.scenarios import (
    FAILOVER,
    PERSISTENT,
    SCENARIO_NAMES,
    RunResult,
    Scenario,
    build_scenarios,
    run_scenario,
)
from amqlite_bench.systems import RelayTarget


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.e2e
def test_every_scenario_on_both_systems_counts_every_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args("--messages", "500", "--latency-seconds", "0.2", "--json")
    assert run_bench(args) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert set(out) == {"results"}
    rows: list[dict[str, Any]] = out["results"]
    transient = [s for s in SCENARIO_NAMES if s != PERSISTENT]
    assert {(r["system"], r["scenario"]) for r in rows if r["scenario"] != PERSISTENT} == {
        (system, scenario) for system in ("amqlite", "raw-trio") for scenario in transient
    }
    # 1to1-persistent-confirm runs on brokers started with --fsync, once `amqlite server`
    # has that flag; until then the bench says so in one line and carries on
    persistent = {r["system"] for r in rows if r["scenario"] == PERSISTENT}
    assert persistent in (set(), {"amqlite-fsync-batch", "amqlite-fsync-always"})
    if not persistent:
        assert "no --fsync flag" in captured.err
    fanout = {"1to1-transient": 1, PERSISTENT: 1, "fanout-1to10": 10, "latency-at-5k": 1}
    published = {"1to1-transient": 500, PERSISTENT: 125, "fanout-1to10": 50, "latency-at-5k": 1000}
    for r in rows:
        assert isinstance(r["msgs_per_s"], float) and r["msgs_per_s"] > 0
        assert r["published"] == published[r["scenario"]]
        assert r["consumed"] == r["expected"] == r["published"] * fanout[r["scenario"]]
        if r["scenario"] == "latency-at-5k":
            assert isinstance(r["p50_ms"], float) and isinstance(r["p99_ms"], float)
            assert 0 < r["p50_ms"] <= r["p99_ms"]
        else:
            assert r["p50_ms"] is None and r["p99_ms"] is None
        if r["system"] == "amqlite":
            assert r["ratio_vs_raw_trio"] > 0
        assert r["server_cpu_us_per_msg"] is None or r["server_cpu_us_per_msg"] >= 0
        assert r["server_peak_rss_mb"] is None or r["server_peak_rss_mb"] > 0


@pytest.mark.e2e
def test_selector_and_group_scenarios_run_on_amqlite_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    scenarios = "1to1-transient,selectors-1to10,groups-10x1000"
    args = _args("--messages", "1000", "--scenarios", scenarios, "--json")
    assert run_bench(args) == 0
    captured = capsys.readouterr()
    rows = {(r["system"], r["scenario"]): r for r in json.loads(captured.out)["results"]}
    assert set(rows) == {
        ("amqlite", "1to1-transient"),
        ("amqlite", "selectors-1to10"),
        ("amqlite", "groups-10x1000"),
        ("raw-trio", "1to1-transient"),
    }
    for name in ("selectors-1to10", "groups-10x1000"):
        r = rows[("amqlite", name)]
        assert r["published"] == r["consumed"] == r["expected"] == 1000
        assert r["msgs_per_s"] > 0
        assert f"raw-trio: {name} not run: selectors and message groups" in captured.err


def test_the_selector_scenario_gives_each_consumer_its_tenth() -> None:
    selectors, groups = build_scenarios(
        ["selectors-1to10", "groups-10x1000"], messages=1005, latency_seconds=1.0
    )
    tallies = selectors.tallies()
    assert [t.selector for t in tallies] == [f"k = {j}" for j in range(10)]
    assert [t.expected for t in tallies] == [101] * 5 + [100] * 5
    assert selectors.plan.pattern == "select" and selectors.queues == 1
    shared = groups.tallies()
    assert len(shared) == 10 and len({id(t.shared) for t in shared}) == 1
    assert shared[0].shared is not None and shared[0].shared.expected == 1005
    assert Scenario.from_json(groups.to_json()) == groups


def test_bad_flags_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(_args("--scenarios", "1to1-transient,nope")) == 2
    assert "--scenarios" in capsys.readouterr().err
    assert run_bench(_args("--messages", "0")) == 2
    assert "--messages" in capsys.readouterr().err
    assert run_bench(_args("--vs", "rabbitmq,kafka")) == 2
    assert "--vs" in capsys.readouterr().err


async def test_relay_delivers_every_publish_to_every_consumer(nursery: trio.Nursery) -> None:
    port = await nursery.start(Relay().serve, 0)
    tallies = [ConsumeTally(300, new_histogram()) for _ in range(3)]
    with trio.fail_after(10):
        async with trio.open_nursery() as clients:
            for tally in tallies:
                await clients.start(relay_consume, "127.0.0.1", port, tally)
            pub = await RelayPublisher.connect("127.0.0.1", port)
            for _ in range(300):
                pub.publish("", "k", b"x" * 100, {"ts": time.perf_counter_ns()})
            await pub.aclose()
    for tally in tallies:
        assert tally.consumed == 300
        assert tally.hist is not None and tally.hist.get_total_count() == 300


class _ShortPublisher(RelayTarget):
    """Publishes half the plan: the consumer waits for messages that never come."""

    async def publish(self, route: Route, plan: PublishPlan, tally: PublishTally) -> None:
        await super().publish(route, PublishPlan(plan.messages // 2, plan.body_size), tally)


async def test_a_stalled_run_fails_with_a_clear_message(nursery: trio.Nursery) -> None:
    port = await nursery.start(Relay().serve, 0)
    target = _ShortPublisher(f"127.0.0.1:{port}")
    scenario = Scenario("1to1-transient", 1, PublishPlan(100))
    with trio.fail_after(10), pytest.raises(BenchError) as info:
        await run_scenario(target, scenario, stall_timeout=0.5)
    text = str(info.value)
    assert "raw-trio 1to1-transient: stalled" in text
    assert "published 50/100" in text and "consumed 50/100" in text


# --- side by side with peers (--vs): the machinery, with a stand-in peer ----------------


class _RelayPeer:
    """Stands in for scripts/peers: the "rabbitmq" peer is a raw-trio relay process,
    driven by the relay's clients in a child process; "nats" cannot be had."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopped: list[str] = []

    async def start_peer(self, name: str) -> Peer:
        if name == "nats":
            raise PeerUnavailable("nats-server is not installed (stand-in)")
        port, pid = await trio.to_thread.run_sync(self._spawn)
        return Peer(name, f"127.0.0.1:{port}", pid, "", True, driver="raw-trio")

    def _spawn(self) -> tuple[int, int]:
        proc = subprocess.Popen(
            baseline_argv(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env()
        )
        self.procs.append(proc)
        assert proc.stderr is not None
        return int(json.loads(proc.stderr.readline())["port"]), proc.pid

    async def stop_peer(self, peer: Peer) -> None:
        self.stopped.append(peer.name)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


@pytest.fixture
def relay_peer(monkeypatch: pytest.MonkeyPatch) -> Iterator[_RelayPeer]:
    fake = _RelayPeer()
    monkeypatch.setattr(contenders, "start_peer", fake.start_peer)
    monkeypatch.setattr(contenders, "stop_peer", fake.stop_peer)
    yield fake
    fake.close()


@pytest.mark.e2e
def test_vs_runs_each_peer_in_turn_and_reports_medians_and_ratios(
    relay_peer: _RelayPeer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = _args(
        "--vs", "rabbitmq,nats", "--systems", "amqlite",
        "--scenarios", "1to1-transient,latency-at-5k",
        "--messages", "300", "--latency-seconds", "0.2", "--repeat", "2", "--json",
        "--save", str(tmp_path / "vs.json"),
    )  # fmt: skip
    assert run_bench(args) == 0
    captured = capsys.readouterr()
    rows: list[dict[str, Any]] = json.loads(captured.out)["results"]
    assert json.loads((tmp_path / "vs.json").read_text())["results"] == rows
    assert [(r["system"], r["scenario"]) for r in rows] == [
        ("amqlite", "1to1-transient"),
        ("rabbitmq", "1to1-transient"),
        ("amqlite", "latency-at-5k"),
        ("rabbitmq", "latency-at-5k"),
    ]
    for r in rows:
        assert r["consumed"] == r["expected"] == r["published"]
        assert r["clients"] == "process"  # with --vs every system's clients run alike
        assert r["repeats"] == 2 and len(r["msgs_per_s_runs"]) == 2
        assert r["client_cpu_us_per_msg"] is not None and r["client_cpu_us_per_msg"] > 0
        assert r["server_peak_rss_mb"] is not None and r["server_peak_rss_mb"] > 0
    amq = {r["scenario"]: r for r in rows if r["system"] == "amqlite"}
    peer = {r["scenario"]: r for r in rows if r["system"] == "rabbitmq"}
    ratio = amq["1to1-transient"]["msgs_per_s"] / peer["1to1-transient"]["msgs_per_s"]
    assert amq["1to1-transient"]["ratio_vs_rabbitmq"] == pytest.approx(ratio, rel=1e-3)
    assert "ratio_vs_nats" not in amq["1to1-transient"]
    p99 = amq["latency-at-5k"]["p99_ms"] / peer["latency-at-5k"]["p99_ms"]
    assert amq["latency-at-5k"]["p99_ratio_vs_rabbitmq"] == pytest.approx(p99, rel=1e-2)
    # the peer that cannot be had: one line, and the run carries on without it
    unavailable = [ln for ln in captured.err.splitlines() if "nats" in ln and "unavailable" in ln]
    assert len(unavailable) == 1 and "not installed" in unavailable[0]
    assert relay_peer.stopped == ["rabbitmq"]


@pytest.mark.e2e
def test_vs_markdown_and_plot(
    relay_peer: _RelayPeer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    chart = tmp_path / "vs.png"
    args = _args(
        "--vs", "rabbitmq", "--systems", "amqlite",
        "--scenarios", "fanout-1to10,latency-at-5k", "--messages", "200",
        "--latency-seconds", "0.2", "--repeat", "1", "--markdown", "--plot", str(chart),
    )  # fmt: skip
    assert run_bench(args) == 0
    out = capsys.readouterr().out
    assert "| vs rabbitmq |" in out.splitlines()[0]
    assert "| amqlite | fanout-1to10 |" in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _result(system: str, scenario: str, msgs: float, p99: float | None = None) -> RunResult:
    return RunResult(
        system, scenario, msgs, None if p99 is None else p99 / 2, p99, p99, 10, 10, 10, 1.0,
        msgs, msgs, "process", 0.5, 0.5, server_cpu_s=0.001, client_cpu_s=0.002,
        server_peak_rss_kib=2048,
    )  # fmt: skip


def test_ratios_compare_every_amqlite_row_with_every_other_system() -> None:
    rows = results_json(
        [
            _result("amqlite-fsync-batch", PERSISTENT, 3000.0),
            _result("amqlite-fsync-always", PERSISTENT, 1000.0),
            _result("rabbitmq", PERSISTENT, 2000.0),
            _result("amqlite", "latency-at-5k", 5000.0, p99=1.0),
            _result("rabbitmq", "latency-at-5k", 5000.0, p99=4.0),
        ]
    )["results"]
    assert rows[0]["ratio_vs_rabbitmq"] == 1.5
    assert rows[1]["ratio_vs_rabbitmq"] == 0.5
    assert "ratio_vs_amqlite_fsync_batch" not in rows[1]  # amqlite is never its own peer
    assert "ratio_vs_rabbitmq" not in rows[2]
    assert rows[3]["p99_ratio_vs_rabbitmq"] == 0.25
    assert rows[0]["server_cpu_us_per_msg"] == 100.0  # 1 ms of CPU over 10 deliveries
    assert rows[0]["client_cpu_us_per_msg"] == 200.0
    assert rows[0]["server_peak_rss_mb"] == 2.0


# --- amqlite-amqp: amqlite's AMQP 0-9-1 listener with the pika clients RabbitMQ gets ------


def test_vs_rabbitmq_adds_amqlite_over_amqp_by_default() -> None:
    assert options_from_args(_args()).systems == ("raw-trio", "amqlite")
    assert options_from_args(_args("--vs", "nats")).systems == ("amqlite",)
    assert options_from_args(_args("--vs", "rabbitmq,nats")).systems == (
        "amqlite",
        "amqlite-amqp",
    )
    assert options_from_args(_args("--systems", "amqlite-amqp,raw-trio")).systems == (
        "raw-trio",
        "amqlite-amqp",
    )


def _pika_or_skip() -> None:
    pytest.importorskip("pika", reason="pika is not installed (pip install -e benchmarks/)")


async def test_amqlite_amqp_rows_use_pika_on_the_brokers_amqp_listener(
    nursery: trio.Nursery,
) -> None:
    _pika_or_skip()
    said: list[str] = []
    lineup = contenders.Lineup(said.append)
    try:
        with trio.fail_after(60):
            found = await lineup.start(
                nursery, systems=("amqlite", "amqlite-amqp"), peers=(),
                scenarios=("1to1-transient", PERSISTENT), servers=None, auth={},
            )  # fmt: skip
        by = {c.system: c for c in found}
        assert list(by) == [
            "amqlite", "amqlite-amqp",
            "amqlite-fsync-batch", "amqlite-amqp-fsync-batch",
            "amqlite-fsync-always", "amqlite-amqp-fsync-always",
        ]  # fmt: skip
        for native, amqp in (
            ("amqlite", "amqlite-amqp"),
            ("amqlite-fsync-batch", "amqlite-amqp-fsync-batch"),
            ("amqlite-fsync-always", "amqlite-amqp-fsync-always"),
        ):
            n, a = by[native], by[amqp]
            assert (n.driver, a.driver) == ("amqlite", "pika")
            # the same broker process (measured alike), reached on its AMQP port
            assert a.pid == n.pid is not None and a.server is n.server
            assert a.address != n.address and a.address.startswith("127.0.0.1:")
            with trio.fail_after(10):
                host, port = a.address.rsplit(":", 1)
                stream = await trio.open_tcp_stream(host, int(port))
                await stream.send_all(b"AMQP\x00\x00\x09\x01")
                head = await stream.receive_some(7)
                await stream.aclose()
            assert head[:1] == b"\x01"  # a method frame: connection.start
        assert not by["amqlite-amqp"].runs(PERSISTENT)
        assert "amqlite-amqp-fsync-*" in by["amqlite-amqp"].skip[PERSISTENT]
        assert by["amqlite-amqp-fsync-batch"].runs(PERSISTENT)
        assert not by["amqlite-amqp-fsync-batch"].runs("1to1-transient")
        assert said == []
    finally:
        await lineup.stop()


async def test_amqlite_amqp_without_pika_is_left_out_in_one_line(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(peers.CLIENT_LIBRARIES, "rabbitmq", ("no_such_module_xyz", "pika"))
    said: list[str] = []
    lineup = contenders.Lineup(said.append)
    try:
        with trio.fail_after(60):
            found = await lineup.start(
                nursery, systems=("amqlite-amqp",), peers=(),
                scenarios=("1to1-transient",), servers=None, auth={},
            )  # fmt: skip
    finally:
        await lineup.stop()
    assert found == []
    assert len(said) == 1 and said[0].startswith("amqlite-amqp: unavailable, left out: ")
    assert "pika is not installed" in said[0]


@pytest.mark.e2e
def test_vs_rabbitmq_runs_amqlite_over_amqp_and_compares_it(
    relay_peer: _RelayPeer, capsys: pytest.CaptureFixture[str]
) -> None:
    _pika_or_skip()
    args = _args(
        "--vs", "rabbitmq", "--scenarios", "1to1-transient,fanout-1to10", "--messages", "300",
        "--repeat", "1", "--json",
    )  # fmt: skip
    assert run_bench(args) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["results"]
    assert [(r["system"], r["scenario"]) for r in rows] == [
        (system, scenario)
        for scenario in ("1to1-transient", "fanout-1to10")
        for system in ("amqlite", "amqlite-amqp", "rabbitmq")
    ]
    by = {(r["system"], r["scenario"]): r for r in rows}
    for scenario, copies in (("1to1-transient", 1), ("fanout-1to10", 10)):
        amqp, peer = by[("amqlite-amqp", scenario)], by[("rabbitmq", scenario)]
        assert amqp["consumed"] == amqp["expected"] == amqp["published"] * copies
        assert amqp["clients"] == "process"
        assert amqp["server_cpu_us_per_msg"] is not None
        assert amqp["ratio_vs_rabbitmq"] == pytest.approx(
            amqp["msgs_per_s"] / peer["msgs_per_s"], rel=1e-3
        )


# the whole comparison against a real RabbitMQ (its start, three scenarios, both
# fsync levels): behind the soak marker. The default suite keeps its parts: the
# comparison through a relay peer (above), the persistent rows' systems
# (test_amqlite_amqp_rows_use_pika_on_the_brokers_amqp_listener) and the real
# RabbitMQ's clients (test_real_peer_clients_count_every_message).
@pytest.mark.e2e
@pytest.mark.soak
@pytest.mark.timeout(300)
def test_amqlite_amqp_against_the_real_rabbitmq(capsys: pytest.CaptureFixture[str]) -> None:
    _peer_or_skip("rabbitmq")
    args = _args(
        "--vs", "rabbitmq", "--systems", "amqlite-amqp", "--messages", "400", "--repeat", "1",
        "--scenarios", f"1to1-transient,{PERSISTENT},fanout-1to10", "--markdown",
    )  # fmt: skip
    assert run_bench(args) == 0
    out = capsys.readouterr().out
    table = out[out.index("| system | scenario | amqlite-amqp | rabbitmq |") :].splitlines()
    compared = [line.split(" | ")[:2] for line in table[2:] if line.startswith("| amqlite-amqp")]
    assert compared == [
        ["| amqlite-amqp", "1to1-transient"],
        ["| amqlite-amqp-fsync-batch", PERSISTENT],
        ["| amqlite-amqp-fsync-always", PERSISTENT],
        ["| amqlite-amqp", "fanout-1to10"],
    ]


def test_the_amqp_table_sets_amqlite_amqp_beside_rabbitmq() -> None:
    results = [
        _result("amqlite", "1to1-transient", 9000.0),
        _result("amqlite-amqp", "1to1-transient", 3000.0),
        _result("rabbitmq", "1to1-transient", 2000.0),
        _result("amqlite-amqp-fsync-always", PERSISTENT, 1000.0),
        _result("amqlite-amqp", "latency-at-5k", 5000.0, p99=2.0),
        _result("rabbitmq", "latency-at-5k", 5000.0, p99=8.0),
    ]
    results[2].server_cpu_s = 0.004
    assert amqp_rows(results) == [
        ["amqlite-amqp", "1to1-transient", "3,000 msg/s", "2,000 msg/s", "1.50", "100.0", "400.0"],
        ["amqlite-amqp", "latency-at-5k", "p99 2.00 ms", "p99 8.00 ms", "p99 0.25", "100.0",
         "100.0"],
    ]  # fmt: skip
    md = markdown_table(results)
    assert "| amqlite-amqp | 1to1-transient | 3,000 msg/s | 2,000 msg/s | 1.50 |" in md
    assert "| amqlite-amqp | 1to1-transient | 3,000 | " in md  # and in the main table
    assert amqp_rows(results[:2]) == []  # no RabbitMQ row: no comparison
    console = Console(record=True, width=220, file=io.StringIO())
    print_report(results, [], console)
    text = console.export_text()
    assert "AMQP 0-9-1, pika on both: amqlite-amqp vs rabbitmq" in text
    assert "p99 0.25" in text and "400.0" in text


# --- amqlite-tls: the same clients over amqlites:// to a TLS broker of its own ----------


def test_amqlite_tls_is_a_system_to_ask_for() -> None:
    assert "amqlite-tls" not in options_from_args(_args()).systems
    assert options_from_args(_args("--systems", "amqlite-tls,amqlite")).systems == (
        "amqlite",
        "amqlite-tls",
    )


def test_tls_rows_compare_amqlite_tls_with_plain_amqlite() -> None:
    results = [
        _result("amqlite", "1to1-transient", 8000.0),
        _result("amqlite-tls", "1to1-transient", 6000.0),
        _result("raw-trio", "1to1-transient", 16000.0),
        _result("amqlite", "latency-at-5k", 5000.0, p99=1.0),
        _result("amqlite-tls", "latency-at-5k", 5000.0, p99=1.5),
        _result("amqlite-tls", "fanout-1to10", 900.0),  # no plain row: no comparison
    ]
    rows = results_json(results)["results"]
    assert rows[1]["ratio_vs_amqlite"] == 0.75
    assert rows[1]["ratio_vs_raw_trio"] == 0.375
    assert "ratio_vs_amqlite" not in rows[0]  # plain amqlite is never its own peer
    assert rows[4]["p99_ratio_vs_amqlite"] == 1.5
    assert "ratio_vs_amqlite" not in rows[5]
    assert tls_rows(results) == [
        ["1to1-transient", "8,000 msg/s", "6,000 msg/s", "0.75", "100.0", "100.0"],
        ["latency-at-5k", "p99 1.00 ms", "p99 1.50 ms", "p99 1.50", "100.0", "100.0"],
    ]
    md = markdown_table(results)
    assert "| 1to1-transient | 8,000 msg/s | 6,000 msg/s | 0.75 |" in md
    console = Console(record=True, width=220, file=io.StringIO())
    print_report(results, [], console)
    assert "TLS against plain: amqlite-tls vs amqlite" in console.export_text()
    assert tls_rows(results[:1]) == []


async def test_amqlite_tls_runs_a_tls_broker_with_a_throwaway_ca(nursery: trio.Nursery) -> None:
    said: list[str] = []
    lineup = contenders.Lineup(said.append)
    try:
        with trio.fail_after(60):
            found = await lineup.start(
                nursery, systems=("amqlite", "amqlite-tls"), peers=(),
                scenarios=("1to1-transient", PERSISTENT), servers=None, auth={},
            )  # fmt: skip
        by = {c.system: c for c in found}
        plain, tls = by["amqlite"], by["amqlite-tls"]
        assert tls.address.startswith("amqlites://127.0.0.1:") and tls.pid != plain.pid
        assert tls.driver == "amqlite" and not tls.runs(PERSISTENT)
        ca = tls.auth["ca"]
        assert await trio.Path(ca).is_file()
        with trio.fail_after(20):
            async with amqlite.connect(tls.address, ca=ca, reconnect=False) as conn:
                status = await conn.status()
            assert status["tls"]["native"] is True
            with pytest.raises(amqlite.AmqliteError, match="TLS"):  # a plain dial is refused
                async with amqlite.connect(tls.address.replace("amqlites://", ""), reconnect=False):
                    pass
        assert said == []
    finally:
        await lineup.stop()
    assert not await trio.Path(ca).exists()  # the throwaway CA is gone with the run


async def test_amqlite_tls_against_a_named_broker_is_left_out(nursery: trio.Nursery) -> None:
    said: list[str] = []
    lineup = contenders.Lineup(said.append)
    try:
        found = await lineup.start(
            nursery, systems=("amqlite-tls",), peers=(), scenarios=("1to1-transient",),
            servers="127.0.0.1:1", auth={},
        )  # fmt: skip
    finally:
        await lineup.stop()
    assert found == []
    assert said == [
        "amqlite-tls: unavailable, left out: it starts a TLS broker of its own, not one "
        "named with -s"
    ]


@pytest.mark.e2e
def test_amqlite_tls_counts_every_message_and_compares_with_plain(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args(
        "--systems", "amqlite,amqlite-tls", "--scenarios", "1to1-transient", "--messages", "300",
        "--json",
    )  # fmt: skip
    assert run_bench(args) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["results"]
    by = {r["system"]: r for r in rows}
    assert set(by) == {"amqlite", "amqlite-tls"}
    tls = by["amqlite-tls"]
    assert tls["consumed"] == tls["expected"] == tls["published"] == 300
    assert tls["ratio_vs_amqlite"] == pytest.approx(  # reported to 4 decimals
        tls["msgs_per_s"] / by["amqlite"]["msgs_per_s"], rel=1e-3, abs=5e-5
    )


def test_client_report_survives_the_trip_through_json() -> None:
    hist = new_histogram()
    for v in (100, 200, 5000):
        hist.record_value(v)
    report = ClientReport(3, 3, 1, 2, 3, 0.25, hist)
    back = ClientReport.from_json(json.loads(json.dumps(report.to_json())))
    assert (back.published, back.consumed, back.client_cpu_s) == (3, 3, 0.25)
    assert back.hist is not None and back.hist.get_total_count() == 3
    assert back.hist.get_value_at_percentile(100) == hist.get_value_at_percentile(100)


async def test_clients_in_a_child_process_count_every_message(nursery: trio.Nursery) -> None:
    port = await nursery.start(Relay().serve, 0)
    scenario = Scenario("fanout-1to10", 3, PublishPlan(200, 100, 20_000.0, stamp=True))
    spec = client_spec("raw-trio", "raw-trio", f"127.0.0.1:{port}", {}, scenario, 10.0)
    seen: list[int] = []
    with trio.fail_after(60):
        result = await run_in_child(
            "raw-trio",
            spec,
            scenario,
            server_pid=os.getpid(),
            on_progress=lambda d, t: seen.append(d),
        )
    assert (result.published, result.consumed) == (200, 600)
    assert result.clients == "process" and result.p99_ms is not None
    assert result.server_cpu_s is not None and result.client_cpu_s is not None
    assert seen and seen[-1] == 600


async def test_a_failing_child_fails_the_run_with_its_reason(nursery: trio.Nursery) -> None:
    scenario = Scenario("1to1-transient", 1, PublishPlan(10))
    spec = client_spec("amqlite", "amqlite", "127.0.0.1:1", {}, scenario, 10.0)
    with trio.fail_after(60), pytest.raises(BenchError) as info:
        await run_in_child("amqlite", spec, scenario)
    assert str(info.value).startswith("amqlite 1to1-transient: ")


async def test_a_server_without_the_fsync_flag_makes_persistent_unavailable(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = contenders.broker_argv

    def argv(*extra: str) -> list[str]:
        if "--fsync" not in extra:
            return real(*extra)
        code = (
            "import sys; print('usage: amqlite ...', file=sys.stderr); print('amqlite: error: "
            "unrecognized arguments: --fsync batch', file=sys.stderr); sys.exit(2)"
        )
        return [sys.executable, "-c", code]

    monkeypatch.setattr(contenders, "broker_argv", argv)
    said: list[str] = []
    lineup = contenders.Lineup(said.append)
    try:
        with trio.fail_after(60):
            found = await lineup.start(
                nursery, systems=("amqlite",), peers=(), scenarios=(PERSISTENT,),
                servers=None, auth={},
            )  # fmt: skip
    finally:
        await lineup.stop()
    assert [c.system for c in found] == ["amqlite"]
    assert not found[0].runs(PERSISTENT)
    assert "no --fsync flag" in found[0].skip[PERSISTENT]


def test_scripts_peers_is_asked_and_its_reason_passed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "peers"
    script.write_text(
        "#!/usr/bin/env bash\n"
        'case "$1" in\n'
        '  status) echo "$2 stopped"; exit 1 ;;\n'
        '  start) echo "peers: $3 is not installed (stand-in)" >&2; exit 3 ;;\n'
        "esac\n"
    )
    monkeypatch.setattr(peers, "PEERS_SCRIPT", script)
    monkeypatch.setattr(peers, "missing_client", lambda name: None)
    with pytest.raises(PeerUnavailable, match=r"^rabbitmq is not installed \(stand-in\)$"):
        trio.run(peers.start_peer, "rabbitmq")


def test_a_missing_client_library_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(peers.CLIENT_LIBRARIES, "rabbitmq", ("no_such_module_xyz", "pika"))
    with pytest.raises(PeerUnavailable, match=r"pika is not installed.*pip install -e benchmarks/"):
        trio.run(peers.start_peer, "rabbitmq")


def test_peer_status_lines_are_parsed() -> None:
    text = "rabbitmq running pid=12 address=127.0.0.1:5682 dir=/tmp/p/rabbitmq\nnats stopped\n"
    assert peers.parse_status(text, "rabbitmq") == {
        "pid": "12", "address": "127.0.0.1:5682", "dir": "/tmp/p/rabbitmq",
    }  # fmt: skip
    assert peers.parse_status(text, "nats") is None


# --- the harness is its own distribution (benchmarks/) -------------------------------------

REPO = Path(__file__).resolve().parents[1]


def test_the_peers_script_ships_in_the_harness_and_scripts_peers_runs_it() -> None:
    shipped = Path(amqlite_bench.__path__[0]).resolve() / "peers.sh"
    assert shipped.is_file() and shipped == peers.PEERS_SCRIPT
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "peers")], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2  # no command: the usage, from peers.sh's header
    assert "scripts/peers start [--no-install]" in result.stderr


def test_children_import_this_amqlite_and_this_harness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    code = "import amqlite, amqlite_bench; print(amqlite.__file__); print(amqlite_bench.__file__)"
    result = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [amqlite.__file__, amqlite_bench.__file__]


def test_python_m_amqlite_bench_is_amqlite_bench() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "amqlite_bench", "--scenarios", "nope"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "--scenarios" in result.stderr


# --- the real peers, when this machine has them ------------------------------------------


def _peer_or_skip(name: str) -> None:
    module, package = peers.CLIENT_LIBRARIES[name]
    pytest.importorskip(module, reason=f"{package} is not installed")
    binary = {"rabbitmq": "/usr/lib/rabbitmq/bin/rabbitmq-server", "nats": "nats-server"}[name]
    if shutil.which(binary) is None:
        pytest.skip(f"{name} is not installed (scripts/peers install {name})")


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["rabbitmq", "nats"])
def test_real_peer_clients_count_every_message(name: str) -> None:
    _peer_or_skip(name)
    scenarios = build_scenarios(
        ["1to1-transient", PERSISTENT, "fanout-1to10", "latency-at-5k"],
        messages=400,
        latency_seconds=0.1,
    )
    if name == "nats":
        scenarios = [s for s in scenarios if s.name != PERSISTENT]

    async def main() -> list[RunResult]:
        peer = await peers.start_peer(name)
        try:
            out = []
            for scenario in scenarios:
                spec = client_spec(name, name, peer.address, {}, scenario, 20.0)
                with trio.fail_after(120):
                    out.append(await run_in_child(name, spec, scenario, server_pid=peer.pid))
            return out
        finally:
            await peers.stop_peer(peer)

    for scenario, r in zip(scenarios, trio.run(main), strict=True):
        assert r.consumed == r.expected == scenario.deliveries
        assert r.published == scenario.plan.messages
        assert (r.p99_ms is not None) == scenario.plan.stamp
        assert r.server_cpu_s is not None and r.server_peak_rss_kib


# --- the failover scenario: an HA pair of its own ------------------------------------------


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_failover_kills_the_master_twice_and_loses_no_confirmed_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args(
        "--scenarios", FAILOVER, "--kills", "2", "--messages", "400", "--repeat", "1",
        "--failover-rate", "500", "--heartbeat-ms", "100", "--failover-timeout-ms", "600",
        "--json",
    )  # fmt: skip
    assert run_bench(args) == 0
    captured = capsys.readouterr()
    rows: list[dict[str, Any]] = json.loads(captured.out)["results"]
    assert [(r["system"], r["scenario"]) for r in rows] == [
        (PAIR_SYSTEM, FAILOVER),
        (PAIR_SYSTEM, REPLICATED),
    ]
    failover, replicated = rows
    assert failover["msgs_per_s"] is None
    assert failover["kills"] == 2 and failover["killed"] == ["primary", "backup"]
    assert failover["redundant_p50_ms"] > 0 and len(failover["restart_ms_runs"]) == 2
    assert failover["lost"] == 0 and failover["unconfirmed"] == 0
    assert failover["confirmed"] > 0 and failover["delivered"] == failover["confirmed"]
    assert (failover["heartbeat_ms"], failover["failover_timeout_ms"]) == (100, 600)
    for key in ("failover", "gap"):
        runs = failover[f"{key}_ms_runs"]
        assert len(runs) == 2 and all(x > 0 for x in runs)
        assert failover[f"{key}_p50_ms"] <= failover[f"{key}_p99_ms"] == failover[f"{key}_max_ms"]
    # each survivor's takeover, read from its log: not before the failover timeout
    # (600 ms) less one heartbeat (100 ms) since the kill
    takeovers = failover["takeover_ms_runs"]
    assert len(takeovers) == 2 and all(t is not None and t >= 450 for t in takeovers)
    refused = failover["refused_dials_runs"]
    assert len(refused) == 2 and all(type(n) is int and n >= 0 for n in refused)
    assert replicated["published"] == replicated["consumed"] == 100
    assert replicated["msgs_per_s"] > 0 and replicated["ratio_vs_standalone"] > 0
    assert replicated["standalone_msgs_per_s"] > 0
    # the systems that cannot take part say so in one line each, and are not started
    assert f"raw-trio: {FAILOVER} not run:" in captured.err


def test_failover_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(_args("--scenarios", FAILOVER, "--kills", "0")) == 2
    assert "--kills" in capsys.readouterr().err
    assert run_bench(_args("--scenarios", FAILOVER, "--failover-timeout-ms", "200")) == 2
    assert "--failover-timeout-ms" in capsys.readouterr().err
    assert run_bench(_args("--scenarios", FAILOVER, "--failover-rate", "0")) == 2
    assert "--failover-rate" in capsys.readouterr().err


async def test_only_failover_starts_nothing_but_says_who_sits_out(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_peer(name: str) -> Peer:
        raise AssertionError(f"{name} was started")

    monkeypatch.setattr(contenders, "start_peer", no_peer)
    said: list[str] = []
    lineup = contenders.Lineup(said.append)
    try:
        found = await lineup.start(
            nursery, systems=("raw-trio", "amqlite"), peers=("rabbitmq",),
            scenarios=(FAILOVER,), servers=None, auth={},
        )  # fmt: skip
    finally:
        await lineup.stop()
    assert [(c.system, c.runs(FAILOVER), c.server) for c in found] == [(PAIR_SYSTEM, True, None)]
    assert [line.split(":")[0] for line in said] == ["raw-trio", "rabbitmq"]
    said.clear()
    found = await contenders.Lineup(said.append).start(
        nursery, systems=("amqlite",), peers=(), scenarios=(FAILOVER,),
        servers="127.0.0.1:1", auth={},
    )  # fmt: skip
    assert found == [] and len(said) == 1
    assert said[0].startswith(f"{PAIR_SYSTEM}: {FAILOVER} not run:") and "-s" in said[0]


def test_percentiles_are_nearest_rank() -> None:
    values = [float(x) for x in range(1, 21)]  # 20 kills
    assert percentile(values, 50) == 10.0
    assert percentile(values, 99) == 20.0  # with 20 samples p99 is the maximum
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_the_delivery_gap_spans_the_kill() -> None:
    times = [1.0, 1.1, 1.2, 3.0, 3.1, 3.15, 5.0]
    # from the last delivery before the kill (1.2) to the next one (3.0)
    assert largest_gap(times, 1.25, 4.0) == pytest.approx(1.8)
    # nothing after the kill until the window ends: the gap runs to the end
    assert largest_gap(times, 3.2, 4.5) == pytest.approx(1.35)
    # no delivery before the kill at all: counted from the kill
    assert largest_gap(times, 0.5, 1.05) == pytest.approx(0.5)


def _failover_row(lost: int) -> RunResult:
    extra = {
        "kills": 20, "lost": lost, "confirmed": 1000, "duplicates": 7,
        "failover_p50_ms": 1050.0, "failover_p99_ms": 1600.0, "failover_max_ms": 1600.0,
        "gap_p50_ms": 1100.0, "gap_p99_ms": 1400.0, "gap_max_ms": 1400.0,
        "redundant_p50_ms": 900.0, "redundant_p99_ms": 4000.0, "redundant_max_ms": 4000.0,
    }  # fmt: skip
    r = _result(PAIR_SYSTEM, FAILOVER, 0.0)
    r.msgs_per_s = None
    r.extra.update(extra)
    return r


def test_failover_rows_get_a_table_of_their_own_next_to_their_targets() -> None:
    replicated = _result(PAIR_SYSTEM, REPLICATED, 3500.0)
    replicated.extra.update({"ratio_vs_standalone": 0.5, "standalone_msgs_per_s": 7000.0})
    results = [_failover_row(lost=0), replicated]
    rows = ha_rows(results)
    assert [row[-1] for row in rows] == ["MISSED", "met", "", "met", "MISSED"]
    assert rows[0][2:6] == ["1.05 s", "1.60 s", "1.60 s", "p99 <= 1.5 s"]
    assert rows[2][3:6] == ["4.00 s", "4.00 s", "-"]  # no target: for the reading
    assert rows[4][4:6] == ["0.50", ">= 0.90"]
    doc = results_json(results)["results"]
    assert doc[0]["msgs_per_s"] is None and doc[0]["lost"] == 0
    table = markdown_table(results)
    assert f"| {PAIR_SYSTEM} | {REPLICATED} | 3,500 |" in table  # a throughput row
    assert f"| {PAIR_SYSTEM} | {FAILOVER} |" not in table  # no msgs/s: HA table only
    assert "| amqlite-pair (20 kills) | kill -> first confirm on the new master |" in table
    lines = failover_lines([_failover_row(lost=3)])
    assert "lost 3 of 1,000 confirmed" in lines[0]


def test_client_logs_never_reach_the_results_on_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Whatever structlog was left configured with (here: configured, printing to
    stdout, as ``structlog.testing.capture_logs`` leaves it), a client warning
    during a bench run goes to stderr, and the configuration comes back after."""
    import structlog

    from amqlite.log import get_logger
    from amqlite_bench.runner import _client_logs_on_stderr

    structlog.configure(processors=[structlog.processors.KeyValueRenderer()])
    try:
        with _client_logs_on_stderr():
            get_logger("amqlite.client").warning("client_connection_lost", code=320)
        captured = capsys.readouterr()
        assert "client_connection_lost" not in captured.out
        assert "client_connection_lost" in captured.err
        assert structlog.is_configured()
        get_logger("amqlite.client").warning("after")  # the old configuration again
        assert "event='after'" in capsys.readouterr().out
    finally:
        structlog.reset_defaults()
