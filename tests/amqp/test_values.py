"""Field-table values at the edges of their types."""

from __future__ import annotations

import struct

import pytest

from amqlite.amqp import AmqpLocalError
from amqlite.amqp.values import decode_table, encode_table


def _table(entry: bytes) -> bytes:
    return struct.pack(">I", len(entry)) + entry


@pytest.mark.parametrize("value", [2**63, 2**64 - 1])
def test_an_unsigned_64_bit_value_goes_back_as_it_came(value: int) -> None:
    # a client may send the spec's `L`; what we decode we must be able to deliver
    data = _table(b"\x01nL" + struct.pack(">Q", value))
    table, _ = decode_table(data, 0)
    assert table == {"n": value}
    assert encode_table(table) == data


def test_ints_beyond_64_bits_are_our_bug() -> None:
    with pytest.raises(AmqpLocalError):
        encode_table({"n": 2**64})
    with pytest.raises(AmqpLocalError):
        encode_table({"n": -(2**63) - 1})
