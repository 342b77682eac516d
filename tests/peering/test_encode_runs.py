"""A sending log's runs are encoded as before the round-15 fast paths of
:mod:`amqlite.peering.cbor`:

- ``_compact_plain`` (bodies of one length joined by their shared head in one
  call; other runs' heads interleaved by slice assignment) writes cbor2's bytes
  of the run's map;
- ``encode_frames`` (a whole run taken at once when it fits, the split points of
  a longer one found by bisection) writes the frames the per-message loop it
  replaced wrote (:func:`_frames_by_loop` below, that loop kept as the model),
  for runs and for lists of envelopes alike.
"""

from __future__ import annotations

from typing import Any

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from amqlite.peering import Envelope, Forwards, Heartbeat, PlainRun
from amqlite.peering import cbor as peering_cbor

from ..examples import examples

# lengths at the byte-string head's boundaries, and the commonest (one length)
_LENGTHS = st.sampled_from([0, 1, 23, 24, 100, 255, 256, 300, 65535, 65536])


def _run(first: int, keys: list[str], lengths: list[int]) -> PlainRun:
    bodies = [bytes([65 + i % 26]) * n for i, n in enumerate(lengths)]
    key: str | list[str] = keys[0] if len(set(keys)) == 1 else keys
    return PlainRun("A", 2, first, key, bodies, "x", ("A",), 1)


_runs = st.builds(
    lambda first, keys, lengths, same: _run(
        first,
        [keys[i % len(keys)] for i in range(len(lengths))],
        [lengths[0]] * len(lengths) if same else lengths,
    ),
    st.integers(0, 2**40),
    st.lists(st.sampled_from(["k", "j", "é"]), min_size=1, max_size=3),
    st.lists(_LENGTHS, min_size=1, max_size=40),
    st.booleans(),  # every body of one length (the one-call branch)
)


@settings(max_examples=examples(300), deadline=None)
@given(_runs, st.integers(0, 2**40))
def test_a_run_is_what_cbor2_writes_of_its_map(run: PlainRun, seq: int) -> None:
    want = cbor2.dumps(Forwards(seq, list(run)).to_map())
    assert peering_cbor._compact_plain(seq, run) == want
    assert peering_cbor._compact_plain(seq, run, [len(b) for b in run.bodies]) == want
    assert peering_cbor.encode(Forwards(seq, run)) == want


def _frames_by_loop(messages: list[Any], limit: int) -> list[bytes]:
    """``encode_frames`` as it was before round 15: a run's parts found by a step a
    message (the model the bisection and the whole-run shortcut must agree with)."""
    frames: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for msg in peering_cbor._gathered(messages):
        if type(msg) is not Forwards:
            item = peering_cbor.encode(msg)
            size += len(item)
            batch.append(item)
            if size >= limit:
                frames.append(batch[0] if len(batch) == 1 else peering_cbor.encode_batch(batch))
                batch, size = [], 0
            continue
        envelopes = msg.envelopes
        seq, j, m = msg.seq, 0, len(envelopes)
        lengths = [len(e.body) for e in envelopes]
        while j < m:
            k = j + 1
            room = limit - size - lengths[j] - 64
            while k < m and room > 0:
                room -= lengths[k] + 64
                k += 1
            item = peering_cbor.encode_forwards(seq + j, list(envelopes)[j:k])
            j = k
            size += len(item)
            batch.append(item)
            if size >= limit:
                frames.append(batch[0] if len(batch) == 1 else peering_cbor.encode_batch(batch))
                batch, size = [], 0
    if batch:
        frames.append(batch[0] if len(batch) == 1 else peering_cbor.encode_batch(batch))
    return frames


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.tuples(_runs, st.booleans(), st.booleans()), min_size=1, max_size=5),
    st.one_of(st.integers(1, 3000), st.sampled_from([64, 65536, 1 << 18])),
)
def test_frames_split_a_run_where_the_loop_did(items: list[Any], limit: int) -> None:
    """Runs (each continuing the seqs of the one before, or after a gap; a
    heartbeat between some) cut into frames of about ``limit`` bytes: the same
    frames as the per-message loop, whether the runs are :class:`PlainRun` s or
    lists of their envelopes."""
    fast: list[Any] = []
    listed: list[Any] = []
    seq = 1
    for run, gap, beat in items:
        seq += 5 if gap else 0
        fast.append(Forwards(seq, run))
        envelopes: list[Envelope] = list(run)
        listed.append(Forwards(seq, envelopes))
        if beat:
            fast.append(Heartbeat())
            listed.append(Heartbeat())
        seq += len(run)
    want = _frames_by_loop(listed, limit)
    assert peering_cbor.encode_frames(fast, limit) == want
    assert peering_cbor.encode_frames(listed, limit) == want


def test_a_run_exactly_filling_the_frame_is_split_as_the_loop_split_it() -> None:
    """The whole-run shortcut's boundary: room left 0 after all but the last
    message is a split (the loop stops at room <= 0), 1 is not."""
    run = _run(1, ["k"], [100] * 4)
    used = 3 * (100 + 64)  # what the first three count
    for limit in (used - 1, used, used + 1, used + 2):
        got = peering_cbor.encode_frames([Forwards(1, run)], limit)
        assert got == _frames_by_loop([Forwards(1, list(run))], limit), limit
