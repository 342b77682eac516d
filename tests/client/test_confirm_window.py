"""A run of bare oks (``protocol.OkRun``, the reader's per-confirm path) settles the
confirm window and the requests as the same oks one by one do."""

from __future__ import annotations

from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st

from amqlite.client.connection import Connection as ClientConnection
from amqlite.client.consumer import Subscriptions
from amqlite.client.publisher import ConfirmWindow, PendingConfirm
from amqlite.client.replies import PendingReply, PendingRequests
from amqlite.client.settling import Settler
from amqlite.protocol import OkRun
from amqlite.protocol import events as ev
from amqlite.protocol.codec import EMPTY


class _Link:
    def send(self, event: ev.Event) -> None:
        pass


class _Host:
    """The parts of a client Connection its reader reads for oks."""

    _on_events = ClientConnection._on_events
    _on_control = ClientConnection._on_control
    _unmatched = ClientConnection._unmatched

    def __init__(self, limit: int, confirms: list[int], requests: list[int]) -> None:
        self._settler = Settler(_Link(), lambda: 0)  # type: ignore[arg-type]
        self._consumers = Subscriptions()
        self._confirms = ConfirmWindow(limit)
        self._requests = PendingRequests()
        self._unreported = None
        self.returned_count = 0
        self.nacked_count = 0
        self.resolved: list[int] = []  # requests, in the order their replies came
        for rid in confirms:
            self._confirms.outstanding[rid] = PendingConfirm(rid, b"frame")
        for rid in requests:
            self._requests[rid] = PendingReply(lambda reply: self.resolved.append(reply.re))


def _state(host: _Host, confirms: list[int]) -> Any:
    window = host._confirms
    return (
        sorted(window.outstanding),
        [(p.done, p.error, p.frame) for p in (window.outstanding.get(r) for r in confirms) if p],
        sorted(host._requests),
        host.resolved,
        window._room is None,
        window._idle is None,
    )


@given(
    ids=st.lists(st.integers(1, 40), unique=True, max_size=30),
    owner=st.lists(st.sampled_from(["confirm", "request", "nobody"]), min_size=30, max_size=30),
    res=st.lists(st.integers(1, 45), max_size=40),
    limit=st.integers(1, 40),
    waiting=st.booleans(),
)
def test_a_run_of_oks_settles_as_the_oks_one_by_one(
    ids: list[int], owner: list[str], res: list[int], limit: int, waiting: bool
) -> None:
    """The same confirms confirmed (their frames dropped), the same requests resolved
    in the same order, the same oks left unmatched, the room and idle waiters woken
    alike; whatever the ids, repeated ones and ones nobody waits for included."""
    confirms = [r for r, o in zip(ids, owner, strict=False) if o == "confirm"]
    requests = [r for r, o in zip(ids, owner, strict=False) if o == "request"]
    pendings: list[dict[int, PendingConfirm]] = []
    hosts = []
    for _ in range(2):
        host = _Host(limit, confirms, requests)
        if waiting:  # a publisher waiting for room, wait_for_confirms for the end
            host._confirms._room = trio.Event()
            host._confirms._idle = trio.Event()
        pendings.append(dict(host._confirms.outstanding))
        hosts.append(host)
    run, single = hosts
    run._on_events([OkRun(res)] if len(res) >= 2 else [ev.Ok(r, EMPTY) for r in res])
    single._on_events([ev.Ok(r, EMPTY) for r in res])
    assert _state(run, confirms) == _state(single, confirms)
    for a, b in zip(pendings[0].values(), pendings[1].values(), strict=True):
        assert (a.done, a.error, a.frame) == (b.done, b.error, b.frame)
        assert a.frame is None if a.done else a.frame == b"frame"


@given(
    outstanding=st.lists(st.integers(1, 30), unique=True, max_size=20),
    res=st.lists(st.integers(1, 35), max_size=30),
    start=st.integers(0, 30),
)
def test_confirm_run_stops_at_the_first_ok_that_is_no_confirm(
    outstanding: list[int], res: list[int], start: int
) -> None:
    """confirm_run(res, start) is confirm() of each of res[start:] until the first
    False, and returns its index."""
    start = min(start, len(res))
    a, b = ConfirmWindow(100), ConfirmWindow(100)
    for w in (a, b):
        for rid in outstanding:
            w.outstanding[rid] = PendingConfirm(rid)
    got = a.confirm_run(res, start)
    expected = start
    while expected < len(res) and b.confirm(res[expected]):
        expected += 1
    assert got == expected
    assert sorted(a.outstanding) == sorted(b.outstanding)
