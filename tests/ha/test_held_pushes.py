"""``HeldPushes.release`` lets every held push go at once when each waits for its
journal id alone and the highest is held by the passive node; the general path looks
at each in turn. Both must take the same frames, in order, and leave the same."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.ha.progress import HeldPushes

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("msg"), st.integers(1, 30)),  # a journaled message
        st.tuples(st.just("next"), st.integers(1, 3)),  # the next ones, in id order
        st.tuples(st.just("owned"), st.integers(1, 30), st.integers(1, 30)),  # + owner
        st.tuples(st.just("stream"), st.sampled_from(["s", "t"]), st.integers(0, 9)),
        st.tuples(st.just("cancel")),  # keeps its place only
        st.tuples(
            st.sampled_from(["release", "release_near"]),  # near: held_id = last id - it
            st.integers(0, 60),  # held_id
            st.integers(0, 35),  # positions up to here are replicated
            st.integers(0, 10),  # stream offsets below this are replicated
        ),
    ),
    max_size=40,
)


def _hold(held: HeldPushes, push: tuple[int, str, int, int, bytes]) -> None:
    """What ``ClientEndpoint._push_gated`` does to hold a push."""
    journal_id, stream, _, position, _ = push
    held.pushes.append(push)
    if journal_id > held.max_id:
        held.max_id = journal_id
    else:
        held.ordered = False
    if stream or position:
        held.checked += 1


@settings(max_examples=400, deadline=None, database=None)
@given(ops=_ops)
def test_release_takes_what_the_walk_takes(ops: list[Any]) -> None:
    fast, walking = HeldPushes(), HeldPushes()
    last_id = 0
    for n, op in enumerate(ops):
        frame = b"%d" % n
        push: tuple[int, str, int, int, bytes] | None = None
        if op[0] == "msg":
            push = (op[1], "", 0, 0, frame)
        elif op[0] == "next":
            last_id += op[1]
            push = (last_id, "", 0, 0, frame)
        elif op[0] == "owned":
            push = (op[1], "", 0, op[2], frame)
        elif op[0] == "stream":
            push = (0, op[1], op[2], 0, frame)
        elif op[0] == "cancel":
            push = (0, "", 0, 0, frame)
        if push is not None:
            _hold(fast, push)
            _hold(walking, push)
            continue
        kind, held_id, positions, offsets = op
        if kind == "release_near":
            held_id = max(0, last_id - held_id % 4)

        def stream_ok(stream: str, offset: int, offsets: int = offsets) -> bool:
            return offset < offsets

        def position_ok(position: int, positions: int = positions) -> bool:
            return position <= positions

        before = copy.copy(fast.pushes)
        got = fast.release(held_id, stream_ok, position_ok)
        want = walking._release_walking(held_id, stream_ok, position_ok)
        assert got == want
        assert list(fast.pushes) == list(walking.pushes)
        assert fast.checked == walking.checked == sum(1 for p in fast.pushes if p[1] or p[3])
        assert all(p[0] <= fast.max_id for p in fast.pushes)
        ids = [p[0] for p in fast.pushes]
        assert not fast.ordered or ids == sorted(ids)
        assert len(got) + len(fast.pushes) == len(before)


def test_the_fast_path_lets_everything_go_at_once() -> None:
    held = HeldPushes()
    for journal_id in (3, 1, 2):  # (a redelivery may come after a later id)
        _hold(held, (journal_id, "", 0, 0, b"%d" % journal_id))
    assert held.release(2, lambda s, o: False, lambda p: False) == []  # 3 first: waits
    assert held.release(3, lambda s, o: False, lambda p: False) == [b"3", b"1", b"2"]
    assert not held.pushes and held.max_id == 0
