"""The bounded waits the tests use: poll a condition owned by another task or
process (a node's own tasks, its counters, another process's answers) until it
holds, failing after ``deadline`` seconds; :func:`wait_until` in trio,
:func:`poll_until` in plain code (a test driving subprocesses). Nothing here sleeps
for a fixed time to let something happen; the poll interval only bounds how late
the test notices."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

T = TypeVar("T")


def poll_until(
    probe: Callable[[], T],
    what: str = "the condition",
    *,
    deadline: float = 10.0,
    every: float = 0.01,
) -> T:
    """``probe()``'s first truthy answer, asked every ``every`` seconds; an
    AssertionError naming ``what`` (and the last answer) after ``deadline`` s."""
    end = time.monotonic() + deadline
    while True:
        answer = probe()
        if answer:
            return answer
        assert time.monotonic() < end, f"{what} did not hold within {deadline} s: {answer!r}"
        time.sleep(every)


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    what: str = "the condition",
    *,
    deadline: float = 10.0,
    every: float = 0.01,
) -> None:
    """Return once ``predicate()`` (or what it awaits to) is true; raise
    ``trio.TooSlowError`` naming ``what`` after ``deadline`` seconds."""
    try:
        with trio.fail_after(deadline):
            while True:
                result = predicate()
                if not isinstance(result, bool):
                    result = await result
                if result:
                    return
                await trio.sleep(every)
    except trio.TooSlowError:
        raise trio.TooSlowError(f"{what} did not hold within {deadline} s") from None
