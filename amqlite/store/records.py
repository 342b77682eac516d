"""Journal records: what a node writes to disk and what HA replicates to its peer.

A record is a frozen dataclass named after what happened. On disk (and on the
peer link) it is one self-describing CBOR map: ``t`` names the record type and
the other keys are its fields; a field left at its default is omitted. Decoding
checks every field's type, so a record we cannot trust never reaches the state
(:class:`~amqlite.store.errors.RecordError` names the type and field). Encoding
runs the same checks, so nothing is written that recovery would refuse. This
module holds the records and the generic map conversion; :mod:`amqlite.store.codec`
turns them into bytes (with hand-written paths for the per-message records).

Types and fields (``docs/storage.md`` has the full table):

================== ==============================================================
``exchange.declare`` vhost, name, type, auto_delete, internal, arguments
``exchange.delete``  vhost, name
``queue.declare``    vhost, name, auto_delete, arguments
``queue.delete``     vhost, name
``queue.purge``      vhost, name
``queue.bind``       vhost, queue, exchange, key, arguments
``queue.unbind``     vhost, queue, exchange, key, arguments
``message.enqueue``  id, vhost, queues, exchange, key, body, headers, props, at, deaths, pk
``message.delivered`` id, queue
``message.ack``      id, queue
``message.marks``    queue, delivered, acked
``stream.append``    vhost, queue, offset, exchange, key, body, headers, props, at, pk
``stream.truncate``  vhost, queue, before
``stream.track``     vhost, queue, name, offset
``peering.marks``    vhost, exchange, marks
``group.owner``      vhost, queue, group, owner
``snapshot.begin``   last_id
``snapshot.end``     (none)
================== ==============================================================

Only durable entities and persistent messages on durable queues are ever
recorded (see :mod:`amqlite.store.state` for the caller's contract), so the
records carry no ``durable`` or ``persistent`` flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, TypeAlias

from amqlite.protocol.codec import check_headers, check_props

from .errors import RecordError

#: Largest journal id (and record integer): they travel as CBOR unsigned integers below 2**63.
MAX_JOURNAL_ID = (1 << 63) - 1
_MAX_NESTING = 8


def _wire(key: str, **kwargs: Any) -> Any:
    """A dataclass field stored under a shorter key on disk."""
    return dataclasses.field(metadata={"key": key}, **kwargs)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExchangeDeclare:
    """A durable exchange was declared (the latest declaration wins)."""

    TYPE: ClassVar[str] = "exchange.declare"
    vhost: str = "/"
    name: str
    type: str
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExchangeDelete:
    """A durable exchange was deleted, with every binding from it."""

    TYPE: ClassVar[str] = "exchange.delete"
    vhost: str = "/"
    name: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueDeclare:
    """A durable, non-exclusive queue was declared (the latest declaration wins)."""

    TYPE: ClassVar[str] = "queue.declare"
    vhost: str = "/"
    name: str
    auto_delete: bool = False
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueDelete:
    """A durable queue was deleted, with its bindings and messages."""

    TYPE: ClassVar[str] = "queue.delete"
    vhost: str = "/"
    name: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueuePurge:
    """Every message of a durable queue was dropped."""

    TYPE: ClassVar[str] = "queue.purge"
    vhost: str = "/"
    name: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueBind:
    """A binding from an exchange to a durable queue was made."""

    TYPE: ClassVar[str] = "queue.bind"
    vhost: str = "/"
    queue: str
    exchange: str
    key: str = ""
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueUnbind:
    """A binding from an exchange to a durable queue was removed."""

    TYPE: ClassVar[str] = "queue.unbind"
    vhost: str = "/"
    queue: str
    exchange: str
    key: str = ""
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MessageEnqueue:
    """A persistent message was routed to these durable queues (one copy of the body
    however many queues hold it).

    ``id`` is chosen by the node, unique among its live messages and increasing
    (:attr:`StoreState.last_journal_id` says where to continue after a restart).
    ``enqueued_at`` is wall-clock Unix time in seconds, so TTLs can be recomputed
    after a restart; ``deaths`` keeps earlier dead-letterings, oldest first, as
    ``(queue, reason)`` pairs; ``publish_key`` is the publisher's key for it (see
    :mod:`amqlite.broker.dedup`), so a node that recovers or takes over still
    recognises the message when its publisher sends it again.
    """

    TYPE: ClassVar[str] = "message.enqueue"
    id: int
    vhost: str = "/"
    queues: tuple[str, ...]
    exchange: str
    routing_key: str = _wire("key", default="")
    body: bytes
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)
    props: dict[str, Any] = dataclasses.field(default_factory=dict)
    enqueued_at: float = _wire("at", default=0.0)
    deaths: tuple[tuple[str, str], ...] = ()
    publish_key: str = _wire("pk", default="")
    #: exchange peering's identity of a message in a peering queue (``Message.mesh``)
    mesh: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"key": "mx"})


_ENQUEUE_SLOTS = tuple(
    getattr(MessageEnqueue, f.name).__set__ for f in dataclasses.fields(MessageEnqueue)
)


def new_message_enqueue(
    journal_id: int,
    vhost: str,
    queues: tuple[str, ...],
    exchange: str,
    routing_key: str,
    body: bytes,
    headers: dict[str, Any],
    props: dict[str, Any],
    enqueued_at: float,
    deaths: tuple[tuple[str, str], ...],
    publish_key: str,
    mesh: dict[str, Any],
) -> MessageEnqueue:
    """``MessageEnqueue(id=journal_id, vhost=vhost, ...)``, every field given, built
    through the slots rather than the frozen dataclass's ``__init__``.

    Why it exists: the recorder makes one for every persistent message, and a frozen
    ``__init__`` (a keyword call setting twelve fields through ``object.__setattr__``)
    cost 2.5 times this. ``tests/store/test_records.py`` checks with hypothesis that
    both give equal records."""
    record: MessageEnqueue = object.__new__(MessageEnqueue)
    s_id, s_vhost, s_queues, s_exchange, s_key, s_body, s_h, s_p, s_at, s_d, s_pk, s_mx = (
        _ENQUEUE_SLOTS
    )
    s_id(record, journal_id)
    s_vhost(record, vhost)
    s_queues(record, queues)
    s_exchange(record, exchange)
    s_key(record, routing_key)
    s_body(record, body)
    s_h(record, headers)
    s_p(record, props)
    s_at(record, enqueued_at)
    s_d(record, deaths)
    s_pk(record, publish_key)
    s_mx(record, mesh)
    return record


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MessageDelivered:
    """A message was handed to a consumer from this queue: after a restart it comes
    back flagged ``redelivered``."""

    TYPE: ClassVar[str] = "message.delivered"
    id: int
    queue: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MessageAck:
    """A message left this queue for good: acked, rejected without requeue, expired,
    dropped by overflow or dead-lettered (the dead-lettered copy is a new
    ``message.enqueue`` with a new id)."""

    TYPE: ClassVar[str] = "message.ack"
    id: int
    queue: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MessageMarks:
    """Many ``message.delivered`` and ``message.ack`` of one queue in one record,
    folded as those records would be, the delivered ones first. A standalone node
    gathers the marks of its deliveries and acks between two commits and writes
    them this way just before the commit (``docs/storage.md``, "Delivery marks and
    acks"): one record per queue and commit instead of two per message. The
    delivered mark of a message acked before the commit is left out (the ack says
    more), so an id is never in both lists."""

    TYPE: ClassVar[str] = "message.marks"
    queue: str
    delivered: tuple[int, ...] = ()
    acked: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StreamAppend:
    """A message was appended to a stream queue at ``offset`` (every message a stream
    takes is stored, persistent or not; offsets count up from 0 per stream)."""

    TYPE: ClassVar[str] = "stream.append"
    vhost: str = "/"
    queue: str
    offset: int
    exchange: str
    routing_key: str = _wire("key", default="")
    body: bytes
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)
    props: dict[str, Any] = dataclasses.field(default_factory=dict)
    enqueued_at: float = _wire("at", default=0.0)
    publish_key: str = _wire("pk", default="")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StreamTruncate:
    """Retention dropped every message of a stream below offset ``before``; the next
    append is at ``before`` or later (so an emptied stream keeps its offsets)."""

    TYPE: ClassVar[str] = "stream.truncate"
    vhost: str = "/"
    queue: str
    before: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StreamTrack:
    """A consumer stored its offset in a stream under ``name`` (the latest wins)."""

    TYPE: ClassVar[str] = "stream.track"
    vhost: str = "/"
    queue: str
    name: str
    offset: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PeeringMarks:
    """Exchange peering: how far this node got in each sending log of its links to
    ``exchange`` (``PeeredExchange.snapshot()``, docs/peering.md). Written before an
    acknowledgement leaves, so a restarted node drops what it already holds; the
    latest record per exchange wins."""

    TYPE: ClassVar[str] = "peering.marks"
    vhost: str = "/"
    exchange: str
    marks: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PeeringOut:
    """Exchange peering: a persistent message the sending log of ``link`` (a link end
    of ``exchange``) took for its remote. Kept until a :class:`PeeringOutAck` of
    that link covers ``id``, so a restarted node (or the HA passive node taking
    over) sends it again, with its peering identity ``mesh`` (docs/peering.md).
    ``id`` is chosen by the node, increasing."""

    TYPE: ClassVar[str] = "peering.out"
    vhost: str = "/"
    exchange: str
    link: str
    id: int
    routing_key: str = _wire("key", default="")
    body: bytes
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)
    props: dict[str, Any] = dataclasses.field(default_factory=dict)
    mesh: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"key": "mx"})
    #: the publisher's key (as in ``message.enqueue``): a node that recovers or takes
    #: over recognises the publish sent again even when no local queue holds it
    publish_key: str = _wire("pk", default="")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PeeringOutAck:
    """Exchange peering: every :class:`PeeringOut` of ``link`` up to ``id`` has left
    the sending log (the remote acknowledged it, or ``drop-oldest`` dropped it)."""

    TYPE: ClassVar[str] = "peering.out.ack"
    vhost: str = "/"
    exchange: str
    link: str
    id: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupOwner:
    """A message group of ``queue`` was given to a consumer, ``owner`` naming it
    across its client's reconnects (``"i:<hello.instance>/<consumer tag>"``, or
    ``"-"`` for one that cannot come back); ``owner`` ``""``: the group is free
    again (no owner, every delivery of it settled). A node that recovers or takes
    over keeps each group for its owner for a while (docs/selectors.md)."""

    TYPE: ClassVar[str] = "group.owner"
    vhost: str = "/"
    queue: str
    group: str
    owner: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotBegin:
    """Everything before this record is superseded: the records up to the matching
    :class:`SnapshotEnd` rebuild the whole durable state. Written by compaction
    (as the first record of a segment) and by HA when a peer rejoins."""

    TYPE: ClassVar[str] = "snapshot.begin"
    last_journal_id: int = _wire("last_id", default=0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotEnd:
    """The snapshot started by the last :class:`SnapshotBegin` is complete."""

    TYPE: ClassVar[str] = "snapshot.end"


Record: TypeAlias = (
    ExchangeDeclare
    | ExchangeDelete
    | QueueDeclare
    | QueueDelete
    | QueuePurge
    | QueueBind
    | QueueUnbind
    | MessageEnqueue
    | MessageDelivered
    | MessageAck
    | MessageMarks
    | StreamAppend
    | StreamTruncate
    | StreamTrack
    | PeeringMarks
    | PeeringOut
    | PeeringOutAck
    | GroupOwner
    | SnapshotBegin
    | SnapshotEnd
)

RECORD_TYPES: tuple[type[Record], ...] = (
    ExchangeDeclare,
    ExchangeDelete,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueBind,
    QueueUnbind,
    MessageEnqueue,
    MessageDelivered,
    MessageAck,
    MessageMarks,
    StreamAppend,
    StreamTruncate,
    StreamTrack,
    PeeringMarks,
    PeeringOut,
    PeeringOutAck,
    GroupOwner,
    SnapshotBegin,
    SnapshotEnd,
)

BY_TYPE: dict[str, type[Record]] = {cls.TYPE: cls for cls in RECORD_TYPES}

# --- field checks --------------------------------------------------------------------

#: Returns None when the value is acceptable, else why not ("must be text").
_Check = Callable[[Any], str | None]


def _text(v: Any) -> str | None:
    return None if type(v) is str else "must be text"


def _flag(v: Any) -> str | None:
    return None if type(v) is bool else "must be a boolean"


def _bytes(v: Any) -> str | None:
    return None if type(v) is bytes else "must be bytes"


def _number(v: Any) -> str | None:
    return None if type(v) is float or type(v) is int else "must be a number"


def _unsigned(v: Any) -> str | None:
    if type(v) is not int or not 0 <= v <= MAX_JOURNAL_ID:
        return "must be an integer in [0, 2**63)"
    return None


def _ids(v: Any) -> str | None:
    if type(v) not in (list, tuple):
        return "must be a list of journal ids"
    for i in v:
        if type(i) is not int or not 0 < i <= MAX_JOURNAL_ID:
            return "must be a list of journal ids (integers in [1, 2**63))"
    return None


def _plain(v: Any, depth: int) -> bool:
    t = type(v)
    if t in (str, int, float, bool, bytes, type(None)):
        return True
    if depth >= _MAX_NESTING:
        return False
    if t is list or t is tuple:
        return all(_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(type(k) is str and _plain(x, depth + 1) for k, x in v.items())
    return False


def _arguments(v: Any) -> str | None:
    if type(v) is dict and _plain(v, 0):
        return None
    return f"must be a map with text keys and plain values (nested < {_MAX_NESTING})"


def _headers(v: Any) -> str | None:
    why = check_headers(v)
    return None if why is None else f"{why}"


def _props(v: Any) -> str | None:
    why = check_props(v)
    return None if why is None else f"{why}"


def _queue_names(v: Any) -> str | None:
    if type(v) not in (list, tuple) or not v or any(type(q) is not str for q in v):
        return "must be a non-empty list of text"
    if len(set(v)) != len(v):
        return "must not name a queue twice"
    return None


def _deaths(v: Any) -> str | None:
    if type(v) not in (list, tuple):
        return "must be a list of [queue, reason] pairs"
    for pair in v:
        if type(pair) not in (list, tuple) or len(pair) != 2:
            return "must be a list of [queue, reason] pairs"
        if type(pair[0]) is not str or type(pair[1]) is not str:
            return "must be a list of [queue, reason] text pairs"
    return None


def _same(v: Any) -> Any:
    return v


def _as_float(v: Any) -> Any:
    return float(v)


def _as_tuple(v: Any) -> Any:
    return tuple(v)


def _as_pairs(v: Any) -> Any:
    return tuple((q, r) for q, r in v)


_CHECKS: dict[str, tuple[_Check, Callable[[Any], Any]]] = {
    "str": (_text, _same),
    "bool": (_flag, _same),
    "bytes": (_bytes, _same),
    "float": (_number, _as_float),
    "int": (_unsigned, _same),
    "dict[str, Any]": (_arguments, _same),
    "tuple[str, ...]": (_queue_names, _as_tuple),
    "tuple[tuple[str, str], ...]": (_deaths, _as_pairs),
    "tuple[int, ...]": (_ids, _as_tuple),
}
_BY_NAME: dict[str, tuple[_Check, Callable[[Any], Any]]] = {
    "headers": (_headers, _same),
    "props": (_props, _same),
}

_MISSING: Any = object()


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    key: str
    check: _Check
    convert: Callable[[Any], Any]
    default: Any  # _MISSING when required


def _fields_of(cls: type[Record]) -> tuple[_Field, ...]:
    out = []
    for f in dataclasses.fields(cls):
        check, convert = _BY_NAME.get(f.name) or _CHECKS[str(f.type)]
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = _MISSING
        out.append(_Field(f.name, f.metadata.get("key", f.name), check, convert, default))
    return tuple(out)


_FIELDS: dict[type[Record], tuple[_Field, ...]] = {cls: _fields_of(cls) for cls in RECORD_TYPES}
_KEYS: dict[type[Record], frozenset[str]] = {
    cls: frozenset(["t", *(f.key for f in fields)]) for cls, fields in _FIELDS.items()
}

# --- encode / decode -------------------------------------------------------------------


def record_to_map(record: Record) -> dict[str, Any]:
    """The CBOR map for ``record`` (defaults left out); raises RecordError when a field
    is ill-typed, so nothing is written that :func:`record_from_map` would refuse."""
    cls = type(record)
    fields = _FIELDS.get(cls)
    if fields is None:
        raise RecordError(f"not a journal record: {record!r}")
    m: dict[str, Any] = {"t": cls.TYPE}
    for f in fields:
        v = getattr(record, f.name)
        if f.default is not _MISSING and v == f.default and type(v) is type(f.default):
            continue
        why = f.check(v)
        if why is not None:
            raise RecordError(f"{cls.TYPE}: field {f.name!r} {why}, got {v!r}")
        m[f.key] = v
    return m


def record_from_map(m: Any) -> Record:
    """Build a record from a decoded CBOR map, checking every field; raises RecordError."""
    if type(m) is not dict:
        raise RecordError(f"a record must be a map, got {type(m).__name__}")
    kind = m.get("t")
    cls = BY_TYPE.get(kind) if type(kind) is str else None
    if cls is None:
        raise RecordError(f"unknown record type {kind!r} (written by a newer amqlite?)")
    extra = m.keys() - _KEYS[cls]
    if extra:
        raise RecordError(f"{cls.TYPE}: unknown fields {sorted(map(str, extra))}")
    kwargs: dict[str, Any] = {}
    for f in _FIELDS[cls]:
        v = m.get(f.key, _MISSING)
        if v is _MISSING:
            if f.default is _MISSING:
                raise RecordError(f"{cls.TYPE}: missing field {f.key!r}")
            continue
        why = f.check(v)
        if why is not None:
            raise RecordError(f"{cls.TYPE}: field {f.key!r} {why}")
        kwargs[f.name] = f.convert(v)
    return cls(**kwargs)
