"""Rates from counters sampled now and then, as RabbitMQ's ``*_details.rate``.

The HTTP service samples the broker's counters every ``RATE_INTERVAL`` seconds
(RabbitMQ's ``collect_statistics_interval`` is 5 s) and hands them here with the
time; a rate is the change between the last two samples per second. No clock,
no I/O: the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

__all__ = ["RATE_INTERVAL", "RateSampler"]

RATE_INTERVAL = 5.0


class RateSampler:
    """Per-key rates between the two latest samples (0.0 for a key seen once)."""

    def __init__(self) -> None:
        self._at: float | None = None
        self._values: dict[Hashable, float] = {}
        self._rates: dict[Hashable, float] = {}

    def observe(self, now: float, values: Mapping[Hashable, float]) -> None:
        """A new sample. Keys missing from it are forgotten; a counter that went
        down (its queue was deleted and declared again) restarts at rate 0."""
        previous, at = self._values, self._at
        rates: dict[Hashable, float] = {}
        if at is not None and now > at:
            elapsed = now - at
            for key, value in values.items():
                before = previous.get(key)
                if before is not None:
                    rates[key] = round((value - before) / elapsed, 3)
        self._values = dict(values)
        self._rates = rates
        self._at = now

    def rate(self, key: Hashable, *, counter: bool = True) -> float:
        """Per second; a ``counter`` never has a negative rate."""
        value = self._rates.get(key, 0.0)
        return max(value, 0.0) if counter else value
