"""tests/ports.py: fixed ports for servers that restart on their own port."""

from __future__ import annotations

import itertools
import socket

import pytest

from amqlite_bench import ports as bench_ports

from .ports import LOWEST, ephemeral_low, fixed_port


def test_a_fixed_port_is_below_the_ephemeral_range_and_binds() -> None:
    low = ephemeral_low()
    ports = {fixed_port() for _ in range(20)}
    assert all(LOWEST <= p < max(LOWEST + 1000, low) for p in ports)
    assert len(ports) > 1  # drawn, not one port for everyone
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_kernel_never_picks_a_fixed_port_for_a_connection() -> None:
    """What the module relies on: an outgoing connection's local port comes from the
    ephemeral range, which fixed ports avoid."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as c:
            assert c.getsockname()[1] >= ephemeral_low()


def test_a_process_never_hands_out_a_port_twice() -> None:
    """A port a test drew may be free for a while (its server killed, to restart on
    it): no later draw in this process may take it."""
    drawn = [fixed_port() for _ in range(300)]
    assert len(set(drawn)) == len(drawn)


@pytest.mark.parametrize("count", [2, 3, 4])
def test_xdist_workers_draw_from_slices_that_do_not_overlap(
    count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    slices = []
    for n in range(count):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{n}")
        slices.append(bench_ports.worker_slice(20000, 32768))
        port = fixed_port()
        assert slices[-1][0] <= port < slices[-1][1]
    assert slices[0][0] == 20000 and slices[-1][1] <= 32768
    for (_, end), (start, _) in itertools.pairwise(slices):
        assert end <= start  # in order, none overlapping the next
    assert all(end - start >= (32768 - 20000) // count - 1 for start, end in slices)
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert bench_ports.worker_slice(20000, 32768) == (20000, 32768)  # not a worker
