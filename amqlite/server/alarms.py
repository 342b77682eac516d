"""Memory and disk alarms, the shell: measure on a timer, block publishers.

:class:`AlarmService` samples the process's resident memory (``/proc/self/statm``)
every ``MEMORY_INTERVAL`` seconds, every ``NEAR_MEMORY_INTERVAL`` seconds once past
half the watermark (while the memory alarm is raised it first
returns freed memory to the system: glibc's ``malloc_trim``) and the free space of
the data directory's file system (``os.statvfs``, in a worker thread) every
``DISK_INTERVAL`` seconds, feeds
them to the sans-IO :class:`~amqlite.broker.alarms.Alarms`, logs each raise and
clear, and tells the node, which hands the raised set to every client connection.

Each client connection has a :class:`PublishGate`. It remembers whether the
connection has published (anything; a persistent message), and while a raised
alarm covers it (:func:`~amqlite.broker.alarms.blocking`) the gate is shut: the
connection has been told (native ``blocked``, AMQP ``connection.blocked``), its
reader waits at :meth:`PublishGate.wait_open` before it handles what it read next
(at most one read, ``amqlite.link.RECEIVE_SIZE`` bytes, waits unhandled; TCP flow
control holds the rest in the sender), and its heartbeat clock does not count the
silence we cause. Writing goes on (deliveries,
confirms, heartbeats). When the alarm clears the gate opens, the connection is told
(``unblocked``) and the reader reads again. Nothing already read is dropped.

Before that, paging (``PAGING_FRACTION`` below, docs/storage.md "Backlogs on
disk"): from 90% of the watermark the queues' messages past their first few wait on
disk (transient bodies in the page file, persistent ones in the journal), and a
sample over the watermark pages first and measures again; publishers are blocked
only when memory is still over.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
import trio

from amqlite.broker.alarms import HYSTERESIS, AlarmChange, Alarms, Resource, blocking

if TYPE_CHECKING:
    from amqlite.config import LimitsConfig
    from amqlite.protocol import HeartbeatClock

log = structlog.get_logger("amqlite.server")

#: Seconds between two memory samples while the memory used is under
#: ``NEAR_FRACTION`` of the watermark, and once it is past that (or the alarm is
#: raised). Reading /proc/self/statm costs some 20 us; a flood of 1 KiB messages
#: grows a broker by some 200 MB/s, so the near interval bounds the overshoot past
#: the watermark.
MEMORY_INTERVAL = 0.1
NEAR_MEMORY_INTERVAL = 0.025
NEAR_FRACTION = 0.5
#: Past ``NEAR_FRACTION`` (or while the alarm is raised), a sample is also taken
#: each time client connections have read this many bytes since the last one: the
#: timer alone lets a flood faster than the one above (or a reader that keeps the
#: loop busy between two timer wake-ups) overshoot further.
NEAR_MEMORY_BYTES = 2 * 1024 * 1024
#: While the memory alarm is raised, freed memory is handed back to the system
#: (``malloc_trim``) at most this often, before a sample.
TRIM_INTERVAL = 0.25
#: Paging: from this fraction of the memory watermark on, messages past each
#: queue's first few wait on disk (transient bodies in the page file, persistent
#: ones in the journal), and a sample at or over the watermark pages first and
#: measures again before it raises the alarm that blocks publishers. Paging stops
#: once memory is clearly back under this mark (the alarms' hysteresis).
PAGING_FRACTION = 0.9
#: Seconds between two disk samples (statvfs runs in a worker thread).
DISK_INTERVAL = 1.0
#: FOR TESTS ONLY: when this environment variable names a file, the memory
#: measurement is the integer in that file (bytes) instead of the real RSS, so a
#: test can raise and clear the memory alarm of a real server process without
#: allocating gigabytes. An unreadable or empty file means "use the real RSS".
TEST_MEMORY_FILE_ENV = "AMQLITE_TEST_MEMORY_FILE"

MemoryProbe = Callable[[], int]
DiskProbe = Callable[[str], int]


def resident_memory() -> int:
    """The process's resident set size in bytes (Linux; elsewhere the peak RSS)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


def _load_malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``: hand the allocator's free pages back to the
    system (None elsewhere). Freed message bodies otherwise stay in the process's
    RSS, and a drained broker would never fall back under its watermark."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def total_memory() -> int:
    """The memory the process may use: the machine's, or its cgroup's limit when
    smaller (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def free_disk(path: str) -> int:
    """Bytes free to an unprivileged user on the file system holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _memory_probe() -> MemoryProbe:
    test_file = os.environ.get(TEST_MEMORY_FILE_ENV)
    if not test_file:
        return resident_memory

    def injected() -> int:  # for tests only: see TEST_MEMORY_FILE_ENV
        try:
            with open(test_file, encoding="ascii") as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return resident_memory()

    return injected


class AlarmService:
    """Samples memory and disk on a timer and raises or clears the node's alarms.

    ``memory`` and ``disk`` replace the probes (tests); ``on_change`` gets the raised
    set after every change. ``directory`` is the data directory (None: no disk
    alarm, nothing is written)."""

    def __init__(
        self,
        limits: LimitsConfig,
        on_change: Callable[[frozenset[Resource]], None],
        *,
        memory: MemoryProbe | None = None,
        disk: DiskProbe | None = None,
        memory_total: int | None = None,
    ) -> None:
        total = memory_total if memory_total is not None else total_memory()
        self.memory_limit = limits.memory_limit(total)
        self.alarms = Alarms(self.memory_limit, limits.disk_free_limit)
        self.on_change = on_change
        self.directory: str | None = None
        self._memory = memory if memory is not None else _memory_probe()
        self._disk = disk if disk is not None else free_disk
        #: while the memory alarm is raised, each sample first returns freed memory
        #: to the system (real measurements only)
        self._trim = _load_malloc_trim() if memory is None else None
        self._trimmed_at = -TRIM_INTERVAL
        #: the node's paging switch: called with True when memory passes the paging
        #: mark (returns how many messages it moved to disk), False once it is back
        self.page: Callable[[bool], int] | None = None
        self.paging = False
        self.paging_mark = int(self.memory_limit * PAGING_FRACTION)
        #: past the near mark: bytes read from clients since the last sample
        #: (None: not near, nothing is counted)
        self._unsampled: int | None = None

    @property
    def raised(self) -> frozenset[Resource]:
        return self.alarms.raised

    async def run(
        self,
        directory: str | None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Sample until cancelled; the first samples are taken before ``started``."""
        self.directory = directory
        log.info(
            "alarms_watching",
            memory_limit=self.memory_limit,
            disk_free_limit=self.alarms.alarms[Resource.DISK].limit,
            directory=directory,
        )
        self.sample_memory()
        if directory is not None:
            await self.sample_disk()
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._memory_loop)
            if directory is not None:
                nursery.start_soon(self._every, DISK_INTERVAL, self.sample_disk)

    async def _every(self, interval: float, sample: Callable[[], Any]) -> None:
        while True:
            await trio.sleep(interval)
            await sample()

    async def _memory_loop(self) -> None:
        while True:
            close = self._unsampled is not None
            await trio.sleep(NEAR_MEMORY_INTERVAL if close else MEMORY_INTERVAL)
            self.sample_memory()

    def received(self, nbytes: int) -> None:
        """A client connection read ``nbytes``: near the watermark, sample memory
        every ``NEAR_MEMORY_BYTES`` read (see there)."""
        if self._unsampled is not None:
            self._unsampled += nbytes
            if self._unsampled >= NEAR_MEMORY_BYTES:
                self.sample_memory()

    def sample_memory(self) -> None:
        if self._trim is not None and Resource.MEMORY in self.alarms.raised:
            now = trio.current_time()
            if now - self._trimmed_at >= TRIM_INTERVAL:
                self._trimmed_at = now
                self._trim()
        used = self._memory()
        page = self.page
        if page is not None:
            if used >= self.paging_mark:
                if not self.paging:
                    self.paging = True
                    log.info("paging_started", memory_used=used, mark=self.paging_mark)
                if page(True):  # moved messages to disk: measure what that freed
                    if self._trim is not None:
                        self._trim()
                    used = self._memory()
            elif self.paging and used < self.paging_mark * (1 - HYSTERESIS):
                self.paging = False
                page(False)
                log.info("paging_stopped", memory_used=used, mark=self.paging_mark)
        self._apply(self.alarms.measure(Resource.MEMORY, used))
        alarm = self.alarms.alarms[Resource.MEMORY]
        close = alarm.raised or used >= NEAR_FRACTION * alarm.limit
        self._unsampled = 0 if close else None

    async def sample_disk(self) -> None:
        directory = self.directory
        if directory is None:
            return
        try:
            free = await trio.to_thread.run_sync(self._disk, directory)
        except OSError as exc:
            log.warning("alarm_disk_check_failed", directory=directory, error=str(exc))
            return
        self._apply(self.alarms.measure(Resource.DISK, free))

    def _apply(self, change: AlarmChange | None) -> None:
        if change is None:
            return
        what = "memory_used" if change.resource is Resource.MEMORY else "disk_free"
        fields = {"resource": change.resource.value, what: change.value, "limit": change.limit}
        if change.raised:
            log.warning("alarm_raised", reason=change.resource.reason, **fields)
        else:
            log.info("alarm_cleared", **fields)
        self.on_change(self.alarms.raised)

    def status(self) -> dict[str, Any]:
        """``alarms`` (the raised ones, by name) and ``limits`` (each alarm's mark and
        last measurement) for the node's status."""
        return {
            "alarms": sorted(r.value for r in self.alarms.raised),
            "limits": {
                "memory": {
                    "used": self.alarms.alarms[Resource.MEMORY].value,
                    "high_watermark": self.memory_limit,
                },
                "disk": {
                    "free": self.alarms.alarms[Resource.DISK].value,
                    "free_limit": self.alarms.alarms[Resource.DISK].limit,
                },
            },
        }


class PublishGate:
    """One client connection's side of the alarms (see the module docstring).

    The connection sets :attr:`published` / :attr:`persistent` as it reads
    publishes, calls :meth:`update` with the node's raised alarms (at its open and
    on every change), :meth:`refresh` after each read's frames while an alarm is
    raised, and awaits :meth:`wait_open` (when :attr:`blocked_by` is set) before it
    handles the next read's frames. ``notify`` tells the
    other end (a reason: blocked; None: unblocked)."""

    __slots__ = ("_clock", "_notify", "_open", "blocked_by", "persistent", "published", "raised")

    def __init__(self, clock: HeartbeatClock, notify: Callable[[str | None], None]) -> None:
        self._clock = clock
        self._notify = notify
        self.published = False
        self.persistent = False
        self.raised: frozenset[Resource] = frozenset()
        #: the alarm blocking the connection now (None: it is read)
        self.blocked_by: Resource | None = None
        self._open = trio.Event()
        self._open.set()

    def update(self, raised: frozenset[Resource]) -> None:
        self.raised = raised
        self.refresh()

    def refresh(self) -> None:
        """Shut or open the gate for the raised alarms and what was published."""
        by = blocking(self.raised, published=self.published, persistent=self.persistent)
        if by is self.blocked_by:
            return
        was = self.blocked_by
        self.blocked_by = by
        if by is not None and was is None:
            self._open = trio.Event()
            self._clock.pause()
            self._notify(by.reason)
        elif by is None:
            self._clock.resume(trio.current_time())
            self._open.set()
            self._notify(None)

    def release(self) -> None:
        """The connection is closing: never hold its reader again."""
        self.raised = frozenset()
        self.published = self.persistent = False
        if self.blocked_by is not None:
            self.blocked_by = None
            self._clock.resume(trio.current_time())
            self._open.set()

    async def wait_open(self) -> None:
        await self._open.wait()
