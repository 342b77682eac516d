"""The shared CBOR helpers write what cbor2 writes, byte for byte."""

import cbor2
from hypothesis import given
from hypothesis import strategies as st

from amqlite.protocol import cbor

_LENGTHS = st.one_of(
    st.integers(min_value=0, max_value=300),
    st.sampled_from([23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]),
)


@given(st.one_of(st.integers(), _LENGTHS))
def test_uint_is_cbor2s_integer(n: int) -> None:
    assert cbor.uint(n) == cbor2.dumps(n)


@given(_LENGTHS)
def test_head_is_cbor2s_item_header(n: int) -> None:
    assert cbor.head(cbor.UINT, n) == cbor2.dumps(n)
    assert cbor.head(cbor.BYTES, n) == cbor.bytes_head(n)
    if n <= 300:
        array = cbor.head(cbor.ARRAY, n)
        assert cbor2.dumps([None] * n) == array + b"\xf6" * n


@given(st.binary(max_size=70000))
def test_bytes_head_then_the_bytes_is_cbor2s_byte_string(b: bytes) -> None:
    assert cbor.bytes_head(len(b)) + b == cbor2.dumps(b)


@given(st.text())
def test_text_is_cbor2s_text_string(s: str) -> None:
    assert cbor.text(s) == cbor2.dumps(s)
    assert cbor.cached_text(s) == cbor2.dumps(s)
    assert cbor.cached_text(s) == cbor2.dumps(s)  # from the cache this time


def test_map_heads() -> None:
    for n, h in enumerate(cbor.MAP_HEADS):
        assert h == cbor2.dumps({str(i): 0 for i in range(n)})[:1]
