"""Exchange peering: the sending broker's own work per peered message, in process.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/peering_sender_micro.py [N] [plain]

No sockets and no broker: a :class:`~amqlite.peering.PeeredExchange` with one link
end up (an interest in the routing key), and for runs of 250 plain 100-byte
messages what the sending broker does for each beyond a local publish: mint the
envelope, offer the run (``published_run``), encode the frames of the sends
(``encode_frames``) and take the remote's ack. Prints the best of three runs in
microseconds per message. Under valgrind (``--tool=cachegrind --cache-sim=no``),
instructions per message are ``(I(N) - I(250)) / (3 (N - 250))``: a figure a shared
machine does not move. ``plain``: the runs are plain client publishes offered
unminted (``published_plain_run``, what a sending site's broker does for a client
read's publishes without headers or properties), not minted envelopes.
"""

from __future__ import annotations

import gc
import sys
import time

from amqlite.peering import Ack, Send
from amqlite.peering.cbor import encode_frames
from peering_core_micro import publishing_link  # (this directory: sys.path[0])

PER_READ = 250


def run(n: int, plain: bool = False) -> float:
    """Send ``n`` messages; seconds per message."""
    px, link = publishing_link()
    log = link.log
    assert log is not None
    body = b"x" * 100
    started = time.perf_counter()
    done = 0
    while done < n:
        if plain:
            actions = px.published_plain_run(["k"] * PER_READ, [body] * PER_READ, now=1.0)
        else:
            envelopes = [px.envelope("k", body, {}, {}) for _ in range(PER_READ)]
            actions = px.published_run(envelopes, [False] * PER_READ, now=1.0)
        encode_frames([a.message for a in actions if type(a) is Send], 65536)
        link.receive(Ack(2, log.last_seq), 1.0)
        done += PER_READ
    return (time.perf_counter() - started) / done


def main() -> None:
    gc.set_threshold(100_000, 10, 10)  # the server's (amqlite/server/main.py)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 60_000
    plain = sys.argv[2:3] == ["plain"]
    print(f"{min(run(n, plain) for _ in range(3)) * 1e6:.3f} us per message")


if __name__ == "__main__":
    main()
