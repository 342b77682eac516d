"""How many hypothesis examples a test runs: its default-suite count, times the
loaded profile's factor. tests/conftest.py registers the ``soak`` profile
(``pytest --hypothesis-profile=soak``), which runs ten times as many; the default
profile runs the count given."""

from __future__ import annotations

from hypothesis import settings

#: hypothesis' own default example count: the default profile's, the factor's unit
_UNIT = 100


def examples(n: int) -> int:
    """``n`` examples in the default suite, ``10 * n`` under the soak profile."""
    return max(1, n * settings.default.max_examples // _UNIT)
