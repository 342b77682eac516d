"""Loopback ports for servers that must restart on the same port (tests and benchmarks).

Most tests bind port 0 and read back what the kernel chose. An HA pair cannot: each
node's config names the other's port, and a killed node restarts on its own. A port
found free by binding port 0 comes from the kernel's ephemeral range, the range the
kernel also draws the local port of every outgoing connection from; between the
probe and the server's (re)bind, any connection on the machine (another test's
client, a node dialing its peer) may be given it, and the server then exits before
it listens (a CI run lost a test to that once, round 12).

:func:`fixed_port` draws from below the ephemeral range instead, where the kernel
never picks a port by itself, and checks that the port binds now. That check cannot
see a port another test drew and has not bound yet, or one whose server it killed
and will restart: with two pytest-xdist workers, one test's backup found its port
taken that way (a CI run, round 17). So a process never hands out a port twice, and
each xdist worker draws from a slice of the range of its own
(``PYTEST_XDIST_WORKER`` ``gwN`` of ``PYTEST_XDIST_WORKER_COUNT``): the tests of one
run cannot draw each other's ports.

The tests take it through ``tests/ports.py``; the benchmarks' pairs and sites
(``hapair.py``, ``ha_cpu.py``, ``persist_cpu.py``, ``peering.py``) use it directly.
"""

from __future__ import annotations

import os
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


#: the ports this process has handed out (never twice: a killed server comes back
#: on its port)
_given: set[int] = set()


def worker_slice(low: int, high: int) -> tuple[int, int]:
    """The part of ``[low, high)`` this process draws from: all of it, or for
    pytest-xdist worker ``gwN`` of ``PYTEST_XDIST_WORKER_COUNT`` the N-th of as many
    equal slices."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    except ValueError:
        count = 1
    if count < 2 or not worker.startswith("gw") or not worker[2:].isdigit():
        return low, high
    width = (high - low) // count
    first = low + (int(worker[2:]) % count) * width
    return first, first + width


def fixed_port() -> int:
    """A loopback port below the ephemeral range (in this process's slice of it) that
    nothing listens on now and that this process has not handed out before."""
    low, high = worker_slice(LOWEST, max(LOWEST + 1000, ephemeral_low()))
    for _ in range(200):
        port = _draw.randrange(low, high)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {low}..{high - 1} after 200 draws")
