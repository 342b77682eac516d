"""SQL ``LIKE`` matching without regular expressions: ``_`` matches one character,
``%`` any run of characters (none included), an escaped ``_``/``%``/escape itself.

A pattern is split at its ``%`` into pieces of fixed length; the first piece must
match at the start, the last at the end, and each middle one is placed at its
leftmost match after the previous. Leftmost placement is always right when the
only variable-length wildcard is ``%``, so a match costs at most
(text length x pattern length) steps: no backtracking blow-up on hostile patterns.
"""

from __future__ import annotations

from collections.abc import Callable

#: one character position of a piece: the character, or None for ``_``
_Piece = tuple[str | None, ...]


def _pieces(pattern: str, escape: str | None) -> list[_Piece]:
    """``pattern`` split at unescaped ``%`` (the parser checked the escapes)."""
    pieces: list[_Piece] = []
    current: list[str | None] = []
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == escape and i + 1 < n:
            current.append(pattern[i + 1])
            i += 2
            continue
        if ch == "%":
            pieces.append(tuple(current))
            current = []
        elif ch == "_":
            current.append(None)
        else:
            current.append(ch)
        i += 1
    pieces.append(tuple(current))
    return pieces


def _matches_at(text: str, at: int, piece: _Piece) -> bool:
    return all(ch is None or text[at + k] == ch for k, ch in enumerate(piece))


def _find(text: str, piece: _Piece, start: int, end: int) -> int:
    """The leftmost index >= ``start`` where ``piece`` matches within ``text[:end]``."""
    size = len(piece)
    if None not in piece:
        return text.find("".join(piece), start, end)  # type: ignore[arg-type]
    for at in range(start, end - size + 1):
        if _matches_at(text, at, piece):
            return at
    return -1


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A function telling whether a text matches ``pattern`` (with ``escape``)."""
    pieces = _pieces(pattern, escape)
    if len(pieces) == 1:
        (only,) = pieces
        if None not in only:
            literal = "".join(only)  # type: ignore[arg-type]
            return literal.__eq__
        size = len(only)
        return lambda text: len(text) == size and _matches_at(text, 0, only)
    first, *middle, last = pieces
    head, tail = len(first), len(last)

    def match(text: str) -> bool:
        n = len(text)
        if n < head + tail or not _matches_at(text, 0, first):
            return False
        if not _matches_at(text, n - tail, last):
            return False
        at, end = head, n - tail
        for piece in middle:
            found = _find(text, piece, at, end)
            if found < 0:
                return False
            at = found + len(piece)
        return True

    return match
