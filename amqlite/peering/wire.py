"""The peering messages: plain maps (the shell CBOR-encodes them), one class each.

Every message is a frozen dataclass with ``to_map()``; :func:`from_map` validates
a received map and returns the message, or raises
:class:`~amqlite.peering.errors.PeeringProtocolError` naming the message type and
the field. Unknown keys are ignored (a newer remote may add some). This module is
independent of :mod:`amqlite.protocol`; a later step maps these maps onto protocol
methods. Shapes (``?`` = may be null):

=================  ===============================================================
``peer.hello``     version 2, node, link, vhost, exchange, exchange_type, mode (1-3),
                   epoch (the sender's log epoch, 0 when this end never sends),
                   resume? [epoch, seq]: the last seq of the other end's log this end
                   holds, so it can skip what already arrived; heartbeat (seconds, 0 off)
``peer.refused``   code, text
``peer.interest``  full (bool), add [[key, {arguments}]...], remove [...],
                   count and digest of the advertiser's whole set after this message
``peer.resync``    (no fields): the sender's digest differs; advertise the full set
``peer.filter``    selector?: the receiver's consumers want only the messages this
                   JMS selector accepts (null: every message); subscribe mode
``peer.forward``   seq, id [origin node, origin epoch, origin seq], path [node...],
                   hops, exchange, routing_key, headers {}, properties {}, body (bytes)
``peer.forwards`` seq (of the first), exchange, path, hops, msgs [[origin node,
                   origin epoch, origin seq, routing_key, headers, properties,
                   body]...]: a run of forwards with consecutive seqs and the same
                   exchange, path and hops, stated once (the shell writes runs)
``peer.ack``       epoch, seq: every message of that log epoch up to seq is settled
``peer.heartbeat`` (no fields)
=================  ===============================================================
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar, NamedTuple, overload

from .errors import PeeringProtocolError
from .interest import EXCHANGE_TYPES, BindingKey
from .mode import PeeringMode

VERSION = 3  # 2: peer.forwards; 3: its compact form (origin, keys, bodies)
_EMPTY: Mapping[str, Any] = {}


class MeshId(NamedTuple):
    """A message's identity across the whole mesh: minted once, where it was
    first published, and carried unchanged on every hop."""

    node: str
    epoch: int
    seq: int


_ONE_NODE_PATHS: dict[str, tuple[str]] = {}


def one_node_path(node: str) -> tuple[str]:
    """``(node,)``, one tuple per node: the path of every message published on
    ``node`` as it leaves, shared rather than made per message (a tuple made per
    message lives in the sending log until acked: one more object per message for
    the cyclic GC's young generation to count and scan)."""
    path = _ONE_NODE_PATHS.get(node)
    if path is None:
        if len(_ONE_NODE_PATHS) >= 1024:  # (a broker has one node id; tests make many)
            _ONE_NODE_PATHS.clear()
        path = _ONE_NODE_PATHS[node] = (node,)
    return path


@dataclass(slots=True)  # per-message: not frozen (frozen init costs 4x); never mutate
class Envelope:
    """A message as peering moves it: the broker message plus its mesh identity,
    the brokers it passed (``path``) and the links it crossed (``hops``)."""

    mesh_id: MeshId
    routing_key: str
    body: bytes
    headers: Mapping[str, Any] = field(default_factory=dict)
    properties: Mapping[str, Any] = field(default_factory=dict)
    exchange: str = ""
    path: tuple[str, ...] = ()
    hops: int = 0
    _size: int = field(default=-1, compare=False, repr=False)  # size(), once known

    def onward(self, node: str) -> Envelope:
        """The envelope as ``node`` sends it on: one more broker on the path, one more hop."""
        path, size = self.path, self._size
        return Envelope(
            self.mesh_id,
            self.routing_key,
            self.body,
            self.headers,
            self.properties,
            self.exchange,
            (*path, node) if path else one_node_path(node),  # (published here: the usual case)
            self.hops + 1,
            (size if size >= 0 else self.size()) + 16 + len(node),  # what size() would say
        )

    def mesh_map(self) -> dict[str, Any]:
        """The identity, path and hops as plain data (kept with a message in a
        peering queue: ``Message.mesh``); :meth:`from_mesh_map` reads it back."""
        mesh_id = self.mesh_id
        return {
            "id": [mesh_id.node, mesh_id.epoch, mesh_id.seq],
            "path": list(self.path),
            "hops": self.hops,
        }

    @classmethod
    def from_mesh_map(
        cls,
        m: Mapping[str, Any],
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any],
        properties: Mapping[str, Any],
        exchange: str,
    ) -> Envelope:
        """The envelope of a message kept with :meth:`mesh_map`; raises
        PeeringProtocolError when ``m`` is not such a map."""
        mesh_id, path, hops = m.get("id"), m.get("path"), m.get("hops")
        ok = (
            isinstance(mesh_id, list | tuple)
            and len(mesh_id) == 3
            and isinstance(mesh_id[0], str)
            and all(type(v) is int and v >= 0 for v in mesh_id[1:])
            and isinstance(path, list | tuple)
            and all(isinstance(p, str) for p in path)
            and type(hops) is int
            and hops >= 0
        )
        if not ok:
            raise PeeringProtocolError(f"not a peering identity: {dict(m)!r}")
        assert isinstance(mesh_id, list | tuple) and isinstance(path, list | tuple)
        return cls(
            MeshId(mesh_id[0], mesh_id[1], mesh_id[2]),
            routing_key,
            body,
            headers,
            properties,
            exchange,
            tuple(path),
            hops,  # type: ignore[arg-type]
        )

    def size(self) -> int:
        """Roughly the encoded size, for the byte cap (worked out once)."""
        n = self._size
        if n >= 0:
            return n
        path = self.path
        n = 64 + len(self.body) + len(self.routing_key) + len(self.exchange) + 16 * len(path)
        for p in path:
            n += len(p)
        for fields in (self.headers, self.properties):
            if fields:
                for name, value in fields.items():
                    t = type(value)
                    n += 8 + len(name) + (len(value) if t is str or t is bytes else 8)
        self._size = n
        return n


class MeshStamp(NamedTuple):
    """A received plain message's peering identity, path and hops (and the
    exchange it came on) as ``Message.mesh`` holds it for a message of a
    :class:`PlainRun` published straight into the local exchange: what its
    :class:`Envelope` would say, without the envelope (and its mesh id and two
    empty maps). :meth:`envelope` gives that envelope when one is needed (a
    subscriber's peering queue sends the message on)."""

    node: str
    epoch: int
    seq: int
    exchange: str
    path: tuple[str, ...]
    hops: int

    def mesh_map(self) -> dict[str, Any]:
        """:meth:`Envelope.mesh_map` of the envelope it stands for."""
        return {"id": [self.node, self.epoch, self.seq], "path": list(self.path), "hops": self.hops}

    def envelope(
        self,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any],
        properties: Mapping[str, Any],
    ) -> Envelope:
        return Envelope(
            MeshId(self.node, self.epoch, self.seq),
            routing_key,
            body,
            headers,
            properties,
            self.exchange,
            self.path,
            self.hops,
        )


_new_tuple = tuple.__new__  # a named tuple without its Python-level __new__
_repeat = itertools.repeat


class PlainRun(Sequence[Envelope]):
    """The envelopes of a received compact ``peer.forwards`` run, kept as the run's
    parts (origin, keys, bodies, exchange, path, hops): the i-th is
    ``Envelope(MeshId(node, epoch, first + i), keys[i], bodies[i], {}, {},
    exchange, path, hops)``, made when asked for (indexing, iterating: a new
    object each time; a slice is a PlainRun again). Equal to any sequence of the
    same envelopes.

    Why it exists: the receiving broker publishes such a run's messages straight
    into its exchange (``Deliver`` of each, or one :class:`~amqlite.peering.actions.DeliverRun`),
    where each message needs its key, its body and a :class:`MeshStamp` only; an
    envelope, a mesh id and a ``Deliver`` per message were about a tenth of that
    broker's time per peered message, and three more objects for the cyclic
    GC to count. ``tests/peering/test_fast_paths.py`` checks a run against the
    list the checked decoder gives."""

    __slots__ = ("bodies", "epoch", "exchange", "first", "hops", "keys", "node", "path")

    def __init__(
        self,
        node: str,
        epoch: int,
        first: int,
        keys: str | list[str],
        bodies: list[bytes],
        exchange: str,
        path: tuple[str, ...],
        hops: int,
    ) -> None:
        self.node, self.epoch, self.first = node, epoch, first
        self.keys = keys  # one key for the run, or one each
        self.bodies = bodies
        self.exchange, self.path, self.hops = exchange, path, hops

    def __len__(self) -> int:
        return len(self.bodies)

    def size(self) -> int:
        """The sum of its envelopes' :meth:`Envelope.size` (no headers, no
        properties: the fixed part once per message, the keys and bodies summed in C)."""
        keys, bodies, path = self.keys, self.bodies, self.path
        n = len(bodies)
        fixed = 64 + len(self.exchange) + 16 * len(path) + sum(map(len, path))
        keyed = len(keys) * n if type(keys) is str else sum(map(len, keys))
        return fixed * n + keyed + sum(map(len, bodies))

    def part(self, start: int, stop: int) -> PlainRun:
        """``self[start:stop]`` (0 <= start, stop <= len): the messages from
        ``start`` up to ``stop``, as a run."""
        keys = self.keys
        stop = max(start, stop)
        return PlainRun(
            self.node,
            self.epoch,
            self.first + start,
            keys if type(keys) is str else keys[start:stop],
            self.bodies[start:stop],
            self.exchange,
            self.path,
            self.hops,
        )

    def chained(self, other: PlainRun) -> PlainRun | None:
        """This run and ``other`` as one run, when ``other`` continues it (same
        origin, the next origin seqs, same exchange, path and hops); None otherwise.
        A sending log's runs (:class:`~amqlite.peering.outbound.OutboundLog`) of
        one exchange's mints follow each other so: one ``peer.forwards`` for them."""
        if (
            other.first != self.first + len(self.bodies)
            or other.epoch != self.epoch
            or other.node != self.node
            or other.hops != self.hops
            or other.path != self.path
            or other.exchange != self.exchange
        ):
            return None
        keys, more = self.keys, other.keys
        if type(keys) is str and keys == more:
            joined: str | list[str] = keys
        else:
            joined = [*self.key_list(), *other.key_list()]
        return PlainRun(
            self.node,
            self.epoch,
            self.first,
            joined,
            self.bodies + other.bodies,
            self.exchange,
            self.path,
            self.hops,
        )

    def onward(self, node: str) -> PlainRun:
        """The run as ``node`` sends it on: :meth:`Envelope.onward` of each."""
        path = self.path
        return PlainRun(
            self.node,
            self.epoch,
            self.first,
            self.keys,
            self.bodies,
            self.exchange,
            (*path, node) if path else one_node_path(node),
            self.hops + 1,
        )

    def key_list(self) -> Sequence[str]:
        keys = self.keys
        return [keys] * len(self.bodies) if type(keys) is str else keys

    def stamps(self) -> list[MeshStamp]:
        """The :class:`MeshStamp` of each message, in order (built in C)."""
        n, first, node, epoch = len(self.bodies), self.first, self.node, self.epoch
        return list(
            map(
                _new_tuple,
                _repeat(MeshStamp),
                zip(
                    _repeat(node),
                    _repeat(epoch),
                    range(first, first + n),
                    _repeat(self.exchange),
                    _repeat(self.path),
                    _repeat(self.hops),
                    strict=False,
                ),
            )
        )

    def __iter__(self) -> Iterator[Envelope]:
        n, first, node, epoch, keys = len(self.bodies), self.first, self.node, self.epoch, self.keys
        return map(
            Envelope,
            map(
                _new_tuple,
                _repeat(MeshId),
                zip(_repeat(node), _repeat(epoch), range(first, first + n), strict=False),
            ),
            _repeat(keys, n) if type(keys) is str else keys,
            self.bodies,
            iter(dict, None),  # (headers: a new empty map each)
            iter(dict, None),  # (properties)
            _repeat(self.exchange),
            _repeat(self.path),
            _repeat(self.hops),
        )

    @overload
    def __getitem__(self, i: int) -> Envelope: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Envelope]: ...
    def __getitem__(self, i: int | slice) -> Envelope | Sequence[Envelope]:
        bodies, keys = self.bodies, self.keys
        if isinstance(i, slice):
            start, stop, step = i.indices(len(bodies))
            if step != 1:
                return list(self)[i]
            return self.part(start, stop)
        n = len(bodies)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("PlainRun index out of range")
        return Envelope(
            MeshId(self.node, self.epoch, self.first + i),
            keys if type(keys) is str else keys[i],
            bodies[i],
            {},
            {},
            self.exchange,
            self.path,
            self.hops,
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlainRun | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (as a list's)

    def __repr__(self) -> str:
        return f"PlainRun({list(self)!r})"


_ENV_KEY, _ENV_BODY = attrgetter("routing_key"), attrgetter("body")


def plain_run_of(envelopes: Sequence[Envelope], least: int = 2) -> PlainRun | None:
    """``envelopes`` as one :class:`PlainRun` (equal to them) when they are one:
    no headers, no properties, one origin with consecutive origin seqs, one
    exchange, path and hops; None otherwise, or when there are fewer than
    ``least`` (the compact encoder, ``cbor._compact``, takes one).

    Why it exists: a subscriber's peering queue hands its link end the envelopes
    its messages were published with (``PeeringLink.take_run``), a run of a
    client's plain publishes minted one after the other; as one run they go into
    the sending log, onto the wire (the compact form, unchecked) and off the log
    on the ack as one item, without an onward envelope each
    (``tests/peering/test_fast_paths.py`` checks the run against the list)."""
    n = len(envelopes)
    if n < least or not n:
        return None
    if type(envelopes) is PlainRun:
        return envelopes
    first = envelopes[0]
    node, epoch, seq = first.mesh_id
    if envelopes[-1].mesh_id[2] != seq + n - 1:
        return None  # (a quick no: a gap, another origin)
    exchange, path, hops = first.exchange, first.path, first.hops
    expected = seq
    for env in envelopes:
        mesh_id = env.mesh_id
        if (
            mesh_id[2] != expected
            or mesh_id[1] != epoch
            or mesh_id[0] != node
            or env.headers
            or env.properties
            or env.hops != hops
            or env.path != path
            or env.exchange != exchange
        ):
            return None
        expected += 1
    keys = list(map(_ENV_KEY, envelopes))
    key = keys[0]
    return PlainRun(
        node,
        epoch,
        seq,
        key if keys.count(key) == n else keys,
        list(map(_ENV_BODY, envelopes)),
        exchange,
        path,
        hops,
    )


def stamped_run(stamps: Sequence[Any], keys: list[str], bodies: list[bytes]) -> PlainRun | None:
    """The :class:`PlainRun` of plain messages (no headers, no properties: the
    caller knows) with these keys, bodies and identities (``Message.mesh`` of
    each) when the identities are :class:`MeshStamp` s of one origin with
    consecutive seqs and one exchange, path and hops; None otherwise. What
    :func:`plain_run_of` is for envelopes, for a peering queue's messages minted
    as stamps (``PeeredExchange.stamp``) or received in a compact run."""
    n = len(stamps)
    if n < 2:
        return None
    first, last = stamps[0], stamps[-1]
    if type(first) is not MeshStamp or type(last) is not MeshStamp or last[2] != first[2] + n - 1:
        return None  # (a quick no)
    node, epoch, seq, exchange, path, hops = first
    key = keys[0]
    run = PlainRun(
        node, epoch, seq, key if keys.count(key) == n else keys, bodies, exchange, path, hops
    )
    # the run's stamps are built in C; equal to the messages' only when they are one run
    return run if run.stamps() == stamps else None


@dataclass(frozen=True, slots=True)
class Hello:
    TYPE: ClassVar[str] = "peer.hello"
    node: str
    link: str
    vhost: str
    exchange: str
    exchange_type: str
    mode: PeeringMode
    epoch: int
    resume: tuple[int, int] | None = None
    heartbeat: float = 0.0
    version: int = VERSION
    #: subscribe mode, from the dialer: how long the remote keeps the peering queue
    #: of a subscriber that went away (seconds), and its byte cap (None: the
    #: remote's defaults)
    lease: float | None = None
    buffer_bytes: int | None = None

    def to_map(self) -> dict[str, Any]:
        m = {
            "type": self.TYPE,
            "version": self.version,
            "node": self.node,
            "link": self.link,
            "vhost": self.vhost,
            "exchange": self.exchange,
            "exchange_type": self.exchange_type,
            "mode": self.mode.value,
            "epoch": self.epoch,
            "resume": list(self.resume) if self.resume is not None else None,
            "heartbeat": self.heartbeat,
        }
        if self.lease is not None:
            m["lease"] = self.lease
        if self.buffer_bytes is not None:
            m["buffer_bytes"] = self.buffer_bytes
        return m


@dataclass(frozen=True, slots=True)
class Refused:
    TYPE: ClassVar[str] = "peer.refused"
    code: int
    text: str

    def to_map(self) -> dict[str, Any]:
        return {"type": self.TYPE, "code": self.code, "text": self.text}


@dataclass(frozen=True, slots=True)
class Interest:
    TYPE: ClassVar[str] = "peer.interest"
    full: bool
    add: tuple[BindingKey, ...]
    remove: tuple[BindingKey, ...]
    count: int
    digest: str

    def to_map(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "full": self.full,
            "add": [[b.key, b.arguments_map()] for b in self.add],
            "remove": [[b.key, b.arguments_map()] for b in self.remove],
            "count": self.count,
            "digest": self.digest,
        }


@dataclass(frozen=True, slots=True)
class Filter:
    """From the receiving end: send only what ``selector`` accepts (None: all)."""

    TYPE: ClassVar[str] = "peer.filter"
    selector: str | None

    def to_map(self) -> dict[str, Any]:
        return {"type": self.TYPE, "selector": self.selector}


@dataclass(frozen=True, slots=True)
class ResyncRequest:
    TYPE: ClassVar[str] = "peer.resync"

    def to_map(self) -> dict[str, Any]:
        return {"type": self.TYPE}


@dataclass(slots=True)  # per-message: not frozen (frozen init costs 4x); never mutate
class Forward:
    TYPE: ClassVar[str] = "peer.forward"
    seq: int
    envelope: Envelope

    def to_map(self) -> dict[str, Any]:
        env = self.envelope
        return {
            "type": self.TYPE,
            "seq": self.seq,
            "id": list(env.mesh_id),
            "path": list(env.path),
            "hops": env.hops,
            "exchange": env.exchange,
            "routing_key": env.routing_key,
            "headers": dict(env.headers),
            "properties": dict(env.properties),
            "body": env.body,
        }


@dataclass(slots=True)  # per-run: not frozen; never mutate
class Forwards:
    """A run of forwards, as the shell puts them on the wire: consecutive seqs from
    ``seq``, one per envelope, which all have the same exchange, path and hops."""

    TYPE: ClassVar[str] = "peer.forwards"
    seq: int
    #: a list, or a :class:`PlainRun` (the compact form's fast decoder)
    envelopes: Sequence[Envelope]
    #: (node, epoch, first origin seq) when the decoder of the compact form made the
    #: envelopes' mesh ids from it (``MeshId(node, epoch, first + i)`` for the i-th):
    #: the receiving link then claims and settles them as one range
    #: (:meth:`~amqlite.peering.inbound.SeenMessages.claim_run`); None says nothing.
    #: Not on the wire (``to_map`` finds the compact form itself) and not compared.
    origin: tuple[str, int, int] | None = field(default=None, compare=False, repr=False)

    def to_map(self) -> dict[str, Any]:
        """The compact form (``origin``, ``keys``, ``bodies``) when the run has it
        (:func:`compact_parts`), else a row (``msgs``) per message."""
        first = self.envelopes[0]
        m = {
            "type": self.TYPE,
            "seq": self.seq,
            "exchange": first.exchange,
            "path": list(first.path),
            "hops": first.hops,
        }
        compact = compact_parts(self.envelopes)
        if compact is not None:
            m["origin"], m["keys"], m["bodies"] = compact
            return m
        return m | {
            "msgs": [
                [
                    *e.mesh_id,
                    e.routing_key,
                    dict(e.headers),
                    dict(e.properties),
                    e.body,
                ]
                for e in self.envelopes
            ],
        }

    def forwards(self) -> list[Forward]:
        """The run as single forwards (what it stands for)."""
        return [Forward(self.seq + i, e) for i, e in enumerate(self.envelopes)]


def compact_parts(
    envelopes: Sequence[Envelope],
) -> tuple[list[Any], str | list[str], list[bytes]] | None:
    """A run's compact form (``peer.forwards`` without ``msgs``): ``origin``
    ``[node, epoch, first origin seq]``, ``keys`` (the routing key of every message,
    or a list of one each) and ``bodies``, when its messages share their origin
    (node, epoch), follow each other's origin seqs and have no headers and no
    properties (a site's client publishes, as its sending log holds them); None
    otherwise."""
    first = envelopes[0]
    node, epoch, origin_seq = first.mesh_id
    key = first.routing_key
    same_key = True
    for i, e in enumerate(envelopes):
        if e.headers or e.properties or e.mesh_id != (node, epoch, origin_seq + i):
            return None
        if e.routing_key != key:
            same_key = False
    keys: str | list[str] = key if same_key else [e.routing_key for e in envelopes]
    return [node, epoch, origin_seq], keys, [e.body for e in envelopes]


@dataclass(frozen=True, slots=True)
class Ack:
    TYPE: ClassVar[str] = "peer.ack"
    epoch: int
    seq: int

    def to_map(self) -> dict[str, Any]:
        return {"type": self.TYPE, "epoch": self.epoch, "seq": self.seq}


@dataclass(frozen=True, slots=True)
class Heartbeat:
    TYPE: ClassVar[str] = "peer.heartbeat"

    def to_map(self) -> dict[str, Any]:
        return {"type": self.TYPE}


PeeringMessage = (
    Hello | Refused | Interest | Filter | ResyncRequest | Forward | Forwards | Ack | Heartbeat
)


# --- decoding -----------------------------------------------------------------------


class _Reader:
    """Typed field access on one received map; errors name the type and the field."""

    __slots__ = ("kind", "m")

    def __init__(self, kind: str, m: Mapping[str, Any]) -> None:
        self.kind = kind
        self.m = m

    def fail(self, name: str, want: str) -> PeeringProtocolError:
        if name not in self.m:
            return PeeringProtocolError(f"{self.kind}: missing {name!r}")
        return PeeringProtocolError(f"{self.kind}: {name!r} must be {want}, got {self.m[name]!r}")

    def text(self, name: str, *, nonempty: bool = False) -> str:
        value = self.m.get(name)
        if not isinstance(value, str) or (nonempty and not value):
            raise self.fail(name, "a non-empty string" if nonempty else "a string")
        return value

    def integer(self, name: str, *, minimum: int = 0) -> int:
        value = self.m.get(name)
        if type(value) is not int or value < minimum:
            raise self.fail(name, f"an integer >= {minimum}")
        return value

    def boolean(self, name: str) -> bool:
        value = self.m.get(name)
        if type(value) is not bool:
            raise self.fail(name, "true or false")
        return value

    def fields(self, name: str) -> dict[str, Any]:
        value = self.m.get(name, _EMPTY)
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise self.fail(name, "a map with string keys")
        return dict(value)

    def bindings(self, name: str) -> tuple[BindingKey, ...]:
        value = self.m.get(name, ())
        want = "a list of [key, {arguments}] pairs"
        if not isinstance(value, list | tuple):
            raise self.fail(name, want)
        out = []
        for item in value:
            ok = isinstance(item, list | tuple) and len(item) == 2
            if not ok or not isinstance(item[0], str) or not isinstance(item[1], Mapping):
                raise self.fail(name, want)
            try:
                out.append(BindingKey.of(item[0], item[1]))
            except TypeError:
                raise self.fail(name, want) from None
        return tuple(out)


def _hello(r: _Reader) -> Hello:
    version = r.integer("version", minimum=1)
    if version != VERSION:
        raise PeeringProtocolError(
            f"peer.hello: unsupported version {version} (we speak {VERSION})"
        )
    mode_value = r.m.get("mode")
    try:
        mode = PeeringMode(mode_value) if type(mode_value) is int else None
    except ValueError:
        mode = None
    if mode is None:
        raise r.fail("mode", "1, 2 or 3")
    kind = r.text("exchange_type")
    if kind not in EXCHANGE_TYPES:
        raise r.fail("exchange_type", "one of " + ", ".join(EXCHANGE_TYPES))
    resume = r.m.get("resume")
    if resume is not None:
        ok = isinstance(resume, list | tuple) and len(resume) == 2
        if not ok or not all(type(v) is int and v >= 0 for v in resume):
            raise r.fail("resume", "null or [epoch, seq]")
        resume = (resume[0], resume[1])
    heartbeat = r.m.get("heartbeat", 0.0)
    if type(heartbeat) not in (int, float) or not 0 <= heartbeat < float("inf"):
        raise r.fail("heartbeat", "a number of seconds >= 0")
    lease = r.m.get("lease")
    if lease is not None and (type(lease) not in (int, float) or not 0 < lease < float("inf")):
        raise r.fail("lease", "null or a number of seconds > 0")
    buffer_bytes = r.m.get("buffer_bytes")
    if buffer_bytes is not None and (type(buffer_bytes) is not int or buffer_bytes < 1):
        raise r.fail("buffer_bytes", "null or an integer >= 1")
    return Hello(
        node=r.text("node", nonempty=True),
        link=r.text("link", nonempty=True),
        vhost=r.text("vhost"),
        exchange=r.text("exchange"),
        exchange_type=kind,
        mode=mode,
        epoch=r.integer("epoch"),
        resume=resume,
        heartbeat=float(heartbeat),
        version=version,
        lease=float(lease) if lease is not None else None,
        buffer_bytes=buffer_bytes,
    )


def _interest(r: _Reader) -> Interest:
    full = r.boolean("full")
    add, remove = r.bindings("add"), r.bindings("remove")
    if full and remove:
        raise PeeringProtocolError("peer.interest: a full advertisement removes nothing")
    digest = r.text("digest")
    if len(digest) != 16 or any(c not in "0123456789abcdef" for c in digest):
        raise r.fail("digest", "16 lowercase hex digits")
    return Interest(full, add, remove, r.integer("count"), digest)


def _forward(r: _Reader) -> Forward:
    ident = r.m.get("id")
    if not isinstance(ident, list | tuple) or len(ident) != 3:
        raise r.fail("id", "[origin node, origin epoch, origin seq]")
    node, epoch, seq = ident
    if (
        not isinstance(node, str)
        or not node
        or not all(type(v) is int and v >= 0 for v in (epoch, seq))
    ):
        raise r.fail("id", "[origin node, origin epoch, origin seq]")
    path = r.m.get("path")
    if not isinstance(path, list | tuple) or not all(isinstance(p, str) and p for p in path):
        raise r.fail("path", "a list of node ids")
    body = r.m.get("body")
    if not isinstance(body, bytes):
        raise r.fail("body", "bytes")
    env = Envelope(
        mesh_id=MeshId(node, epoch, seq),
        routing_key=r.text("routing_key"),
        body=body,
        headers=r.fields("headers"),
        properties=r.fields("properties"),
        exchange=r.text("exchange"),
        path=tuple(path),
        hops=r.integer("hops"),
    )
    return Forward(r.integer("seq", minimum=1), env)


def _forwards(r: _Reader) -> Forwards:
    seq = r.integer("seq", minimum=1)
    exchange = r.text("exchange")
    path = r.m.get("path")
    if not isinstance(path, list | tuple) or not all(isinstance(p, str) and p for p in path):
        raise r.fail("path", "a list of node ids")
    hops = r.integer("hops")
    rows = r.m.get("msgs")
    if rows is None and "bodies" in r.m:
        return _compact_forwards(r, seq, exchange, tuple(path), hops)
    want = "a non-empty list of [node, epoch, seq, routing_key, {headers}, {properties}, body]"
    if not isinstance(rows, list | tuple) or not rows:
        raise r.fail("msgs", want)
    envelopes = []
    for row in rows:
        if not isinstance(row, list | tuple) or len(row) != 7:
            raise r.fail("msgs", want)
        node, epoch, origin_seq, routing_key, headers, properties, body = row
        ok = (
            isinstance(node, str)
            and node
            and type(epoch) is int
            and epoch >= 0
            and type(origin_seq) is int
            and origin_seq >= 0
            and isinstance(routing_key, str)
            and isinstance(body, bytes)
        )
        for fields in (headers, properties):
            ok = ok and isinstance(fields, Mapping) and all(isinstance(k, str) for k in fields)
        if not ok:
            raise r.fail("msgs", want)
        envelopes.append(
            Envelope(
                MeshId(node, epoch, origin_seq),
                routing_key,
                body,
                dict(headers),
                dict(properties),
                exchange,
                tuple(path),
                hops,
            )
        )
    return Forwards(seq, envelopes)


_new_mesh_id = tuple.__new__  # MeshId(...) without the Python-level __new__


def _compact_forwards(
    r: _Reader, seq: int, exchange: str, path: tuple[str, ...], hops: int
) -> Forwards:
    """:func:`_forwards` of the compact form (``origin``, ``keys``, ``bodies``)."""
    origin = r.m.get("origin")
    if not (
        isinstance(origin, list | tuple)
        and len(origin) == 3
        and isinstance(origin[0], str)
        and origin[0]
        and all(type(v) is int and v >= 0 for v in origin[1:])
    ):
        raise r.fail("origin", "[node, epoch, first origin seq]")
    bodies = r.m.get("bodies")
    if (
        not isinstance(bodies, list | tuple)
        or not bodies
        or not all(isinstance(b, bytes) for b in bodies)
    ):
        raise r.fail("bodies", "a non-empty list of byte strings")
    keys = r.m.get("keys")
    if isinstance(keys, str):
        keys = [keys] * len(bodies)
    elif not (
        isinstance(keys, list | tuple)
        and len(keys) == len(bodies)
        and all(isinstance(k, str) for k in keys)
    ):
        raise r.fail("keys", "a string, or a list of one string per body")
    node, epoch, first = origin
    return Forwards(
        seq,
        [
            Envelope(MeshId(node, epoch, first + i), key, body, {}, {}, exchange, path, hops)
            for i, (key, body) in enumerate(zip(keys, bodies, strict=True))
        ],
        (node, epoch, first),
    )


def _compact_fast(
    get: Callable[[str], Any], seq: int, exchange: str, route: tuple[str, ...], hops: int
) -> Forwards | None:
    """:func:`forwards_fast` of the compact form: a :class:`PlainRun` (the
    envelopes made only when asked for), no row to unpack and check. The checks
    run in C (``set(map(type, ...))``): the per-message loop in Python was a
    tenth of what the receiving broker spent on a run."""
    origin = get("origin")
    bodies = get("bodies")
    keys = get("keys")
    if type(origin) is not list or len(origin) != 3 or type(bodies) is not list or not bodies:
        return None
    node, epoch, first = origin
    if (
        type(node) is not str
        or not node
        or type(epoch) is not int
        or epoch < 0
        or type(first) is not int
        or first < 0
    ):
        return None
    n = len(bodies)
    if type(keys) is not str and (  # (a str: one key for the run)
        type(keys) is not list or len(keys) != n or set(map(type, keys)) != _STR
    ):
        return None
    if set(map(type, bodies)) != _BYTES:
        return None
    return Forwards(
        seq, PlainRun(node, epoch, first, keys, bodies, exchange, route, hops), (node, epoch, first)
    )


_STR = {str}
_BYTES = {bytes}


def forwards_fast(m: dict[str, Any]) -> Forwards | None:
    """A well-formed ``peer.forwards`` map as it comes from the CBOR decoder (exact
    built-in types), checked in one pass; None for anything else, which
    :func:`_forwards` then accepts or rejects with the precise reason. Whatever
    this accepts, :func:`_forwards` accepts too, with the same result. The
    envelopes take over the map's headers and properties maps (no copies)."""
    get = m.get
    seq = get("seq")
    exchange = get("exchange")
    path = get("path")
    hops = get("hops")
    rows = get("msgs")
    if (
        type(seq) is not int
        or seq < 1
        or type(exchange) is not str
        or type(path) is not list
        or type(hops) is not int
        or hops < 0
    ):
        return None
    for p in path:
        if type(p) is not str or not p:
            return None
    route = tuple(path)
    if type(rows) is not list or not rows:
        if rows is None and "bodies" in m:
            return _compact_fast(get, seq, exchange, route, hops)
        return None
    envelopes: list[Envelope] = []
    append = envelopes.append
    for row in rows:
        if type(row) is not list or len(row) != 7:
            return None
        node, epoch, origin_seq, routing_key, headers, properties, body = row
        if (
            type(node) is not str
            or not node
            or type(epoch) is not int
            or epoch < 0
            or type(origin_seq) is not int
            or origin_seq < 0
            or type(routing_key) is not str
            or type(headers) is not dict
            or type(properties) is not dict
            or type(body) is not bytes
        ):
            return None
        if headers:
            for k in headers:
                if type(k) is not str:
                    return None
        if properties:
            for k in properties:
                if type(k) is not str:
                    return None
        append(
            Envelope(
                _new_mesh_id(MeshId, (node, epoch, origin_seq)),
                routing_key,
                body,
                headers,
                properties,
                exchange,
                route,
                hops,
            )
        )
    return Forwards(seq, envelopes)


def from_map(m: object) -> PeeringMessage:
    """The peering message a received map holds; malformed maps raise
    :class:`~amqlite.peering.errors.PeeringProtocolError`."""
    if type(m) is dict:
        kind = m.get("type")
        if kind == Forwards.TYPE:
            fast = forwards_fast(m)
            if fast is not None:
                return fast
    if not isinstance(m, Mapping):
        raise PeeringProtocolError(f"a peering message must be a map, got {type(m).__name__}")
    kind = m.get("type")
    r = _Reader(str(kind), m)
    if kind == Hello.TYPE:
        return _hello(r)
    if kind == Forward.TYPE:
        return _forward(r)
    if kind == Forwards.TYPE:
        return _forwards(r)
    if kind == Ack.TYPE:
        return Ack(r.integer("epoch"), r.integer("seq"))
    if kind == Interest.TYPE:
        return _interest(r)
    if kind == Heartbeat.TYPE:
        return Heartbeat()
    if kind == ResyncRequest.TYPE:
        return ResyncRequest()
    if kind == Filter.TYPE:
        selector = m.get("selector")
        if selector is not None and not isinstance(selector, str):
            raise r.fail("selector", "text or null")
        return Filter(selector)
    if kind == Refused.TYPE:
        return Refused(r.integer("code"), r.text("text"))
    raise PeeringProtocolError(f"unknown peering message type {kind!r}")
