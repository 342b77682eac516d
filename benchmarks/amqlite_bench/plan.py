"""What one run asks of its clients, and what they count.

These values cross a process boundary (a publisher may run in a child process,
:mod:`amqlite_bench.worker`), so the plan and the route are plain JSON-friendly
dataclasses. Times are ``time.perf_counter_ns()``, which on Linux is
``CLOCK_MONOTONIC``: one clock for every process on the machine, so a send time
taken in one process and a receive time taken in another can be subtracted.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import trio
from hdrh.histogram import HdrHistogram

#: Messages per batch when publishing as fast as possible.
BATCH = 500
#: The pacer's tick: a paced publisher sends what is due, then sleeps at least this long.
TICK = 0.001
#: Header carrying the send time (perf_counter_ns) of a latency-stamped message.
STAMP_HEADER = "ts"
#: Message shapes for amqlite's consumer features (``PublishPlan.pattern``):
#: ``select``: header ``k`` = the message's number mod :data:`SELECT_SHARES` (each
#: consumer selects one value); ``group``: ``group_id`` = its number mod :data:`GROUPS`.
SELECT, GROUP = "select", "group"
SELECT_HEADER = "k"
SELECT_SHARES = 10
GROUPS = 1000


@dataclass(frozen=True, slots=True)
class Route:
    """Where the publisher sends (exchange, key) and the queues consumers read."""

    exchange: str
    key: str
    queues: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Route:
        return cls(str(d["exchange"]), str(d["key"]), tuple(d["queues"]))


@dataclass(frozen=True, slots=True)
class PublishPlan:
    """``messages`` bodies of ``body_size`` bytes, as fast as possible or at ``rate``/s;
    ``stamp`` adds the send time in the :data:`STAMP_HEADER` header. ``persistent``
    messages go to durable queues; ``confirm`` > 0 asks for publisher confirms with
    at most that many outstanding (the run ends when all are confirmed). ``pattern``
    (:data:`SELECT`, :data:`GROUP`, "" plain) shapes each message for the selector
    and group scenarios."""

    messages: int
    body_size: int = 100
    rate: float | None = None
    stamp: bool = False
    persistent: bool = False
    confirm: int = 0
    pattern: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PublishPlan:
        rate = d.get("rate")
        return cls(
            int(d["messages"]),
            int(d["body_size"]),
            None if rate is None else float(rate),
            bool(d["stamp"]),
            bool(d.get("persistent", False)),
            int(d.get("confirm", 0)),
            str(d.get("pattern", "")),
        )


@dataclass(slots=True)
class PublishTally:
    published: int = 0
    first_ns: int = 0
    last_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PublishTally:
        return cls(int(d["published"]), int(d["first_ns"]), int(d["last_ns"]))


@dataclass(slots=True)
class SharedCount:
    """Consumers that share one expectation (a group-keyed queue: which consumer
    gets which group is the broker's choice): ``reached`` is set at ``expected``."""

    expected: int
    consumed: int = 0
    reached: trio.Event | None = None

    def event(self) -> trio.Event:
        if self.reached is None:
            self.reached = trio.Event()
        return self.reached


@dataclass(slots=True)
class ConsumeTally:
    """One consumer's count; ``done_ns`` is set when ``consumed`` reaches ``expected``
    (or, with ``shared``, when the consumers together reach ``shared.expected``)."""

    expected: int
    hist: HdrHistogram | None = None
    consumed: int = 0
    done_ns: int = 0
    shared: SharedCount | None = None
    selector: str | None = None  # the consumer's selector (the selector scenario)


@dataclass(slots=True)
class ClientReport:
    """What a run's clients measured, wherever they ran (this process or a child).

    Times are ``perf_counter_ns``: ``first_ns`` the first publish, ``last_ns`` the
    last publish (or confirm), ``done_ns`` the last delivery. ``client_cpu_s`` is
    the CPU time the client process(es) used while messages moved.
    """

    published: int
    consumed: int
    first_ns: int
    last_ns: int
    done_ns: int
    client_cpu_s: float
    hist: HdrHistogram | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "consumed": self.consumed,
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "done_ns": self.done_ns,
            "client_cpu_s": self.client_cpu_s,
            "hist": None if self.hist is None else self.hist.encode().decode("ascii"),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClientReport:
        hist = d.get("hist")
        return cls(
            int(d["published"]),
            int(d["consumed"]),
            int(d["first_ns"]),
            int(d["last_ns"]),
            int(d["done_ns"]),
            float(d["client_cpu_s"]),
            None if hist is None else HdrHistogram.decode(hist.encode("ascii")),
        )


def new_histogram() -> HdrHistogram:
    """Latencies in microseconds, 1 us .. 60 s, 3 significant digits."""
    return HdrHistogram(1, 60_000_000, 3)


SendBatch = Callable[[int], Awaitable[None]]


async def drive_publisher(plan: PublishPlan, send_batch: SendBatch, tally: PublishTally) -> None:
    """Call ``send_batch(k)`` until ``plan.messages`` are sent: in batches of
    :data:`BATCH`, or paced at ``plan.rate`` by sending whatever is due once per tick
    (never one sleep per message)."""
    total = plan.messages
    rate = plan.rate
    tally.first_ns = time.perf_counter_ns()
    if rate is None:
        while tally.published < total:
            k = min(BATCH, total - tally.published)
            await send_batch(k)
            tally.published += k
    else:
        start = trio.current_time()
        while tally.published < total:
            now = trio.current_time()
            due = min(total, int((now - start) * rate) + 1)
            k = due - tally.published
            if k > 0:
                await send_batch(k)
                tally.published += k
            next_due = start + tally.published / rate
            await trio.sleep_until(max(next_due, trio.current_time() + TICK))
    tally.last_ns = time.perf_counter_ns()
