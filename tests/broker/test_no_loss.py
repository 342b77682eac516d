"""No message is lost or duplicated, whatever clients do.

A state machine drives random publishes, consumes, gets, acks, nacks, rejects,
cancels, flow-control flips and session closes against one queue (whose rejected
messages are dead-lettered into a second queue) and accounts for every message
(numbered in its body): each is exactly once ready, unacknowledged in one session,
consumed, or dead.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from amqlite.broker import Broker, Message, Session

from .support import queue_status


class NoLoss(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.broker = Broker()
        admin = self.broker.open_session()
        admin.declare_exchange("dlx", "fanout")
        admin.declare_queue("dead")
        admin.bind("dead", "dlx")
        admin.declare_queue("q", arguments={"x-dead-letter-exchange": "dlx"})
        self.admin = admin
        self.sessions: list[Session] = []
        self.outstanding: dict[Session, dict[int, str]] = {}
        self.no_ack_tags: dict[Session, dict[str, bool]] = {}
        self.published = 0
        self.consumed: Counter[str] = Counter()
        self.dead: Counter[str] = Counter()
        self.seen: set[str] = set()

    # --- helpers ----------------------------------------------------------------------

    def _session(self, i: int) -> Session:
        return self.sessions[i % len(self.sessions)]

    def _received(
        self, s: Session, dtag: int, body: bytes, redelivered: bool, no_ack: bool
    ) -> None:
        number = body.decode()
        assert redelivered or number not in self.seen, f"{number} delivered twice as new"
        self.seen.add(number)
        for held in self.outstanding.values():
            assert number not in held.values(), f"{number} is already out with a session"
        assert not self.consumed[number], f"{number} was already consumed"
        if no_ack:
            self.consumed[number] += 1
        else:
            self.outstanding[s][dtag] = number

    def _collect(self) -> None:
        for s in self.broker.take_ready():
            for d in s.take_deliveries():
                self._received(
                    s, d.dtag, d.message.body, d.redelivered, self.no_ack_tags[s][d.ctag]
                )
            s.take_cancellations()

    def _settled(self, s: Session, dtag: int, multiple: bool) -> list[str]:
        held = self.outstanding[s]
        tags = [t for t in held if t <= dtag or dtag == 0] if multiple else [dtag]
        return [held.pop(t) for t in sorted(tags)]

    # --- rules --------------------------------------------------------------------------

    @precondition(lambda self: len(self.sessions) < 4)
    @rule()
    def open_session(self) -> None:
        s = self.broker.open_session()
        self.sessions.append(s)
        self.outstanding[s] = {}
        self.no_ack_tags[s] = {}

    @rule(n=st.integers(1, 5))
    def publish(self, n: int) -> None:
        for _ in range(n):
            self.published += 1
            self.admin.publish(Message("", "q", str(self.published).encode()), now=0)
        self._collect()

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 3), prefetch=st.integers(0, 3), no_ack=st.booleans())
    def consume(self, i: int, prefetch: int, no_ack: bool) -> None:
        s = self._session(i)
        tag = s.consume("q", prefetch=prefetch, no_ack=no_ack, now=0)
        self.no_ack_tags[s][tag] = no_ack
        self._collect()

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 3), no_ack=st.booleans())
    def get(self, i: int, no_ack: bool) -> None:
        s = self._session(i)
        got = s.get("q", no_ack=no_ack, now=0)
        if got is not None:
            d = got[0]
            self._received(s, d.dtag, d.message.body, d.redelivered, no_ack)
        self._collect()

    @precondition(lambda self: any(self.no_ack_tags.values()))
    @rule(i=st.integers(0, 3), j=st.integers(0, 10))
    def cancel(self, i: int, j: int) -> None:
        s = self._session(i)
        tags = list(self.no_ack_tags[s])
        if tags:
            s.cancel(tags[j % len(tags)])
        self._collect()

    @precondition(lambda self: any(self.outstanding.values()))
    @rule(
        i=st.integers(0, 3),
        j=st.integers(0, 10),
        how=st.sampled_from(["ack", "nack", "reject"]),
        multiple=st.booleans(),
        requeue=st.booleans(),
        all_tags=st.booleans(),
    )
    def settle(
        self, i: int, j: int, how: str, multiple: bool, requeue: bool, all_tags: bool
    ) -> None:
        s = self._session(i)
        held = self.outstanding[s]
        if not held:
            return
        dtag = 0 if (multiple and all_tags) else sorted(held)[j % len(held)]
        if how == "reject":
            multiple = False
            dtag = dtag or min(held)
        ids = self._settled(s, dtag, multiple)
        if how == "ack":
            s.ack(dtag, multiple=multiple)
            self.consumed.update(ids)
        elif how == "nack":
            s.nack(dtag, multiple=multiple, requeue=requeue, now=0)
        else:
            s.reject(dtag, requeue=requeue, now=0)
        if how != "ack" and not requeue:
            self.dead.update(ids)
        self._collect()

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 3), flag=st.booleans())
    def set_writable(self, i: int, flag: bool) -> None:
        self._session(i).set_writable(flag)
        self._collect()

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 3))
    def close(self, i: int) -> None:
        s = self._session(i)
        s.close(now=0)
        self.sessions.remove(s)
        del self.outstanding[s]
        del self.no_ack_tags[s]
        self._collect()

    # --- checks -------------------------------------------------------------------------

    @invariant()
    def every_message_is_somewhere_once(self) -> None:
        q = queue_status(self.broker, "q")
        dead = queue_status(self.broker, "dead")
        held = sum(len(h) for h in self.outstanding.values())
        assert q["unacked"] == held
        assert dead["messages"] == sum(self.dead.values())
        assert max(self.consumed.values(), default=0) <= 1
        assert max(self.dead.values(), default=0) <= 1
        assert q["messages"] + held + sum(self.consumed.values()) + dead["messages"] == (
            self.published
        )

    def teardown(self) -> None:
        for s in list(self.sessions):
            s.close(now=0)
        left: Counter[str] = Counter()
        for queue in ("q", "dead"):
            while (got := self.admin.get(queue, no_ack=True, now=0)) is not None:
                left[got[0].message.body.decode()] += 1
        everything = self.consumed + left
        assert everything == Counter(str(i) for i in range(1, self.published + 1))
        assert all(n == 1 for n in everything.values())


TestNoLoss = NoLoss.TestCase
TestNoLoss.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
