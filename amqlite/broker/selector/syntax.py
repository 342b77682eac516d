"""Tokens -> a checked syntax tree: a Pratt (top-down operator precedence) parser.

Precedence, loosest first (JMS): ``OR``; ``AND``; ``NOT``; the comparisons
(``= <> < <= > >=``, ``[NOT] BETWEEN``, ``[NOT] IN``, ``[NOT] LIKE``,
``IS [NOT] NULL``), which do not chain; ``+ -``; ``* /``; unary ``+ -``.

Each node has a static kind (:data:`BOOL`, :data:`NUM`, :data:`STR`, or
:data:`ANY` for an identifier, whose type only the message knows); the parser
refuses what can never make sense (``'a' + 1``, ``NOT 3``, ``'a' < 'b'``: JMS
orders numbers only) at the position of the operator.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SelectorError
from .lexer import END, IDENT, KEYWORD, NUMBER, OP, STRING, Token, tokenize
from .names import check_identifier

BOOL = "condition"
NUM = "number"
STR = "string"
ANY = "identifier"

Value = int | float | str | bool


@dataclass(frozen=True, slots=True)
class Literal:
    value: Value


@dataclass(frozen=True, slots=True)
class Ident:
    name: str


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "-", "+" or "NOT"
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # + - * / = <> < <= > >= AND OR
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class In:
    operand: Ident
    values: tuple[str | int | float, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class Like:
    operand: Ident
    pattern: str
    escape: str | None
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Ident
    negated: bool


Node = Literal | Ident | Unary | Binary | Between | In | Like | IsNull

ARITHMETIC = frozenset("+-*/")
ORDERING = frozenset(("<", "<=", ">", ">="))
EQUALITY = frozenset(("=", "<>"))
COMPARISONS = ORDERING | EQUALITY

_OR, _AND, _NOT, _COMPARE, _SUM, _PRODUCT, _SIGN = 1, 2, 3, 4, 5, 6, 7
_INFIX_BP = {
    "OR": _OR,
    "AND": _AND,
    **dict.fromkeys(COMPARISONS, _COMPARE),
    "BETWEEN": _COMPARE,
    "IN": _COMPARE,
    "LIKE": _COMPARE,
    "IS": _COMPARE,
    "+": _SUM,
    "-": _SUM,
    "*": _PRODUCT,
    "/": _PRODUCT,
}
_NEGATABLE = frozenset(("BETWEEN", "IN", "LIKE"))


def kind_of(node: Node) -> str:
    """The static kind of ``node``."""
    if isinstance(node, Literal):
        v = node.value
        if type(v) is bool:
            return BOOL
        return STR if type(v) is str else NUM
    if isinstance(node, Ident):
        return ANY
    if isinstance(node, Unary):
        return BOOL if node.op == "NOT" else NUM
    if isinstance(node, Binary):
        return NUM if node.op in ARITHMETIC else BOOL
    return BOOL


def parse(text: str) -> Node:
    """The checked syntax tree of selector ``text``; SelectorError when it is bad."""
    if not text.strip():
        raise SelectorError(0, "empty selector")
    parser = _Parser(tokenize(text))
    node = parser.expression(0)
    token = parser.peek()
    if token.kind != END:
        raise SelectorError(token.pos, f"unexpected {_describe(token)}")
    if depth(node) > MAX_DEPTH:
        raise SelectorError(0, f"selector nested deeper than {MAX_DEPTH} operations")
    if kind_of(node) not in (BOOL, ANY):
        raise SelectorError(0, f"a selector must be a condition, not a {kind_of(node)}")
    return node


#: how deep a selector's operations may nest (its closures call each other this deep)
MAX_DEPTH = 100


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Unary):
        return (node.operand,)
    if isinstance(node, Binary):
        return (node.left, node.right)
    if isinstance(node, Between):
        return (node.operand, node.low, node.high)
    if isinstance(node, In | Like | IsNull):
        return (node.operand,)
    return ()


def depth(node: Node) -> int:
    """How many nodes the longest path from ``node`` down holds (no recursion)."""
    deepest = 0
    stack = [(node, 1)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in children(n))
    return deepest


def _describe(token: Token) -> str:
    if token.kind == END:
        return "end of selector"
    if token.kind == STRING:
        return "string literal"
    if token.kind == NUMBER:
        return f"number {token.value!r}"
    return f"{token.kind} {token.value!r}" if token.kind != OP else f"{token.value!r}"


class _Parser:
    __slots__ = ("i", "nesting", "tokens")

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.i = 0
        self.nesting = 0

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.i]
        if token.kind != END:
            self.i += 1
        return token

    def expect(self, kind: str, value: object, what: str) -> Token:
        token = self.advance()
        if token.kind != kind or token.value != value:
            raise SelectorError(token.pos, f"expected {what}, found {_describe(token)}")
        return token

    def _infix_bp(self, token: Token) -> int:
        if token.kind == OP or token.kind == KEYWORD:
            value = token.value
            if value == "NOT":
                after = self.peek(1)
                if after.kind == KEYWORD and after.value in _NEGATABLE:
                    return _COMPARE
                return 0
            if type(value) is str:
                return _INFIX_BP.get(value, 0)
        return 0

    def expression(self, rbp: int) -> Node:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            token = self.peek()
            raise SelectorError(token.pos, f"selector nested deeper than {MAX_DEPTH} operations")
        try:
            return self._expression(rbp)
        finally:
            self.nesting -= 1

    def _expression(self, rbp: int) -> Node:
        left = self.prefix(rbp)
        compared = False
        while True:
            token = self.peek()
            bp = self._infix_bp(token)
            if bp <= rbp:
                return left
            if bp == _COMPARE:
                if compared:
                    raise SelectorError(
                        token.pos, "comparisons do not chain; use AND or parentheses"
                    )
                compared = True
            self.advance()
            left = self.infix(token, left)

    # --- prefix: literals, identifiers, ( ), NOT, signs --------------------------------

    def prefix(self, rbp: int) -> Node:
        token = self.advance()
        kind, value = token.kind, token.value
        if kind in (NUMBER, STRING):
            assert isinstance(value, int | float | str)
            return Literal(value)
        if kind == IDENT:
            assert isinstance(value, str)
            check_identifier(value, token.pos)
            return Ident(value)
        if kind == KEYWORD:
            if value == "TRUE" or value == "FALSE":
                return Literal(value == "TRUE")
            if value == "NOT":
                if rbp > _NOT:
                    raise SelectorError(token.pos, "NOT inside an operand needs parentheses")
                operand = self.expression(_NOT)
                _need(operand, (BOOL, ANY), token, "NOT applies to a condition")
                return Unary("NOT", operand)
            if value == "NULL":
                raise SelectorError(token.pos, "NULL is only allowed in IS [NOT] NULL")
        if kind == OP:
            if value == "(":
                inner = self.expression(0)
                self.expect(OP, ")", "')'")
                return inner
            if value == "-" or value == "+":
                operand = self.expression(_SIGN)
                _need(operand, (NUM, ANY), token, f"unary {value} applies to a number")
                if value == "-" and isinstance(operand, Literal):
                    return Literal(-operand.value)  # type: ignore[operator]
                return Unary(value, operand)
        raise SelectorError(token.pos, f"expected a value, found {_describe(token)}")

    # --- infix -------------------------------------------------------------------------

    def infix(self, token: Token, left: Node) -> Node:
        op = token.value
        assert isinstance(op, str)
        if op == "AND" or op == "OR":
            right = self.expression(_INFIX_BP[op])
            _need(left, (BOOL, ANY), token, f"{op} joins conditions")
            _need(right, (BOOL, ANY), token, f"{op} joins conditions")
            return Binary(op, left, right)
        if op in ARITHMETIC:
            right = self.expression(_INFIX_BP[op])
            _need(left, (NUM, ANY), token, f"{op} applies to numbers")
            _need(right, (NUM, ANY), token, f"{op} applies to numbers")
            return Binary(op, left, right)
        if op in COMPARISONS:
            right = self.expression(_COMPARE)
            if op in ORDERING:
                text = f"{op} compares numbers (strings and booleans compare only with = and <>)"
                _need(left, (NUM, ANY), token, text)
                _need(right, (NUM, ANY), token, text)
            return Binary(op, left, right)
        negated = False
        if op == "NOT":
            negated = True
            token = self.advance()
            op = token.value
        if op == "BETWEEN":
            low = self.expression(_COMPARE)
            self.expect(KEYWORD, "AND", "AND of BETWEEN")
            high = self.expression(_COMPARE)
            for node in (left, low, high):
                _need(node, (NUM, ANY), token, "BETWEEN compares numbers")
            return Between(left, low, high, negated)
        if op == "IS":
            operand = _identifier(left, token, "IS NULL")
            if self.peek().kind == KEYWORD and self.peek().value == "NOT":
                self.advance()
                negated = True
            self.expect(KEYWORD, "NULL", "NULL after IS")
            return IsNull(operand, negated)
        if op == "IN":
            return In(_identifier(left, token, "IN"), self.in_list(), negated)
        assert op == "LIKE"
        return self.like(_identifier(left, token, "LIKE"), negated)

    def in_list(self) -> tuple[str | int | float, ...]:
        self.expect(OP, "(", "'(' after IN")
        values: list[str | int | float] = []
        while True:
            token = self.advance()
            sign = 1
            if token.kind == OP and token.value in ("-", "+"):
                sign = -1 if token.value == "-" else 1
                token = self.advance()
                if token.kind != NUMBER:
                    raise SelectorError(token.pos, f"expected a number, found {_describe(token)}")
            if token.kind == STRING:
                assert isinstance(token.value, str)
                values.append(token.value)
            elif token.kind == NUMBER:
                assert isinstance(token.value, int | float)
                values.append(sign * token.value)
            else:
                raise SelectorError(
                    token.pos, f"IN lists string or number literals, found {_describe(token)}"
                )
            token = self.advance()
            if token.kind == OP and token.value == ")":
                return tuple(values)
            if token.kind != OP or token.value != ",":
                raise SelectorError(token.pos, f"expected ',' or ')', found {_describe(token)}")

    def like(self, operand: Ident, negated: bool) -> Like:
        token = self.advance()
        if token.kind != STRING:
            raise SelectorError(token.pos, f"LIKE needs a string pattern, found {_describe(token)}")
        pattern = token.value
        assert isinstance(pattern, str)
        escape: str | None = None
        if self.peek().kind == KEYWORD and self.peek().value == "ESCAPE":
            self.advance()
            esc = self.advance()
            if esc.kind != STRING or len(str(esc.value)) != 1:
                raise SelectorError(esc.pos, "ESCAPE needs a string of one character")
            escape = str(esc.value)
            _check_escapes(pattern, escape, token.pos)
        return Like(operand, pattern, escape, negated)


def _need(node: Node, kinds: tuple[str, ...], token: Token, text: str) -> None:
    kind = kind_of(node)
    if kind not in kinds:
        raise SelectorError(token.pos, f"{text}, not a {kind}")


def _identifier(node: Node, token: Token, what: str) -> Ident:
    if not isinstance(node, Ident):
        raise SelectorError(token.pos, f"{what} applies to an identifier only")
    return node


def _check_escapes(pattern: str, escape: str, pos: int) -> None:
    """SQL-92: the escape character must precede ``_``, ``%`` or itself."""
    i = 0
    while i < len(pattern):
        if pattern[i] == escape:
            if i + 1 >= len(pattern) or pattern[i + 1] not in ("_", "%", escape):
                raise SelectorError(
                    pos, f"escape {escape!r} must be followed by '_', '%' or itself"
                )
            i += 2
        else:
            i += 1
