"""The action applier's shortcuts do what the general paths do: a turn of sends
only (a client publish on a peered exchange) and a run of deliveries (a received
``peer.forwards``)."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections import deque
from typing import Any

import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from amqlite.auth import AuthenticatedUser, Permissions
from amqlite.broker import ALL_APPENDED, Broker, Message, PublishOutcome, Session
from amqlite.errors import AmqliteError
from amqlite.peering import (
    Ack,
    Action,
    Address,
    BindingKey,
    Deliver,
    DeliverRun,
    Envelope,
    Forward,
    Forwards,
    Heartbeat,
    Hello,
    Interest,
    LinkSettings,
    MeshId,
    OverflowPolicy,
    PeeredExchange,
    PeeringMode,
    PlainRun,
    Send,
)
from amqlite.peering import cbor as peering_cbor
from amqlite.peering.link import PlainPublish
from amqlite.protocol import PublishRun
from amqlite.protocol import events as ev
from amqlite.server.dispatch import RequestDispatcher
from amqlite.server.peering.applier import ActionApplier
from amqlite.server.peering.hooks import PublishHook
from amqlite.server.peering.registry import LinkRegistry


class _Storage:
    def __init__(self) -> None:
        self.holds = 0
        self.held = 0

    def hold(self) -> None:
        self.holds += 1
        self.held += 1

    def release(self) -> None:
        self.held -= 1


class _Durability:
    def __init__(self) -> None:
        self.storage = _Storage()
        self.marks_pending: dict[Any, Any] = {}


def _applier() -> tuple[ActionApplier, list[str]]:
    calls: list[str] = []
    registry = LinkRegistry()
    registry.conns = {"l1": "conn1", "l2": "conn2"}  # type: ignore[dict-item]
    applier = ActionApplier(
        registry,
        _Durability(),  # type: ignore[arg-type]
        session=lambda vhost: None,  # type: ignore[arg-type,return-value]
        dial=lambda link, address: calls.append(f"dial {link}"),
        pump=lambda: calls.append("pump"),
        turn_ended=lambda: calls.append("turn ended"),
    )
    return applier, calls


sends = st.builds(Send, st.sampled_from(["l1", "l2", "gone"]), st.builds(Heartbeat))


@given(st.lists(st.tuples(st.lists(sends, max_size=4), st.booleans()), max_size=6))
def test_a_turn_of_sends_is_what_the_general_turn_makes(
    turns: list[tuple[list[Action], bool]],
) -> None:
    """Same outbox (per connection, in order), same pumps and turn ends; the
    shortcut takes no journal hold (nothing is written), the general turn one."""
    (fast, fast_calls), (ref, ref_calls) = _applier(), _applier()
    for actions, delivered in turns:
        fast._delivered = ref._delivered = delivered
        fast.apply(list(actions))
        ref._turn(list(actions))
        assert fast._outbox == ref._outbox
        assert fast_calls == ref_calls
        assert fast._delivered == ref._delivered is False
    assert fast.durability.storage.holds == 0  # type: ignore[attr-defined]
    assert ref.durability.storage.holds == len(turns)  # type: ignore[attr-defined]
    assert ref.durability.storage.held == 0  # type: ignore[attr-defined]


# --- a run of deliveries ---------------------------------------------------------------


class _Session:
    """A broker session whose journal span says a message "wrote" when its body
    starts with ``w`` (the applier only reads the span)."""

    def __init__(self, session: Session) -> None:
        self.inner = session
        self.closed = False
        self.last: Message | None = None

    def publish(self, message: Message, *, now: float) -> PublishOutcome:
        self.last = message
        return self.inner.publish(message, now=now)

    def publish_run(self, *args: Any, **kwargs: Any) -> bool:
        return False  # each message through publish (the per-message loop)

    @property
    def journal_span(self) -> tuple[int, int]:
        last = self.last
        return (1, 2) if last is not None and last.body.startswith(b"w") else (0, 0)


class _Kept:
    """The durability calls a delivery makes (and the link's confirms)."""

    def __init__(self) -> None:
        self.storage = _Storage()
        self.marks_pending: dict[Any, Any] = {}
        self.calls: list[Any] = []

    def marks_due(self, px: PeeredExchange) -> None:
        self.calls.append("marks due")

    def when_durable(self, first: int, last: int, committed: Any) -> None:
        self.calls.append((first, last))


def _receiving(exchange_present: bool) -> tuple[ActionApplier, Broker, _Session, _Kept]:
    broker = Broker(node_id="b")
    session = broker.open_session("/")
    if exchange_present:
        session.declare_exchange("x", "topic")
        session.declare_queue("q")
        session.bind("q", "x", "k.#")
    px = PeeredExchange(node_id="b", epoch=1, exchange="x", exchange_type="topic", rand=random)
    link = px.add_link(LinkSettings(name="l1", addresses=(Address("a", 1),)))
    registry = LinkRegistry()
    registry.owner[link.id] = px
    shim, kept = _Session(session), _Kept()

    def confirm(tag: int, now: float) -> list[Action]:
        kept.calls.append(("confirm", tag))
        return []

    link.confirm = confirm  # type: ignore[method-assign]
    applier = ActionApplier(
        registry,
        kept,  # type: ignore[arg-type]
        session=lambda vhost: shim,  # type: ignore[arg-type,return-value]
        dial=lambda link, address: None,
        pump=lambda: None,
        turn_ended=lambda: None,
    )
    return applier, broker, shim, kept


deliveries = st.lists(
    st.tuples(
        st.sampled_from(["k", "k.a", "other"]),
        st.one_of(st.sampled_from([b"", b"t", b"w", b"w2"]), st.binary(max_size=6)),
        st.sampled_from([{}, {"h": 1}, {"bad": object()}]),
        st.sampled_from([{}, {"priority": 3}]),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)  # (a loaded machine passed 200 ms)
@given(deliveries, st.booleans(), st.sampled_from([0, 0, 2]), st.sampled_from([None, 3]))
@example([("k", b"t", {}, {}), ("k", b"w", {}, {}), ("k", b"t", {}, {})], True, 0, None)
@example([("k", b"t", {}, {}), ("k", b"t", {"h": 1}, {}), ("k", b"t", {}, {})], True, 0, 3)
def test_a_run_of_deliveries_is_each_delivered(
    items: list[tuple[str, bytes, dict[str, Any], dict[str, Any]]],
    exchange_present: bool,
    pending: int,
    confirmed: int | None,
) -> None:
    """``_deliver_run`` leaves what ``_deliver`` for each leaves: the queue's
    messages (key, body, headers, properties, mesh identity, in order), the
    confirms due at the turn's end, the deliveries waiting for the journal and
    the durability calls (including with commits already pending, and with an
    exchange gone: nothing routed, confirmed all the same)."""
    run = [
        Deliver(
            "l1",
            10 + i,
            Envelope(MeshId("a", 1, i + 1), key, body, headers, props, "x", ("a",), 1),
        )
        for i, (key, body, headers, props) in enumerate(items)
    ]
    results = []

    async def deliver(applier: ActionApplier, fast: bool) -> None:
        # (a turn's confirms read trio's clock)
        if fast:
            applier._deliver_run(list(run), 0.0)
        else:
            for action in run:
                applier._deliver(action, 0.0)

    for fast in (True, False):
        applier, broker, _, kept = _receiving(exchange_present)
        if pending:
            applier._commits_pending["l1"] = pending
        if confirmed is not None:
            applier._confirms["l1"] = confirmed
        trio.run(deliver, applier, fast)
        held = []
        if exchange_present:
            session = broker.open_session("/")
            while (got := session.get("q", no_ack=True, now=0.0)) is not None:
                m = got[0].message
                held.append((m.routing_key, m.body, m.headers, m.properties, m.mesh))
        results.append(
            (held, applier._confirms, applier._commits_pending, kept.calls, applier._delivered)
        )
    assert results[0] == results[1]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["k", "k.a", "other"]), st.sampled_from([b"", b"t", b"w"])),
        min_size=1,
        max_size=12,
    ),
    st.booleans(),
    st.sampled_from([0, 0, 2]),
    st.sampled_from([None, 3]),
    st.booleans(),
)
@example([("k", b"t"), ("k", b"w"), ("k", b"t")], True, 0, None, False)
def test_a_plain_run_is_delivered_as_its_single_deliveries(
    items: list[tuple[str, bytes]],
    exchange_present: bool,
    pending: int,
    confirmed: int | None,
    one_key: bool,
) -> None:
    """``_deliver_plain_run`` of a ``DeliverRun`` (a compact run received with
    ``deliver_runs``) leaves what ``_deliver_run`` of its single deliveries
    leaves: the queue's messages (key, body, headers, properties, and the same
    peering identity: ``mesh_map``, and the envelope a peering queue would send),
    the confirms, the deliveries waiting for the journal, the durability calls."""
    keys: str | list[str] = "k" if one_key else [k for k, _ in items]
    run = PlainRun("a", 1, 5, keys, [b for _, b in items], "x", ("a",), 1)
    action = DeliverRun("l1", 10, run)
    results = []

    async def deliver(applier: ActionApplier, fast: bool) -> None:
        if fast:
            applier._deliver_plain_run(action, 0.0)
        else:
            applier._deliver_run(action.delivers(), 0.0)

    for fast in (True, False):
        applier, broker, _, kept = _receiving(exchange_present)
        if pending:
            applier._commits_pending["l1"] = pending
        if confirmed is not None:
            applier._confirms["l1"] = confirmed
        trio.run(deliver, applier, fast)
        held = []
        if exchange_present:
            session = broker.open_session("/")
            while (got := session.get("q", no_ack=True, now=0.0)) is not None:
                m = got[0].message
                mesh = m.mesh
                env = mesh if isinstance(mesh, Envelope) else mesh.envelope(
                    m.routing_key, m.body, m.headers, m.properties
                )  # fmt: skip
                held.append((m.routing_key, m.body, m.headers, m.properties, mesh.mesh_map(), env))
        results.append(
            (held, applier._confirms, applier._commits_pending, kept.calls, applier._delivered)
        )
    assert results[0] == results[1]


class _Journal:
    """A broker session that journals the messages whose body starts with ``w``
    (one position each, in publish order) and takes runs through the real
    ``Session.publish_run``; its span is the latest publish's or run's."""

    def __init__(self, session: Session) -> None:
        self.inner = session
        self.closed = False
        self.pos = 0  # the last position appended
        self.span = (0, 0)
        self.wrote: list[int] = []  # the journal position of each message published (0: none)
        self.runs = 0  # the runs publish_run took

    def _write(self, body: bytes) -> int:
        if not body.startswith(b"w"):
            self.wrote.append(0)
            return 0
        self.pos += 1
        self.wrote.append(self.pos)
        return self.pos

    def publish(self, message: Message, *, now: float) -> PublishOutcome:
        outcome = self.inner.publish(message, now=now)
        at = self._write(message.body)
        self.span = (at, at)
        return outcome

    def publish_run(self, exchange: str, key: str, bodies: list[bytes], **kwargs: Any) -> bool:
        if not self.inner.publish_run(exchange, key, bodies, **kwargs):
            return False
        self.runs += 1
        written = [at for at in map(self._write, bodies) if at]
        self.span = (written[0], written[-1]) if written else (0, 0)
        return True

    @property
    def journal_span(self) -> tuple[int, int]:
        return self.span


class _Commits:
    """Durability whose commits the test makes, in order."""

    def __init__(self) -> None:
        self.storage = _Storage()
        self.marks_pending: dict[Any, Any] = {}
        self.marks = 0
        self.waiting: list[tuple[int, Any]] = []

    def marks_due(self, px: PeeredExchange) -> None:
        self.marks += 1

    def when_durable(self, first: int, last: int, committed: Any) -> None:
        self.waiting.append((last, committed))


def _committing(action: DeliverRun, fast: bool, exchange_present: bool, early: int) -> Any:
    """Deliver ``action`` (``fast``: ``_deliver_plain_run``, else ``_deliver_run``
    of its single deliveries), commit the journal in order (``early`` commits
    before the turn's end), checking each confirm against the commits; returns
    what the queue holds, the last tag confirmed, the commits pending, whether
    marks were due and what each message wrote."""
    applier, broker, plain, _ = _receiving(exchange_present)
    shim, commits = _Journal(plain.inner), _Commits()
    applier._session = lambda vhost: shim  # type: ignore[assignment,method-assign,return-value]
    applier.durability = commits  # type: ignore[assignment]
    link = applier.registry.link("l1")
    assert link is not None
    committed_at = 0
    confirmed = 0

    def confirm(tag: int, now: float) -> list[Action]:
        nonlocal confirmed
        for i, at in enumerate(shim.wrote[: tag - action.tag + 1]):  # what the tag covers
            assert at <= committed_at, (tag, i, at, committed_at)
        confirmed = max(confirmed, tag)
        return []

    link.confirm = confirm  # type: ignore[method-assign]

    def commit(done: int) -> None:
        nonlocal committed_at
        last, committed = commits.waiting[done]
        committed_at = max(committed_at, shim.pos if last == ALL_APPENDED else last)
        committed(True)

    async def deliver() -> None:
        if fast:
            applier._deliver_plain_run(action, 0.0)
        else:
            applier._deliver_run(action.delivers(), 0.0)
        done = 0
        while done < min(early, len(commits.waiting)):
            commit(done)
            done += 1
        applier._confirm_safe()  # the turn's end
        while done < len(commits.waiting):
            commit(done)
            done += 1

    trio.run(deliver)
    if fast:
        assert shim.runs == (1 if exchange_present else 0)  # the run was taken whole
    held = []
    if exchange_present:
        session = broker.open_session("/")
        while (got := session.get("q", no_ack=True, now=0.0)) is not None:
            m = got[0].message
            held.append((m.routing_key, m.body, m.headers, m.properties, m.mesh.mesh_map()))
    return held, confirmed, dict(applier._commits_pending), commits.marks > 0, shim.wrote


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([b"", b"t", b"w", b"w2"]), min_size=1, max_size=12),
    st.sampled_from(["k.a", "other"]),
    st.booleans(),
    st.integers(0, 12),
)
@example([b"t", b"w", b"t"], "k.a", True, 0)
def test_a_plain_run_published_whole_confirms_no_sooner(
    bodies: list[bytes], key: str, exchange_present: bool, early: int
) -> None:
    """``_deliver_plain_run`` of a one-key run (published whole through
    ``Session.publish_run``) against ``_deliver_run`` of its single deliveries,
    the journal committing in order (``early`` commits before the turn's end,
    the rest after): the same queue contents (key, body, peering identity), every
    tag confirmed in the end, and no confirm ever before the commit of a message
    it covers (the run's may come later than each's, never sooner)."""
    run = PlainRun("a", 1, 5, key, list(bodies), "x", ("a",), 1)
    action = DeliverRun("l1", 10, run)
    results = [_committing(action, fast, exchange_present, early) for fast in (True, False)]
    assert results[0] == results[1]
    assert results[0][1] == 10 + len(bodies) - 1  # every tag confirmed


# --- a read's client publishes as one run --------------------------------------------------


def _sending(overflow: OverflowPolicy) -> tuple[ActionApplier, PublishHook, Any, list[str]]:
    px = PeeredExchange(node_id="a", epoch=1, exchange="x", exchange_type="topic", rand=random)
    link = px.add_link(
        LinkSettings(
            name="l1", addresses=(Address("b", 1),), buffer_bytes=600, overflow=overflow,
            max_in_flight=3,
        )
    )  # fmt: skip
    link.start(0.0)
    link.connected(0.0)
    link.receive(Hello("b", "l1", "/", "x", "topic", PeeringMode.PUBLISH, 5), 0.0)
    link.receive(Interest(True, (BindingKey.of("k.#"),), (), 0, "0" * 16), 0.0)
    registry = LinkRegistry()
    registry.owner[link.id] = px
    registry.conns = {link.id: "conn"}  # type: ignore[dict-item]
    calls: list[str] = []
    applier = ActionApplier(
        registry,
        _Durability(),  # type: ignore[arg-type]
        session=lambda vhost: None,  # type: ignore[arg-type,return-value]
        dial=lambda link, address: None,
        pump=lambda: None,
        turn_ended=lambda: calls.append("turn ended"),
    )
    return applier, PublishHook(applier, px), link, calls


def _forwarded(applier: ActionApplier) -> list[tuple[int, MeshId]]:
    out: list[tuple[int, MeshId]] = []
    for message in applier._outbox.get("conn", []):  # type: ignore[call-overload]
        run = message.forwards() if isinstance(message, Forwards) else [message]
        out += [(f.seq, f.envelope.mesh_id) for f in run if isinstance(f, Forward)]
    return out


publishes = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["k.a", "other"]),
            st.booleans(),  # mandatory
            st.booleans(),  # a local queue took it
        ),
        st.sampled_from(["read ends", "has room", "ack"]),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(
    publishes,
    st.sampled_from([OverflowPolicy.BLOCK, OverflowPolicy.DROP_OLDEST]),
    st.sampled_from(
        ["sends", "sends; one receives", "receives", "queue-fed", "queue-fed; receives"]
    ),
)
def test_a_run_of_client_publishes_goes_as_each_would(
    steps: list[Any], overflow: OverflowPolicy, ends: str
) -> None:
    """The dispatcher's way for a publish that is not mandatory (``published_later``:
    offered with the rest of the read, before the next flush) against ``published``
    for each: the same forwards in the same order, the same answers to mandatory
    publishes and ``has_room``, the same counters and held (blocked) messages; a
    mandatory publish or ``has_room`` in between first offers what waits. With link
    ends that take no offers (a receiving end; a subscriber's, fed by a peering
    queue) beside the sending one or alone (then nothing joins a run:
    ``offers_taken``, which must say whether some end sends unfed)."""

    async def run() -> list[Any]:
        seen = []
        for fast in (True, False):
            applier, hook, link, calls = _sending(overflow)
            px = hook.px
            if "receives" in ends:  # the acceptor end of c's link in mode publish
                px.attach(Hello("c", "l2", "/", "x", "topic", PeeringMode.PUBLISH, 3), 0.0)
            if "queue-fed" in ends:  # the acceptor end of d's link in mode subscribe
                px.attach(Hello("d", "l3", "/", "x", "topic", PeeringMode.SUBSCRIBE, 4), 0.0)
            if not ends.startswith("sends"):
                px.remove_link(link.id, 0.0)
            assert px.offers_taken is any(
                end.sends and not end.queue_fed for end in px.links.values()
            )
            assert px.offers_taken is ends.startswith("sends")
            answers: list[Any] = []
            for i, step in enumerate(steps):
                if step == "read ends":
                    applier.offer_runs()
                    continue
                if step == "ack":
                    if link.id not in px.links:
                        continue
                    applier.offer_runs()
                    assert link.log is not None
                    applier.apply(link.receive(Ack(1, link.log.next_seq - 1).to_map(), 0.0))
                    continue
                env = hook.px.envelope("k.a" if step == "has room" else step[0], b"m" * 100)
                if step == "has room":
                    answers.append(hook.has_room(env))
                    continue
                _key, mandatory, routed = step
                outcome = PublishOutcome.ROUTED if routed else PublishOutcome.UNROUTABLE
                if fast and not mandatory:
                    before = len(calls)
                    hook.published_later(env, outcome)
                    if px.offers_taken:
                        assert "turn ended" in calls  # the flusher will run
                    else:  # nothing to offer: no run, no turn
                        assert len(calls) == before and not hook.run
                else:
                    taken = hook.published(env, outcome, 0.0)
                    if mandatory:  # (only a mandatory publish's reply depends on it)
                        answers.append((i, taken))
            applier.offer_runs()
            held = applier.registry.held.get(link.id)
            seen.append(
                (
                    _forwarded(applier),
                    answers,
                    link.counters,
                    link.skipped,
                    [e.mesh_id for e, _ in held.envelopes] if held is not None else [],
                )
            )
        return seen

    fast, ref = trio.run(run)
    assert fast == ref


# --- a peer.batch frame of deliveries ------------------------------------------------------


def test_a_batch_frame_is_one_journal_turn() -> None:
    """Every delivery of a ``peer.batch`` frame is published inside the journal
    hold that the frame's turn end (confirms, receive marks) closes: one commit
    writes the deliveries with the marks that cover them, so a kill -9 cannot
    keep the ones without the others (which the sender would then duplicate)."""
    applier, _, shim, kept = _receiving(True)
    px = PeeredExchange(node_id="b", epoch=1, exchange="x", exchange_type="topic", rand=random)
    end, _ = px.attach(Hello("a", "l9", "/", "x", "topic", PeeringMode.PUBLISH, 4), 0.0)
    assert end is not None and end.receives
    applier.registry.owner[end.id] = px
    holds: list[int] = []
    publish = shim.publish

    def watched(message: Message, *, now: float) -> PublishOutcome:
        holds.append(kept.storage.held)
        return publish(message, now=now)

    shim.publish = watched  # type: ignore[method-assign]

    def run(seq: int, n: int) -> dict[str, Any]:
        envs = [
            Envelope(MeshId("a", 4, seq + i), "k.a", b"w", {}, {"persistent": True}, "x", ("a",), 1)
            for i in range(n)
        ]
        return Forwards(seq, envs).to_map()

    frame = {"type": "peer.batch", "msgs": [run(1, 2), Heartbeat().to_map(), run(3, 2)]}

    async def receive() -> None:
        applier.receive(end, frame, 1.0)

    trio.run(receive)
    assert holds == [1, 1, 1, 1]  # each inside the frame's one hold
    assert kept.storage.held == 0 and kept.storage.holds >= 1


# --- the dispatcher's forward-only path ----------------------------------------------------

_peered_publish = st.builds(
    ev.Publish,
    id=st.integers(0, 99),
    exchange=st.sampled_from(["x", "x", "x", "y"]),
    key=st.sampled_from(["k.a", "other"]),
    body=st.binary(max_size=40),
    headers=st.one_of(st.just({}), st.just({"h": 1})),
    props=st.one_of(st.just({}), st.just({"persistent": True}), st.just({"priority": 3})),
    mandatory=st.booleans(),
    confirm=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            _peered_publish,
            st.sampled_from(["bind", "unbind", "read ends", "trace", "internal", "delete"]),
        ),
        max_size=25,
    )
)
def test_a_forward_only_publish_is_what_the_general_path_does(steps: list[Any]) -> None:
    """``RequestDispatcher._publish`` on a peered exchange with no queue bound here
    (``Session.routes_nowhere``: no ``Message``, no routing) against the general
    path (``routes_nowhere`` always False): the same replies, the same forwards in
    the same order, the same messages in the local queues; with bindings made and
    removed, the trace hook on, the exchange internal or gone in between, and
    mandatory, confirmed, persistent publishes and ones with headers or
    properties beside the plain ones."""

    async def run() -> list[Any]:
        seen = []
        for _fast in (True, False):
            applier, plain, link, _calls = _sending(OverflowPolicy.DROP_OLDEST)
            hook = _RecordingHook(applier, plain.px)
            broker = Broker()
            session = broker.open_session("/")
            session.declare_exchange("x", "topic")
            session.declare_exchange("y", "direct")
            session.declare_queue("q")
            user = AuthenticatedUser("u", Permissions(".*", ".*", ".*"))
            dispatcher = RequestDispatcher(session, user, "/", dict, "i", {"x": hook})
            replies: list[Any] = []
            for i, step in enumerate(steps):
                if step in ("bind", "unbind"):
                    with contextlib.suppress(AmqliteError):  # (gone: "delete")
                        getattr(session, step)("q", "x", "k.#")
                elif step == "read ends":
                    applier.offer_runs()
                elif step == "trace":
                    broker.tracer = None if broker.tracer is not None else _Tracer()
                elif step == "internal":
                    exchange = broker.vhost("/").exchanges.get("x")  # type: ignore[union-attr]
                    if exchange is not None:
                        exchange.internal = not exchange.internal
                elif step == "delete":
                    broker.vhost("/").exchanges.pop("x", None)  # type: ignore[union-attr]
                else:
                    replies.append(dispatcher.publish(step, float(i)))
            applier.offer_runs()
            host = broker.vhost("/")
            assert host is not None
            queued = [
                (m.routing_key, m.body, m.headers, m.properties)
                for m, _, _ in host.queues["q"].ready
            ]
            forwarded = [
                (e.mesh_id, e.routing_key, e.body, e.headers, e.properties)
                for message in applier._outbox.get("conn", [])  # type: ignore[call-overload]
                for e in (message.envelopes if isinstance(message, Forwards) else [])
            ]
            seen.append((replies, queued, forwarded, link.counters, link.skipped, hook.calls))
            Session.routes_nowhere = _general  # type: ignore[method-assign]  # the second: general
        return seen

    routes_nowhere = Session.routes_nowhere
    try:
        fast, ref = trio.run(run)
    finally:
        Session.routes_nowhere = routes_nowhere  # type: ignore[method-assign]
    assert fast == ref


#: what each kind of publish in the strategies below carries as properties
_KIND_PROPS: dict[str, dict[str, bool]] = {
    "persistent": {"persistent": True},
    "props": {"persistent": False},
}


def _publishes(exchange: str, keys: list[str], kinds: list[str]) -> st.SearchStrategy[ev.Publish]:
    """Publishes to ``exchange`` with one of ``keys``, each of one of ``kinds``:
    plain, with headers, with properties (``_KIND_PROPS``), confirmed or mandatory."""
    return st.builds(
        lambda i, key, kind: ev.Publish(
            i,
            exchange,
            key,
            b"",
            headers={"h": 1} if kind == "headers" else {},
            props=dict(_KIND_PROPS.get(kind, {})),
            confirm=kind == "confirm",
            mandatory=kind == "mandatory",
        ),
        st.integers(0, 999),
        st.sampled_from(keys),
        st.sampled_from(kinds),
    )


_forwarded_publish = _publishes(
    "x", ["k.a", "k.a", "other"], ["plain"] * 4 + ["headers", "persistent", "confirm", "mandatory"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(["k.a", "k.a", "k.b", "other"]),
                st.integers(1, 8),
                st.sampled_from([10, 100, 100]),
            ),
            _forwarded_publish,
            st.sampled_from(["read ends", "ack", "has room", "held back", "bind", "trace"]),
        ),
        max_size=20,
    ),
    st.sampled_from([OverflowPolicy.BLOCK, OverflowPolicy.DROP_OLDEST]),
    st.sampled_from(["sends", "receives"]),
)
def test_a_forwarded_run_is_its_publishes_each(
    steps: list[Any], overflow: OverflowPolicy, ends: str
) -> None:
    """A client's read of plain publishes on a sending site (no queue bound to the
    peered exchange here) taken as one run (``RequestDispatcher.publish_run`` ->
    ``PublishHook.forwarded_run``: the keys and bodies as read, no event per
    message) against each publish through ``RequestDispatcher.publish``: the same
    replies, the same forwards (mesh ids, keys, bodies, maps) in the same order, the
    same mesh ids used up, the same messages held by a full ``block`` link and the
    same push-back (``held_back``, ``has_room``), the same counters, skipped and
    turns; with single publishes (headers, persistent, confirmed, mandatory)
    between runs, acks freeing room, a queue bound here and unbound (the run
    falls back), the trace on and off, and no end taking offers (the mints are
    only used up). Checked to fail when ``forwarded_run`` uses up one mint less
    with no end taking offers, and when it does not offer the waiting envelopes
    first."""

    async def run() -> list[Any]:
        seen = []
        for fast in (True, False):
            applier, hook, link, calls = _sending(overflow)
            px = hook.px
            if ends == "receives":  # the acceptor end of c's link in mode publish, alone
                px.attach(Hello("c", "l2", "/", "x", "topic", PeeringMode.PUBLISH, 3), 0.0)
                px.remove_link(link.id, 0.0)
            broker = Broker()
            session = broker.open_session("/")
            session.declare_exchange("x", "topic")
            session.declare_queue("q")
            user = AuthenticatedUser("u", Permissions(".*", ".*", ".*"))
            dispatcher = RequestDispatcher(session, user, "/", dict, "i", {"x": hook})
            dispatcher._write_ok["x"] = True  # (as a first publish leaves it)
            replies: list[Any] = []
            answers: list[Any] = []
            sent = 0
            bound = False
            for i, step in enumerate(steps):
                now = float(i)
                if step == "read ends":
                    applier.offer_runs()
                elif step == "ack":
                    if link.id in px.links and link.log is not None:
                        applier.offer_runs()
                        if link.log.in_flight:  # (what was sent)
                            upto = link.log.gone_upto + link.log.in_flight
                            applier.apply(link.receive(Ack(1, upto).to_map(), now))
                elif step == "has room":
                    answers.append(("room", hook.has_room(px.envelope("k.a", b"r" * 100))))
                elif step == "held back":
                    answers.append(("held", dispatcher.held_back(), hook.refusing()))
                elif step == "bind":
                    getattr(session, "unbind" if bound else "bind")("q", "x", "k.#")
                    bound = not bound
                elif step == "trace":
                    broker.tracer = None if broker.tracer is not None else _Tracer()
                elif isinstance(step, ev.Publish):
                    body, sent = b"p%d" % sent, sent + 1
                    replies.append(dispatcher.publish(dataclasses.replace(step, body=body), now))
                else:
                    key, n, size = step
                    bodies = [b"%d:" % (sent + j) + b"m" * size for j in range(n)]
                    read = PublishRun(sent, "x", key, bodies)
                    sent += n
                    if fast and dispatcher.publish_run(read, now):
                        replies += [None] * n
                    else:
                        replies += [dispatcher.publish(p, now) for p in read.publishes()]
                answers.append(("sent", sorted(dispatcher.peered_sent)))
            applier.offer_runs()
            forwarded = [
                (e.mesh_id, e.routing_key, e.body, e.headers, e.properties, e.path, e.hops)
                for message in applier._outbox.get("conn", [])  # type: ignore[call-overload]
                for e in (
                    message.envelopes
                    if isinstance(message, Forwards)
                    else [message.envelope]
                    if isinstance(message, Forward)
                    else []
                )
            ]
            held = applier.registry.held.get(link.id)
            host = broker.vhost("/")
            assert host is not None
            queued = [(m.routing_key, m.body, m.mesh) for m, _, _ in host.queues["q"].ready]
            seen.append(
                (
                    replies,
                    answers,
                    forwarded,
                    queued,
                    px._minted,
                    link.counters,
                    link.skipped,
                    [e.mesh_id for e, _ in held.envelopes] if held is not None else [],
                    calls,
                )
            )
        return seen

    fast, ref = trio.run(run)
    assert fast == ref


class _RecordingHook(PublishHook):
    """Which of the hook's ways each publish took (a persistent message must take
    ``published``, whose ``peering.out`` record a durable log needs)."""

    def __init__(self, applier: ActionApplier, px: PeeredExchange) -> None:
        super().__init__(applier, px)
        self.calls: list[tuple[str, str, PublishOutcome]] = []

    def published(
        self, envelope: Envelope, outcome: PublishOutcome, now: float, publish_key: str = ""
    ) -> bool:
        self.calls.append(("now", envelope.routing_key, outcome))
        return super().published(envelope, outcome, now, publish_key)

    def published_later(self, envelope: Envelope, outcome: PublishOutcome) -> None:
        self.calls.append(("later", envelope.routing_key, outcome))
        super().published_later(envelope, outcome)

    def forwarded_later(self, publish: PlainPublish) -> None:
        self.calls.append(("later", publish.key, PublishOutcome.UNROUTABLE))
        super().forwarded_later(publish)


def _general(session: Session, exchange: str) -> bool:
    return False


class _Tracer:
    def __init__(self) -> None:
        self.seen = 0

    def published(self, *args: Any) -> None:
        self.seen += 1


class _AckingSession:
    """What ``PeeringQueue.acked`` asks of its broker session: the acks it made."""

    closed = False

    def __init__(self) -> None:
        self.acks: list[tuple[int, bool]] = []

    def ack(self, dtag: int, *, multiple: bool = False, now: float = 0.0) -> None:
        self.acks.append((dtag, multiple))


@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(0, 2)), max_size=8),
    st.lists(st.integers(0, 8), max_size=8),
)
def test_a_peering_queue_settles_blocks_as_single_deliveries(
    blocks: list[tuple[int, int]], acks: list[int]
) -> None:
    """``PeeringQueue.taken`` holding a batch the link took as one run as one block
    (``ActionApplier.feed``) against one entry per delivery (the general path): the
    same acks of the queue's deliveries for every cumulative ack of the
    subscriber, acks up to inside a block included, and the same deliveries left.
    Checked to fail with the split of a block one off."""
    from amqlite.server.peering.peering_queue import PeeringQueue

    fast, ref = PeeringQueue.__new__(PeeringQueue), PeeringQueue.__new__(PeeringQueue)
    for pq in (fast, ref):
        pq.taken = deque()
        pq.session = _AckingSession()  # type: ignore[assignment]
    seq, dtag = 1, 1
    for n, gap in blocks:
        dtag += gap  # (tags skipped: filtered or settled deliveries between batches)
        fast.taken.append((seq, dtag, n))
        ref.taken.extend((seq + i, dtag + i, 1) for i in range(n))
        seq, dtag = seq + n, dtag + n
    upto = 0
    for step in acks:
        upto += step
        fast.acked(upto, 1.0)
        ref.acked(upto, 1.0)
        assert fast.session.acks == ref.session.acks  # type: ignore[attr-defined]
        expanded = [(s + i, d + i, 1) for s, d, n in fast.taken for i in range(n)]
        assert expanded == list(ref.taken)
        assert all(n > 0 for _, _, n in fast.taken)


def _subscribers_remote() -> tuple[ActionApplier, RequestDispatcher, Any, Any, Session]:
    """A subscriber's remote: exchange ``y`` with one accepting end in mode
    subscribe (up), its durable peering queue bound to ``y`` with ``k.#``, and a
    client's dispatcher with the exchange's publish hook."""
    from amqlite.server.peering.peering_queue import PeeringQueue

    broker = Broker(node_id="b")
    session = broker.open_session("/")
    session.declare_exchange("y", "topic")
    px = PeeredExchange(node_id="b", epoch=1, exchange="y", exchange_type="topic", rand=random)
    hello = Hello("a", "l", "/", "y", "topic", PeeringMode.SUBSCRIBE, 5, None, lease=60.0)
    link, _ = px.attach(hello, 0.0)
    assert link is not None and link.queue_fed
    registry = LinkRegistry()
    registry.owner[link.id] = px
    registry.conns = {link.id: "conn"}  # type: ignore[dict-item]
    applier = ActionApplier(
        registry,
        _Durability(),  # type: ignore[arg-type]
        session=lambda vhost: session,
        dial=lambda link, address: None,
        pump=lambda: None,
        turn_ended=lambda: None,
    )
    pq = PeeringQueue(broker, px, link, prefetch=7, now=0.0, on_deliveries=applier.feed)
    registry.queues[link.id] = pq
    session.bind(pq.name, "y", "k.#")
    user = AuthenticatedUser("u", Permissions(".*", ".*", ".*"))
    dispatcher = RequestDispatcher(session, user, "/", dict, "i", {"y": PublishHook(applier, px)})
    return applier, dispatcher, link, pq, session


_subscribed_publish = _publishes(
    "y",
    ["k.a", "k.a", "k.b", "other"],
    ["plain"] * 6 + ["headers", "props", "confirm", "mandatory"],
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(_subscribed_publish, min_size=1, max_size=9),
            st.sampled_from(["feed", "ack", "ack all", "filter"]),
        ),
        max_size=14,
    )
)
def test_a_peering_queue_sends_its_stamped_messages_as_envelopes(steps: list[Any]) -> None:
    """A subscriber's remote whose plain publishes are minted as stamps
    (``PeeredExchange.stamp``) and whose peering queue hands a batch of them to
    its link end as one run (``applier._stamped``) against the general path
    (every publish minted as an envelope, the queue's deliveries as their
    envelopes): the same replies, the same frames to the subscriber (byte for
    byte), the same messages settled in the queue and the same link counters;
    with headers, properties, confirmed and mandatory publishes beside the plain
    ones, keys the queue does not take, partial acks and a filter on and off.
    Checked to fail with the stamps' seqs one off."""
    from amqlite.server.peering import applier as applier_module

    async def run() -> list[Any]:
        seen = []
        for _fast in (True, False):
            applier, dispatcher, link, pq, _ = _subscribers_remote()
            replies: list[Any] = []
            frames: list[bytes] = []
            sent = 0
            for step in steps:
                if step == "feed":
                    pq.push()
                elif step in ("ack", "ack all"):
                    log = link.log
                    upto = log.last_seq if step == "ack all" else log.gone_upto + log.in_flight // 2
                    applier.receive(link, Ack(1, upto).to_map(), 1.0)
                elif step == "filter":
                    link.remote_filter = None if link.remote_filter else "TRUE"
                else:
                    for p in step:  # (a body each: the frames show any message's)
                        body, sent = b"m%d" % sent, sent + 1
                        replies.append(dispatcher.publish(dataclasses.replace(p, body=body), 1.0))
                outbox = applier._outbox.pop("conn", [])  # type: ignore[call-overload]
                frames += peering_cbor.encode_frames(outbox, 65536)
            taken = [(s + i, d + i) for s, d, n in pq.taken for i in range(n)]
            queue = pq.host.queues[pq.name]
            seen.append((replies, frames, queue.count(), taken, link.counters))
            applier_module._stamped = lambda deliveries: None  # the second: general
            PublishHook.stamps = lambda self: False  # type: ignore[method-assign]
        return seen

    stamped, stamps = applier_module._stamped, PublishHook.stamps
    try:
        fast, ref = trio.run(run)
    finally:
        applier_module._stamped = stamped
        PublishHook.stamps = stamps  # type: ignore[method-assign]
    assert fast == ref


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from(["k.a", "k.b", "other"]), st.integers(1, 9)),
            _subscribed_publish,
            st.sampled_from(["feed", "ack", "ack all", "filter", "unbind", "q2"]),
        ),
        max_size=16,
    )
)
def test_a_run_on_a_subscribers_remote_is_its_publishes_each(steps: list[Any]) -> None:
    """A client's read of plain publishes on a subscriber's remote taken as one run
    (``RequestDispatcher.publish_run``: the stamps minted as a range,
    ``PeeredExchange.stamp_run``) against each publish through
    ``RequestDispatcher.publish`` (the general path): the same mints, the same
    frames to the subscriber (byte for byte), the same messages in the peering
    queue and in a second queue bound with one key, the same link counters; with
    single publishes (headers, properties, confirm, mandatory) between runs,
    partial acks, a filter, the queue's binding gone (a forward-only site: the run
    falls back) and back. Checked to fail with ``stamp_run``'s seqs one off."""

    async def run() -> list[Any]:
        seen = []
        for fast in (True, False):
            applier, dispatcher, link, pq, session = _subscribers_remote()
            dispatcher._write_ok["y"] = True  # (as a first publish leaves it)
            replies: list[Any] = []
            frames: list[bytes] = []
            sent = 0
            bound, q2 = True, False
            for step in steps:
                if step == "feed":
                    pq.push()
                elif step in ("ack", "ack all"):
                    log = link.log
                    upto = log.last_seq if step == "ack all" else log.gone_upto + log.in_flight // 2
                    applier.receive(link, Ack(1, upto).to_map(), 1.0)
                elif step == "filter":
                    link.remote_filter = None if link.remote_filter else "TRUE"
                elif step == "unbind":
                    if bound:
                        session.unbind(pq.name, "y", "k.#")
                    else:
                        session.bind(pq.name, "y", "k.#")
                    bound = not bound
                elif step == "q2":
                    if not q2:
                        session.declare_queue("q2")
                        session.bind("q2", "y", "k.a")
                        q2 = True
                elif isinstance(step, ev.Publish):
                    body, sent = b"m%d" % sent, sent + 1
                    replies.append(dispatcher.publish(dataclasses.replace(step, body=body), 1.0))
                else:
                    key, n = step
                    bodies = [b"m%d" % (sent + i) for i in range(n)]
                    read = PublishRun(sent, "y", key, bodies)
                    sent += n
                    if not (fast and dispatcher.publish_run(read, 1.0)):
                        replies += [dispatcher.publish(p, 1.0) for p in read.publishes()]
                    else:
                        replies += [None] * n
                outbox = applier._outbox.pop("conn", [])  # type: ignore[call-overload]
                frames += peering_cbor.encode_frames(outbox, 65536)
            taken = [(s + i, d + i) for s, d, n in pq.taken for i in range(n)]
            queues = pq.host.queues
            second = queues.get("q2")
            held = [] if second is None else [(e[0].body, e[0].mesh) for e in second.ready]
            counted = (queues[pq.name].count(), second.count() if second else None)
            px = pq.px
            seen.append((replies, frames, counted, held, taken, link.counters, px._minted))
        return seen

    fast, ref = trio.run(run)
    assert fast == ref
