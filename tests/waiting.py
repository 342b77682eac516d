"""The one bounded wait the in-process tests use: poll a condition owned by
another task (a node's own tasks, its counters, another process's answers) until it
holds, failing after ``deadline`` seconds. Nothing here sleeps for a fixed time to
let something happen; the poll interval only bounds how late the test notices."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio


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
