"""Durability with real broker processes: kill -9 under confirmed persistent load,
a damaged journal tail, and a data dir that serves one broker only.

The checker counts every message: each body is a global sequence number, so after
the last restart we know exactly which confirmed messages must be there, that
nothing appears that was never published, and that queue order is kept.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

import amqlite
from amqlite.broker import backlog as backlog_module
from amqlite.errors import AmqliteError

from .procs import ServerProcess, run_cli, start_server

pytestmark = pytest.mark.e2e

#: kill -9 cycles: the default suite's run, and the soak run's (each is a broker start)
KILL_CYCLES = 12
SOAK_KILL_CYCLES = 50
QUEUE = "durable-q"


@dataclass
class Ledger:
    """What the clients did, and the rules the broker's contents must satisfy."""

    published: int = 0  # sequence numbers 0..published-1 were sent
    confirmed: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)  # acks sent (may be lost by a kill)

    def check(self, found: list[int]) -> None:
        seen = set(found)
        assert len(found) == len(seen), "a message is in the queue twice"
        never_published = {n for n in seen if not 0 <= n < self.published}
        assert not never_published, f"never published: {sorted(never_published)[:10]}"
        lost = self.confirmed - self.acked - seen
        assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:10]}"
        assert found == sorted(found), "queue order not kept"


async def kill9(server: ServerProcess) -> None:
    server.proc.send_signal(signal.SIGKILL)
    with trio.fail_after(10):
        await server.proc.wait()


def padded(n: int) -> str:
    """A body that shows any damage: the number, then a digest of it."""
    return f"{n}:" + hashlib.sha256(str(n).encode()).hexdigest() * 2


def number(body: bytes) -> int:
    n = int(body.split(b":", 1)[0])
    if b":" in body:
        assert body.decode() == padded(n), f"body of message {n} damaged"
    return n


async def load_until_killed(
    server: ServerProcess,
    ledger: Ledger,
    rng: random.Random,
    *,
    confirms: tuple[int, int] = (0, 400),
    body: Callable[[int], str] = str,
) -> None:
    """Publish persistent confirmed messages (and consume a few) until a random
    number of confirms (in ``confirms``) has arrived, then kill -9 the broker
    mid-stream."""
    kill_after = len(ledger.confirmed) + rng.randrange(*confirms)
    killed = trio.Event()

    async def publisher(conn: amqlite.Connection) -> None:
        async with trio.open_nursery() as confirms:
            while True:
                n = ledger.published
                pending = await conn.publish_nowait("", QUEUE, body(n), persistent=True)
                ledger.published += 1

                async def confirm(n: int = n, pending: amqlite.PendingConfirm = pending) -> None:
                    await pending.wait()
                    ledger.confirmed.add(n)
                    if len(ledger.confirmed) >= kill_after and not killed.is_set():
                        killed.set()

                confirms.start_soon(confirm)

    async def consumer(conn: amqlite.Connection) -> None:
        for _ in range(rng.randrange(0, 40)):
            got = await conn.get(QUEUE)
            if got is None:
                return
            await got.ack()
            ledger.acked.add(number(got.body))

    async def killer() -> None:
        await killed.wait()
        # shielded: the clients' errors at the kill (connections reset) end the
        # nursery and would cancel the wait for the process, which then looked alive
        with trio.CancelScope(shield=True):
            await kill9(server)

    errors: list[BaseException] = []
    with trio.move_on_after(30):  # a broker that never confirms fails below
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(killer)
                async with amqlite.connect(f"127.0.0.1:{server.port}") as conn:
                    await conn.declare_queue(QUEUE, durable=True)
                    async with amqlite.connect(f"127.0.0.1:{server.port}") as reader:
                        nursery.start_soon(consumer, reader)
                        await publisher(conn)
        except* (AmqliteError, trio.BrokenResourceError, OSError) as group:
            errors.extend(group.exceptions)
    if server.proc.returncode is None:
        await kill9(server)
        # what the broker said, to tell a stall from an error (its stderr is only read
        # up to server_listening while it runs)
        tail = await _rest_of_log(server)
        pytest.fail(
            f"the kill never came: {len(ledger.confirmed)} confirmed of {ledger.published} "
            f"published, waiting for {kill_after}; client errors {errors!r}; "
            f"the broker's last log lines: {tail}"
        )


async def _rest_of_log(server: ServerProcess) -> list[str]:
    """The last lines the (dead) broker wrote to stderr."""
    assert server.proc.stderr is not None
    data = bytes(server._buffer)
    with trio.move_on_after(5):
        while chunk := await server.proc.stderr.receive_some(65536):
            data += chunk
    return [line.decode(errors="replace")[:300] for line in data.splitlines()[-15:]]


async def drain(server: ServerProcess) -> list[int]:
    found = []
    async with amqlite.connect(f"127.0.0.1:{server.port}") as conn:
        while (got := await conn.get(QUEUE, no_ack=True)) is not None:
            found.append(number(got.body))
    return found


async def _kill_9_cycles(tmp_path: Path, cycles: int) -> None:
    rng = random.Random(int(os.environ.get("AMQLITE_TEST_SEED", "0")) or None)
    ledger = Ledger()
    for _ in range(cycles):
        server = await start_server("--data-dir", str(tmp_path))
        await load_until_killed(server, ledger, rng)
    server = await start_server("--data-dir", str(tmp_path))
    try:
        (recovered,) = [r for r in server.log_lines if r.get("event") == "journal_recovered"]
        assert recovered["messages"] >= len(ledger.confirmed - ledger.acked)  # type: ignore[operator]
        ledger.check(await drain(server))
        assert len(ledger.confirmed) > cycles  # the load was real
    finally:
        await kill9(server)


@pytest.mark.timeout(300)
async def test_kill_9_under_confirmed_persistent_load_loses_nothing(tmp_path: Path) -> None:
    await _kill_9_cycles(tmp_path, KILL_CYCLES)


@pytest.mark.soak
@pytest.mark.timeout(900)  # 50 broker starts: about 2 minutes on 2 busy cores
async def test_kill_9_under_confirmed_persistent_load_50_times_loses_nothing(
    tmp_path: Path,
) -> None:
    await _kill_9_cycles(tmp_path, SOAK_KILL_CYCLES)


@pytest.mark.timeout(600)
async def test_kill_9_with_a_backlog_on_disk_loses_nothing(tmp_path: Path) -> None:
    """Thousands of messages waiting (more than a queue keeps in memory: the rest
    wait in its backlog, bodies in the journal), kill -9 mid-load, restart: every
    confirmed message comes back exactly once, in order, its body intact."""
    rng = random.Random(int(os.environ.get("AMQLITE_TEST_SEED", "0")) or None)
    ledger = Ledger()
    for _ in range(4):
        server = await start_server("--data-dir", str(tmp_path))
        await load_until_killed(server, ledger, rng, confirms=(1000, 2500), body=padded)
    server = await start_server("--data-dir", str(tmp_path))
    try:
        (recovered,) = [r for r in server.log_lines if r.get("event") == "journal_recovered"]
        assert recovered["messages"] >= len(ledger.confirmed - ledger.acked)  # type: ignore[operator]
        assert len(ledger.confirmed - ledger.acked) > 4000  # a backlog, not just a head
        ledger.check(await drain(server))
    finally:
        await kill9(server)


@pytest.mark.timeout(600)
async def test_a_backlog_written_out_in_chunks_drains_whole_across_a_kill_9(
    tmp_path: Path,
) -> None:
    """A backlog long enough that its middle goes to the page file in chunks (more
    than four chunks of 16,384), under a memory watermark: a consumer drains part
    of it, the broker is killed mid-drain, and after the restart (which writes the
    rebuilt backlog's middle out again) every confirmed message not acked comes
    back exactly once, in order, its body intact, and the rest drains to the last."""
    config = tmp_path / "server.toml"
    config.write_text("[limits]\nmemory_high_watermark = 268435456\n")
    data = tmp_path / "node"
    args = ("--data-dir", str(data), "--config", str(config))
    total = 4 * backlog_module.CHUNK + 5_000
    ledger = Ledger()
    server = await start_server(*args)
    try:
        async with amqlite.connect(f"127.0.0.1:{server.port}") as conn:
            await conn.declare_queue(QUEUE, durable=True)
            window: list[tuple[int, amqlite.PendingConfirm]] = []
            for n in range(total):
                window.append((n, await conn.publish_nowait("", QUEUE, padded(n), persistent=True)))
                ledger.published += 1
                if len(window) >= 1000 or n == total - 1:
                    for k, pending in window:
                        await pending.wait()
                        ledger.confirmed.add(k)
                    window.clear()
        assert list((data / "page").glob("page-*.bin")), "the backlog's middle is on disk"
        async with amqlite.connect(f"127.0.0.1:{server.port}") as conn:
            consumer = await conn.consume(QUEUE, prefetch=500)
            async for delivery in consumer:
                await delivery.ack()
                ledger.acked.add(number(delivery.body))
                if len(ledger.acked) == backlog_module.CHUNK + 2_000:  # into a chunk
                    await kill9(server)
                    break
    finally:
        if server.proc.returncode is None:
            await kill9(server)
    server = await start_server(*args, deadline_s=60)
    try:
        (recovered,) = [r for r in server.log_lines if r.get("event") == "journal_recovered"]
        assert recovered["messages"] >= total - len(ledger.acked)  # type: ignore[operator]
        assert list((data / "page").glob("page-*.bin")), "the rebuilt middle is on disk"
        found = []
        async with amqlite.connect(f"127.0.0.1:{server.port}") as conn:
            consumer = await conn.consume(QUEUE, prefetch=1000)
            with trio.fail_after(300):
                async for delivery in consumer:
                    await delivery.ack()
                    found.append(number(delivery.body))
                    if found[-1] == total - 1:
                        break
            await consumer.cancel()
            info = await conn.declare_queue(QUEUE, durable=True, passive=True)
            assert info.messages == 0
        ledger.check(found)
        assert len(found) + len(ledger.acked) >= total
    finally:
        await kill9(server)


def segments(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("journal-*.log"))


async def publish_confirmed(server: ServerProcess, count: int) -> None:
    async with amqlite.connect(f"127.0.0.1:{server.port}") as conn:
        await conn.declare_queue(QUEUE, durable=True)
        for n in range(count):
            await conn.publish("", QUEUE, str(n), persistent=True, confirm=True)


@pytest.mark.parametrize("damage", ["garbage", "cut"])
async def test_a_damaged_tail_is_cut_and_reported(tmp_path: Path, damage: str) -> None:
    server = await start_server("--data-dir", str(tmp_path))
    await publish_confirmed(server, 20)
    await kill9(server)
    (last,) = segments(tmp_path)
    size = last.stat().st_size
    if damage == "garbage":
        with last.open("ab") as f:
            f.write(b"\x00\x00\x01\x00not a record at all" + bytes(range(256)))
        expect = list(range(20))
    else:  # the last record loses its end, as a crash mid-write would leave it
        os.truncate(last, size - 3)
        expect = list(range(19))
    server = await start_server("--data-dir", str(tmp_path))
    try:
        (record,) = [r for r in server.log_lines if r.get("event") == "journal_tail_truncated"]
        assert record["dropped_bytes"] > 0  # type: ignore[operator]
        assert record["segment"] == last.name
        assert await drain(server) == expect
    finally:
        await kill9(server)


async def test_a_second_broker_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    server = await start_server("--data-dir", str(tmp_path))
    try:
        second = await trio.to_thread.run_sync(
            lambda: run_cli("server", "--port", "0", "--data-dir", str(tmp_path))
        )
        assert second.returncode == 1
        assert f"data dir {tmp_path} is in use by pid {server.proc.pid}" in second.stderr
    finally:
        await kill9(server)
    # the lock dies with its process, even after kill -9
    server = await start_server("--data-dir", str(tmp_path))
    await kill9(server)
