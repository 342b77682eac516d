"""What the broker trace (amq.trace) costs the broker core per message.

    .venv/bin/python benchmarks/trace_cost.py [--messages 200000] [--runs 5]

Drives the sans-IO broker directly (no network, no journal): publish N messages
to a classic queue, deliver them to a consumer (prefetch 1000) and ack each,
with the trace off and on, alternating runs. With the trace on every message
makes three trace records (publish, deliver, ack). Prints the median rates and
their ratio (on / off) as JSON. The network and the client are left out on
purpose: this is the core's share, the part the trace adds to.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from amqlite.broker import Broker, Message
from amqlite.broker.trace import set_trace


def one_run(n: int, traced: bool) -> float:
    broker = Broker(node_id="bench")
    set_trace(broker, traced)
    s = broker.open_session("/", owner="bench")
    s.declare_queue("q")
    s.consume("q", prefetch=1000, now=0.0)
    body = b"x" * 100
    started = time.perf_counter()
    for i in range(n):
        s.publish(Message("", "q", body, None, {"message_id": str(i)}), now=0.0)
        if i % 500 == 499:
            for d in s.take_deliveries():
                s.ack(d.dtag, now=0.0)
    for d in s.take_deliveries():
        s.ack(d.dtag, now=0.0)
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    off, on = [], []
    for _ in range(args.runs):
        off.append(one_run(args.messages, False))
        on.append(one_run(args.messages, True))
    result = {
        "messages": args.messages,
        "runs": args.runs,
        "off_msg_s": round(statistics.median(off)),
        "on_msg_s": round(statistics.median(on)),
        "ratio_on_over_off": round(statistics.median(on) / statistics.median(off), 3),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
