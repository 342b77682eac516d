"""JMS message selectors: a SQL-92 subset over a message's fields and headers.

``compile_selector(text)`` parses ``text`` once (:mod:`.lexer`, :mod:`.syntax`: a
hand-written tokenizer and a Pratt parser), checks it, and turns it into nested
closures (:mod:`.compiler`; user text is never handed to ``eval``). A consumer with
a selector gets only the messages for which the selector is TRUE (not FALSE, not
UNKNOWN). docs/selectors.md has the grammar and the rules for NULL and types;
:mod:`.names` says what the identifiers name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..message import Message
from .compiler import compile_condition, header_equals_accepts
from .errors import SelectorError
from .syntax import parse

__all__ = ["Selector", "SelectorError", "compile_selector"]


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled selector: ``accepts(message)`` is True when it selects the message."""

    text: str
    accepts: Callable[[Message], bool]


def compile_selector(text: str) -> Selector:
    """Parse and compile ``text``; :class:`SelectorError` (406) with the position and
    reason when it is not a valid selector."""
    tree = parse(text)
    fast = header_equals_accepts(tree)
    if fast is not None:
        return Selector(text, fast)
    fn = compile_condition(tree)

    def accepts(message: Message) -> bool:
        return fn(message) is True

    return Selector(text, accepts)
