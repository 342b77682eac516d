"""``NodeStorage.confirm_when_durable`` (a publish's plain confirm, gathered with
the same connection's others into one waiter) against ``when_durable`` (one waiter
and callback each): for the same requests, commits, write failures and HA
``fail_held`` calls, both give the same replies in the same order."""

from __future__ import annotations

import functools
import types
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.broker import ALL_APPENDED
from amqlite.config import StorageConfig
from amqlite.server.storage import NodeStorage
from amqlite.store.errors import StoreWriteError


class _Sink:
    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.log = log

    def confirmed(self, ids: list[int]) -> None:
        self.log.extend(("ok", self.name, rid) for rid in ids)

    def refused(self, rid: int, text: str) -> None:
        self.log.append(("refused", self.name, rid, text))


def _general(log: list[tuple[Any, ...]], name: str, rid: int, lost: str | None) -> None:
    log.append(("ok", name, rid) if lost is None else ("refused", name, rid, lost))


# a confirmed publish of connection 0 or 1 whose span is a new record, an older
# one (a publish sent again: this much below the newest), nothing, or all appended
_PUBLISH = st.tuples(
    st.just("publish"),
    st.integers(0, 1),
    st.sampled_from(["new", "new", "new", "older", "none", "all"]),
    st.integers(0, 4),
)
_OPS = st.lists(
    st.one_of(
        _PUBLISH,
        _PUBLISH,  # (twice as likely as the other steps)
        st.tuples(st.just("other"), st.integers(0, 1)),  # another durable request's ok
        st.tuples(st.just("commit"), st.integers(0, 4)),  # covers this many more positions
        st.tuples(st.just("fail"), st.lists(st.integers(0, 6), max_size=3)),
        st.tuples(st.just("fail_held"), st.integers(0, 3)),
        st.tuples(st.just("turn")),
    ),
    max_size=60,
)


def _run(ops: list[tuple[Any, ...]], gathered: bool) -> list[tuple[Any, ...]]:
    log: list[tuple[Any, ...]] = []

    async def main() -> None:
        storage = NodeStorage(StorageConfig())
        journal = types.SimpleNamespace(appended=0)  # all the barrier asks of it
        storage.journal = journal  # type: ignore[assignment]
        appended = 0
        committed = 0
        now = 0.0
        rid = 0
        sinks = [_Sink("a", log), _Sink("b", log)]
        for op in ops:
            kind = op[0]
            if kind == "publish" or kind == "other":
                rid += 1
                sink = sinks[op[1]]
                how = op[2] if kind == "publish" else "new"
                if how == "new":
                    appended += 1
                    first = last = appended
                elif how == "older":
                    first = last = max(1, appended - op[3])
                elif how == "all":
                    first, last = 0, ALL_APPENDED
                else:
                    first = last = 0
                if last == 0:
                    log.append(("ok", sink.name, rid))  # nothing to wait for: at once
                    continue
                journal.appended = appended
                if gathered and kind == "publish":
                    storage.confirm_when_durable(first, last, sink, rid, now)
                else:
                    callback = functools.partial(_general, log, sink.name, rid)
                    _when_durable(storage, first, last, callback, now)
            elif kind == "commit":
                committed = min(appended, committed + op[1])
                storage._release(committed)
            elif kind == "fail":
                dropped = tuple(sorted({committed + 1 + d for d in op[1]}))
                storage._failed(StoreWriteError("disk full", dropped=dropped))
                storage.last_error = None
            elif kind == "fail_held":
                log.append(("failed", storage.fail_held(now - op[1] + 0.5, "held too long")))
            else:
                now += 1.0

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


@settings(max_examples=1000, deadline=None, database=None)
@given(_OPS)
def test_gathered_confirms_are_the_replies_single_waiters_give(ops: list[tuple[Any, ...]]) -> None:
    assert _run(ops, gathered=True) == _run(ops, gathered=False)


def test_a_publish_sent_again_whose_first_copy_is_durable_is_confirmed_at_once() -> None:
    # (not after the run it would have joined: as when_durable does)
    ops: list[tuple[Any, ...]] = [
        ("publish", 0, "new", 0),
        ("commit", 1),
        ("publish", 0, "new", 0),
        ("publish", 0, "older", 1),
        ("commit", 1),
    ]
    expected = [("ok", "a", 1), ("ok", "a", 3), ("ok", "a", 2)]
    assert _run(ops, gathered=True) == _run(ops, gathered=False) == expected


def test_a_commit_covering_part_of_a_run_confirms_that_part() -> None:
    ops: list[tuple[Any, ...]] = [("publish", 0, "new", 0)] * 5 + [("commit", 3)]
    assert _run(ops, gathered=True) == [("ok", "a", 1), ("ok", "a", 2), ("ok", "a", 3)]
