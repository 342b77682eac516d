"""An AMQP channel's publisher confirms wait at the barrier as runs
(``NodeStorage.confirm_when_durable``, ``AmqpChannel.confirmed`` / ``refused``)
instead of one ``when_durable`` waiter each: for the same publishes, commits,
write failures, HA ``fail_held`` calls, writer flushes and channel closes, the
client reads the same ``basic.ack`` / ``basic.nack`` frames (the tags, whether
``multiple``, in the same order, interleaved alike with other durable replies)."""

from __future__ import annotations

import functools
import types
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.amqp import BasicProperties
from amqlite.amqp import methods as m
from amqlite.amqp.spec import Method
from amqlite.broker import ALL_APPENDED
from amqlite.config import StorageConfig
from amqlite.protocol import events as ev
from amqlite.server.amqp.channel import AmqpChannel
from amqlite.server.storage import NodeStorage
from amqlite.store.errors import StoreWriteError


class _OneByOne(AmqpChannel):
    """The channel as it was before the runs: each confirm its own waiter."""

    def _run_publish(self, request: ev.Publish, properties: BasicProperties, now: float) -> None:
        reply = self.dispatcher.publish(request, now)
        assert type(reply) is ev.Ok
        send = functools.partial(self._ack_publish, request.id)
        storage = self.node.storage
        session = self.session
        assert storage is not None and session is not None
        first, last = session.journal_span
        if not last:
            send(None)
            return
        _when_durable(storage, first, last, functools.partial(self._released_reply, send), now)


class _Link:
    """The connection under the channels: what it writes, and the flush the writer
    does before each write (``AmqpServerConnection._flush_confirms``)."""

    remote_address = "test"

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.pending: list[AmqpChannel] = []

    def send_method(self, channel: int, method: Method) -> None:
        self.log.append((channel, method))

    def confirms_pending(self, channel: AmqpChannel) -> None:
        self.pending.append(channel)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for channel in pending:
            channel.flush_confirms()


class _Dispatcher:
    """A publish is routed and journaled: its span is what the step says."""

    vhost = "/"

    def __init__(self, session: Any) -> None:
        self.session = session
        self.span = (0, 0)

    def publish(self, p: ev.Publish, now: float) -> ev.Event:
        self.session.journal_span = self.span
        return ev.Ok(p.id)


# a confirmed publish on channel 1 or 2 whose span is a new record, an older one (a
# publish sent again: this much below the newest), nothing, or all appended
_PUBLISH = st.tuples(
    st.just("publish"),
    st.integers(0, 1),
    st.sampled_from(["new", "new", "new", "older", "none", "all"]),
    st.integers(0, 4),
)
_OPS = st.lists(
    st.one_of(
        _PUBLISH,
        _PUBLISH,
        _PUBLISH,  # (three times as likely as the other steps)
        st.tuples(st.just("other"), st.integers(0, 1)),  # another durable reply (declare-ok)
        st.tuples(st.just("commit"), st.integers(0, 4)),  # covers this many more positions
        st.tuples(st.just("fail"), st.lists(st.integers(0, 6), max_size=3)),
        st.tuples(st.just("fail_held"), st.integers(0, 3)),
        st.tuples(st.just("flush")),
        st.tuples(st.just("close"), st.integers(0, 1)),
        st.tuples(st.just("turn")),
    ),
    max_size=60,
)

_PERSISTENT = BasicProperties(delivery_mode=2)


def _run(ops: list[tuple[Any, ...]], gathered: bool) -> list[tuple[Any, ...]]:
    log: list[tuple[Any, ...]] = []

    async def main() -> None:
        storage = NodeStorage(StorageConfig())
        journal = types.SimpleNamespace(appended=0)  # all the barrier asks of it
        storage.journal = journal  # type: ignore[assignment]
        node: Any = types.SimpleNamespace(storage=storage)
        link = _Link(log)
        kind_of = AmqpChannel if gathered else _OneByOne
        channels: list[AmqpChannel] = []
        dispatchers: list[_Dispatcher] = []
        for number in (1, 2):
            session: Any = types.SimpleNamespace(journal_span=(0, 0), close=lambda now: None)
            dispatcher = _Dispatcher(session)
            channel = kind_of(node, link, number, session, dispatcher)  # type: ignore[arg-type]
            channel.confirming = True
            channels.append(channel)
            dispatchers.append(dispatcher)
        appended = committed = 0
        now = 0.0
        for op in ops:
            kind = op[0]
            if kind == "publish":
                channel, dispatcher = channels[op[1]], dispatchers[op[1]]
                if channel.session is None:
                    continue  # closed
                how = op[2]
                if how == "new":
                    appended += 1
                    dispatcher.span = (appended, appended)
                elif how == "older":
                    position = max(1, appended - op[3])
                    dispatcher.span = (position, position)
                elif how == "all":
                    dispatcher.span = (0, ALL_APPENDED)
                else:
                    dispatcher.span = (0, 0)
                journal.appended = appended
                method = m.BasicPublish(0, "", "q", False, False)
                channel.publish(method, _PERSISTENT, b"x", now)
            elif kind == "other":
                appended += 1
                journal.appended = appended
                callback = functools.partial(_other, log, op[1], appended)
                _when_durable(storage, appended, appended, callback, now)
            elif kind == "commit":
                committed = min(appended, committed + op[1])
                storage._release(committed)
            elif kind == "fail":
                dropped = tuple(sorted({committed + 1 + d for d in op[1]}))
                storage._failed(StoreWriteError("disk full", dropped=dropped))
                storage.last_error = None
            elif kind == "fail_held":
                log.append(("failed", storage.fail_held(now - op[1] + 0.5, "held too long")))
            elif kind == "flush":
                link.flush()
            elif kind == "close":
                channels[op[1]].close(now)
            else:
                now += 1.0
        link.flush()

    trio.run(main)
    return log


def _when_durable(storage: NodeStorage, first: int, last: int, callback: Any, now: float) -> None:
    """``storage.when_durable`` with the clock at ``now`` (it reads trio's)."""
    clock = trio.current_time
    trio.current_time = lambda: now  # type: ignore[assignment]
    try:
        storage.when_durable(first, last, callback)
    finally:
        trio.current_time = clock  # type: ignore[assignment]


def _other(log: list[tuple[Any, ...]], channel: int, position: int, lost: str | None) -> None:
    log.append(("other", channel, position, lost))


@settings(max_examples=1000, deadline=None, database=None)
@given(_OPS)
def test_confirm_runs_give_the_acks_and_nacks_one_by_one_confirms_give(
    ops: list[tuple[Any, ...]],
) -> None:
    assert _run(ops, gathered=True) == _run(ops, gathered=False)


def test_a_run_released_by_one_commit_is_one_multiple_ack() -> None:
    ops: list[tuple[Any, ...]] = [("publish", 0, "new", 0)] * 5 + [("commit", 5), ("flush",)]
    assert _run(ops, gathered=True) == [(1, m.BasicAck(5, True))]


def test_a_dropped_message_is_nacked_alone_after_the_acks_due_before_it() -> None:
    ops: list[tuple[Any, ...]] = [("publish", 0, "new", 0)] * 4
    ops += [("commit", 2), ("fail", [0]), ("commit", 4), ("flush",)]
    expected = [
        (1, m.BasicAck(2, True)),
        (1, m.BasicNack(3, False, False)),
        (1, m.BasicAck(4, False)),
    ]
    assert _run(ops, gathered=True) == _run(ops, gathered=False) == expected
