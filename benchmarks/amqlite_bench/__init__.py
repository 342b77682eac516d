"""``amqlite bench``: amqlite against a raw-trio baseline and, with ``--vs``,
RabbitMQ and NATS, in one invocation.

This package is the ``amqlite-bench`` distribution (benchmarks/pyproject.toml),
apart from ``amqlite``. ``amqlite bench`` (``amqlite/cli``) wires
:func:`add_bench_arguments` into its ``bench`` sub-parser and calls :func:`run_bench`
with the parsed arguments (it returns the exit status); ``python -m amqlite_bench``
does the same without the CLI. Both import the runner lazily, so
``python -m amqlite_bench.baseline`` stays light.
"""

from __future__ import annotations

import argparse

__all__ = ["add_bench_arguments", "run_bench"]


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``amqlite bench``'s flags to ``parser``."""
    from .runner import add_bench_arguments as add

    add(parser)


def run_bench(args: argparse.Namespace) -> int:
    """Run ``amqlite bench`` with parsed arguments; returns the exit status."""
    from .runner import run_bench as run

    return run(args)
