"""The fault proxy against tiny loopback targets: forwarding, cuts, partitions, delay,
retargeting and seeded chaos. No test sleeps to pass; each waits on a condition under
a deadline (virtual time where the mock clock is used)."""

from __future__ import annotations

import hashlib
import itertools
import random
import socket
import struct
from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio
import trio.testing

from tests.faultproxy import FaultProxy, ProxyStats

DEADLINE = 10.0

_Handler = Callable[["_Target", trio.SocketStream], Awaitable[None]]


class _Target:
    """A loopback target that counts what it received and how connections ended."""

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler
        self.port = 0
        self.connections = 0
        self.ended = 0
        self.resets = 0
        self.received = 0
        self._changed = trio.Event()

    @property
    def target(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    async def start(self, nursery: trio.Nursery) -> _Target:
        listeners = await nursery.start(partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]
        return self

    def note(self, **amounts: int) -> None:
        for name, amount in amounts.items():
            setattr(self, name, getattr(self, name) + amount)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    async def _serve(self, stream: trio.SocketStream) -> None:
        self.note(connections=1)
        try:
            await self._handler(self, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.note(resets=1)
        finally:
            self.note(ended=1)


async def _echo(target: _Target, stream: trio.SocketStream) -> None:
    """Echo every chunk; on EOF, half-close back."""
    async for data in stream:
        target.note(received=len(data))
        await stream.send_all(data)
    await stream.send_eof()


async def _digest(target: _Target, stream: trio.SocketStream) -> None:
    """Read to EOF (the client half-closed), then reply with length and sha256."""
    hasher = hashlib.sha256()
    async for data in stream:
        target.note(received=len(data))
        hasher.update(data)
    await stream.send_all(b"%d:" % target.received + hasher.digest())


async def _bye_first(target: _Target, stream: trio.SocketStream) -> None:
    """Say bye and half-close at once, then keep reading what the client still sends."""
    await stream.send_all(b"bye")
    await stream.send_eof()
    async for data in stream:
        target.note(received=len(data))


async def _serve_target(nursery: trio.Nursery, handler: _Handler = _echo) -> _Target:
    return await _Target(handler).start(nursery)


async def _connect(proxy: FaultProxy) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", proxy.port)


async def _receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        data = await stream.receive_some(size - len(buffer))
        if not data:
            raise EOFError(f"EOF after {len(buffer)} of {size} bytes")
        buffer += data
    return bytes(buffer)


async def _receive_to_eof(stream: trio.SocketStream) -> bytes:
    buffer = bytearray()
    async for data in stream:
        buffer += data
    return bytes(buffer)


async def _round_trip(stream: trio.SocketStream, payload: bytes) -> bytes:
    await stream.send_all(payload)
    return await _receive_exactly(stream, len(payload))


async def _is_broken(stream: trio.SocketStream) -> bool:
    """True once the connection was reset or closed under us (reset or EOF)."""
    try:
        return await stream.receive_some(1024) == b""
    except trio.BrokenResourceError:
        return True


def _reset(stream: trio.SocketStream) -> None:
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- lifecycle and forwarding --------------------------------------------------------


async def test_run_reports_its_loopback_port(nursery: trio.Nursery) -> None:
    echo = await _serve_target(nursery)
    proxy = FaultProxy(echo.target)
    port = await nursery.start(proxy.run)
    assert port == proxy.port != 0
    assert proxy.address == f"127.0.0.1:{port}"
    with trio.fail_after(DEADLINE):
        client = await _connect(proxy)
        assert await _round_trip(client, b"hello") == b"hello"


async def test_forwards_a_large_payload_both_ways_byte_exact(nursery: trio.Nursery) -> None:
    payload = random.Random(1).randbytes(4 * 1024 * 1024 + 17)
    echo = await _serve_target(nursery)
    async with FaultProxy.open(echo.target) as proxy:
        with trio.fail_after(DEADLINE):
            client = await _connect(proxy)

            async def send_then_half_close() -> None:
                for start in range(0, len(payload), 100_000):
                    await client.send_all(payload[start : start + 100_000])
                await client.send_eof()

            async with trio.open_nursery() as senders:
                senders.start_soon(send_then_half_close)
                echoed = await _receive_to_eof(client)

            assert echoed == payload
            stats = await proxy.wait_for(lambda s: s.closed == 1)
    assert stats.accepted == 1
    assert stats.cuts == 0
    assert stats.bytes_from_client == stats.bytes_to_target == len(payload)
    assert stats.bytes_from_target == stats.bytes_to_client == len(payload)


async def test_client_half_close_reaches_the_target_which_still_replies(
    nursery: trio.Nursery,
) -> None:
    payload = random.Random(2).randbytes(1024 * 1024)
    digest = await _serve_target(nursery, _digest)
    async with FaultProxy.open(digest.target) as proxy:
        with trio.fail_after(DEADLINE):
            client = await _connect(proxy)
            await client.send_all(payload)
            await client.send_eof()
            reply = await _receive_to_eof(client)
            await proxy.wait_for(lambda s: s.closed == 1)
    assert reply == b"%d:" % len(payload) + hashlib.sha256(payload).digest()
    assert digest.resets == 0


async def test_target_half_close_reaches_the_client_which_still_sends(
    nursery: trio.Nursery,
) -> None:
    bye = await _serve_target(nursery, _bye_first)
    async with FaultProxy.open(bye.target) as proxy:
        with trio.fail_after(DEADLINE):
            client = await _connect(proxy)
            assert await _receive_to_eof(client) == b"bye"
            await client.send_all(b"still here")
            await client.send_eof()
            await bye.wait_until(lambda: bye.ended == 1)
            await proxy.wait_for(lambda s: s.closed == 1)
    assert bye.received == len(b"still here")
    assert bye.resets == 0


async def test_a_reset_from_the_client_closes_the_target_side(nursery: trio.Nursery) -> None:
    echo = await _serve_target(nursery)
    async with FaultProxy.open(echo.target) as proxy:
        with trio.fail_after(DEADLINE):
            client = await _connect(proxy)
            assert await _round_trip(client, b"ping") == b"ping"
            _reset(client)
            await echo.wait_until(lambda: echo.ended == 1)
            stats = await proxy.wait_for(lambda s: s.closed == 1)
    assert stats.cuts == 0


async def test_an_unreachable_target_closes_the_client(nursery: trio.Nursery) -> None:
    async with FaultProxy.open(("127.0.0.1", _unused_port())) as proxy:
        with trio.fail_after(DEADLINE):
            client = await _connect(proxy)
            assert await _is_broken(client)
            stats = await proxy.wait_for(lambda s: s.closed == 1)
    assert stats.connect_failures == 1


async def test_open_re_raises_errors_from_the_block_unwrapped(nursery: trio.Nursery) -> None:
    echo = await _serve_target(nursery)
    with pytest.raises(KeyError):
        async with FaultProxy.open(echo.target):
            raise KeyError("from the block")


# -- cut -----------------------------------------------------------------------------


async def test_cut_resets_open_connections_and_new_ones_work(nursery: trio.Nursery) -> None:
    echo = await _serve_target(nursery)
    async with FaultProxy.open(echo.target) as proxy:
        with trio.fail_after(DEADLINE):
            first = await _connect(proxy)
            second = await _connect(proxy)
            assert await _round_trip(first, b"one") == b"one"
            assert await _round_trip(second, b"two") == b"two"

            assert proxy.cut() == 2

            for client in (first, second):
                with pytest.raises(trio.BrokenResourceError):
                    await client.receive_some(1024)
            await echo.wait_until(lambda: echo.ended == 2)
            assert echo.resets == 2, "a cut is a reset on both sides, not a clean close"
            await proxy.wait_for(lambda s: s.open == 0)

            third = await _connect(proxy)
            assert await _round_trip(third, b"three") == b"three"
    stats = proxy.stats
    assert (stats.accepted, stats.cuts) == (3, 2)


# -- partition -----------------------------------------------------------------------


async def test_partition_holds_bytes_and_heal_delivers_them_in_order(
    nursery: trio.Nursery,
) -> None:
    echo = await _serve_target(nursery)
    async with FaultProxy.open(echo.target) as proxy:
        with trio.fail_after(DEADLINE):
            client = await _connect(proxy)
            assert await _round_trip(client, b"before") == b"before"

            proxy.partition()
            held = [b"held-1 ", b"held-2 ", b"held-3"]
            for piece in held:
                await client.send_all(piece)
            # The latecomer is accepted, but its bytes stay in its socket: no upstream yet.
            latecomer = await _connect(proxy)
            await latecomer.send_all(b"late")
            sent = len(b"before") + sum(map(len, held))
            await proxy.wait_for(lambda s: s.bytes_from_client == sent and s.accepted == 2)
            await trio.testing.wait_all_tasks_blocked()

            assert echo.received == len(b"before")
            assert echo.connections == 1, "no upstream connection during a partition"
            assert proxy.stats.bytes_to_target == len(b"before")

            proxy.heal()
            assert await _receive_exactly(client, sent - len(b"before")) == b"".join(held)
            assert await _receive_exactly(latecomer, 4) == b"late"
    assert proxy.stats.cuts == 0


async def test_partition_holds_eof_until_heal(nursery: trio.Nursery) -> None:
    digest = await _serve_target(nursery, _digest)
    async with FaultProxy.open(digest.target) as proxy:
        with trio.fail_after(DEADLINE):
            client = await _connect(proxy)
            await digest.wait_until(lambda: digest.connections == 1)
            proxy.partition()
            await client.send_all(b"x")
            await client.send_eof()
            await proxy.wait_for(lambda s: s.bytes_from_client == 1)
            await trio.testing.wait_all_tasks_blocked()
            assert digest.ended == 0

            proxy.heal()
            reply = await _receive_to_eof(client)
    assert reply == b"1:" + hashlib.sha256(b"x").digest()


async def test_heal_with_drop_cuts_instead_of_delivering(nursery: trio.Nursery) -> None:
    echo = await _serve_target(nursery)
    async with FaultProxy.open(echo.target) as proxy:
        with trio.fail_after(DEADLINE):
            client = await _connect(proxy)
            assert await _round_trip(client, b"before") == b"before"
            proxy.partition()
            await client.send_all(b"stale")
            await proxy.wait_for(lambda s: s.bytes_from_client == len(b"beforestale"))

            proxy.heal(drop=True)

            assert await _is_broken(client)
            await echo.wait_until(lambda: echo.ended == 1)
            assert echo.received == len(b"before"), "stale bytes arrived after heal"
            fresh = await _connect(proxy)
            assert await _round_trip(fresh, b"fresh") == b"fresh"
    assert proxy.stats.cuts == 1


async def test_partition_refusing_new_connections(nursery: trio.Nursery) -> None:
    echo = await _serve_target(nursery)
    async with FaultProxy.open(echo.target) as proxy:
        with trio.fail_after(DEADLINE):
            client = await _connect(proxy)
            assert await _round_trip(client, b"a") == b"a"
            proxy.partition(refuse_new=True)
            await client.send_all(b"held")

            refused = await _connect(proxy)
            assert await _is_broken(refused)
            assert proxy.stats.refused == 1

            proxy.heal()
            assert await _receive_exactly(client, 4) == b"held"
            accepted = await _connect(proxy)
            assert await _round_trip(accepted, b"b") == b"b"
    assert echo.connections == 2


# -- delay (virtual time) ------------------------------------------------------------


async def test_delay_adds_latency_and_keeps_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        echo = await _serve_target(nursery)
        async with FaultProxy.open(echo.target) as proxy:
            with trio.fail_after(100):
                client = await _connect(proxy)
                start = trio.current_time()
                assert await _round_trip(client, b"instant") == b"instant"
                assert trio.current_time() == start

                proxy.delay(5)
                start = trio.current_time()
                assert await _round_trip(client, b"ping") == b"ping"
                assert trio.current_time() - start == pytest.approx(10)

                # "fast" is read with no delay, but must not overtake "slow".
                start = trio.current_time()
                await client.send_all(b"slow")
                await proxy.wait_for(lambda s: s.bytes_from_client == 15)
                proxy.delay(0)
                await client.send_all(b"fast")
                assert await _receive_exactly(client, 8) == b"slowfast"
                assert trio.current_time() - start == pytest.approx(5)
        nursery.cancel_scope.cancel()


# -- retarget ------------------------------------------------------------------------


async def test_retarget_moves_new_connections_and_optionally_cuts_old(
    nursery: trio.Nursery,
) -> None:
    old = await _serve_target(nursery)
    new = await _serve_target(nursery)
    async with FaultProxy.open(old.target) as proxy:
        with trio.fail_after(DEADLINE):
            first = await _connect(proxy)
            assert await _round_trip(first, b"1") == b"1"

            proxy.retarget(new.target)
            assert proxy.target == new.target
            second = await _connect(proxy)
            assert await _round_trip(second, b"22") == b"22"
            assert await _round_trip(first, b"333") == b"333"
            assert (old.connections, new.connections) == (1, 1)
            assert (old.received, new.received) == (4, 2)

            proxy.retarget(old.target, cut_existing=True)
            assert await _is_broken(first)
            assert await _is_broken(second)
            third = await _connect(proxy)
            assert await _round_trip(third, b"4") == b"4"
    assert (old.connections, new.connections) == (2, 1)
    assert proxy.stats.cuts == 2


# -- chaos ---------------------------------------------------------------------------


async def _chatter_under_chaos(seed: int) -> tuple[list[tuple[int, int]], ProxyStats, int, int]:
    """Lockstep echo round trips (one chunk each way) under per-chunk chaos.

    Returns where each connection broke, the proxy's stats, the bytes the target
    received and the bytes the clients received.
    """
    broke: list[tuple[int, int]] = []
    client_received = 0
    async with trio.open_nursery() as nursery:
        echo = await _serve_target(nursery)
        async with FaultProxy.open(echo.target) as proxy:
            proxy.chaos(random.Random(seed), cut_probability=0.1)
            with trio.fail_after(DEADLINE):
                for connection in range(12):
                    client = await _connect(proxy)
                    for message in range(10):
                        payload = b"%d.%d;" % (connection, message)
                        try:
                            client_received += len(await _round_trip(client, payload))
                        except (trio.BrokenResourceError, EOFError):
                            broke.append((connection, message))
                            break
                    client.socket.close()
                await proxy.wait_for(lambda s: s.closed == s.accepted)
                await echo.wait_until(lambda: echo.ended == echo.connections)
            stats = proxy.stats
        nursery.cancel_scope.cancel()
    return broke, stats, echo.received, client_received


async def test_chaos_cuts_are_reproducible_and_counters_add_up() -> None:
    broke, stats, target_received, client_received = await _chatter_under_chaos(seed=42)

    assert broke, "chaos made no cut"
    assert stats.cuts == len(broke)
    assert stats.accepted == stats.closed == 12
    assert stats.bytes_to_target == target_received
    assert stats.bytes_to_client == client_received
    assert stats.bytes_from_client - stats.bytes_to_target <= 8 * stats.cuts
    assert (broke, stats) == (await _chatter_under_chaos(seed=42))[:2]


async def test_timed_chaos_cuts_at_seeded_times(autojump_clock: trio.testing.MockClock) -> None:
    seed, mean_interval = 7, 3.0
    draws = random.Random(seed)
    expected = list(itertools.accumulate(draws.expovariate(1 / mean_interval) for _ in range(5)))
    seen: list[float] = []
    async with trio.open_nursery() as nursery:
        echo = await _serve_target(nursery)
        async with FaultProxy.open(echo.target) as proxy:
            with trio.fail_after(1000):
                start = trio.current_time()
                proxy.chaos(random.Random(seed), mean_interval=mean_interval)
                for _ in expected:
                    client = await _connect(proxy)
                    assert await _round_trip(client, b"up") == b"up"
                    await proxy.wait_for(lambda s: s.cuts == len(seen) + 1)
                    seen.append(trio.current_time() - start)
                    assert await _is_broken(client)
                proxy.calm()
                client = await _connect(proxy)
                assert await _round_trip(client, b"calm") == b"calm"
        nursery.cancel_scope.cancel()
    assert seen == pytest.approx(expected)


def test_chaos_needs_exactly_one_mode() -> None:
    proxy = FaultProxy(("127.0.0.1", 1))
    with pytest.raises(ValueError, match="exactly one"):
        proxy.chaos(random.Random(0))
    with pytest.raises(ValueError, match="exactly one"):
        proxy.chaos(random.Random(0), cut_probability=0.5, mean_interval=1.0)
