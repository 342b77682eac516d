"""The per-message fast paths give exactly what the general paths give.

- :mod:`amqlite.peering.cbor` writes the bytes ``cbor2.dumps(msg.to_map())`` writes;
- :func:`amqlite.peering.wire.forwards_fast` accepts only what
  the checked decoders accept, with the same result, and take every well-formed
  forward (run) off the wire;
- the shell's frames (runs of forwards as ``peer.forwards``) stand for exactly the
  messages sent, in order, and a link takes a run exactly as the single forwards;
- a link's offer takes exactly what :func:`decide` says to send;
- the seen-message window's in-order shortcut ends where the general rule ends;
- a remote interest's remembered topic verdicts follow its bindings.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqlite.errors import LocalProtocolError
from amqlite.peering import (
    Ack,
    Address,
    BindingKey,
    Decision,
    Deliver,
    DeliverRun,
    Envelope,
    Forward,
    Forwards,
    Heartbeat,
    Hello,
    Interest,
    LinkSettings,
    LinkState,
    MemorySpill,
    MeshId,
    OverflowPolicy,
    PeeredExchange,
    PeeringMode,
    PeeringProtocolError,
    PlainRun,
    RemoteInterest,
    SeenMessages,
    Send,
    decide,
    from_map,
)
from amqlite.peering import cbor as peering_cbor
from amqlite.peering.inbound import _Origin
from amqlite.peering.outbound import OutboundLog
from amqlite.peering.wire import _forwards, _Reader, forwards_fast
from amqlite.protocol import Connection, Role, codec
from amqlite.protocol import events as ev

from ..examples import examples
from .test_wire import SAMPLES

# the envelopes' strategies draw a lot: on a busy machine their generation is slow
# and an example can pass the default deadline, and lists of them often overrun
# hypothesis' entropy limit (health checks that fail by load and size, not by the code)
SLOW_INPUTS = [HealthCheck.too_slow, HealthCheck.data_too_large]

texts = st.text(max_size=12)
node_ids = st.text(min_size=1, max_size=8)
counters = st.one_of(
    st.integers(0, 30),
    st.integers(0, 2**70),  # past 64 bits: the encoder falls back to cbor2
    st.sampled_from([23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, 2**64]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    texts,
    st.binary(max_size=8),
)
headers = st.dictionaries(texts, scalars, max_size=4)
properties = st.fixed_dictionaries(
    {}, optional={"message_id": texts, "priority": st.integers(0, 9), "persistent": st.booleans()}
)
envelopes = st.builds(
    Envelope,
    mesh_id=st.builds(MeshId, node_ids, counters, counters),
    routing_key=texts,
    body=st.one_of(st.binary(max_size=300), st.binary(min_size=65536, max_size=65536)),
    headers=headers,
    properties=properties,
    exchange=texts,
    path=st.lists(node_ids, max_size=4).map(tuple),
    hops=counters,
)
forwards = st.builds(Forward, st.integers(1, 2**65), envelopes)


# --- the encoder ----------------------------------------------------------------------


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_encodes_as_its_map(message: Any) -> None:
    assert cbor2.loads(peering_cbor.encode(message)) == message.to_map()


@settings(max_examples=examples(50), deadline=None, suppress_health_check=SLOW_INPUTS)
@given(st.lists(forwards, max_size=30))
def test_a_batch_is_the_generic_batch_map(items: list[Forward]) -> None:
    data = peering_cbor.encode_batch([peering_cbor.encode(f) for f in items])
    assert data == cbor2.dumps({"type": "peer.batch", "msgs": [f.to_map() for f in items]})


def test_a_peer_frame_is_what_the_generic_encoder_writes() -> None:
    msg = peering_cbor.encode_batch([peering_cbor.encode(m) for m in SAMPLES])
    generic = codec.encode(ev.PeerMessage(cbor2.loads(msg)))
    assert codec.encode_peer(msg) == generic
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    with pytest.raises(LocalProtocolError, match="cannot send 'peer'"):
        client.send_peer(msg)  # before the handshake, like send()
    server.receive_data(client.send(ev.Hello(1, role="peer-link")))
    server.next_event()
    client.receive_data(server.send(ev.Welcome(1)))
    client.next_event()
    data = client.send_peer(msg)
    server.receive_data(data)
    assert server.next_event() == ev.PeerMessage(cbor2.loads(msg))
    small = Connection(Role.CLIENT, remote_max_frame_size=len(msg))
    small._set_state(client.state)
    with pytest.raises(LocalProtocolError, match="exceeds the other end's maximum"):
        small.send_peer(msg)


def _run_of(
    seq: int, envs: list[Envelope], exchange: str, path: tuple[str, ...], hops: int
) -> Forwards:
    return Forwards(
        seq,
        [
            Envelope(
                e.mesh_id, e.routing_key, e.body, e.headers, e.properties, exchange, path, hops
            )
            for e in envs
        ],
    )


def _plain_run_of(
    seq: int,
    origin: tuple[str, int, int],
    keys: list[str],
    bodies: list[bytes],
    exchange: str,
    path: tuple[str, ...],
    hops: int,
) -> Forwards:
    """A run that has the compact form: one origin, origin seqs in a row, no maps
    (one key for all, or ``keys`` drawn in turn)."""
    node, epoch, first = origin
    return Forwards(
        seq,
        [
            Envelope(MeshId(node, epoch, first + i), keys[i % len(keys)], body, {}, {},
                     exchange, path, hops)
            for i, body in enumerate(bodies)
        ],
    )  # fmt: skip


runs = st.one_of(
    st.builds(
        _run_of,
        st.integers(1, 2**65),
        st.lists(envelopes, min_size=1, max_size=6),
        texts,
        st.lists(node_ids, max_size=3).map(tuple),
        counters,
    ),
    st.builds(
        _plain_run_of,
        st.integers(1, 2**65),
        st.tuples(node_ids, counters, counters),
        st.lists(texts, min_size=1, max_size=2),
        st.lists(
            st.one_of(st.binary(max_size=300), st.binary(min_size=65536, max_size=65536)),
            min_size=1,
            max_size=6,
        ),
        texts,
        st.lists(node_ids, max_size=3).map(tuple),
        counters,
    ),
)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=SLOW_INPUTS)
@given(runs)
def test_a_run_is_encoded_byte_for_byte_as_cbor2_does(run: Forwards) -> None:
    data = peering_cbor.encode(run)
    assert data == cbor2.dumps(run.to_map())
    assert from_map(cbor2.loads(data)) == run


def _expanded(m: dict[str, Any]) -> list[Any]:
    msg = from_map(m)
    return msg.forwards() if isinstance(msg, Forwards) else [msg]


@settings(max_examples=examples(80), deadline=None, suppress_health_check=SLOW_INPUTS)
@given(
    st.lists(
        st.one_of(
            forwards,
            st.sampled_from(SAMPLES),
            st.tuples(st.integers(1, 50), st.integers(1, 5), envelopes).map(
                lambda t: [Forward(t[0] + i, t[2]) for i in range(t[1])]  # a run's worth
            ),
            runs,  # what a link's pump sends: split by the frame size only
            runs.map(  # a run in two parts that continue each other: gathered again
                lambda r: (
                    [Forwards(r.seq, r.envelopes[:1])]
                    + ([Forwards(r.seq + 1, r.envelopes[1:])] if len(r.envelopes) > 1 else [])
                )
            ),
        ),
        max_size=12,
    ),
    st.sampled_from([1, 300, 2000, 1 << 18]),
)
def test_frames_carry_exactly_the_messages_in_order(items: list[Any], limit: int) -> None:
    messages: list[Any] = []
    for item in items:
        messages += item if isinstance(item, list) else [item]
    got: list[Any] = []
    for frame in peering_cbor.encode_frames(messages, limit):
        m = cbor2.loads(frame)
        if m["type"] == "peer.batch":
            assert len(m["msgs"]) > 1
            for inner in m["msgs"]:
                got += _expanded(inner)
        else:
            got += _expanded(m)
    want: list[Any] = []
    for message in messages:
        want += _expanded(cbor2.loads(peering_cbor.encode(message)))
    assert got == want


def test_consecutive_forwards_go_as_one_run_until_something_differs() -> None:
    env = Envelope(MeshId("A", 1, 1), "k", b"x" * 10, {}, {}, "x", ("A",), 1)
    other = Envelope(MeshId("A", 1, 9), "k", b"", {}, {}, "x", ("A", "C"), 2)
    messages: list[Any] = [Forward(seq, env) for seq in range(1, 6)]
    (frame,) = peering_cbor.encode_frames(messages, 1 << 18)
    assert from_map(cbor2.loads(frame)) == Forwards(1, [env] * 5)
    messages += [Forward(6, other), Forward(8, env), Heartbeat(), Forward(9, env)]
    (frame,) = peering_cbor.encode_frames(messages, 1 << 18)
    kinds = [(m["type"], m.get("seq")) for m in cbor2.loads(frame)["msgs"]]
    assert kinds == [
        ("peer.forwards", 1),
        ("peer.forwards", 6),
        ("peer.forwards", 8),
        ("peer.heartbeat", None),
        ("peer.forwards", 9),
    ]
    assert len(peering_cbor.encode_frames(messages[:5], 100)) > 1  # the frame size splits runs
    # runs and single forwards that continue each other go as one run again
    parts: list[Any] = [Forwards(1, [env] * 2), Forward(3, env), Forwards(4, [env] * 2)]
    (frame,) = peering_cbor.encode_frames(parts, 1 << 18)
    assert from_map(cbor2.loads(frame)) == Forwards(1, [env] * 5)


@given(envelopes, node_ids, st.booleans())
def test_an_onward_envelope_knows_its_size(env: Envelope, node: str, known: bool) -> None:
    if known:
        env.size()
    out = env.onward(node)
    fresh = Envelope(
        out.mesh_id, out.routing_key, out.body, out.headers, out.properties, out.exchange, out.path,
        out.hops,
    )  # fmt: skip
    assert out.size() == fresh.size() and out == fresh


@given(texts, st.binary(max_size=300), headers, properties, texts)
def test_a_minted_envelope_knows_its_size(
    key: str, body: bytes, fields: dict[str, Any], props: dict[str, Any], exchange: str
) -> None:
    """``PeeredExchange.envelope`` works out a plain message's size at once: what
    ``size()`` says of the same envelope."""
    px = PeeredExchange(
        node_id="A", epoch=1, exchange=exchange, exchange_type="topic", rand=random.random
    )
    env = px.envelope(key, body, fields, props)
    fresh = Envelope(env.mesh_id, key, body, fields, props, exchange)
    assert env.size() == fresh.size() and env == fresh


# --- the receiver's decoder ----------------------------------------------------------

ODD: list[Any] = [
    None, True, False, 0, -1, 1, 2**64, 1.0, "", "A", b"", b"x", [], ["A"], [""], ["A", 1],
    ("A",), ["A", 1, 2], ["A", -1, 2], ["", 1, 2], ["A", True, 2], ("A", 1, 2), {}, {1: 2},
    {"k": 1}, {"k": [1]},
]  # fmt: skip
RUN_FIELDS = ["seq", "exchange", "path", "hops", "msgs", "origin", "keys", "bodies"]
ROW_ODD: list[Any] = [*ODD, ["A", 1, 2, "k", {}, {}, b""], ["A", 1, 2, "k", {}, {}]]


def _checked_run(m: dict[str, Any]) -> Forwards | str:
    try:
        return _forwards(_Reader("peer.forwards", m))
    except PeeringProtocolError as exc:
        return exc.text


@settings(max_examples=examples(120), deadline=None, suppress_health_check=SLOW_INPUTS)
@given(
    runs,
    st.lists(st.tuples(st.sampled_from(RUN_FIELDS), st.sampled_from([*ODD, "drop"])), max_size=2),
    st.lists(st.tuples(st.integers(0, 7), st.integers(0, 6), st.sampled_from(ROW_ODD)), max_size=3),
)
def test_the_fast_run_decoder_agrees_with_the_checked_one(
    run: Forwards, changes: list[tuple[str, Any]], row_changes: list[tuple[int, int, Any]]
) -> None:
    m = cbor2.loads(peering_cbor.encode(run))
    for name, value in changes:
        if value == "drop" and type(value) is str:
            m.pop(name, None)
        else:
            m[name] = value
    rows = m.get("msgs")
    for index, position, value in row_changes:
        for column in ("bodies", "keys", "origin"):  # the compact form's lists
            items = m.get(column)
            if (
                isinstance(items, list)
                and items
                and position % 3 == ("bodies", "keys", "origin").index(column)
            ):
                items[index % len(items)] = value
        if isinstance(rows, list) and rows:
            row = rows[index % len(rows)]
            if isinstance(row, list) and row:
                row[position % len(row)] = value
    fast = forwards_fast(m)
    checked = _checked_run(m)
    if fast is not None:
        assert fast == checked
    if not changes and not row_changes:
        assert fast == run  # whatever comes off the wire well-formed takes the fast path


def _receiving_end() -> tuple[PeeredExchange, Any]:
    px = PeeredExchange(
        node_id="B", epoch=1, exchange="x", exchange_type="topic", rand=random.Random(0).random,
        max_hops=3,
    )  # fmt: skip
    link, _ = px.attach(Hello("A", "l", "/", "x", "topic", PeeringMode.PUBLISH, 5), 0.0)
    assert link is not None and link.state is LinkState.UP
    return px, link


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW_INPUTS)
@given(
    st.lists(
        st.tuples(
            st.integers(-2, 3),  # seq step from the last run's end (<= 0: resent)
            st.one_of(  # origin seqs: any, or in a row (the compact form: one range)
                st.lists(st.integers(1, 12), min_size=1, max_size=5),
                st.builds(
                    lambda o, n: list(range(o, o + n)), st.integers(1, 12), st.integers(1, 5)
                ),
            ),
            st.lists(st.sampled_from(["A", "B", "C"]), max_size=2).map(tuple),
            st.integers(0, 4),
        ),
        max_size=6,
    ),
    st.lists(st.one_of(st.booleans(), st.integers(0, 20)), max_size=12),
)
def test_a_link_takes_a_run_as_the_single_forwards(
    runs_: list[tuple[int, list[int], tuple[str, ...], int]], confirms: list[bool | int]
) -> None:
    """Same deliveries, tags, counters, marks and acks; loops, resends and copies
    along other paths included; confirms of all so far or up to a tag (inside a
    run's pending entry)."""
    (px1, singles), (px2, batched) = _receiving_end(), _receiving_end()
    px3, as_runs = _receiving_end()  # receive(..., deliver_runs=True): a DeliverRun each
    seq, now = 0, 1.0
    for step, origins, path, hops in runs_:
        first = max(1, seq + step)
        envs = [
            Envelope(MeshId("Z", 1, o), "k" if o % 3 else "k.x", b"%d" % o, {}, {}, "x", path, hops)
            for o in origins
        ]
        run = Forwards(first, envs)
        one: list[Any] = []
        for fwd in run.forwards():
            one += singles.receive(cbor2.loads(peering_cbor.encode(fwd)), now)
        many = batched.receive(cbor2.loads(peering_cbor.encode(run)), now)
        ran = as_runs.receive(cbor2.loads(peering_cbor.encode(run)), now, deliver_runs=True)
        assert [a for a in one if isinstance(a, Deliver)] == [
            a for a in many if isinstance(a, Deliver)
        ]
        assert _each_delivered(ran) == many
        assert [a.message for a in one if isinstance(a, Send)][-1:] == [
            a.message for a in many if isinstance(a, Send)
        ][-1:]
        seq = max(seq, first + len(envs) - 1)
        confirm = confirms.pop() if confirms else False
        if confirm is not False:
            tag = singles._tags if confirm is True else min(confirm, singles._tags)
            one, many = singles.confirm(tag, now), batched.confirm(tag, now)
            assert one == many == as_runs.confirm(tag, now)
            assert px1.snapshot() == px2.snapshot() == px3.snapshot()
        assert _pendings(px1.ctx.seen) == _pendings(px2.ctx.seen) == _pendings(px3.ctx.seen)
        now += 1.0
    assert singles.counters == batched.counters == as_runs.counters
    assert px1.snapshot() == px2.snapshot() == px3.snapshot()
    assert (
        [i for p in singles._pending for i in p.items()]
        == [i for p in batched._pending for i in p.items()]
        == [i for p in as_runs._pending for i in p.items()]
    )


def _each_delivered(actions: list[Any]) -> list[Any]:
    """``actions`` with each ``DeliverRun`` as the ``Deliver`` of each of its messages."""
    out: list[Any] = []
    for a in actions:
        out += a.delivers() if isinstance(a, DeliverRun) else [a]
    return out


@settings(max_examples=examples(150), deadline=None, suppress_health_check=SLOW_INPUTS)
@given(
    node_ids,
    st.integers(0, 2**40),
    st.integers(0, 2**40),
    st.one_of(texts, st.lists(texts, min_size=1, max_size=6)),
    st.lists(st.binary(max_size=6), min_size=1, max_size=6),
    texts,
    st.lists(node_ids, max_size=3).map(tuple),
    st.integers(0, 5),
    st.integers(-8, 8),
    st.integers(-8, 8),
)
def test_a_plain_run_is_the_list_of_its_envelopes(
    node: str,
    epoch: int,
    first: int,
    keys: str | list[str],
    bodies: list[bytes],
    exchange: str,
    path: tuple[str, ...],
    hops: int,
    start: int,
    stop: int,
) -> None:
    """A :class:`PlainRun` (the compact form's fast decoder) against the list the
    checked decoder makes of the same map: equal, the same length, items
    (negative indices too) and slices; each message's :class:`MeshStamp` says
    what its envelope says (``mesh_map``, and the envelope it gives back)."""
    if isinstance(keys, list):
        keys = (keys * len(bodies))[: len(bodies)]
    m = {
        "type": "peer.forwards", "seq": 1, "exchange": exchange, "path": list(path),
        "hops": hops, "origin": [node, epoch, first], "keys": keys, "bodies": bodies,
    }  # fmt: skip
    fast = forwards_fast(m)
    checked = _checked_run(m)
    assert fast is not None and isinstance(checked, Forwards)
    run, envs = fast.envelopes, checked.envelopes
    assert isinstance(run, PlainRun) and type(envs) is list
    assert run == envs and envs == run and list(run) == envs and len(run) == len(envs)
    for i in range(-len(envs), len(envs)):
        assert run[i] == envs[i]
    with pytest.raises(IndexError):
        run[len(envs)]
    assert run[start:stop] == envs[start:stop] and list(run[start:stop]) == envs[start:stop]
    assert isinstance(run[start:stop], PlainRun)
    assert run[::2] == envs[::2]
    assert list(run.key_list()) == [e.routing_key for e in envs]
    stamps = run.stamps()
    assert [s.mesh_map() for s in stamps] == [e.mesh_map() for e in envs]
    assert [
        s.envelope(e.routing_key, e.body, {}, {}) for s, e in zip(stamps, envs, strict=True)
    ] == envs


# --- the sender's decision -------------------------------------------------------------


def _up_link(mode: PeeringMode, keys: list[str] | None) -> tuple[PeeredExchange, Any]:
    px = PeeredExchange(
        node_id="A", epoch=2, exchange="x", exchange_type="topic", rand=random.Random(0).random,
        max_hops=3,
    )  # fmt: skip
    link = px.add_link(LinkSettings(name="l", mode=mode, addresses=(Address("b", 1),)))
    link.start(0.0)
    link.connected(0.0)
    link.receive(Hello("B", "l", "/", "x", "topic", mode, 5), 0.0)
    if keys is not None:
        link.receive(Interest(True, tuple(BindingKey.of(k) for k in keys), (), 0, "0" * 16), 0.0)
    assert link.state is LinkState.UP
    return px, link


@given(
    st.sampled_from([PeeringMode.PUBLISH, PeeringMode.FORWARD]),
    st.one_of(st.none(), st.lists(st.sampled_from(["a.*", "#", "b", "a.b"]), max_size=2)),
    st.lists(
        st.tuples(
            st.sampled_from(["a.b", "b", "c.d"]),
            st.lists(st.sampled_from(["B", "C", "D"]), max_size=2).map(tuple),
            st.integers(0, 4),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_an_offer_takes_exactly_what_decide_sends(
    mode: PeeringMode, keys: list[str] | None, offers: list[tuple[str, tuple[str, ...], int, bool]]
) -> None:
    px, link = _up_link(mode, keys)
    seq = 0
    for key, path, hops, routed in offers:
        env = Envelope(MeshId("Z", 1, len(path) + hops), key, b"", {}, {}, "x", path, hops)
        want = decide(
            sends=True, mode=mode, routed_locally=routed, remote_node="B", path=path, hops=hops,
            max_hops=3, interest=link.interest, routing_key=key, headers={},
        )  # fmt: skip
        skipped = dict(link.skipped)
        actions = px.published(env, routed_locally=routed, now=1.0)
        assert link.took is (want is Decision.SEND) and px.taken == int(link.took)
        if want is Decision.SEND:
            seq += 1
            (send,) = actions
            assert isinstance(send, Send) and isinstance(send.message, Forward)
            assert send.message.seq == seq and send.message.envelope == env.onward("A")
        else:
            assert actions == []
            assert link.skipped[want.value] == skipped.get(want.value, 0) + 1


@given(
    st.sampled_from([PeeringMode.PUBLISH, PeeringMode.FORWARD]),
    st.sampled_from(list(OverflowPolicy)),
    st.integers(1, 3),
    st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(["a.b", "b"]),
                st.lists(st.sampled_from(["B", "C"]), max_size=1).map(tuple),
                st.integers(0, 4),
                st.booleans(),
                st.booleans(),
            ),
            st.just("ack"),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_offering_to_the_one_link_is_offering_to_each(
    mode: PeeringMode, overflow: OverflowPolicy, max_in_flight: int, steps: list[Any]
) -> None:
    """``published``'s one-link shortcut against its general rule (``_offer_each``):
    the same actions, ``taken``, counters and log, with the window and the byte
    cap filling (block, drop-oldest, spill) and acks in between."""
    ends = []
    for _ in range(2):
        px, link = _up_link(mode, ["a.*", "b"])
        link.settings = dataclasses.replace(
            link.settings, max_in_flight=max_in_flight, buffer_bytes=400, overflow=overflow
        )
        assert link.log is not None
        link.log.buffer_bytes, link.log.overflow = 400, overflow
        if overflow is OverflowPolicy.SPILL:
            link.log.spill = MemorySpill()
        ends.append((px, link))
    (fast, fast_link), (ref, ref_link) = ends
    for i, step in enumerate(steps):
        if step == "ack":
            acks = [
                end.receive(Ack(end.log.epoch, end.log.next_seq // 2), 1.0)
                for end in (fast_link, ref_link)
            ]
            assert acks[0] == acks[1]
            continue
        key, path, hops, routed, persistent = step
        props = {"persistent": True} if persistent else {}
        env = Envelope(MeshId("Z", 1, i), key, b"x" * 150, {}, props, "x", path, hops)
        got = fast.published(env, routed_locally=routed, now=1.0)
        want = ref._offer_each(env, routed_locally=routed, now=1.0)
        assert got == want and fast.taken == ref.taken
        assert fast_link.counters == ref_link.counters and fast_link.skipped == ref_link.skipped
        assert (fast_link.log.in_flight, fast_link.log.unacked, fast_link.log.dropped) == (
            ref_link.log.in_flight,
            ref_link.log.unacked,
            ref_link.log.dropped,
        )


def _check_held(log: OutboundLog) -> None:
    """The held items' invariants: no empty run, the count of their messages,
    each envelope's size known (what ``ack`` reads), the bytes their sizes' sum."""
    items = list(log._held)
    assert all(len(i) > 0 for i in items if isinstance(i, PlainRun))
    assert log._count == sum(len(i) if isinstance(i, PlainRun) else 1 for i in items)
    assert log._runs == sum(isinstance(i, PlainRun) for i in items)
    assert log.holds_runs == (log._runs > 0)
    assert all(i._size == i.size() for i in items if isinstance(i, Envelope))
    assert log.buffered_bytes == sum(e.size() for e in log._envelopes())


def _one_by_one(actions: list[Any]) -> list[Any]:
    """``actions`` with each ``Send`` of a run (``Forwards``) as the ``Send`` of
    each of its forwards."""
    out: list[Any] = []
    for a in actions:
        if isinstance(a, Send) and isinstance(a.message, Forwards):
            run = a.message
            assert all(
                (e.exchange, e.path, e.hops) == (run.envelopes[0].exchange, run.envelopes[0].path,
                run.envelopes[0].hops) for e in run.envelopes
            )  # fmt: skip
            out += [Send(a.link, f) for f in run.forwards()]
        else:
            out.append(a)
    return out


@settings(max_examples=examples(150), deadline=None)
@given(
    st.sampled_from([PeeringMode.PUBLISH, PeeringMode.FORWARD]),
    st.sampled_from(list(OverflowPolicy)),
    st.integers(1, 4),
    st.booleans(),
    st.lists(
        st.one_of(
            st.lists(
                st.tuples(
                    st.sampled_from(["a.b", "b", "c"]),
                    st.lists(st.sampled_from(["B", "C"]), max_size=1).map(tuple),
                    st.integers(0, 4),
                    st.booleans(),
                    st.booleans(),
                    st.booleans(),
                ),
                min_size=1,
                max_size=8,
            ),
            st.sampled_from(["ack", "lost", "back"]),
        ),
        min_size=1,
        max_size=10,
    ),
)
def test_offering_a_run_is_offering_each(
    mode: PeeringMode, overflow: OverflowPolicy, max_in_flight: int, durable: bool, steps: list[Any]
) -> None:
    """``published_run`` (a read's client publishes as one run) against
    ``published`` for each of them: the same forwards sent, in order, the same
    other actions (``Blocked``, ``Persist``, ``Acked``) in the same order, the
    same ``took`` / ``taken``, counters, skipped and log; with the window and the
    byte cap filling (block, drop-oldest, spill), a durable log with persistent
    messages, loops, used-up hops, no interest, acks and cuts in between."""
    ends = []
    for _ in range(2):
        px, link = _up_link(mode, ["a.*", "b"])
        link.settings = dataclasses.replace(
            link.settings, max_in_flight=max_in_flight, buffer_bytes=700, overflow=overflow
        )
        link.durable_log = durable
        assert link.log is not None
        link.log.buffer_bytes, link.log.overflow = 700, overflow
        if overflow is OverflowPolicy.SPILL:
            link.log.spill = MemorySpill()
        ends.append((px, link))
    (fast, fast_link), (ref, ref_link) = ends
    origin, now = 0, 1.0
    for step in steps:
        if step == "ack":
            acks = [
                _one_by_one(end.receive(Ack(end.log.epoch, end.log.next_seq // 2), now))
                for end in (fast_link, ref_link)
            ]
            assert acks[0] == acks[1]
        elif step == "lost":
            assert fast_link.connection_lost(now) == ref_link.connection_lost(now)
        elif step == "back":
            for end in (fast_link, ref_link):
                if end.state is LinkState.BACKOFF:
                    end.tick(now + 60.0)
                    end.connected(now)
                    end.receive(Hello("B", "l", "/", "x", "topic", mode, 5), now)
        else:
            envs, routed = [], []
            for key, path, hops, was_routed, persistent, sized in step:
                origin += 1
                props = {"persistent": True} if persistent else {}
                env = Envelope(MeshId("Z", 1, origin), key, b"x" * 150, {}, props, "x", path, hops)
                if sized:  # its size known (a minted one's is): offer_run's inlined onward
                    env.size()
                envs.append(env)
                routed.append(was_routed)
            got = fast.published_run(envs, routed, now=now)
            want: list[Any] = []
            for env, r in zip(envs, routed, strict=True):
                want += ref.published(env, routed_locally=r, now=now)
            assert _one_by_one(got) == _one_by_one(want)
            assert fast_link.took is ref_link.took and fast.taken == ref.taken
        now += 1.0
        assert fast_link.state is ref_link.state
        assert fast_link.counters == ref_link.counters and fast_link.skipped == ref_link.skipped
        flog, rlog = fast_link.log, ref_link.log
        assert (flog.in_flight, flog.unacked, flog.dropped, flog.blocked, flog.spilled) == (
            rlog.in_flight,
            rlog.unacked,
            rlog.dropped,
            rlog.blocked,
            rlog.spilled,
        )
        assert list(flog._envelopes()) == list(rlog._envelopes())
        _check_held(flog)
        _check_held(rlog)
        assert (flog.gone_upto, flog.next_seq, flog.oldest_accepted_at) == (
            rlog.gone_upto,
            rlog.next_seq,
            rlog.oldest_accepted_at,
        )
        assert [e.size() for e in flog._envelopes()] == [e.size() for e in rlog._envelopes()]
        assert flog.buffered_bytes == rlog.buffered_bytes


@settings(max_examples=examples(150), deadline=None)
@given(
    st.sampled_from([PeeringMode.PUBLISH, PeeringMode.FORWARD]),
    st.sampled_from(list(OverflowPolicy)),
    st.integers(1, 4),
    st.booleans(),
    st.one_of(st.none(), st.just(["a.*", "b"])),
    st.lists(
        st.one_of(
            st.lists(
                st.tuples(st.sampled_from(["a.b", "b", "c"]), st.integers(0, 300)),
                min_size=1,
                max_size=8,
            ),
            st.sampled_from(["ack", "lost", "back", "minted"]),
        ),
        min_size=1,
        max_size=10,
    ),
)
def test_offering_a_plain_run_is_offering_its_minted_envelopes(
    mode: PeeringMode,
    overflow: OverflowPolicy,
    max_in_flight: int,
    durable: bool,
    keys: list[str] | None,
    steps: list[Any],
) -> None:
    """``published_plain_run`` (a sending site's plain client publishes, not minted
    yet: one envelope each) against ``published_run`` of the envelopes
    ``envelope`` mints for them, none routed locally: the same actions in the
    same order (forwards with the same mesh ids, ``Blocked``, ``Acked``), the same
    ``took`` / ``taken``, counters, skipped, log and sizes; with the window and
    the byte cap filling (block, drop-oldest, spill), no interest or some, acks,
    cuts, and messages minted one by one in between."""
    ends = []
    for _ in range(2):
        px, link = _up_link(mode, keys)
        link.settings = dataclasses.replace(
            link.settings, max_in_flight=max_in_flight, buffer_bytes=900, overflow=overflow
        )
        link.durable_log = durable
        assert link.log is not None
        link.log.buffer_bytes, link.log.overflow = 900, overflow
        if overflow is OverflowPolicy.SPILL:
            link.log.spill = MemorySpill()
        ends.append((px, link))
    (fast, fast_link), (ref, ref_link) = ends
    now = 1.0
    for step in steps:
        if step == "ack":
            acks = [
                _one_by_one(end.receive(Ack(end.log.epoch, end.log.next_seq // 2), now))
                for end in (fast_link, ref_link)
            ]
            assert acks[0] == acks[1]
        elif step == "lost":
            assert fast_link.connection_lost(now) == ref_link.connection_lost(now)
        elif step == "back":
            for end in (fast_link, ref_link):
                if end.state is LinkState.BACKOFF:
                    end.tick(now + 60.0)
                    end.connected(now)
                    end.receive(Hello("B", "l", "/", "x", "topic", mode, 5), now)
        elif step == "minted":  # one through the general path, between runs
            got = fast.published(fast.envelope("b", b"m"), routed_locally=False, now=now)
            want = ref.published(ref.envelope("b", b"m"), routed_locally=False, now=now)
            assert _one_by_one(got) == _one_by_one(want)
        else:
            keys, bodies = [key for key, _ in step], [b"y" * n for _, n in step]
            got = fast.published_plain_run(list(keys), list(bodies), now=now)
            envs = [ref.envelope(k, b) for k, b in zip(keys, bodies, strict=True)]
            want = ref.published_run(envs, [False] * len(envs), now=now)
            assert _one_by_one(got) == _one_by_one(want)
            assert fast_link.took is ref_link.took and fast.taken == ref.taken
        now += 1.0
        assert fast_link.state is ref_link.state
        assert fast_link.counters == ref_link.counters and fast_link.skipped == ref_link.skipped
        flog, rlog = fast_link.log, ref_link.log
        assert (flog.in_flight, flog.unacked, flog.dropped, flog.blocked, flog.spilled) == (
            rlog.in_flight,
            rlog.unacked,
            rlog.dropped,
            rlog.blocked,
            rlog.spilled,
        )
        assert list(flog._envelopes()) == list(rlog._envelopes())
        _check_held(flog)
        _check_held(rlog)
        assert (flog.gone_upto, flog.next_seq, flog.oldest_accepted_at) == (
            rlog.gone_upto,
            rlog.next_seq,
            rlog.oldest_accepted_at,
        )
        assert [e.size() for e in flog._envelopes()] == [e.size() for e in rlog._envelopes()]
        assert flog.buffered_bytes == rlog.buffered_bytes
    assert fast._minted == ref._minted


@given(
    st.lists(
        st.tuples(st.sampled_from([(), ("C",), ("C", "D")]), st.sampled_from(["x", "y"])),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 14),
)
def test_a_pump_sends_the_due_forwards_as_runs(
    items: list[tuple[tuple[str, ...], str]], max_in_flight: int
) -> None:
    """What ``_pump`` sends, its runs taken apart, is a ``Forward`` of each entry
    the log says is due (``take_unsent`` on a twin log), in order; a run's
    envelopes share exchange, path and hops (``_one_by_one`` checks)."""
    _, link = _up_link(PeeringMode.PUBLISH, ["#"])
    link.settings = dataclasses.replace(link.settings, max_in_flight=max_in_flight)
    twin = OutboundLog(epoch=link.log.epoch, buffer_bytes=link.log.buffer_bytes)
    for i, (path, exchange) in enumerate(items):
        env = Envelope(MeshId("Z", 1, i), "k", b"m", {}, {}, exchange, path, len(path))
        link.log.accept(env, 0.0)
        twin.accept(env, 0.0)
    want = [Forward(e.seq, e.envelope) for e in twin.take_unsent(max_in_flight)]
    assert _sent(link._pump()) == want
    assert link.counters["forwarded"] == len(want)


def test_a_run_is_sent_as_one_forwards() -> None:
    """The usual case: a client's publishes, one link that keeps up: one ``Send``."""
    px, link = _up_link(PeeringMode.PUBLISH, ["#"])
    envs = [Envelope(MeshId("A", 2, i), "k", b"m", {}, {}, "x") for i in range(1, 6)]
    (send,) = px.published_run(envs, [False] * 5, now=1.0)
    assert send == Send(link.id, Forwards(1, [e.onward("A") for e in envs]))
    assert link.counters["accepted"] == link.counters["forwarded"] == 5


@given(
    st.lists(st.sampled_from(["accept", "ack", "rewind", "take"]), max_size=40),
    st.integers(1, 4),
    st.booleans(),
)
def test_taking_the_last_one_is_what_taking_the_one_due_gives(
    ops: list[str], max_in_flight: int, spill: bool
) -> None:
    """``take_last`` (offer's shortcut) against the rule: when exactly one message
    is due and the window has room, ``take_unsent(1)``; otherwise nothing."""
    kind = OverflowPolicy.SPILL if spill else OverflowPolicy.BLOCK
    logs = [
        OutboundLog(
            epoch=1, buffer_bytes=300, overflow=kind, spill=MemorySpill() if spill else None
        )
        for _ in range(2)
    ]
    fast, ref = logs
    for i, op in enumerate(ops):
        if op == "accept":
            env = Envelope(MeshId("A", 1, i), "k", b"x" * 100)
            assert fast.accept(env, 0.0) == ref.accept(env, 0.0)
            want = ref.take_unsent(1) if ref.unsent == 1 and ref.in_flight < max_in_flight else []
            got = fast.take_last(max_in_flight)
            if got is None:
                assert want == [] or fast.take_unsent(1) == want  # the general path
            else:
                assert [got] == want
        elif op == "ack":
            assert fast.ack(fast.next_seq // 2) == ref.ack(ref.next_seq // 2)
        elif op == "rewind":
            assert fast.rewind() == ref.rewind()
        else:
            assert fast.take_unsent(2) == ref.take_unsent(2)
        assert (fast.in_flight, fast.unsent, fast.unacked) == (
            ref.in_flight,
            ref.unsent,
            ref.unacked,
        )


def _queue_fed_end(max_in_flight: int) -> tuple[PeeredExchange, Any]:
    px = PeeredExchange(
        node_id="B", epoch=3, exchange="x", exchange_type="topic", rand=random.Random(0).random,
        max_hops=3,
    )  # fmt: skip
    hello = Hello("A", "l", "/", "x", "topic", PeeringMode.SUBSCRIBE, 0, None, lease=60.0)
    end, _ = px.attach(hello, 0.0)
    assert end is not None and end.queue_fed
    end.settings = dataclasses.replace(end.settings, max_in_flight=max_in_flight)
    return px, end


# a batch: (path, hops, a header, the origin seqs' gap before it) per message
_batch_item = st.tuples(
    st.lists(st.sampled_from(["A", "C", "D"]), max_size=2).map(tuple),
    st.integers(0, 4),
    st.booleans(),
    st.integers(0, 1),
)
# ... or a run of plain messages minted one after the other (one path and hops,
# mostly none), what a client's publishes on the subscriber's remote are:
# take_run's PlainRun path (then and there a key each or one for all)
_plain_batch = st.tuples(
    st.integers(2, 8),
    st.sampled_from([((), 0), ((), 0), (("C",), 1), (("A",), 1), ((), 3)]),
    st.booleans(),
).map(lambda t: [(t[1][0], t[1][1], False, 0, t[2]) for _ in range(t[0])])


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(_batch_item.map(lambda t: (*t, False)), max_size=6),
            _plain_batch,
            st.sampled_from(["ack", "lost", "back"]),
        ),
        max_size=8,
    ),
    st.integers(1, 5),
    st.sampled_from([1 << 20, 600]),
)
def test_taking_a_batch_is_taking_each(
    steps: list[list[tuple[tuple[str, ...], int, bool, int, bool]] | str],
    max_in_flight: int,
    buffer_bytes: int,
) -> None:
    """``take_run`` (the peering queue's batches) against ``take`` for each: the
    same sequence numbers (None: skipped), the same forwards sent, in order, the
    same counters and the same log (envelopes, figures); loops, used-up hops,
    headers, gaps in the origin seqs, a narrow window, a small buffer (the run
    refused as one), cuts included, and plain runs (``take_run`` holds them as one
    :class:`PlainRun`: ``tests`` checked to fail with its seqs one off)."""
    (px1, each), (px2, batch) = _queue_fed_end(max_in_flight), _queue_fed_end(max_in_flight)
    for end in (each, batch):
        assert end.log is not None
        end.log.buffer_bytes = buffer_bytes
    now, origin = 1.0, 0
    for step in steps:
        if step == "ack":
            for end in (each, batch):
                assert end.log is not None
                end.receive(Ack(3, end.log.in_flight // 2 + end.log.gone_upto).to_map(), now)
        elif step == "lost":
            each.connection_lost(now), batch.connection_lost(now)
        elif step == "back":
            for px, end in ((px1, each), (px2, batch)):
                if end.state is not LinkState.UP:
                    hello = Hello("A", "l", "/", "x", "topic", PeeringMode.SUBSCRIBE, 0, None)
                    again, _ = px.attach(hello, now)
                    assert again is end
        else:
            envs = []
            for path, hops, header, gap, key_each in step:
                origin += 1 + gap
                headers = {"h": 1} if header else {}
                key = f"k{origin}" if key_each else "k"
                envs.append(
                    Envelope(MeshId("Z", 1, origin), key, b"m", headers, {}, "x", path, hops)
                )
            one: list[Any] = []
            seqs: list[int | None] = []
            for env in envs:
                if (
                    buffer_bytes < 1 << 20
                    and each.log is not None
                    and not each.log.has_room(env.onward("B").size())
                ):
                    break  # (a queue-fed log has no byte cap: the queue has it)
                seq, actions = each.take(env, now)
                seqs.append(seq)
                one += actions
            else:
                got, many = batch.take_run(envs, now)
                assert list(got) == seqs
                assert _sent(one) == _sent(many)
            if len(seqs) < len(envs):  # the first log was full: make the second the same
                for env in envs[: len(seqs)]:
                    batch.take(env, now)
        now += 1.0
        assert each.counters == batch.counters and each.skipped == batch.skipped
        assert each.log is not None and batch.log is not None
        assert list(each.log._envelopes()) == list(batch.log._envelopes())
        _check_held(batch.log)
        figures = [
            (lg.in_flight, lg.unsent, lg.unacked, lg.buffered_bytes, lg.gone_upto, lg.last_seq)
            for lg in (each.log, batch.log)
        ]
        assert figures[0] == figures[1]


def _sent(actions: list[Any]) -> list[Any]:
    return [a.message for a in _one_by_one(actions) if isinstance(a, Send)]


# --- the seen-message window ------------------------------------------------------------


def _settle_by_the_rule(o: _Origin, seq: int, window: int) -> None:
    """``_Origin.settle`` without its in-order shortcut (the reference)."""
    import heapq

    o.pending.discard(seq)
    if seq <= o.floor or seq in o.above:
        return
    o.above.add(seq)
    heapq.heappush(o.heap, seq)
    while len(o.above) > window:
        o.floor = heapq.heappop(o.heap)
        o.above.discard(o.floor)
    while o.heap and o.heap[0] == o.floor + 1:
        o.floor = heapq.heappop(o.heap)
        o.above.discard(o.floor)


@given(st.lists(st.integers(1, 40), max_size=80), st.integers(1, 6))
def test_the_in_order_shortcut_ends_where_the_rule_ends(seqs: list[int], window: int) -> None:
    fast, ref = _Origin(), _Origin()
    for seq in seqs:
        fast.settle(seq, window)
        _settle_by_the_rule(ref, seq, window)
        assert (fast.floor, fast.above, sorted(fast.heap)) == (
            ref.floor,
            ref.above,
            sorted(ref.heap),
        )


mesh_ids = st.builds(MeshId, st.sampled_from(["A", "B"]), st.integers(1, 4), st.integers(1, 12))


@given(
    st.lists(st.tuples(st.booleans(), st.lists(mesh_ids, max_size=8)), max_size=10),
    st.integers(1, 4),
    st.integers(1, 3),
)
def test_claiming_and_settling_a_run_is_doing_each(
    steps: list[tuple[bool, list[MeshId]]], window: int, epochs_kept: int
) -> None:
    """``claim_each`` / ``settle_each`` (a run of forwards, a cumulative confirm)
    against ``claim`` / ``settle`` for each id: the same verdicts and the same
    state, mixed origins, epochs that push older ones out, duplicates included."""
    fast, ref = SeenMessages(window, epochs_kept), SeenMessages(window, epochs_kept)
    for claim, ids in steps:
        if claim:
            assert fast.claim_each(ids) == [ref.claim(m) for m in ids]
        else:
            fast.settle_each(ids)
            for m in ids:
                ref.settle(m)
        assert fast.snapshot() == ref.snapshot()
        assert {
            (n, e): sorted(o.pending) for n, es in fast._origins.items() for e, o in es.items()
        } == {(n, e): sorted(o.pending) for n, es in ref._origins.items() for e, o in es.items()}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["claim", "settle", "claim_each", "settle_each"]),
            st.sampled_from(["A", "B"]),
            st.integers(1, 4),
            st.integers(1, 14),
            st.integers(1, 6),
        ),
        max_size=14,
    ),
    st.integers(1, 4),
    st.integers(1, 3),
)
def test_claiming_and_settling_a_range_is_doing_each(
    steps: list[tuple[str, str, int, int, int]], window: int, epochs_kept: int
) -> None:
    """``claim_run`` / ``settle_run`` (a compact run's ids, a range) against
    ``claim`` / ``settle`` for each id of the range: ``claim_run`` is True only
    when every one is a first copy, and then the state is the same; when it is
    False nothing changed (``claim_each`` then says which). Ranges that overlap
    pending, settled and out-of-order ones, and older epochs, included."""
    fast, ref = SeenMessages(window, epochs_kept), SeenMessages(window, epochs_kept)
    for what, node, epoch, first, n in steps:
        ids = [MeshId(node, epoch, first + i) for i in range(n)]
        if what == "claim":
            before = fast.snapshot(), _pendings(fast)
            verdicts = [ref.claim(m) for m in ids]
            if fast.claim_run(node, epoch, first, n):
                assert all(verdicts)
            else:
                assert not all(verdicts)
                assert (fast.snapshot(), _pendings(fast)) == before
                assert fast.claim_each(ids) == verdicts
        elif what == "settle":
            fast.settle_run(node, epoch, first, n)
            for m in ids:
                ref.settle(m)
        elif what == "claim_each":  # ids claimed one by one, out of a range's way
            assert fast.claim_each(ids[::-1]) == [ref.claim(m) for m in ids[::-1]]
        else:
            fast.settle_each(ids[::-1])
            for m in ids[::-1]:
                ref.settle(m)
        assert fast.snapshot() == ref.snapshot()
        assert _pendings(fast) == _pendings(ref)
        assert {
            (n, e): (o.floor, sorted(o.above), sorted(o.heap))
            for n, es in fast._origins.items()
            for e, o in es.items()
        } == {
            (n, e): (o.floor, sorted(o.above), sorted(o.heap))
            for n, es in ref._origins.items()
            for e, o in es.items()
        }


def _pendings(seen: SeenMessages) -> dict[tuple[str, int], list[int]]:
    return {(n, e): sorted(o.pending) for n, es in seen._origins.items() for e, o in es.items()}


# --- remembered verdicts -----------------------------------------------------------------


def test_topic_verdicts_follow_the_bindings() -> None:
    interest = RemoteInterest("topic")
    assert interest.matches("a.b", {})  # not advertised yet: everything
    interest.replace([BindingKey.of("a.*")])
    assert interest.matches("a.b", {}) and not interest.matches("z", {})
    interest.remove(BindingKey.of("a.*"))
    assert not interest.matches("a.b", {})
    interest.add(BindingKey.of("#"))
    assert interest.matches("z", {}) and interest.matches("a.b", {})
    interest.replace([BindingKey.of("z")])
    assert interest.matches("z", {}) and not interest.matches("a.b", {})


# --- the protocol's plain-data check on peer frames ----------------------------------------

odd_values = st.one_of(
    scalars,
    st.sampled_from([(1, 2), {1, 2}, frozenset(), 1j, object()]),  # what cbor2 tags decode to
)
plain_trees = st.recursive(
    odd_values,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(texts, st.integers(0, 3)), inner, max_size=4),
    ),
    max_leaves=40,
)


@settings(max_examples=examples(120), deadline=None, suppress_health_check=SLOW_INPUTS)
@given(
    st.one_of(
        plain_trees,
        st.dictionaries(texts, plain_trees, max_size=4),
        st.builds(
            lambda items, extra: {"type": "peer.batch", "msgs": items, **extra},
            st.lists(
                st.one_of(
                    plain_trees,
                    st.builds(lambda f: f.to_map(), forwards),
                    st.builds(lambda r: r.to_map(), runs),
                )
            ),
            st.dictionaries(texts, plain_trees, max_size=2),
        ),
        st.builds(lambda r: r.to_map(), runs),
        st.builds(  # a run whose rows hold odd values
            lambda rows: {"type": "peer.forwards", "msgs": rows},
            st.lists(st.lists(st.one_of(odd_values, plain_trees), max_size=7), max_size=3),
        ),
        st.builds(  # a batch of flat maps, some with an odd value
            lambda items: {"msgs": items},
            st.lists(st.dictionaries(texts, odd_values, max_size=3), max_size=3),
        ),
    )
)
def test_the_peer_frame_check_agrees_with_the_general_one(value: Any) -> None:
    assert codec._is_plain_peer_map(value) is codec._is_str_map(value)


def test_the_peer_frame_check_counts_nesting_like_the_general_one() -> None:
    deep: Any = 1
    for depth in range(12):
        deep = [deep] if depth % 2 else {"k": deep}
        for shape in (
            deep,
            {"msgs": [deep]},
            {"msgs": [[deep]]},
            {"msgs": [["A", deep]]},
            {"msgs": [{"id": [deep]}]},
            {"msgs": [{"h": deep}]},
            {"msgs": [{"msgs": [[deep]]}]},
            {"msgs": [{"msgs": [["A", {}, deep]]}]},
        ):
            assert codec._is_plain_peer_map(shape) is codec._is_str_map(shape), (depth, shape)


def _held_run(mint: int, keys: list[str], bodies: list[bytes]) -> PlainRun:
    """A sending log's run: A's plain publishes minted from ``mint`` on."""
    return PlainRun("A", 2, mint, keys[0] if len(set(keys)) == 1 else keys, bodies, "x", ("A",), 1)


_LOG_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("run"),
            st.lists(
                st.tuples(st.sampled_from(["k", "j"]), st.integers(0, 120)), min_size=1, max_size=8
            ),
            st.booleans(),  # a gap in the mints before it (a minted message sent nowhere)
        ),
        st.tuples(st.just("one"), st.integers(0, 120), st.booleans()),
        st.tuples(st.sampled_from(["ack", "take", "entries", "last"]), st.integers(0, 9)),
        st.tuples(st.just("rewind")),
        st.tuples(st.just("same_time")),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=examples(300), deadline=None)
@given(st.sampled_from(list(OverflowPolicy)), st.sampled_from([300, 1000, 5000]), _LOG_OPS)
def test_a_log_holding_runs_is_the_log_of_their_envelopes(
    overflow: OverflowPolicy, buffer_bytes: int, ops: list[Any]
) -> None:
    """An ``OutboundLog`` given each plain run as one ``PlainRun`` (what
    ``offer_plain_run`` does) against one given the run's envelopes: after every
    accept (a run, or one message; block, drop-oldest and spill at the byte cap),
    ack (cumulative, up to inside a run), take (``take_unsent_run``, ``take_unsent``,
    ``take_last``, ending inside a run) and rewind, the same answers, the same
    messages held in the same order, the same figures, sizes and times."""
    logs = []
    for _ in range(2):
        spill = MemorySpill() if overflow is OverflowPolicy.SPILL else None
        logs.append(OutboundLog(epoch=2, buffer_bytes=buffer_bytes, overflow=overflow, spill=spill))
    fast, ref = logs
    now, mint = 1.0, 0
    for op in ops:
        kind = op[0]
        if kind == "run":
            mint += 1 + op[2]
            run = _held_run(mint, [k for k, _ in op[1]], [b"b" * n for _, n in op[1]])
            mint += len(run) - 1
            envs = list(run)
            assert [e.size() for e in envs] == [e.size() for e in run]  # (and known now)
            size = run.size()
            assert size == sum(e.size() for e in envs)
            got = fast.accept_run_if_room(run, size, now)
            want = ref.accept_run_if_room(envs, size, now)
            assert got == want
            if got is None:  # each its own way (offer_plain_run's loop)
                for env in run:
                    env.size()
                    assert fast.accept(env, now) == ref.accept(dataclasses.replace(env), now)
        elif kind == "one":
            mint += 1 + op[2]
            env = Envelope(MeshId("A", 2, mint), "k", b"b" * op[1], {}, {}, "x", ("A",), 1)
            assert fast.accept(env, now) == ref.accept(dataclasses.replace(env), now)
        elif kind == "ack":
            seq = fast.gone_upto + op[1]
            assert fast.ack(seq) == ref.ack(seq)
        elif kind == "take":
            first, items = fast.take_unsent_run(op[1])
            rfirst, renvs = ref.take_unsent_run(op[1])
            flat = [e for i in items for e in (i if isinstance(i, PlainRun) else (i,))]
            assert (first, flat) == (rfirst, renvs)
            assert all(len(i) for i in items if isinstance(i, PlainRun))
            for a, b in itertools.pairwise(items):  # runs that chain are joined
                assert not (isinstance(a, PlainRun) and isinstance(b, PlainRun) and a.chained(b))
        elif kind == "entries":
            assert fast.take_unsent(op[1]) == ref.take_unsent(op[1])
        elif kind == "last":
            assert fast.take_last(op[1] + 1) == ref.take_last(op[1] + 1)
        elif kind == "rewind":
            assert fast.rewind() == ref.rewind()
        if kind != "same_time":
            now += 1.0
        assert list(fast._envelopes()) == list(ref._envelopes())
        _check_held(fast)
        _check_held(ref)
        figures = [
            (lg.in_flight, lg.unsent, lg.unacked, lg.buffered_bytes, lg.spilled_bytes,
             lg.oldest_accepted_at, lg.gone_upto, lg.last_seq, lg.dropped, lg.blocked,
             lg.spilled)
            for lg in (fast, ref)
        ]  # fmt: skip
        assert figures[0] == figures[1]
    fast.rewind()
    ref.rewind()
    assert fast.take_unsent(10**6) == ref.take_unsent(10**6)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(["k", "j", "é"]), min_size=1, max_size=3),
            st.lists(st.integers(0, 300), min_size=1, max_size=6),
            st.integers(0, 2),  # mints skipped before it
            st.booleans(),  # the next log seq (False: a gap, another Send)
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(64, 2000),
)
def test_a_plain_run_is_encoded_as_its_envelopes(runs: list[Any], limit: int) -> None:
    """The frames of ``Forwards`` of ``PlainRun`` s (a sending log's runs; joined
    by ``encode_frames`` where they chain) are byte for byte those of the same
    ``Forwards`` holding the runs' envelopes; ``encode`` of one alike; and a run's
    ``chained``, ``part`` and ``size`` are those of its envelopes' lists."""
    mint, seq = 0, 1
    fast, ref = [], []
    for keys, lengths, skip, follows in runs:
        mint += 1 + skip
        bodies = [bytes([65 + i % 26]) * n for i, n in enumerate(lengths)]
        run = _held_run(mint, [keys[i % len(keys)] for i in range(len(bodies))], bodies)
        mint += len(run) - 1
        seq += 0 if follows else 3
        fast.append(Send("l", Forwards(seq, run)))
        ref.append(Send("l", Forwards(seq, list(run))))
        assert peering_cbor.encode(fast[-1].message) == peering_cbor.encode(ref[-1].message)
        assert run.size() == sum(e.size() for e in run)
        assert list(run.part(1, len(run))) == list(run)[1:]
        seq += len(run)
    got = peering_cbor.encode_frames([s.message for s in fast], limit)
    want = peering_cbor.encode_frames([s.message for s in ref], limit)
    assert got == want
    for a, b in itertools.pairwise(fast):
        ra, rb = a.message.envelopes, b.message.envelopes
        joined = ra.chained(rb)
        if joined is not None:
            assert list(joined) == list(ra) + list(rb)
