"""amqlite's AMQP 0-9-1 codec against pamqp's, per message.

    .venv/bin/python benchmarks/amqp_codec.py [--messages 20000] [--runs 5] [--body 100]

Four cases, each one message of three frames (method, content header with a few
properties, one body frame): encode basic.publish (what a client sends), decode
it (what the broker reads), encode basic.deliver (what the broker sends), decode
it. Ours encodes with ``encode_content`` and decodes with ``FrameReader``; pamqp
with ``frame.marshal`` and ``frame.unmarshal`` over the same bytes. Prints the
median messages per second and ours / pamqp (above 1 = ours is faster) as JSON.
Needs pamqp (the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import pamqp.body
import pamqp.commands
import pamqp.frame
import pamqp.header

from amqlite.amqp import NEED_DATA, BasicProperties, FrameReader
from amqlite.amqp import methods as m
from amqlite.amqp.frames import encode_content

#: strings only and keys sorted (pamqp sorts them), so both codecs write the same bytes
HEADERS = {"tenant": "acme", "trace-id": "abc123"}


def _ours_encode(method: m.Method, body: bytes) -> Callable[[], bytes]:
    props = BasicProperties(
        content_type="application/json", delivery_mode=2, message_id="m-1", headers=HEADERS
    )

    def run() -> bytes:
        return encode_content(1, method, props, body)

    return run


def _pamqp_encode(method: object, body: bytes) -> Callable[[], bytes]:
    def run() -> bytes:
        props = pamqp.commands.Basic.Properties(
            content_type="application/json", delivery_mode=2, message_id="m-1", headers=HEADERS
        )
        return (
            pamqp.frame.marshal(method, 1)  # type: ignore[arg-type]
            + pamqp.frame.marshal(pamqp.header.ContentHeader(0, len(body), props), 1)
            + pamqp.frame.marshal(pamqp.body.ContentBody(body), 1)
        )

    return run


def _ours_decode(wire: bytes) -> Callable[[], object]:
    def run() -> object:
        reader = FrameReader()
        reader.receive_data(wire)
        frames = []
        while (frame := reader.next_frame()) is not NEED_DATA:
            frames.append(frame)
        return frames

    return run


def _pamqp_decode(wire: bytes) -> Callable[[], object]:
    def run() -> object:
        frames, offset = [], 0
        while offset < len(wire):
            consumed, _, frame = pamqp.frame.unmarshal(wire[offset:])
            frames.append(frame)
            offset += consumed
        return frames

    return run


def _rate(fn: Callable[[], object], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - started)


def rates(
    ours: Callable[[], object], theirs: Callable[[], object], n: int, runs: int
) -> tuple[float, float]:
    """Median rates of both, their runs alternated so that a noisy neighbour on a
    shared machine hits both alike."""
    mine, other = [], []
    for _ in range(runs):
        mine.append(_rate(ours, n))
        other.append(_rate(theirs, n))
    return statistics.median(mine), statistics.median(other)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--body", type=int, default=100, help="body size in bytes")
    args = parser.parse_args()
    body = b"x" * args.body
    ours_publish = m.BasicPublish(exchange="amq.direct", routing_key="orders")
    theirs_publish = pamqp.commands.Basic.Publish(exchange="amq.direct", routing_key="orders")
    ours_deliver = m.BasicDeliver("ctag-1", 42, False, "amq.direct", "orders")
    theirs_deliver = pamqp.commands.Basic.Deliver("ctag-1", 42, False, "amq.direct", "orders")
    publish_wire = _ours_encode(ours_publish, body)()
    deliver_wire = _ours_encode(ours_deliver, body)()
    assert _pamqp_encode(theirs_publish, body)() == publish_wire
    cases = {
        "encode basic.publish": (
            _ours_encode(ours_publish, body),
            _pamqp_encode(theirs_publish, body),
        ),
        "decode basic.publish": (_ours_decode(publish_wire), _pamqp_decode(publish_wire)),
        "encode basic.deliver": (
            _ours_encode(ours_deliver, body),
            _pamqp_encode(theirs_deliver, body),
        ),
        "decode basic.deliver": (_ours_decode(deliver_wire), _pamqp_decode(deliver_wire)),
    }
    report = {}
    for name, (ours, theirs) in cases.items():
        ours_rate, theirs_rate = rates(ours, theirs, args.messages, args.runs)
        report[name] = {
            "amqlite_msgs_per_s": round(ours_rate),
            "pamqp_msgs_per_s": round(theirs_rate),
            "ratio_ours_over_pamqp": round(ours_rate / theirs_rate, 2),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
