"""Messages as hypothesis draws them for the Spark readers' agreement tests (the
fast reader against the consumer path, the JVM reader against the Python one):
a body, perhaps a routing key, headers of every scalar type and properties."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

text = st.text(max_size=12)


def messages(*, infinities: bool) -> st.SearchStrategy[dict[str, Any]]:
    """One message's ``body`` and optional ``key``, ``headers`` and ``properties``;
    ``infinities``: whether float headers may be infinite."""
    header_value = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**40), 2**40), text, st.binary(max_size=6),
        st.floats(allow_nan=False, allow_infinity=infinities),
    )  # fmt: skip
    return st.fixed_dictionaries(
        {"body": st.binary(max_size=300)},
        optional={
            "key": st.sampled_from(["rk", "clé", ""]),
            "headers": st.dictionaries(text, header_value, max_size=3),
            "properties": st.fixed_dictionaries(
                {},
                optional={
                    "message_id": text,
                    "correlation_id": text,
                    "content_type": text,
                    "timestamp": st.integers(0, 2**33),
                    "priority": st.integers(0, 9),
                },
            ),
        },
    )
