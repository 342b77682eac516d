"""Publisher confirms on an AMQP channel are coalesced (``AmqpChannel.flush_confirms``):
whatever the order in which publishes become durable or are refused, and wherever
the writer flushes, a client reading the acks and nacks as the spec says (``multiple``
= every publish not yet confirmed up to the tag) learns each publish's outcome once,
and never before the broker decided it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.amqp import methods as m
from amqlite.amqp.spec import Method
from amqlite.server.amqp.channel import AmqpChannel


class _Link:
    remote_address = "test"

    def __init__(self) -> None:
        self.sent: list[Method] = []
        self.pending: list[AmqpChannel] = []

    def send_method(self, channel: int, method: Method) -> None:
        self.sent.append(method)

    def confirms_pending(self, channel: AmqpChannel) -> None:
        self.pending.append(channel)


def _channel(link: _Link) -> AmqpChannel:
    node: Any = SimpleNamespace(storage=None)
    dispatcher: Any = SimpleNamespace(vhost="/")
    session: Any = None
    return AmqpChannel(node, link, 1, session, dispatcher)


class _Client:
    """What a client concludes from the confirms it reads."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.outcome: dict[int, str] = {}

    def read(self, method: Method, decided: dict[int, str]) -> None:
        assert isinstance(method, m.BasicAck | m.BasicNack)
        tag = method.delivery_tag
        kind = "ack" if isinstance(method, m.BasicAck) else "nack"
        covered = (
            [s for s in range(1, tag + 1) if s not in self.outcome] if method.multiple else [tag]
        )
        assert covered and tag in covered
        for seq in covered:
            assert seq not in self.outcome, f"{seq} confirmed twice"
            assert decided.get(seq) == kind, f"{seq} got {kind} before or against the broker"
            self.outcome[seq] = kind


@st.composite
def _histories(draw: st.DrawFn) -> list[tuple[str, int]]:
    """Publishes 1..n decided in any order (ack or nack), with flushes anywhere."""
    n = draw(st.integers(1, 40))
    order = draw(st.permutations(range(1, n + 1)))
    steps: list[tuple[str, int]] = []
    for seq in order:
        steps.append((draw(st.sampled_from(["ack", "ack", "ack", "nack", "lost"])), seq))
        if draw(st.booleans()):
            steps.append(("flush", 0))
    return steps


@settings(max_examples=300, deadline=None)
@given(_histories())
def test_coalesced_confirms_tell_each_outcome_once_and_never_early(
    steps: list[tuple[str, int]],
) -> None:
    link = _Link()
    channel = _channel(link)
    n = sum(1 for what, _ in steps if what != "flush")
    client = _Client(n)
    decided: dict[int, str] = {}
    for what, seq in steps:
        if what == "ack":
            decided[seq] = "ack"
            channel._ack_publish(seq, None)
        elif what == "lost":  # the disk lost it: a nack from the durability barrier
            decided[seq] = "nack"
            channel._ack_publish(seq, "disk full")
        elif what == "nack":  # refused at once (a full peering link)
            decided[seq] = "nack"
            channel._nack_publish(seq)
        else:
            channel.flush_confirms()
        for method in link.sent:
            client.read(method, decided)
        link.sent.clear()
    channel.flush_confirms()
    for method in link.sent:
        client.read(method, decided)
    assert client.outcome == decided
    assert len(decided) == n


def test_a_run_of_acks_is_one_frame_and_singles_are_not_covered_again() -> None:
    link = _Link()
    channel = _channel(link)
    for seq in (3, 1, 2):
        channel._ack_publish(seq, None)
    assert link.pending == [channel]  # the connection is told once, at the first ack due
    channel.flush_confirms()
    assert link.sent == [m.BasicAck(3, True)]
    link.sent.clear()
    channel._ack_publish(5, None)
    channel.flush_confirms()
    channel._ack_publish(4, None)
    channel._ack_publish(6, None)
    channel._ack_publish(7, None)
    channel.flush_confirms()
    # 5 went out alone; 4 joins it, so 6..7 is a run of its own after it
    assert link.sent == [m.BasicAck(5, False), m.BasicAck(4, False), m.BasicAck(7, True)]
