"""Loopback ports for servers that must restart on the same port (tests and benchmarks).

Most tests bind port 0 and read back what the kernel chose. An HA pair cannot: each
node's config names the other's port, and a killed node restarts on its own. A port
found free by binding port 0 comes from the kernel's ephemeral range, the range the
kernel also draws the local port of every outgoing connection from; between the
probe and the server's (re)bind, any connection on the machine (another test's
client, a node dialing its peer) may be given it, and the server then exits before
it listens (a CI run lost a test to that once, round 12).

:func:`fixed_port` draws from below the ephemeral range instead, where the kernel
never picks a port by itself, and checks that the port binds now. Two tests running
at once could still draw the same port (about one chance in ten thousand a draw);
the bind check catches it when the other already listens.

The tests take it through ``tests/ports.py``; the benchmarks' pairs and sites
(``hapair.py``, ``ha_cpu.py``, ``persist_cpu.py``, ``peering.py``) use it directly.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: the lowest port drawn (above the registered services tests might meet, and far
#: from 5672 / 15672, which a local RabbitMQ may hold)
LOWEST = 20000
#: Linux's default ephemeral range starts here when /proc does not say
DEFAULT_EPHEMERAL_LOW = 32768

_draw = random.SystemRandom()


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux), else the default."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def fixed_port() -> int:
    """A loopback port below the ephemeral range that nothing listens on now."""
    high = max(LOWEST + 1000, ephemeral_low())
    for _ in range(200):
        port = _draw.randrange(LOWEST, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {LOWEST}..{high - 1} after 200 draws")
