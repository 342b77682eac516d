"""A CPU-time sampler for broker processes, beside py-spy.

py-spy counts a thread that is runnable but waiting for a core as busy where it
stopped: on a loaded machine a syscall that wakes another process (``os.write``)
looks far costlier than it is (round 15: ``WireLink._writer`` 20-23 % of the sending
broker in py-spy, 1.8 % here). This sampler ticks on ``ITIMER_PROF``, which counts
only while the process runs (user + system), so a sample is CPU spent.

Use: put this directory first on the brokers' ``PYTHONPATH`` and set
``CPUPROF_DIR``; every process whose command line names ``server`` then starts
sampling on ``SIGUSR1`` (counts reset) and on ``SIGUSR2`` stops and writes
``$CPUPROF_DIR/<pid>.txt`` in py-spy's raw format (``benchmarks/profile_summary.py``
reads it). The kernel's timer granularity (a few ms) bounds the rate: run a phase
long enough for a few hundred samples. Python runs a signal handler between
bytecodes, so a sample inside a C call (an encoder, a system call) is charged to the
Python frame that made it (as py-spy without ``--native`` does).
"""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("CPUPROF_DIR")
if _DIR and "server" in sys.argv:
    import collections
    import signal
    from types import CodeType, FrameType

    _out_dir: str = _DIR
    _counts: collections.Counter[str] = collections.Counter()
    _names: dict[CodeType, str] = {}

    def _name(code: CodeType) -> str:
        name = _names.get(code)
        if name is None:
            name = _names[code] = f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
        return name

    def _sample(signum: int, frame: FrameType | None) -> None:
        stack = []
        while frame is not None:
            stack.append(_name(frame.f_code))
            frame = frame.f_back
        _counts[";".join(reversed(stack))] += 1

    def _start(signum: int, frame: FrameType | None) -> None:
        _counts.clear()
        signal.setitimer(signal.ITIMER_PROF, 0.0005, 0.0005)

    def _stop(signum: int, frame: FrameType | None) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        with open(os.path.join(_out_dir, f"{os.getpid()}.txt"), "w") as out:
            for stack, n in _counts.items():
                out.write(f"{stack} {n}\n")

    signal.signal(signal.SIGPROF, _sample)
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
