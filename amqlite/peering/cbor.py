"""Peering messages as CBOR bytes, for the shell: forwards encoded by hand (they
are the per-message path), everything else by cbor2 from ``to_map()``.

What :func:`encode` returns decodes to exactly ``msg.to_map()``, and
:func:`encode_batch` to ``{"type": "peer.batch", "msgs": [...]}`` (key order aside,
which CBOR maps ignore): the wire format is the one docs/peering.md describes; this
is only a faster way to write it. :func:`encode_frames` is what the shell sends
for one turn's messages of a connection: runs of forwards as ``peer.forwards``
maps, in ``peer.batch`` frames. Pure functions, no I/O.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Mapping, Sequence
from operator import add as _add
from typing import Any

import cbor2

from amqlite.protocol.cbor import ARRAY, bytes_head, cached_text, head, text, uint

from .wire import Envelope, Forward, Forwards, PeeringMessage, PlainRun, plain_run_of

BATCH = "peer.batch"
_repeat = itertools.repeat


_PATH_CACHE: dict[tuple[str, ...], bytes] = {}
_PATH_CACHE_MAX = 4096


def _path(path: tuple[str, ...]) -> bytes:
    enc = _PATH_CACHE.get(path)
    if enc is None:
        enc = head(ARRAY, len(path)) + b"".join(cached_text(p) for p in path)
        if len(_PATH_CACHE) >= _PATH_CACHE_MAX:
            _PATH_CACHE.clear()
        _PATH_CACHE[path] = enc
    return enc


_EMPTY_MAP = b"\xa0"
_EMPTY_MAPS = _EMPTY_MAP + _EMPTY_MAP  # headers and properties of a plain message
_BYTES8 = tuple(bytes_head(n) for n in range(0x100))
_SEQ32 = struct.Struct(">BI").pack  # uint() of 0x10000 <= n < 2**32: 0x1a, 4 bytes
_K_TYPE = text("type")
_K_PATH = text("path")
_K_HOPS = text("hops")
_K_EXCHANGE = text("exchange")
_BATCH_HEAD = b"\xa2" + _K_TYPE + text(BATCH) + text("msgs")


def _fields(m: Mapping[str, Any]) -> bytes:
    return cbor2.dumps(m if type(m) is dict else dict(m))


# map of 6 pairs, "type": "peer.forwards", "seq":
_FORWARDS_HEAD = b"\xa6" + _K_TYPE + text(Forwards.TYPE) + text("seq")
_K_MSGS = text("msgs")
# the compact form: a map of 8 pairs, "origin" a 3-item array
_COMPACT_HEAD = b"\xa8" + _K_TYPE + text(Forwards.TYPE) + text("seq")
_K_ORIGIN = text("origin") + b"\x83"
_K_KEYS = text("keys")
_K_BODIES = text("bodies")
_ROW = b"\x87"  # each message: a 7-item array


def encode_forwards(seq: int, envelopes: Sequence[Envelope]) -> bytes:
    """``cbor2.dumps(Forwards(seq, envelopes).to_map())``, by hand; the envelopes
    share exchange, path and hops (the first one's are written). The compact form
    when the run has it (``wire.compact_parts``), else a row per message."""
    compact = _compact(seq, envelopes)
    if compact is not None:
        return compact
    first = envelopes[0]
    out = [
        _FORWARDS_HEAD,
        uint(seq),
        _K_EXCHANGE,
        cached_text(first.exchange),
        _K_PATH,
        _path(first.path),
        _K_HOPS,
        uint(first.hops),
        _K_MSGS,
        head(ARRAY, len(envelopes)),
    ]
    extend = out.extend
    # A run's rows mostly share their origin (node, epoch) and routing key, and most
    # have no headers or properties: those parts are encoded once per run
    row_node, row_epoch, row_head = "", -1, b""  # row_head: _ROW, row_node, row_epoch
    plain_keys: dict[str, bytes] = {}  # routing key -> it and two empty maps
    for env in envelopes:
        node, epoch, origin_seq = env.mesh_id
        if epoch != row_epoch or node != row_node:
            row_node, row_epoch = node, epoch
            row_head = _ROW + cached_text(node) + uint(epoch)
        headers, properties, body = env.headers, env.properties, env.body
        n = len(body)
        if headers or properties:
            extend(
                (
                    row_head,
                    uint(origin_seq),
                    cached_text(env.routing_key),
                    _fields(headers) if headers else _EMPTY_MAP,
                    _fields(properties) if properties else _EMPTY_MAP,
                    _BYTES8[n] if n < 0x100 else bytes_head(n),
                    body,
                )
            )
            continue
        key = env.routing_key
        key_maps = plain_keys.get(key)
        if key_maps is None:
            key_maps = plain_keys[key] = cached_text(key) + _EMPTY_MAPS
        extend(
            (
                row_head,
                _SEQ32(0x1A, origin_seq) if 0x10000 <= origin_seq < 1 << 32 else uint(origin_seq),
                key_maps,
                _BYTES8[n] if n < 0x100 else bytes_head(n),
                body,
            )
        )
    return b"".join(out)


def _compact(seq: int, envelopes: Sequence[Envelope]) -> bytes | None:
    """:func:`encode_forwards` of a run in the compact form (``origin``, ``keys``,
    ``bodies``); None when it has no such form (``wire.plain_run_of``: one origin,
    origin seqs in a row, no headers, no properties). Why the form exists: a row
    per message (seven fields, two empty maps) was what the sending broker spent
    most on encoding a run and the receiving one on decoding and checking it."""
    run = plain_run_of(envelopes, least=1)
    return None if run is None else _compact_plain(seq, run)


def _compact_plain(seq: int, run: PlainRun, lengths: list[int] | None = None) -> bytes:
    """The compact form of a :class:`PlainRun` (a sending log's run of plain
    publishes, or envelopes :func:`~amqlite.peering.wire.plain_run_of` found to be
    one): it has the form by construction (one origin, consecutive origin seqs, no
    headers, no properties), so nothing is checked per message and no envelope is
    read (``tests/peering/test_fast_paths.py`` checks the bytes against the run's
    envelopes encoded by cbor2). ``lengths``: the bodies' lengths, when the caller
    has them.

    The bodies go out without a Python step each: bodies of one length (a
    benchmark's, any fixed-size record) share their byte-string head, and
    ``head.join`` writes the frame's header and every head and body in one C call
    (one copy of the bodies); other runs interleave the heads and bodies by slice
    assignment. Why: a head each in a generator, chained and joined twice, was
    most of encoding a run (with :func:`encode_frames`' whole-run shortcut: 2,205 ->
    511 instructions a 100-byte message in cachegrind, a run of 370);
    ``tests/peering/test_encode_runs.py`` checks every branch against cbor2."""
    bodies, keys = run.bodies, run.keys
    if type(keys) is str:
        key_bytes = cached_text(keys)
    else:
        key = keys[0]
        if all(k == key for k in keys):  # (as _compact: one key when all are the same)
            key_bytes = cached_text(key)
        else:
            key_bytes = head(ARRAY, len(keys)) + b"".join(map(cached_text, keys))
    n = len(bodies)
    frame_head = b"".join(
        (
            _COMPACT_HEAD,
            uint(seq),
            _K_EXCHANGE,
            cached_text(run.exchange),
            _K_PATH,
            _path(run.path),
            _K_HOPS,
            uint(run.hops),
            _K_ORIGIN,
            cached_text(run.node),
            uint(run.epoch),
            uint(run.first),
            _K_KEYS,
            key_bytes,
            _K_BODIES,
            head(ARRAY, n),
        )
    )
    if not n:
        return frame_head
    if lengths is None:
        lengths = list(map(len, bodies))
    first = lengths[0]
    if lengths.count(first) == n:  # one length: frame_head, then (head, body) each
        items = [frame_head]
        items += bodies
        return (_BYTES8[first] if first < 0x100 else bytes_head(first)).join(items)
    if max(lengths) < 0x100:
        heads = list(map(_BYTES8.__getitem__, lengths))
    else:
        heads = [_BYTES8[k] if k < 0x100 else bytes_head(k) for k in lengths]
    items = [frame_head] * (2 * n + 1)  # (the head first; the rest overwritten)
    items[1::2] = heads
    items[2::2] = bodies
    return b"".join(items)


def encode(msg: PeeringMessage) -> bytes:
    """One peering message's map, CBOR-encoded."""
    if type(msg) is Forwards:
        return encode_forwards(msg.seq, msg.envelopes)
    return cbor2.dumps(msg.to_map())


def _gathered(messages: Sequence[PeeringMessage]) -> list[PeeringMessage]:
    """``messages`` with consecutive forwards (single ``Forward``s and runs alike)
    that continue each other's seqs and share exchange, path and hops gathered
    into one ``Forwards`` each (a run's envelopes share them: its first stands for
    all)."""
    out: list[PeeringMessage] = []
    envs: list[Envelope] | PlainRun = []  # the run being gathered (a list of our own)
    following = -1  # the seq that would continue it
    path: tuple[str, ...] = ()
    exchange, hops = "", -1
    for msg in messages:
        t = type(msg)
        if t is Forward:
            first = msg.envelope  # type: ignore[union-attr]
            more: Sequence[Envelope] | None = None
        elif t is Forwards:
            more = msg.envelopes  # type: ignore[union-attr]
            if type(more) is PlainRun:  # (its parts, not an envelope made to look)
                exchange_, path_, hops_ = more.exchange, more.path, more.hops
            else:
                first = more[0]
                exchange_, path_, hops_ = first.exchange, first.path, first.hops
        else:
            following = -1
            out.append(msg)
            continue
        if more is None:
            exchange_, path_, hops_ = first.exchange, first.path, first.hops
        seq = msg.seq  # type: ignore[union-attr]
        if seq == following and hops_ == hops and path_ == path and exchange_ == exchange:
            if type(envs) is PlainRun:  # a sending log's runs: joined while they chain
                joined = envs.chained(more) if type(more) is PlainRun else None
                if joined is not None:
                    envs = joined
                    out[-1] = Forwards(out[-1].seq, envs)  # type: ignore[union-attr]
                    following += len(more)  # type: ignore[arg-type]
                    continue
                envs = list(envs)  # (else a list of their envelopes, as any other)
                out[-1] = Forwards(out[-1].seq, envs)  # type: ignore[union-attr]
            assert type(envs) is list
            if more is None:
                envs.append(first)
                following += 1
            else:
                envs += more
                following += len(more)
            continue
        if more is None:
            envs = [first]
        elif type(more) is PlainRun:
            envs = more
        else:
            envs = list(more)
        following = seq + len(envs)
        exchange, path, hops = exchange_, path_, hops_
        out.append(Forwards(seq, envs))
    return out


def encode_frames(messages: Sequence[PeeringMessage], limit: int) -> list[bytes]:
    """The ``msg`` of each ``peer`` frame that carries ``messages``, in order: a
    ``peer.batch`` (or one map alone) of at most about ``limit`` bytes. Consecutive
    forwards (single ones and runs) with consecutive seqs and the same exchange,
    path and hops go as one ``peer.forwards`` run (what the receiver takes as the
    single forwards), split only to keep frames near ``limit``."""
    frames: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for msg in _gathered(messages):
        item = b""  # one item for the frame, when the message goes whole
        if type(msg) is not Forwards:
            item = encode(msg)
        else:
            envelopes = msg.envelopes
            seq, j, m = msg.seq, 0, len(envelopes)
            if type(envelopes) is PlainRun:  # (its bodies' lengths, not envelopes made)
                lengths = list(map(len, envelopes.bodies))
                if m and (m == 1 or limit - size - (sum(lengths) - lengths[-1]) - 64 * (m - 1) > 0):
                    # the whole run in this frame, as the loop below would take it: a
                    # sending log's run (the usual case) without the running sizes, and
                    # its lengths handed on (tests/peering/test_encode_runs.py checks
                    # the frames against the per-message loop this replaced)
                    item = _compact_plain(seq, envelopes, lengths)
            else:
                lengths = [len(e.body) for e in envelopes]
        if item:
            size += len(item)
            batch.append(item)
            if size >= limit:
                frames.append(batch[0] if len(batch) == 1 else encode_batch(batch))
                batch, size = [], 0
            continue
        # ends[i]: what the first i messages count against the frame (a body and 64
        # each); a part ends before the first message that leaves no room, found
        # by bisection (not a step a message)
        ends = list(itertools.accumulate(map(_add, lengths, _repeat(64)), initial=0))
        while j < m:
            k = bisect.bisect_left(ends, limit - size + ends[j], j + 1, m)
            item = encode_forwards(seq + j, envelopes if k - j == m else envelopes[j:k])
            j = k
            size += len(item)
            batch.append(item)
            if size >= limit:
                frames.append(batch[0] if len(batch) == 1 else encode_batch(batch))
                batch, size = [], 0
    if batch:
        frames.append(batch[0] if len(batch) == 1 else encode_batch(batch))
    return frames


def encode_batch(items: Sequence[bytes]) -> bytes:
    """A ``peer.batch`` map holding the already encoded messages ``items``, in order."""
    return b"".join((_BATCH_HEAD, head(ARRAY, len(items)), *items))
