"""``amqlite server`` and ``amqlite bench``: each hands its arguments to its own
package, imported only when that command runs.

The bench harness is not part of ``amqlite``: it is the ``amqlite-bench``
distribution (package ``amqlite_bench``, in benchmarks/ of the source tree).
``amqlite bench`` hands over to it when it is installed and otherwise fails with
one line saying how to install it.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from .common import UsageError

#: The package ``amqlite bench`` hands over to.
BENCH_PACKAGE = "amqlite_bench"
BENCH_MISSING = (
    "amqlite bench needs the benchmark harness (amqlite_bench, not part of amqlite): "
    "in a source checkout, pip install -e benchmarks/ or run scripts/bench"
)


def bench_harness() -> ModuleType:
    """The harness package; :class:`UsageError` saying how to install it when it is
    not installed (an import error inside an installed harness propagates)."""
    try:
        return importlib.import_module(BENCH_PACKAGE)
    except ModuleNotFoundError as exc:
        if exc.name != BENCH_PACKAGE:
            raise
        raise UsageError(BENCH_MISSING) from None


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The harness's flags, description and epilog on ``amqlite bench``'s parser."""
    bench_harness().add_bench_arguments(parser)


def cmd_server(args: argparse.Namespace) -> int:
    from amqlite.server.main import run_server

    return run_server(args)


def cmd_bench(args: argparse.Namespace) -> int:
    status: int = bench_harness().run_bench(args)
    return status
