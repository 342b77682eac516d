"""A checked syntax tree -> nested closures over a message (no ``eval``).

Values: None is NULL (and the logical UNKNOWN), Python bools are JMS booleans,
``int`` is an exact number (Java ``long``), ``float`` an approximate one (Java
``double``), ``str`` a string; any other header value (bytes) is a value of its own
type, equal only to itself.

JMS rules, as each closure applies them:
- An operation with a NULL operand is NULL (UNKNOWN); ``AND``/``OR``/``NOT`` use
  SQL's three-valued tables, where a non-boolean value counts as UNKNOWN.
- Comparing values of unlike types is FALSE (a number and a string, a boolean and
  a number); exact and approximate numbers compare after Java numeric promotion
  (the exact one becomes a ``double``). Only numbers order (``< <= > >=``).
- Arithmetic on numbers promotes as Java does; exact results wrap to 64 bits as a
  Java ``long`` does; an exact division truncates toward zero, and by zero it is
  NULL; an approximate one follows IEEE 754 (infinities, NaN). Arithmetic on a
  non-number is NULL.
- ``LIKE``/``IN`` on a value of another type than the pattern's/list's is FALSE.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from ..message import Message
from .like import like_matcher
from .names import getter, is_header
from .syntax import Between, Binary, Ident, In, IsNull, Like, Literal, Node, Unary

Fn = Callable[[Message], Any]

_NUM = frozenset((int, float))
_MIN_LONG = -(2**63)
_LONG_RANGE = 2**64


def wrap(x: int) -> int:
    """``x`` as a Java ``long`` (two's complement, 64 bits)."""
    if _MIN_LONG <= x < -_MIN_LONG:
        return x
    return (x - _MIN_LONG) % _LONG_RANGE + _MIN_LONG


def add(a: Any, b: Any) -> Any:
    r = a + b
    return wrap(r) if type(r) is int else r


def subtract(a: Any, b: Any) -> Any:
    r = a - b
    return wrap(r) if type(r) is int else r


def multiply(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        return wrap(a * b)
    return float(a) * float(b)


def divide(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        if b == 0:
            return None
        q = abs(a) // abs(b)
        return wrap(-q if (a < 0) != (b < 0) else q)
    fa, fb = float(a), float(b)
    if fb == 0.0:
        if fa == 0.0 or math.isnan(fa):
            return math.nan
        return math.copysign(math.inf, fa) * math.copysign(1.0, fb)
    return fa / fb


def negate(a: Any) -> Any:
    return wrap(-a) if type(a) is int else -a


ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": add,
    "-": subtract,
    "*": multiply,
    "/": divide,
}
ORDERING: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def equal(a: Any, b: Any) -> bool:
    """JMS ``=`` of two non-NULL values (FALSE for unlike types)."""
    ta, tb = type(a), type(b)
    if ta is tb:
        return bool(a == b)
    if ta in _NUM and tb in _NUM:
        return float(a) == float(b)
    return False


def unequal(a: Any, b: Any) -> bool:
    """JMS ``<>`` of two non-NULL values: FALSE for unlike types too, so it is not
    the negation of ``=`` (``'a' <> 1`` and ``'a' = 1`` are both FALSE)."""
    ta, tb = type(a), type(b)
    if ta is tb:
        return bool(a != b)
    if ta in _NUM and tb in _NUM:
        return float(a) != float(b)
    return False


def compile_condition(node: Node) -> Fn:
    """The closure computing ``node`` as a condition: True, False or None (UNKNOWN);
    an identifier whose value is not a boolean is UNKNOWN."""
    f = compile_node(node)
    if not isinstance(node, Ident):
        return f

    def condition(m: Message) -> Any:
        a = f(m)
        return a if a is True or a is False else None

    return condition


def header_equals_accepts(node: Node) -> Callable[[Message], bool] | None:
    """For a selector that is only ``header = constant`` (or ``constant = header``)
    with an integer or text constant: its ``accepts`` as one function, None for any
    other selector.

    Why it exists: such a selector (a consumer's share of a queue, ``k = 3``) is run
    for each message against each consumer's selector until one accepts it, and
    the general closures take three calls for it (accepts, the comparison, the
    header's getter), about a tenth of the broker's time a message in the bench's
    selectors-1to10. The result is the general path's (``compile_condition(node)(m)
    is True``): TRUE only for a value of the constant's type equal to it, or, for
    an integer constant, a float equal to it as a float (``_equals_constant``);
    tests/broker/test_selector_fuzz.py checks the two agree."""
    if not (isinstance(node, Binary) and node.op == "="):
        return None
    left, right = node.left, node.right
    if isinstance(left, Literal):
        left, right = right, left
    if not (isinstance(left, Ident) and isinstance(right, Literal) and is_header(left.name)):
        return None
    name = left.name
    c = right.value
    if type(c) is str:

        def text_equals(m: Message) -> bool:
            a = m.headers.get(name)
            return type(a) is str and a == c

        return text_equals
    if type(c) is int:
        fc = float(c)

        def int_equals(m: Message) -> bool:
            a = m.headers.get(name)
            ta = type(a)
            if ta is int:
                return bool(a == c)
            return ta is float and a == fc

        return int_equals
    return None


def compile_node(node: Node) -> Fn:
    """The closure computing ``node``'s value for a message."""
    if isinstance(node, Literal):
        value = node.value
        return lambda m: value
    if isinstance(node, Ident):
        return getter(node.name)
    if isinstance(node, Unary):
        return _unary(node.op, compile_node(node.operand))
    if isinstance(node, Binary):
        return _binary(node)
    if isinstance(node, Between):
        return _between(node)
    if isinstance(node, In):
        return _in(node)
    if isinstance(node, Like):
        return _like(node)
    assert isinstance(node, IsNull)
    return _is_null(node)


def _unary(op: str, f: Fn) -> Fn:
    if op == "NOT":

        def not_(m: Message) -> Any:
            a = f(m)
            if a is True:
                return False
            if a is False:
                return True
            return None

        return not_
    if op == "-":

        def minus(m: Message) -> Any:
            a = f(m)
            return negate(a) if type(a) in _NUM else None

        return minus

    def plus(m: Message) -> Any:
        a = f(m)
        return a if type(a) in _NUM else None

    return plus


def _and(f: Fn, g: Fn) -> Fn:
    def and_(m: Message) -> Any:
        a = f(m)
        if a is False:
            return False
        b = g(m)
        if b is False:
            return False
        if a is True and b is True:
            return True
        return None

    return and_


def _or(f: Fn, g: Fn) -> Fn:
    def or_(m: Message) -> Any:
        a = f(m)
        if a is True:
            return True
        b = g(m)
        if b is True:
            return True
        if a is False and b is False:
            return False
        return None

    return or_


def _binary(node: Binary) -> Fn:
    op = node.op
    if op == "AND":
        return _and(compile_node(node.left), compile_node(node.right))
    if op == "OR":
        return _or(compile_node(node.left), compile_node(node.right))
    if op in ARITHMETIC:
        return _arithmetic(ARITHMETIC[op], compile_node(node.left), compile_node(node.right))
    if op in ORDERING:
        return _ordering(ORDERING[op], node.left, node.right)
    return _equality(node.left, node.right, op == "=")


def _arithmetic(fn: Callable[[Any, Any], Any], f: Fn, g: Fn) -> Fn:
    def arithmetic(m: Message) -> Any:
        a = f(m)
        if type(a) not in _NUM:
            return None
        b = g(m)
        if type(b) not in _NUM:
            return None
        return fn(a, b)

    return arithmetic


def _ordering(cmp: Callable[[Any, Any], bool], left: Node, right: Node) -> Fn:
    if isinstance(right, Literal) and type(right.value) in _NUM:
        return _ordering_constant(cmp, compile_node(left), right.value)
    f, g = compile_node(left), compile_node(right)

    def ordering(m: Message) -> Any:
        a = f(m)
        if a is None:
            return None
        b = g(m)
        if b is None:
            return None
        ta, tb = type(a), type(b)
        if ta in _NUM and tb in _NUM:
            if ta is not tb:
                return cmp(float(a), float(b))
            return cmp(a, b)
        return False

    return ordering


def _ordering_constant(cmp: Callable[[Any, Any], bool], f: Fn, c: Any) -> Fn:
    """``f <op> c`` for a numeric constant ``c``: the common case, one call less."""
    tc = type(c)
    fc = float(c)

    def ordering_constant(m: Message) -> Any:
        a = f(m)
        ta = type(a)
        if ta is tc:
            return cmp(a, c)
        if ta in _NUM:
            return cmp(float(a), fc)
        return None if a is None else False

    return ordering_constant


def _equality(left: Node, right: Node, equals: bool) -> Fn:
    if isinstance(right, Literal) and not isinstance(left, Literal):
        return _equals_constant(compile_node(left), right.value, equals)
    if isinstance(left, Literal) and not isinstance(right, Literal):
        return _equals_constant(compile_node(right), left.value, equals)
    f, g = compile_node(left), compile_node(right)
    same = equal if equals else unequal

    def equality(m: Message) -> Any:
        a = f(m)
        if a is None:
            return None
        b = g(m)
        if b is None:
            return None
        return same(a, b)

    return equality


def _equals_constant(f: Fn, c: Any, equals: bool) -> Fn:
    """``f = c`` or ``f <> c`` for a constant ``c``: the common case, one call less."""
    tc = type(c)
    numeric = tc in _NUM
    fc = float(c) if numeric else 0.0
    if not equals:

        def unequal_constant(m: Message) -> Any:
            a = f(m)
            ta = type(a)
            if ta is tc:
                return a != c
            if a is None:
                return None
            if numeric and ta in _NUM:
                return float(a) != fc
            return False

        return unequal_constant

    def equals_constant(m: Message) -> Any:
        a = f(m)
        ta = type(a)
        if ta is tc:
            return a == c
        if a is None:
            return None
        if numeric and ta in _NUM:
            return float(a) == fc
        return False

    return equals_constant


def _between(node: Between) -> Fn:
    low = Binary(">=", node.operand, node.low)
    high = Binary("<=", node.operand, node.high)
    both = _and(_binary(low), _binary(high))
    return _unary("NOT", both) if node.negated else both


def _in(node: In) -> Fn:
    f = getter(node.operand.name)
    strings = frozenset(v for v in node.values if type(v) is str)
    numbers = tuple(v for v in node.values if type(v) is not str)
    negated = node.negated

    def in_(m: Message) -> Any:
        a = f(m)
        if a is None:
            return None
        if type(a) is str:
            found = a in strings
        elif type(a) in _NUM:
            found = any(equal(a, v) for v in numbers)
        else:
            found = False
        return found is not negated

    return in_


def _like(node: Like) -> Fn:
    f = getter(node.operand.name)
    match = like_matcher(node.pattern, node.escape)
    negated = node.negated

    def like(m: Message) -> Any:
        a = f(m)
        if a is None:
            return None
        if type(a) is not str:
            return False
        return match(a) is not negated

    return like


def _is_null(node: IsNull) -> Fn:
    f = getter(node.operand.name)
    if node.negated:
        return lambda m: f(m) is not None
    return lambda m: f(m) is None
