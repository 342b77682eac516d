"""Selector text -> tokens (JMS message-selector lexical rules).

- Whitespace: space, tab, form feed and line terminators.
- Strings: single quotes, a quote inside doubled (``'it''s'``).
- Exact numbers: Java integer literals: decimal, ``0x`` hexadecimal, octal (a
  leading ``0``), an optional ``L`` suffix.
- Approximate numbers: Java floating-point literals: a ``.`` or an exponent or an
  ``F``/``D`` suffix (``7.``, ``.5``, ``57.9E2``, ``3d``).
- Identifiers: a Java identifier start (letter, ``_``, ``$``) then letters, digits,
  ``_``, ``$``. Keywords are case-insensitive, identifiers case-sensitive.
- Operators: ``= <> < <= > >= + - * / ( ) ,``.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import SelectorError

KEYWORDS = frozenset(
    ("NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "NULL", "TRUE", "FALSE", "ESCAPE")
)
#: token kinds
NUMBER = "number"
STRING = "string"
IDENT = "identifier"
KEYWORD = "keyword"
OP = "operator"
END = "end"

_WHITESPACE = frozenset(" \t\f\r\n")
_OPS2 = frozenset(("<>", "<=", ">="))
_OPS1 = frozenset("=<>+-*/(),")
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")


class Token(NamedTuple):
    """``kind`` (one of the kinds above), ``value`` (the keyword in upper case, the
    operator, the identifier, the literal's value), ``pos`` (offset in the text)."""

    kind: str
    value: object
    pos: int


def _ident_start(ch: str) -> bool:
    return ch.isalpha() or ch == "_" or ch == "$"


def _ident_part(ch: str) -> bool:
    return ch.isalnum() or ch == "_" or ch == "$"


def tokenize(text: str) -> list[Token]:
    """Every token of ``text``, ending with an END token; SelectorError on bad input."""
    tokens: list[Token] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch in _WHITESPACE:
            i += 1
        elif ch == "'":
            i = _string(text, i, tokens)
        elif ch in _DIGITS or (ch == "." and i + 1 < n and text[i + 1] in _DIGITS):
            i = _number(text, i, tokens)
        elif _ident_start(ch):
            j = i + 1
            while j < n and _ident_part(text[j]):
                j += 1
            word = text[i:j]
            upper = word.upper()
            if upper in KEYWORDS:
                tokens.append(Token(KEYWORD, upper, i))
            else:
                tokens.append(Token(IDENT, word, i))
            i = j
        elif text[i : i + 2] in _OPS2:
            tokens.append(Token(OP, text[i : i + 2], i))
            i += 2
        elif ch in _OPS1:
            tokens.append(Token(OP, ch, i))
            i += 1
        elif text[i : i + 2] == "!=":
            raise SelectorError(i, "'!=' is not a selector operator; use '<>'")
        else:
            raise SelectorError(i, f"unexpected character {ch!r}")
    tokens.append(Token(END, None, n))
    return tokens


def _string(text: str, start: int, tokens: list[Token]) -> int:
    parts: list[str] = []
    i = start + 1
    n = len(text)
    while True:
        j = text.find("'", i)
        if j < 0:
            raise SelectorError(start, "string not closed (a quote is missing)")
        parts.append(text[i:j])
        if j + 1 < n and text[j + 1] == "'":
            parts.append("'")
            i = j + 2
            continue
        tokens.append(Token(STRING, "".join(parts), start))
        return j + 1


def _number(text: str, start: int, tokens: list[Token]) -> int:
    n = len(text)
    i = start
    if text[i] == "0" and i + 1 < n and text[i + 1] in "xX":
        j = i + 2
        while j < n and text[j] in _HEX:
            j += 1
        if j == i + 2:
            raise SelectorError(start, "hexadecimal number without digits")
        value = int(text[i + 2 : j], 16)
        if j < n and text[j] in "lL":
            j += 1
        return _finish(text, start, j, value, tokens)
    j = i
    while j < n and text[j] in _DIGITS:
        j += 1
    approximate = False
    if j < n and text[j] == ".":
        approximate = True
        j += 1
        while j < n and text[j] in _DIGITS:
            j += 1
    if j < n and text[j] in "eE":
        k = j + 1
        if k < n and text[k] in "+-":
            k += 1
        if k >= n or text[k] not in _DIGITS:
            raise SelectorError(j, "exponent without digits")
        while k < n and text[k] in _DIGITS:
            k += 1
        approximate = True
        j = k
    digits = text[start:j]
    if j < n and text[j] in "fFdD":
        return _finish(text, start, j + 1, float(digits), tokens)
    if approximate:
        return _finish(text, start, j, float(digits), tokens)
    if len(digits) > 1 and digits[0] == "0":
        if any(d in "89" for d in digits):
            raise SelectorError(start, f"{digits!r} is not octal (Java reads a leading 0 so)")
        value = int(digits, 8)
    else:
        value = int(digits)
    if j < n and text[j] in "lL":
        j += 1
    return _finish(text, start, j, value, tokens)


#: the largest exact number a selector may write (Java's long range, the sign aside)
MAX_EXACT = 2**63


def _finish(text: str, start: int, end: int, value: float, tokens: list[Token]) -> int:
    if end < len(text) and (_ident_part(text[end]) or text[end] == "."):
        raise SelectorError(start, f"malformed number {text[start : end + 1]!r}")
    if type(value) is int and value > MAX_EXACT:
        raise SelectorError(start, "exact number out of range (Java long)")
    if value == float("inf"):
        raise SelectorError(start, "approximate number out of range (Java double)")
    tokens.append(Token(NUMBER, value, start))
    return end
