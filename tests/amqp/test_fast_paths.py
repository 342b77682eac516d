"""The hand-written codecs of the per-message methods (``methods.py``, fast paths:
basic.deliver encoding, basic.publish decoding) agree with the compiled codec they
shortcut, on every input: the same bytes or values, or the same error."""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.amqp import methods as m
from amqlite.amqp.spec import _CODECS, general_codec

#: text of any length around the 255-byte limit of a short string, any characters
SHORT_TEXT = st.one_of(st.text(max_size=20), st.text(min_size=80, max_size=300))


def _outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=500)
@given(
    tag=SHORT_TEXT,
    delivery_tag=st.one_of(st.integers(-2, 2**64 + 1), st.floats(allow_nan=False)),
    redelivered=st.one_of(st.booleans(), st.integers(0, 3), st.none()),
    exchange=SHORT_TEXT,
    key=st.one_of(SHORT_TEXT, st.binary(max_size=5)),
)
def test_basic_deliver_encodes_as_the_compiled_codec_does(
    tag: str, delivery_tag: Any, redelivered: Any, exchange: str, key: Any
) -> None:
    d = m.BasicDeliver(tag, delivery_tag, redelivered, exchange, key)
    general, _ = general_codec(m.BasicDeliver)
    assert _outcome(_CODECS[m.BasicDeliver].encode_args, d) == _outcome(general, d)


def _publish_payloads() -> st.SearchStrategy[bytes]:
    valid = st.builds(
        lambda *a: m.BasicPublish(*a).encode(),
        st.integers(0, 2**16 - 1),
        st.text(max_size=40),
        st.one_of(st.text(max_size=40), st.text(string.ascii_letters, min_size=200, max_size=255)),
        st.booleans(),
        st.booleans(),
    )

    def mutate(payload: bytes, data: st.DataObject) -> bytes:
        how = data.draw(st.sampled_from(["as is", "cut", "extend", "flip", "bits"]))
        if how == "cut":
            return payload[: data.draw(st.integers(0, len(payload)))]
        if how == "extend":
            return payload + data.draw(st.binary(min_size=1, max_size=4))
        if how == "flip":
            i = data.draw(st.integers(0, len(payload) - 1))
            return payload[:i] + bytes((data.draw(st.integers(0, 255)),)) + payload[i + 1 :]
        if how == "bits":  # bits beyond mandatory and immediate are ignored by both
            return payload[:-1] + bytes((data.draw(st.integers(0, 255)),))
        return payload

    mutated = st.builds(lambda p, d: mutate(p, d), valid, st.data())
    raw = st.binary(max_size=12).map(lambda b: m.BasicPublish().encode()[:4] + b)
    return st.one_of(mutated, raw, st.binary(max_size=80))


@settings(max_examples=1000)
@given(_publish_payloads())
def test_basic_publish_decodes_as_the_compiled_codec_does(payload: bytes) -> None:
    _, general = general_codec(m.BasicPublish)
    fast = _CODECS[m.BasicPublish].decode_args
    assert _outcome(fast, payload, 4) == _outcome(general, payload, 4)


def test_the_fast_paths_are_in_place() -> None:
    _, general_decode = general_codec(m.BasicPublish)
    assert _CODECS[m.BasicPublish].decode_args.__name__ == "decode_either"
    assert _CODECS[m.BasicDeliver].encode_args.__name__ == "encode_either"
    d = m.BasicDeliver("ctag", 7, True, "ex", "key")
    assert (
        d.encode()
        == b"\x00\x3c\x00\x3c" + b"\x04ctag" + (7).to_bytes(8, "big") + b"\x01\x02ex\x03key"
    )
    assert m.BasicPublish(0, "ex", "rk", True, False).encode()[4:] == b"\x00\x00\x02ex\x02rk\x01"
    assert general_decode(b"\x00\x3c\x00\x28\x00\x00\x02ex\x02rk\x01", 4) == [
        0, "ex", "rk", True, False,
    ]  # fmt: skip
