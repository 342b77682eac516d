"""A second, deliberately plain reading of the selector rules: an interpreter over
the syntax tree, written apart from amqlite.broker.selector.compiler (no constant
specialisation, no closures, regular expressions for LIKE, Fraction for exact
division, explicit truth tables). The fuzz tests hold the two to the same answers.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from amqlite.broker import Message
from amqlite.broker.selector.names import value_of
from amqlite.broker.selector.syntax import (
    Between,
    Binary,
    Ident,
    In,
    IsNull,
    Like,
    Literal,
    Node,
    Unary,
)

T, F, U = "T", "F", "U"
_AND = {
    (T, T): T, (T, F): F, (T, U): U,
    (F, T): F, (F, F): F, (F, U): F,
    (U, T): U, (U, F): F, (U, U): U,
}  # fmt: skip
_OR = {
    (T, T): T, (T, F): T, (T, U): T,
    (F, T): T, (F, F): F, (F, U): U,
    (U, T): T, (U, F): U, (U, U): U,
}  # fmt: skip
_NOT = {T: F, F: T, U: U}


def _truth(v: Any) -> str:
    if v is True:
        return T
    if v is False:
        return F
    return U


def _from_truth(t: str) -> Any:
    return {T: True, F: False, U: None}[t]


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "other:" + type(v).__name__


def _long(x: int) -> int:
    return (x + 2**63) % 2**64 - 2**63


def _promote(a: Any, b: Any) -> tuple[Any, Any]:
    if isinstance(a, float) or isinstance(b, float):
        return float(a), float(b)
    return a, b


def _arith(op: str, a: Any, b: Any) -> Any:
    if _kind(a) != "number" or _kind(b) != "number":
        return None
    a, b = _promote(a, b)
    if isinstance(a, int):
        if op == "+":
            return _long(a + b)
        if op == "-":
            return _long(a - b)
        if op == "*":
            return _long(a * b)
        if b == 0:
            return None
        return _long(int(Fraction(a, b)))  # int() truncates toward zero
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        if a == 0 or a != a:
            return math.nan
        sign = 1.0 if (a > 0) == (math.copysign(1.0, b) > 0) else -1.0
        return sign * math.inf
    return a / b


def _compare(op: str, a: Any, b: Any) -> str:
    ka, kb = _kind(a), _kind(b)
    if ka == "null" or kb == "null":
        return U
    if ka != kb:
        return F
    if op in ("=", "<>"):
        if ka == "number":
            a, b = _promote(a, b)
        same = a == b
        return _truth(same if op == "=" else not same)
    if ka != "number":
        return F
    a, b = _promote(a, b)
    result = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    return _truth(result)


def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape:
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def reference(node: Node, message: Message) -> Any:
    """``node``'s value in ``message``; conditions as True, False or None."""
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, Ident):
        return value_of(message, node.name)
    if isinstance(node, Unary):
        v = reference(node.operand, message)
        if node.op == "NOT":
            return _from_truth(_NOT[_truth(v)])
        if _kind(v) != "number":
            return None
        if node.op == "+":
            return v
        return -v if isinstance(v, float) else _long(-v)
    if isinstance(node, Binary):
        if node.op in ("AND", "OR"):
            a = _truth(reference(node.left, message))
            b = _truth(reference(node.right, message))
            return _from_truth((_AND if node.op == "AND" else _OR)[(a, b)])
        a = reference(node.left, message)
        b = reference(node.right, message)
        if node.op in ("+", "-", "*", "/"):
            return _arith(node.op, a, b)
        return _from_truth(_compare(node.op, a, b))
    if isinstance(node, Between):
        v = reference(node.operand, message)
        low = _compare(">=", v, reference(node.low, message))
        high = _compare("<=", v, reference(node.high, message))
        inside = _AND[(low, high)]
        return _from_truth(_NOT[inside] if node.negated else inside)
    if isinstance(node, In):
        v = reference(node.operand, message)
        if v is None:
            return None
        found = any(_compare("=", v, x) == T for x in node.values)
        return found != node.negated
    if isinstance(node, Like):
        v = reference(node.operand, message)
        if v is None:
            return None
        if _kind(v) != "string":
            return False
        matched = _like_regex(node.pattern, node.escape).fullmatch(v) is not None
        return matched != node.negated
    assert isinstance(node, IsNull)
    v = reference(node.operand, message)
    return (v is None) != node.negated


def reference_condition(node: Node, message: Message) -> Any:
    return _from_truth(_truth(reference(node, message)))
