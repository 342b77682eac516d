"""The selector grammar and rules, as a table: an expression, a message, and the
three-valued result (True, False, None = UNKNOWN), or a parse error's position.

The message below has: headers ``s`` = 'abc', ``i`` = 5, ``f`` = 2.5,
``t`` = TRUE, ``u`` = FALSE, ``z`` = 0, ``big`` = 2**62, ``pct`` = '50%',
``under`` = 'a_b', ``quote`` = "it's", ``raw`` = b'abc', ``nan`` = NaN, ``dash-ed``
= 1; properties priority 7, message_id 'm-1', type 'order', timestamp 1000,
persistent TRUE, group_id 'g1'; routing key 'eu.orders.new', exchange 'ex'.
``missing`` is nowhere.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from amqlite.broker import Message
from amqlite.broker.selector import SelectorError, compile_selector
from amqlite.broker.selector.compiler import compile_condition
from amqlite.broker.selector.names import PROPERTIES
from amqlite.broker.selector.syntax import parse
from amqlite.protocol.codec import PROPERTY_TYPES

MESSAGE = Message(
    "ex",
    "eu.orders.new",
    b"body",
    {
        "s": "abc",
        "i": 5,
        "f": 2.5,
        "t": True,
        "u": False,
        "z": 0,
        "big": 2**62,
        "pct": "50%",
        "under": "a_b",
        "quote": "it's",
        "raw": b"abc",
        "nan": math.nan,
        "dash-ed": 1,
        "priority": 1,  # shadowed by the property
    },
    {
        "priority": 7,
        "message_id": "m-1",
        "type": "order",
        "timestamp": 1000,
        "persistent": True,
        "group_id": "g1",
    },
)
BARE = Message("", "q", b"")

T, F, U = True, False, None

TABLE: list[tuple[str, Any]] = [
    # literals and identifiers
    ("TRUE", T),
    ("false", F),
    ("t", T),
    ("u", F),
    ("missing", U),
    ("s", U),  # a string is no condition: UNKNOWN
    ("i", U),
    # comparisons of like types
    ("s = 'abc'", T),
    ("s <> 'abc'", F),
    ("'abc' = s", T),
    ("s = 'ABC'", F),  # strings compare exactly
    ("i = 5", T),
    ("i > 4 AND i < 6 AND i >= 5 AND i <= 5", T),
    ("t = TRUE", T),
    ("t <> u", T),
    ("quote = 'it''s'", T),
    # numeric promotion: exact and approximate numbers compare
    ("i = 5.0", T),
    ("f = 2.5", T),
    ("f > 2", T),
    ("i + f = 7.5", T),
    ("i / 2 = 2", T),  # exact division truncates
    ("-i / 2 = -2", T),  # toward zero
    ("i / 2.0 = 2.5", T),
    ("i * 1.0 = 5", T),
    ("1e1 = 10", T),
    ("7. = 7", T),
    (".5 = 0.5", T),
    ("3d = 3", T),
    ("2f = 2.0", T),
    ("10L = 10", T),
    ("0x1F = 31", T),
    ("017 = 15", T),  # Java octal
    ("big * 2 = -9223372036854775808", T),  # a Java long wraps
    ("big * 4 = 0", T),
    ("big * 4.0 > 0", T),  # a double does not
    ("-9223372036854775808 - 1 = 9223372036854775807", T),
    ("9007199254740993 = 9007199254740992.0", T),  # the long becomes a double
    # unlike types compare FALSE, not UNKNOWN
    ("s = 5", F),
    ("NOT (s = 5)", T),
    ("s <> 5", F),  # FALSE too: <> is not the negation of = for unlike types
    ("t <> 1", F),
    ("i <> 5.0", F),
    ("i <> 4.5", T),
    ("i = '5'", F),
    ("t = 1", F),
    ("u = 0", F),
    ("z = FALSE", F),
    ("s > 1", F),
    ("t > 0", F),
    ("raw = 'abc'", F),
    ("raw = raw", T),
    ("raw <> raw", F),
    # NaN compares as Java's double does
    ("nan = nan", F),
    ("nan <> nan", T),
    ("nan > 0 OR nan <= 0", F),
    # NULL (missing) in comparisons and arithmetic: UNKNOWN
    ("missing = 1", U),
    ("missing <> 1", U),
    ("missing = missing", U),
    ("NOT (missing = 1)", U),
    ("missing + 1 = 1", U),
    ("missing > 1", U),
    ("s + 1 = 1", U),  # arithmetic on a non-number is NULL
    ("i / 0 = 0", U),  # exact division by zero is NULL
    ("i / 0.0 > 1e308", T),  # an approximate one is an infinity
    ("-i / 0.0 < -1e308", T),
    ("z / 0.0 = z / 0.0", F),  # NaN
    # three-valued AND / OR / NOT, every pair
    ("TRUE AND TRUE", T),
    ("TRUE AND FALSE", F),
    ("TRUE AND missing", U),
    ("FALSE AND missing", F),
    ("missing AND FALSE", F),
    ("missing AND missing", U),
    ("missing AND TRUE", U),
    ("TRUE OR missing", T),
    ("missing OR TRUE", T),
    ("FALSE OR missing", U),
    ("missing OR FALSE", U),
    ("FALSE OR FALSE", F),
    ("missing OR missing", U),
    ("NOT missing", U),
    ("NOT TRUE", F),
    ("NOT u", T),
    ("NOT s", U),
    ("i AND TRUE", U),
    # precedence: NOT over AND over OR; arithmetic over comparison
    ("TRUE OR TRUE AND FALSE", T),
    ("(TRUE OR TRUE) AND FALSE", F),
    ("NOT FALSE AND FALSE", F),
    ("NOT i = 4", T),
    ("1 + 2 * 3 = 7", T),
    ("(1 + 2) * 3 = 9", T),
    ("10 - 4 - 3 = 3", T),
    ("12 / 3 / 2 = 2", T),
    ("- 2 * 3 = -6", T),
    ("- -2 = 2", T),
    ("+i = 5", T),
    # BETWEEN
    ("i BETWEEN 5 AND 6", T),
    ("i BETWEEN 6 AND 7", F),
    ("i NOT BETWEEN 6 AND 7", T),
    ("f BETWEEN 2 AND 3", T),
    ("i BETWEEN 1 AND 2 + 3", T),
    ("i BETWEEN 1 AND 3 OR TRUE", T),
    ("missing BETWEEN 1 AND 2", U),
    ("missing NOT BETWEEN 1 AND 2", U),
    ("i BETWEEN missing AND 2", F),  # i <= 2 is FALSE, so FALSE
    ("i BETWEEN missing AND 9", U),
    ("i NOT BETWEEN missing AND 2", T),
    ("s BETWEEN 1 AND 2", F),
    # IN
    ("s IN ('x', 'abc')", T),
    ("s IN ('x', 'y')", F),
    ("s NOT IN ('x', 'y')", T),
    ("missing IN ('x')", U),
    ("missing NOT IN ('x')", U),
    ("i IN (1, 5)", T),
    ("i IN (5.0)", T),
    ("i IN (-5, 4)", F),
    ("i IN ('5')", F),
    ("i NOT IN ('5')", T),
    ("t IN ('TRUE')", F),
    # LIKE, wildcards and escapes
    ("s LIKE 'abc'", T),
    ("s LIKE 'a%'", T),
    ("s LIKE '%c'", T),
    ("s LIKE '%b%'", T),
    ("s LIKE '%'", T),
    ("s LIKE 'a_c'", T),
    ("s LIKE '_'", F),
    ("s LIKE '___'", T),
    ("s LIKE 'a%b%c'", T),
    ("s LIKE 'a%c%'", T),
    ("s LIKE 'a%%c'", T),
    ("s LIKE 'ab'", F),
    ("s LIKE 'ABC'", F),
    ("s NOT LIKE 'a%'", F),
    ("routing_key LIKE 'eu.%.new'", T),
    ("routing_key LIKE 'eu._rders%'", T),
    ("pct LIKE '50!%' ESCAPE '!'", T),
    ("s LIKE '50!%' ESCAPE '!'", F),
    ("pct LIKE '%!%' ESCAPE '!'", T),
    ("s LIKE '%!%' ESCAPE '!'", F),
    ("under LIKE 'a\\_b' ESCAPE '\\'", T),
    ("s LIKE 'a\\_c' ESCAPE '\\'", F),
    ("under LIKE '%\\_%' ESCAPE '\\'", T),
    ("pct LIKE '50%%' ESCAPE '%'", T),  # the escape may be a wildcard itself
    ("s LIKE '50%%' ESCAPE '%'", F),
    ("quote LIKE 'it''_'", T),
    ("missing LIKE 'a%'", U),
    ("missing NOT LIKE 'a%'", U),
    ("i LIKE '5'", F),
    # IS [NOT] NULL
    ("missing IS NULL", T),
    ("missing IS NOT NULL", F),
    ("s IS NULL", F),
    ("s IS NOT NULL", T),
    ("correlation_id IS NULL", T),
    # the standard names
    ("priority = 7", T),  # the property, not the header
    ("JMSPriority = 7", T),
    ("message_id = 'm-1'", T),
    ("JMSMessageID = 'm-1'", T),
    ("type = 'order' AND JMSType = 'order'", T),
    ("timestamp = 1000 AND JMSTimestamp = 1000", T),
    ("JMSDeliveryMode = 'PERSISTENT'", T),
    ("persistent", T),
    ("group_id = 'g1' AND JMSXGroupID = 'g1'", T),
    ("JMSCorrelationID IS NULL", T),
    ("routing_key = 'eu.orders.new'", T),
    ("exchange = 'ex'", T),
    ("JMSXDeliveryCount IS NULL", T),  # JMSX: a header
    ("JMS_vendor IS NULL", T),
    # keywords are case-insensitive, identifiers are not
    ("s like 'a%' and not (i between 6 and 7) or false", T),
    ("S = 'abc'", U),
    # whitespace
    ("\ts\n=\r'abc'\f", T),
]

BARE_TABLE: list[tuple[str, Any]] = [
    ("JMSPriority = 4", T),  # JMS's default priority
    ("priority IS NULL", T),
    ("JMSDeliveryMode = 'NON_PERSISTENT'", T),
    ("JMSMessageID IS NULL", T),
    ("JMSTimestamp IS NULL", T),
]


def evaluate(text: str, message: Message) -> Any:
    return compile_condition(parse(text))(message)


@pytest.mark.parametrize(("text", "expected"), TABLE)
def test_table(text: str, expected: Any) -> None:
    assert evaluate(text, MESSAGE) is expected
    assert compile_selector(text).accepts(MESSAGE) is (expected is True)


@pytest.mark.parametrize(("text", "expected"), BARE_TABLE)
def test_bare_message(text: str, expected: Any) -> None:
    assert evaluate(text, BARE) is expected


ERRORS: list[tuple[str, int, str]] = [
    ("", 0, "empty selector"),
    ("   ", 0, "empty selector"),
    ("a = (1", 6, "expected ')'"),
    ("a = 1)", 5, "unexpected ')'"),
    ("a != 1", 2, "use '<>'"),
    ("a == 1", 3, "expected a value"),
    ("a = #", 4, "unexpected character"),
    ("s = 'abc", 4, "string not closed"),
    ("1 + 2", 0, "must be a condition"),
    ("'abc'", 0, "must be a condition"),
    ("a = b = c", 6, "comparisons do not chain"),
    ("a < b > c", 6, "comparisons do not chain"),
    ("'a' < 'b'", 4, "compare only with = and <>"),
    ("s > 'a'", 2, "compare only with = and <>"),
    ("t >= TRUE", 2, "compare only with = and <>"),
    ("'a' + 1 = 2", 4, "applies to numbers"),
    ("-'a' = 2", 0, "applies to a number"),
    ("NOT 3", 0, "NOT applies to a condition"),
    ("1 AND TRUE", 2, "AND joins conditions"),
    ("TRUE OR 'x'", 5, "OR joins conditions"),
    ("a = NOT b", 4, "needs parentheses"),
    ("1 + 1 IS NULL", 6, "identifier only"),
    ("'a' LIKE 'a'", 4, "identifier only"),
    ("1 IN (1)", 2, "identifier only"),
    ("a IN ()", 6, "IN lists"),
    ("a IN (b)", 6, "IN lists"),
    ("a IN ('x' 'y')", 10, "expected ','"),
    ("a IN 'x'", 5, "'(' after IN"),
    ("a LIKE b", 7, "string pattern"),
    ("a LIKE 'x' ESCAPE 'ab'", 18, "one character"),
    ("a LIKE 'x' ESCAPE ''", 18, "one character"),
    ("a LIKE 'x!' ESCAPE '!'", 7, "must be followed by"),
    ("a LIKE '!x' ESCAPE '!'", 7, "must be followed by"),
    ("a BETWEEN 1", 11, "AND of BETWEEN"),
    ("a BETWEEN 'x' AND 2", 2, "BETWEEN compares numbers"),
    ("a IS 1", 5, "NULL after IS"),
    ("a NOT = 1", 2, "unexpected keyword 'NOT'"),
    ("NULL = 1", 0, "IS [NOT] NULL"),
    ("019 = 1", 0, "not octal"),
    ("1.2.3 = 1", 0, "malformed number"),
    ("12ab = 1", 0, "malformed number"),
    ("1e = 1", 1, "exponent without digits"),
    ("0x = 1", 0, "without digits"),
    ("9223372036854775809 = 1", 0, "out of range"),
    ("1e999 = 1", 0, "out of range"),
    ("JMSReplyTo = 'x'", 0, "cannot be used in a selector"),
    ("JMSDestination IS NULL", 0, "cannot be used in a selector"),
    ("a AND", 5, "expected a value"),
    ("(" * 200 + "a" + ")" * 200, 100, "nested deeper"),
    (" OR ".join(["a"] * 200), 0, "nested deeper"),
]


@pytest.mark.parametrize(("text", "position", "reason"), ERRORS)
def test_errors(text: str, position: int, reason: str) -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector(text)
    assert info.value.code == 406
    assert info.value.position == position
    assert reason in info.value.reason
    assert f"position {position}" in info.value.text


def test_names_know_every_message_property() -> None:
    assert set(PROPERTY_TYPES) == PROPERTIES


def test_a_long_like_pattern_against_a_long_text_is_quick() -> None:
    """Many ``%``: each piece is placed once, no backtracking (a regex engine with
    ``.*`` per ``%`` takes exponential time here)."""
    text = "a" * 5000
    message = Message("", "", b"", {"s": text})
    selector = compile_selector("s LIKE '" + "%a" * 40 + "%b'")
    assert selector.accepts(message) is False
