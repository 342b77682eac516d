"""The bench's one error type, and how a task group's errors become one message."""

from __future__ import annotations


class BenchError(Exception):
    """A run could not finish; the message says which and why."""


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


def collapse_errors(group: BaseExceptionGroup[BaseException], what: str) -> BaseException:
    """The one error worth showing from a run's task group."""
    leaves = _leaves(group)
    for exc in leaves:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            return exc
    for exc in leaves:
        if isinstance(exc, BenchError):
            return exc
    first = leaves[0]
    return BenchError(f"{what}: {type(first).__name__}: {first}")
