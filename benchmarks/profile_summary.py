"""Summarise a py-spy ``--format raw`` profile: the hottest frames, self and total.

    py-spy record -p <broker pid> -f raw -o broker.txt -r 250 -d 20
    python benchmarks/profile_summary.py broker.txt [--top 25] [--exclude _thread_cache]

Self time is where the CPU was (the leaf frame); total time counts a frame once
per sample it appears in. Percentages are of all busy samples.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

_LINE = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def _name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["file"]
    for marker in ("site-packages/", "/amqlite/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/amqlite/":
                path = "amqlite/" + path
            break
    return f"{m['func']} ({path})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="TEXT",
        help="drop samples whose stack mentions TEXT (e.g. _thread_cache: trio's idle "
        "worker threads, which py-spy --idle samples too)",
    )
    args = parser.parse_args()
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    with open(args.profile) as f:
        for line in f:
            m = _LINE.match(line.rstrip("\n"))
            if not m:
                continue
            stack, n = m[1].split(";"), int(m[2])
            if any(text in m[1] for text in args.exclude):
                continue
            samples += n
            names = [_name(fr) for fr in stack]
            own[names[-1]] += n
            for name in set(names):
                total[name] += n
    print(f"{samples} samples\n\nself time:")
    for name, n in own.most_common(args.top):
        print(f"  {100 * n / samples:5.1f}%  {name}")
    print("\ntotal time (inclusive):")
    for name, n in total.most_common(args.top):
        print(f"  {100 * n / samples:5.1f}%  {name}")


if __name__ == "__main__":
    main()
