"""The broker's per-message work for groups-10x1000 and 1to1-transient, in-process.

No sockets, no trio: publish frames are read as a server reads them
(``codec.read_plain_publish``), published into one queue through a broker session,
the deliveries encoded as the server encodes them (``codec.encode_deliver``) and
acked as a client acks them (one multiple ack per consumer per turn). ``groups``:
10 consumers, messages in 1,000 groups (``group_id``); ``plain``: 1 consumer, no
properties; ``selectors``: 10 consumers with selectors ``k = 0`` .. ``k = 9``,
messages with header ``k`` = 0..9. Prints CPU microseconds per message, the minimum and median of
``--repeat`` runs: the core's share of the server us/msg ``amqlite bench``
reports, steadier than the bench on a busy machine.

    PYTHONPATH=$PWD python benchmarks/groups_core.py groups --messages 100000 --repeat 5
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import cbor2

from amqlite.broker import Broker, Message
from amqlite.protocol import codec

GC_THRESHOLDS = (100_000, 10, 10)  # as amqlite.server.main sets them


def run_once(frames: list[bytes], consumers: int, turn: int, selecting: bool = False) -> float:
    broker = Broker()
    pub = broker.open_session("/", owner="p")
    pub.declare_queue("q")
    subs = []
    for j in range(consumers):
        s = broker.open_session("/", owner=f"c{j}")
        s.consume("q", prefetch=1000, selector=f"k = {j}" if selecting else None, now=0)
        subs.append(s)
    read = codec.read_plain_publish
    encode = codec.encode_deliver
    out = bytearray()
    started = time.process_time()
    for first in range(0, len(frames), turn):
        for f in frames[first : first + turn]:
            p = read(f, 4, len(f))
            if p is None:  # a frame the fast reader leaves: the server's general path
                p = codec._publish_from_map(cbor2.loads(f[4:]))
            pub.publish(Message(p.exchange, p.key, p.body, p.headers, p.props), now=0.0)
        for s in subs:
            last = 0
            for d in s.take_deliveries():
                out += encode(d.ctag, d.dtag, d.redelivered, d.message, d.offset)
                last = d.dtag
            if last:
                s.ack(last, multiple=True)
        out.clear()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("groups", "selectors", "plain"))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--turn", type=int, default=512, help="publishes between pushes")
    args = parser.parse_args()
    gc.set_threshold(*GC_THRESHOLDS)
    grouped = args.mode == "groups"
    selecting = args.mode == "selectors"
    frames = [
        codec.encode_publish(
            i + 1, "", "q", b"x" * 100, {"k": i % 10} if selecting else None,
            {"group_id": f"g{i % 1000}"} if grouped else None, False, False,
        )
        for i in range(args.messages)
    ]  # fmt: skip
    consumers = 1 if args.mode == "plain" else 10
    runs = sorted(run_once(frames, consumers, args.turn, selecting) for _ in range(args.repeat))
    per = [1e6 * t / args.messages for t in runs]
    print(f"{args.mode}: min {per[0]:.2f} us/msg, median {statistics.median(per):.2f}")


if __name__ == "__main__":
    main()
