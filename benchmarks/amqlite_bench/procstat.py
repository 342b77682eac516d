"""What the bench reads about processes from Linux's /proc: CPU time and peak memory.

No psutil: three small files tell all the bench needs. Every reader returns None
when /proc cannot tell (another OS, a process that is gone, no permission), and
the reports show ``-`` for it.
"""

from __future__ import annotations

import os
import resource

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def own_cpu_seconds() -> float:
    """User + system CPU time of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_seconds() -> float | None:
    """CPU time all processes on this machine have used (all cores, from /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS  # all but idle and iowait


def peak_rss_kib(pid: int) -> int | None:
    """``VmHWM`` of ``pid``: its peak resident memory, in KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss(pid: int) -> bool:
    """Start ``pid``'s VmHWM afresh from its current RSS (``clear_refs`` 5, Linux >= 4.0),
    so the next :func:`peak_rss_kib` is the peak of one run. False when not allowed:
    the peak then covers the process's whole life."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class ServerMeter:
    """A server's CPU time and the machine's busy time between :meth:`start` and
    :meth:`stop`, and the server's peak memory since :meth:`reset_peak`."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.peak_scope = "run"
        self._cpu0: float | None = None
        self._busy0: float | None = None
        self.cpu_s: float | None = None
        self.busy_s: float | None = None
        self.peak_rss_kib: int | None = None

    def reset_peak(self) -> None:
        if self.pid is not None and not reset_peak_rss(self.pid):
            self.peak_scope = "process"

    def start(self) -> None:
        self._cpu0 = process_cpu_seconds(self.pid) if self.pid else None
        self._busy0 = machine_busy_seconds()

    def stop(self) -> None:
        cpu1 = process_cpu_seconds(self.pid) if self.pid else None
        busy1 = machine_busy_seconds()
        if self._cpu0 is not None and cpu1 is not None:
            self.cpu_s = cpu1 - self._cpu0
        if self._busy0 is not None and busy1 is not None:
            self.busy_s = busy1 - self._busy0
        if self.pid is not None:
            self.peak_rss_kib = peak_rss_kib(self.pid)
