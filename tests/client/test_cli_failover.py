"""``amqlite publish`` and ``amqlite consume`` (real processes) riding out a
failover between two in-process brokers on 127.0.0.1:0.

The brokers keep messages in memory only, so the queue is declared on both nodes
beforehand (HA replication would do that), and what the first node held dies
with it.
"""

from __future__ import annotations

import subprocess
import sys
from functools import partial

import trio

import amqlite
from tests.waiting import wait_until

from .test_failover_server import _Node


async def _declare_everywhere(queue: str, *nodes: _Node) -> None:
    for node in nodes:
        async with amqlite.connect(node.address) as conn:
            await conn.declare_queue(queue, durable=True)


def _amqlite(*argv: str) -> list[str]:
    return [sys.executable, "-m", "amqlite", *argv]


async def test_publish_confirm_count_ends_all_confirmed(nursery: trio.Nursery) -> None:
    a = await _Node.start(nursery)
    b = await _Node.start(nursery)
    await _declare_everywhere("cli-jobs", a, b)
    n = 400
    argv = _amqlite(
        "publish",
        "-s",
        f"{a.address},{b.address}",
        "-k",
        "cli-jobs",
        "--confirm",
        "--count",
        str(n),
        "--rate",
        "500",
        "job {n}",
    )
    result: list[subprocess.CompletedProcess[bytes]] = []
    finished = trio.Event()

    async def publish() -> None:
        result.append(
            await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
        )
        finished.set()

    nursery.start_soon(publish)
    # the in-process broker's counters have no change event
    await wait_until(lambda: a.queue("cli-jobs")["messages"] >= 50, deadline=30)
    assert not finished.is_set()
    a.stop()
    with trio.fail_after(60):
        await finished.wait()
    (done,) = result
    err = done.stderr.decode()
    assert done.returncode == 0, err
    lines = err.splitlines()
    assert lines[0].startswith(f"amqlite: lost {a.address} (")
    assert lines[1].startswith(f"amqlite: reconnected to {b.address} after "), err
    assert lines[2:] == [f"published {n} confirmed {n}"]
    async with amqlite.connect(b.address) as conn:
        bodies = []
        while (d := await conn.get("cli-jobs")) is not None:
            bodies.append(int(d.body.split()[1]))
            await d.ack()
    # the tail A had not confirmed, then the rest: nothing missing at the end
    assert set(bodies) == set(range(min(bodies), n + 1))


async def test_consume_carries_on_on_the_backup(nursery: trio.Nursery) -> None:
    a = await _Node.start(nursery)
    b = await _Node.start(nursery)
    await _declare_everywhere("cli-feed", a, b)
    argv = _amqlite("consume", "-s", f"{a.address},{b.address}", "-q", "cli-feed", "--count", "10")
    proc = await nursery.start(
        partial(
            trio.run_process,
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            check=False,
        )
    )
    out = bytearray()
    err = bytearray()

    async def read_lines(stream: trio.abc.ReceiveStream, into: bytearray, count: int) -> None:
        with trio.fail_after(30):
            while into.count(b"\n") < count:
                chunk = await stream.receive_some()
                if not chunk:
                    break
                into.extend(chunk)

    async with amqlite.connect(a.address) as feeder:
        for i in range(1, 5):
            await feeder.publish("", "cli-feed", f"a{i}", confirm=True)
        await read_lines(proc.stdout, out, 4)
    await a.kill()
    await read_lines(proc.stderr, err, 2)  # lost ..., reconnected ...
    lines = err.decode().splitlines()
    assert lines[0].startswith(f"amqlite: lost {a.address} "), lines
    assert lines[1].startswith(f"amqlite: reconnected to {b.address} after "), lines
    async with amqlite.connect(b.address) as feeder:
        for i in range(1, 7):
            await feeder.publish("", "cli-feed", f"b{i}", confirm=True)
    await read_lines(proc.stdout, out, 10)
    with trio.fail_after(30):
        await proc.wait()
        await read_lines(proc.stderr, err, 1000)  # to the end
    assert proc.returncode == 0, err.decode()
    assert out.decode().split() == [f"a{i}" for i in range(1, 5)] + [f"b{i}" for i in range(1, 7)]
    assert len(err.decode().splitlines()) == 2, err.decode()
    assert b.queue("cli-feed")["messages"] == 0
