"""Jittered exponential backoff between connection attempts.

Attempt ``n`` (from 0) waits a uniform time in ``[c / 2, c]`` with
``c = min(maximum, initial * 2 ** (n + 1))``, and never less than ``initial``: the
first wait is 100-200 ms, the waits double, and from the sixth on they lie in
2.5-5 s. The jitter keeps many links cut at once from retrying in step. The random
source is injected (``random.Random(seed).random`` in tests), so the core stays
deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

_MAX_DOUBLINGS = 62


@dataclass(slots=True)
class Backoff:
    """Delays for successive failed attempts; :meth:`reset` after a success."""

    rand: Callable[[], float]  # uniform in [0, 1)
    initial: float = 0.1
    maximum: float = 5.0
    attempts: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(
                f"backoff needs 0 < initial <= maximum, got {self.initial} and {self.maximum}"
            )

    def ceiling(self, attempt: int) -> float:
        """The longest wait of attempt ``attempt`` (from 0)."""
        return min(self.maximum, self.initial * 2.0 ** min(attempt + 1, _MAX_DOUBLINGS))

    def next_delay(self) -> float:
        """The wait before the next attempt; counts the attempt."""
        c = self.ceiling(self.attempts)
        self.attempts += 1
        low = max(self.initial, c / 2)
        return low + (c - low) * self.rand()

    def reset(self) -> None:
        self.attempts = 0
