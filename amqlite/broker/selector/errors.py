"""The one error a selector's text can raise."""

from __future__ import annotations

from amqlite.errors import PreconditionFailed


class SelectorError(PreconditionFailed):
    """A selector that does not parse or type-check: 406 PRECONDITION_FAILED.

    ``position`` is where in the selector text the problem is (characters counted
    from 0), ``reason`` what it is. The text carries both, so a client that only
    sees the error frame learns them too.
    """

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"selector error at position {position}: {reason}")
        self.position = position
        self.reason = reason
