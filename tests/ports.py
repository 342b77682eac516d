"""Fixed loopback ports for servers a test restarts on the same port.

One implementation for the tests and the benchmarks: see
``benchmarks/amqlite_bench/ports.py`` (``benchmarks`` is on the tests' path).
"""

from __future__ import annotations

from amqlite_bench.ports import DEFAULT_EPHEMERAL_LOW, LOWEST, ephemeral_low, fixed_port

__all__ = ["DEFAULT_EPHEMERAL_LOW", "LOWEST", "ephemeral_low", "fixed_port"]
