"""Hypothesis strategies for AMQP 0-9-1 values: field tables, basic properties and
every method, shaped so that pamqp (the test oracle) accepts them too."""

from __future__ import annotations

import dataclasses
import string
import struct
import typing
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from amqlite.amqp import BasicProperties, Method

#: pamqp checks exchange and queue names against this alphabet
NAME = st.text(alphabet=string.ascii_letters + string.digits + "_.:-", max_size=40)
#: fields the spec reserves and pamqp insists on leaving at their defaults
RESERVED = frozenset(
    {"ticket", "capabilities", "insist", "known_hosts", "out_of_band", "channel_id", "cluster_id"}
)

KEYS = st.text(max_size=20)
TEXT = st.text(max_size=50)


def _float32(value: float) -> float:
    return float(struct.unpack(">f", struct.pack(">f", value))[0])


#: values that ours and pamqp encode with the same tags
PLAIN_SCALARS = st.one_of(st.none(), st.booleans(), TEXT)
#: every RabbitMQ value kind, each exactly representable (floats fit 32 bits, since
#: pamqp sends floats as 'f'; timestamps are whole seconds in UTC)
SCALARS = st.one_of(
    PLAIN_SCALARS,
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, width=32).map(_float32),
    st.binary(max_size=30),
    st.builds(
        lambda m, s: Decimal(m).scaleb(-s),
        st.integers(-(2**31), 2**31 - 1),
        st.integers(0, 9),
    ),
    st.integers(0, 4102444800).map(lambda s: datetime.fromtimestamp(s, tz=UTC)),
)


def tables(scalars: st.SearchStrategy[Any] = SCALARS) -> st.SearchStrategy[dict[str, Any]]:
    values = st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)
        ),
        max_leaves=12,
    )
    return st.dictionaries(KEYS, values, max_size=6)


#: pamqp leaves an empty string property out, so an empty one would not round-trip
SHORTSTR_PROPS = st.one_of(st.none(), NAME.filter(bool))
properties = st.builds(
    BasicProperties,
    content_type=SHORTSTR_PROPS,
    content_encoding=SHORTSTR_PROPS,
    headers=st.one_of(st.none(), tables()),
    delivery_mode=st.one_of(st.none(), st.sampled_from([1, 2])),
    priority=st.one_of(st.none(), st.integers(0, 9)),
    correlation_id=SHORTSTR_PROPS,
    reply_to=SHORTSTR_PROPS,
    expiration=st.one_of(st.none(), st.integers(0, 10**9).map(str)),
    message_id=SHORTSTR_PROPS,
    timestamp=st.one_of(
        st.none(), st.integers(0, 4102444800).map(lambda s: datetime.fromtimestamp(s, tz=UTC))
    ),
    type=SHORTSTR_PROPS,
    user_id=SHORTSTR_PROPS,
    app_id=SHORTSTR_PROPS,
    cluster_id=st.none(),
)

_KIND_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "octet": st.integers(0, 255),
    "short": st.integers(0, 2**16 - 1),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**63 - 1),
    "bit": st.booleans(),
    "shortstr": NAME,
    "longstr": TEXT,
    "longbytes": TEXT.map(str.encode),
}


def field_kinds(cls: type[Method]) -> list[tuple[str, str]]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return [(f.name, hints[f.name].__metadata__[0]) for f in dataclasses.fields(cls)]  # type: ignore[arg-type]


def methods_of(
    cls: type[Method], table_strategy: st.SearchStrategy[dict[str, Any]] | None = None
) -> st.SearchStrategy[Method]:
    """Instances of one method class with every non-reserved field drawn."""
    table_strategy = table_strategy if table_strategy is not None else tables()
    kwargs = {
        name: table_strategy if kind == "table" else _KIND_STRATEGIES[kind]
        for name, kind in field_kinds(cls)
        if name not in RESERVED
    }
    if cls.NAME == "exchange.declare":
        kwargs["exchange_type"] = st.sampled_from(["direct", "fanout", "topic", "headers"])
    return st.builds(cls, **kwargs)
