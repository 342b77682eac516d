"""``python -m amqlite_bench ...``: the same as ``amqlite bench ...``."""

from __future__ import annotations

import argparse
import sys

from . import add_bench_arguments, run_bench


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m amqlite_bench")
    add_bench_arguments(parser)
    return run_bench(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
