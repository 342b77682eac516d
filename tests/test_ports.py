"""tests/ports.py: fixed ports for servers that restart on their own port."""

from __future__ import annotations

import socket

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
