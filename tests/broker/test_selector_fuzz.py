"""Hypothesis against the selector: random text only ever raises SelectorError, and
the compiled closures agree with a plain interpreter (selector_reference) on
generated expressions over generated messages.

Expressions are generated as syntax trees of the right kinds, printed as text
(fully parenthesised, and again with only the parentheses precedence needs), and
parsed back: so the printer, the parser's precedence and the compiler are all
under test, against a reference that shares nothing with the compiler.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from amqlite.broker import Message
from amqlite.broker.selector import SelectorError, compile_selector
from amqlite.broker.selector.compiler import compile_condition, compile_node, header_equals_accepts
from amqlite.broker.selector.lexer import tokenize
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
    _Parser,
    parse,
)

from .selector_reference import reference, reference_condition

HEADERS = ("a", "b", "c", "d")
NAMES = (*HEADERS, "priority", "routing_key", "JMSPriority", "message_id")
LIKE_ALPHABET = "ab%_!"
TEXT_ALPHABET = "ab%_!'"

# --- messages ---------------------------------------------------------------------------

header_values = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.sampled_from([2**62, -(2**63), 2**63 - 1, 2**64 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.5, -0.0, 2.0, 5.0]),
    st.text(TEXT_ALPHABET, max_size=4),
    st.booleans(),
    st.sampled_from([b"", b"a"]),
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    headers = {}
    for name in HEADERS:
        value = draw(header_values)
        if value is not None or draw(st.booleans()):
            headers[name] = value
    properties: dict[str, Any] = {}
    if draw(st.booleans()):
        properties["priority"] = draw(st.integers(0, 9))
    if draw(st.booleans()):
        properties["message_id"] = draw(st.text(TEXT_ALPHABET, max_size=3))
    return Message("", draw(st.text(TEXT_ALPHABET, max_size=4)), b"", headers, properties)


# --- expressions ------------------------------------------------------------------------

idents = st.sampled_from(NAMES).map(Ident)
number_literals = st.one_of(
    st.integers(0, 2**63 - 1),
    st.integers(0, 20),
    st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False),
).map(Literal)
string_literals = st.text(TEXT_ALPHABET, max_size=4).map(Literal)
bool_literals = st.booleans().map(Literal)


def _numbers(inner: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    return st.one_of(
        st.builds(Unary, st.sampled_from("-+"), inner),
        st.builds(Binary, st.sampled_from("+-*/"), inner, inner),
    )


numbers: st.SearchStrategy[Node] = st.recursive(
    st.one_of(number_literals, idents), _numbers, max_leaves=6
)
anything = st.one_of(numbers, string_literals, bool_literals, idents)


@st.composite
def likes(draw: st.DrawFn) -> Like:
    escape = draw(st.sampled_from([None, "!", "%", "_"]))
    parts = []
    for ch in draw(st.text(LIKE_ALPHABET, max_size=6)):
        if ch == escape:
            parts.append(escape + draw(st.sampled_from(["%", "_", escape])))
        else:
            parts.append(ch)
    return Like(draw(idents), "".join(parts), escape, draw(st.booleans()))


in_values = st.lists(
    st.one_of(st.text(TEXT_ALPHABET, max_size=3), st.integers(-5, 5), st.floats(-5, 5)),
    min_size=1,
    max_size=4,
).map(tuple)

simple_conditions = st.one_of(
    bool_literals,
    idents,
    st.builds(Binary, st.sampled_from(["=", "<>"]), anything, anything),
    st.builds(Binary, st.sampled_from(["<", "<=", ">", ">="]), numbers, numbers),
    st.builds(Between, numbers, numbers, numbers, st.booleans()),
    st.builds(In, idents, in_values, st.booleans()),
    likes(),
    st.builds(IsNull, idents, st.booleans()),
)


def _conditions(inner: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    return st.one_of(
        st.builds(Unary, st.just("NOT"), inner),
        st.builds(Binary, st.sampled_from(["AND", "OR"]), inner, inner),
    )


conditions: st.SearchStrategy[Node] = st.recursive(simple_conditions, _conditions, max_leaves=8)


# --- printing ---------------------------------------------------------------------------


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    text = repr(value)
    if value < 0:
        return "-" + text[1:]
    return text


#: binding strength of each printed form (higher binds tighter)
_STRENGTH = {"OR": 1, "AND": 2, "NOT": 3, "compare": 4, "+": 5, "-": 5, "*": 6, "/": 6, "sign": 7}


def _strength(node: Node) -> int:
    if isinstance(node, Literal | Ident):
        return 8
    if isinstance(node, Unary):
        return _STRENGTH["NOT"] if node.op == "NOT" else _STRENGTH["sign"]
    if isinstance(node, Binary) and node.op in _STRENGTH:
        return _STRENGTH[node.op]
    return _STRENGTH["compare"]


def show(node: Node, minimal: bool) -> str:
    """``node`` as selector text; ``minimal``: only the parentheses needed."""

    def sub(child: Node, need: int) -> str:
        text = show(child, minimal)
        if not minimal:
            return text if isinstance(child, Literal | Ident) else f"({text})"
        # a NOT in an operand position always needs them (SQL's grammar)
        if _strength(child) < need or (
            isinstance(child, Unary) and child.op == "NOT" and need > _STRENGTH["NOT"]
        ):
            return f"({text})"
        return text

    if isinstance(node, Literal):
        text = _literal(node.value)
        return f"({text})" if minimal and text.startswith("-") else text
    if isinstance(node, Ident):
        return node.name
    if isinstance(node, Unary):
        if node.op == "NOT":
            return f"NOT {sub(node.operand, _STRENGTH['NOT'])}"
        return f"{node.op} {sub(node.operand, _STRENGTH['sign'])}"
    if isinstance(node, Binary):
        if node.op in ("AND", "OR", "+", "-", "*", "/"):
            s = _STRENGTH[node.op]
            # left-associative: the right operand needs one more
            return f"{sub(node.left, s)} {node.op} {sub(node.right, s + 1)}"
        c = _STRENGTH["compare"]
        return f"{sub(node.left, c + 1)} {node.op} {sub(node.right, c + 1)}"
    c = _STRENGTH["compare"] + 1
    if isinstance(node, Between):
        neg = "NOT " if node.negated else ""
        return f"{sub(node.operand, c)} {neg}BETWEEN {sub(node.low, c)} AND {sub(node.high, c)}"
    if isinstance(node, In):
        neg = "NOT " if node.negated else ""
        return f"{node.operand.name} {neg}IN ({', '.join(_literal(v) for v in node.values)})"
    if isinstance(node, Like):
        neg = "NOT " if node.negated else ""
        escape = "" if node.escape is None else f" ESCAPE {_literal(node.escape)}"
        return f"{node.operand.name} {neg}LIKE {_literal(node.pattern)}{escape}"
    assert isinstance(node, IsNull)
    return f"{node.operand.name} IS {'NOT ' if node.negated else ''}NULL"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


# --- the properties -----------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(conditions, st.lists(messages(), min_size=1, max_size=4))
def test_compiled_agrees_with_the_reference(node: Node, sample: list[Message]) -> None:
    for minimal in (False, True):
        text = show(node, minimal)
        try:
            parsed = parse(text)
        except SelectorError as exc:
            assume("nested deeper" not in exc.reason)
            raise AssertionError(f"{text!r}: {exc}") from exc
        fn = compile_condition(parsed)
        accepts = compile_selector(text).accepts
        for message in sample:
            expected = reference_condition(node, message)
            assert _same(fn(message), expected), (text, message)
            assert accepts(message) is (expected is True)


@settings(max_examples=400, deadline=None)
@given(conditions)
def test_printing_with_fewest_parentheses_parses_the_same(node: Node) -> None:
    """Precedence and associativity: the minimal text means what the full one does."""
    full = parse(show(node, minimal=False))
    assert parse(show(node, minimal=True)) == full


TOKENS = st.sampled_from(
    [
        "a", "b", "JMSPriority", "JMSReplyTo", "=", "<>", "<", ">=", "+", "-", "*", "/",
        "(", ")", ",", "AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS",
        "NULL", "TRUE", "FALSE", "'x'", "'%'", "'", "1", "2.5", "0x1F", "017", "1e",
        "!=", "!", ".", " ", "\n",
    ]
)  # fmt: skip


@settings(max_examples=1000, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(TOKENS, max_size=25).map(" ".join)))
def test_any_text_compiles_or_raises_selector_error(text: str) -> None:
    try:
        selector = compile_selector(text)
    except SelectorError as exc:
        assert 0 <= exc.position <= len(text)
        return
    message = Message("", "k", b"", {"a": 1, "b": "x"}, {"priority": 3})
    assert selector.accepts(message) in (True, False)


numeric_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-7, 7),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, -2.5]),
)


@settings(max_examples=400, deadline=None)
@given(numbers, st.fixed_dictionaries({name: numeric_values for name in HEADERS}))
def test_arithmetic_agrees_with_the_reference(node: Node, headers: dict[str, Any]) -> None:
    """Arithmetic values themselves (not only the conditions over them): Java
    promotion, 64-bit wrapping, truncating division, IEEE division by zero."""
    text = show(node, minimal=True)
    parsed = _Parser(tokenize(text)).expression(0)
    message = Message("", "", b"", headers, {"priority": 3})
    assert _same(compile_node(parsed)(message), reference(node, message)), text


equality_constants = st.one_of(
    st.sampled_from([0, 1]),  # equal to False and True as Python values
    st.integers(0, 20),
    st.sampled_from([2**62, 2**63 - 1, 2**53 + 1]),
    st.text(TEXT_ALPHABET, max_size=3),
    st.floats(min_value=0.0, max_value=10.0),
    st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(NAMES),
    equality_constants,
    st.booleans(),
    st.lists(messages(), min_size=1, max_size=6),
)
def test_the_header_equality_fast_path_agrees_with_the_general_closures(
    name: str, constant: Any, flipped: bool, sample: list[Message]
) -> None:
    """``header = constant`` (compiler.header_equals_accepts, taken by
    compile_selector) accepts exactly the messages the general closures find TRUE,
    and exactly those the reference does; other names and constants take the
    general path."""
    pair = (Literal(constant), Ident(name))
    node = Binary("=", *(pair if flipped else pair[::-1]))
    selector = compile_selector(show(node, flipped))
    general = compile_condition(node)
    fast = header_equals_accepts(node)
    if name in HEADERS and type(constant) in (int, str):
        assert fast is not None
    else:
        assert fast is None
    for message in sample:
        if type(constant) is int and name in HEADERS and message.headers.get(name) is not None:
            # the values that must compare: an equal int, float and text, and a bool
            for value in (constant, float(constant), str(constant), True, False):
                message.headers[name] = value
                expected = general(message) is True
                assert selector.accepts(message) is expected
                assert (reference_condition(node, message) is True) is expected
        expected = general(message) is True
        assert selector.accepts(message) is expected
        assert (reference_condition(node, message) is True) is expected
