"""``amqlite bench``: the machinery, with tiny counts (no wall-clock assertions)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pytest
import trio

from amqlite.bench import add_bench_arguments, run_bench
from amqlite.bench.baseline import Relay
from amqlite.bench.errors import BenchError
from amqlite.bench.plan import ConsumeTally, PublishPlan, PublishTally, Route, new_histogram
from amqlite.bench.relayclient import RelayPublisher
from amqlite.bench.relayclient import consume as relay_consume
from amqlite.bench.scenarios import SCENARIO_NAMES, Scenario, run_scenario
from amqlite.bench.systems import RelayTarget


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
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"results"}
    rows: list[dict[str, Any]] = out["results"]
    assert {(r["system"], r["scenario"]) for r in rows} == {
        (system, scenario) for system in ("amqlite", "raw-trio") for scenario in SCENARIO_NAMES
    }
    fanout = {"1to1-transient": 1, "fanout-1to10": 10, "latency-at-5k": 1}
    published = {"1to1-transient": 500, "fanout-1to10": 50, "latency-at-5k": 1000}
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


def test_bad_flags_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(_args("--scenarios", "1to1-transient,nope")) == 2
    assert "--scenarios" in capsys.readouterr().err
    assert run_bench(_args("--messages", "0")) == 2
    assert "--messages" in capsys.readouterr().err


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
