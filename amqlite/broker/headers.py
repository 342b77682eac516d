"""Headers routing: a binding's arguments compiled once into a :class:`HeadersRule`.

``x-match`` is ``all`` (the default: every pair must match) or ``any`` (one pair
suffices). Other ``x-`` arguments are not matched. A pair matches when the message
header of that name holds an equal value of the same type (so ``1``, ``1.0`` and
``True`` are three different values). ``all`` with no pairs matches every message;
``any`` with no pairs matches none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from amqlite.errors import PreconditionFailed


class HeadersRule:
    """The matching part of a headers binding."""

    __slots__ = ("match_any", "pairs")

    def __init__(self, match_any: bool, pairs: tuple[tuple[str, Any], ...]) -> None:
        self.match_any = match_any
        self.pairs = pairs

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> HeadersRule:
        """Compile binding arguments; a bad ``x-match`` raises 406 naming it."""
        mode = arguments.get("x-match", "all")
        if mode not in ("all", "any") or type(mode) is not str:
            raise PreconditionFailed(
                f"invalid arg 'x-match': expected 'all' or 'any', got {mode!r}"
            )
        pairs = tuple((k, v) for k, v in arguments.items() if not k.startswith("x-"))
        return cls(mode == "any", pairs)

    def matches(self, headers: Mapping[str, Any]) -> bool:
        missing = _MISSING
        if self.match_any:
            for name, want in self.pairs:
                got = headers.get(name, missing)
                if type(got) is type(want) and got == want:
                    return True
            return False
        for name, want in self.pairs:
            got = headers.get(name, missing)
            if type(got) is not type(want) or got != want:
                return False
        return True


class _Missing:
    __slots__ = ()


_MISSING = _Missing()
