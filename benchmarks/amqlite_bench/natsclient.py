"""NATS's bench clients: nats-py on one asyncio loop, core NATS publish/subscribe.

Core NATS has no queues, acks or prefetch: a message goes to every subscriber of
its subject that is connected when it is published, at most once. So the NATS
rows measure that (lighter) contract: one subject per run, one subscriber
connection per consumer (ten for ``fanout-1to10``), each confirmed subscribed
(``flush``) before the publisher starts; the publisher writes in batches of
:data:`~amqlite_bench.plan.BATCH` and yields to the loop between them (nats-py
flushes and bounds its own buffer). Latency stamps travel in a NATS header, as
they do in amqlite's and RabbitMQ's headers.

``1to1-persistent-confirm`` is not run on NATS (see
:func:`amqlite_bench.contenders.nats_persistent_reason`).

nats-py is imported when a run starts (a dependency of the harness:
``pip install -e benchmarks/``).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from itertools import count
from typing import Any

from .errors import BenchError
from .plan import BATCH, STAMP_HEADER, TICK, ClientReport, new_histogram
from .procstat import own_cpu_seconds
from .scenarios import Scenario

PROGRESS_INTERVAL = 0.25
#: Subscriber-side buffer: far above what a run sends, so nats-py never drops.
PENDING_MSGS_LIMIT = 4_000_000
PENDING_BYTES_LIMIT = 1 << 30

_run_ids = count(1)


class _Count:
    __slots__ = ("done", "done_ns", "expected", "hist", "n")

    def __init__(self, expected: int, stamped: bool) -> None:
        self.expected = expected
        self.hist = new_histogram() if stamped else None
        self.n = 0
        self.done_ns = 0
        self.done = asyncio.Event()


async def _run(nats: Any, address: str, scenario: Scenario, emit: Any) -> ClientReport:
    plan = scenario.plan
    subject = f"bench.{scenario.name}.{os.getpid()}.{next(_run_ids)}"
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(f"{type(exc).__name__}: {exc}")

    async def connect(name: str) -> Any:
        return await nats.connect(
            f"nats://{address}",
            name=name,
            allow_reconnect=False,
            connect_timeout=5,
            error_cb=on_error,
        )

    counts = [_Count(plan.messages, plan.stamp) for _ in range(scenario.queues)]
    conns: list[Any] = []
    try:
        for i, c in enumerate(counts):
            nc = await connect(f"bench-consumer-{i}")
            conns.append(nc)
            await nc.subscribe(
                subject,
                cb=_on_message(c),
                pending_msgs_limit=PENDING_MSGS_LIMIT,
                pending_bytes_limit=PENDING_BYTES_LIMIT,
            )
            await nc.flush()  # the server has the subscription
        pub = await connect("bench-publisher")
        conns.append(pub)
        published = 0
        body = b"x" * plan.body_size
        clock = time.perf_counter_ns

        async def progress() -> None:
            while True:
                await asyncio.sleep(PROGRESS_INTERVAL)
                emit.progress(published, sum(c.n for c in counts))
                if errors:
                    return

        async def send(k: int) -> None:
            publish = pub.publish
            if plan.stamp:
                for _ in range(k):
                    await publish(subject, body, headers={STAMP_HEADER: str(clock())})
            else:
                for _ in range(k):
                    await publish(subject, body)

        emit.started()
        cpu0 = own_cpu_seconds()
        first_ns = clock()
        reporter = asyncio.create_task(progress())
        if plan.rate is None:
            while published < plan.messages:
                k = min(BATCH, plan.messages - published)
                await send(k)
                published += k
                await asyncio.sleep(0)
        else:
            loop = asyncio.get_running_loop()
            start = loop.time()
            while published < plan.messages:
                due = min(plan.messages, int((loop.time() - start) * plan.rate) + 1)
                if due > published:
                    await send(due - published)
                    published = due
                next_due = start + published / plan.rate
                await asyncio.sleep(max(next_due - loop.time(), TICK))
        await pub.flush()
        last_ns = clock()
        waiting = [asyncio.create_task(c.done.wait()) for c in counts]
        while not all(t.done() for t in waiting):
            if errors or reporter.done():
                raise BenchError(f"nats {scenario.name}: {errors[0] if errors else 'stopped'}")
            await asyncio.wait(waiting, timeout=PROGRESS_INTERVAL)
        cpu1 = own_cpu_seconds()
        emit.finished()
        reporter.cancel()
        emit.progress(published, sum(c.n for c in counts))
    finally:
        for nc in conns:
            try:
                await nc.close()
            except Exception as exc:  # closing is best-effort; the run's outcome is known
                errors.append(str(exc))
    hist = None
    if plan.stamp:
        hist = new_histogram()
        for c in counts:
            assert c.hist is not None
            hist.add(c.hist)
    return ClientReport(
        published=published,
        consumed=sum(c.n for c in counts),
        first_ns=first_ns,
        last_ns=last_ns,
        done_ns=max(c.done_ns for c in counts),
        client_cpu_s=cpu1 - cpu0,
        hist=hist,
    )


def _on_message(c: _Count) -> Any:
    hist = c.hist
    clock = time.perf_counter_ns

    async def on_message(msg: Any) -> None:
        c.n += 1
        if hist is not None:
            hist.record_value(max(1, (clock() - int(msg.headers[STAMP_HEADER])) // 1000))
        if c.n >= c.expected:
            c.done_ns = clock()
            c.done.set()

    return on_message


def run_nats(address: str, scenario: Scenario, emit: Any) -> ClientReport:
    """Run ``scenario`` against the NATS server at ``address`` (see the module doc)."""
    nats = importlib.import_module("nats")
    return asyncio.run(_run(nats, address, scenario, emit))
