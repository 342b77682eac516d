"""A node taking over from a dead master flags every ready message redelivered:
the master may have handed some out without the follower hearing of it."""

from __future__ import annotations

from amqlite.broker import Broker, Message
from amqlite.store import StoreState
from amqlite.store.records import Record


def test_flag_redelivered_marks_every_ready_message_of_every_queue() -> None:
    records: list[Record] = []
    master = Broker(record=records.append)
    s = master.open_session()
    for q in ("a", "b"):
        s.declare_queue(q, durable=True)
        for i in range(3):
            s.publish(Message("", q, b"%d" % i, None, {"persistent": True}), now=0)
    first = s.get("a", now=0)  # handed out and recorded: already flagged on the follower
    assert first is not None
    state = StoreState()
    for r in records:
        state.apply(r)
    follower = Broker()
    follower.apply(state.snapshot(), now=0)
    assert follower.flag_redelivered() == 5  # 6 messages, one already flagged
    assert follower.flag_redelivered() == 0
    f = follower.open_session()
    for q in ("a", "b"):
        while (got := f.get(q, no_ack=True, now=0)) is not None:
            assert got[0].redelivered, (q, got[0].message.body)
