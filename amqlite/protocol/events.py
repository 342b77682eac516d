"""Protocol events: one frozen dataclass per wire method.

Each class names its wire method (``METHOD``) and who may send it (``SENDER``).
Field names are the wire keys, so ``docs/protocol.md`` and this module read alike.
Requests from the client carry ``id``; replies from the server carry ``re``, the id
they answer. ``Deliver``, ``Cancelled``, ``Blocked``, ``Unblocked``, ``Heartbeat``,
``Close`` and ``CloseOk`` are not replies and carry neither.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar


class Role(Enum):
    """Which end of a connection a :class:`~amqlite.protocol.Connection` plays."""

    CLIENT = "client"
    SERVER = "server"


class Sender(Enum):
    CLIENT = "client"
    SERVER = "server"
    BOTH = "both"


PROTOCOL_VERSION = 1

Headers = dict[str, Any]
Props = dict[str, Any]


class Event:
    """Base of every protocol event. Events are values: never mutate one (a decoded
    ``Deliver`` or ``Ok`` may share its empty maps with others). All are frozen
    except the four that exist once per message (``Publish``, ``Deliver``, ``Ack``
    and ``Ok``, a publish confirm), whose frozen ``__init__`` would cost about
    1.5 us a message."""

    __slots__ = ()
    METHOD: ClassVar[str] = ""
    SENDER: ClassVar[Sender] = Sender.BOTH


# --- handshake ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello(Event):
    METHOD: ClassVar[str] = "hello"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    vhost: str = "/"
    login: str = "guest"
    password: str = field(default="guest", repr=False)
    client: str = ""
    protocol: int = PROTOCOL_VERSION
    heartbeat: float = 0.0
    role: str = "client"
    instance: str = ""


@dataclass(frozen=True, slots=True)
class Welcome(Event):
    METHOD: ClassVar[str] = "welcome"
    SENDER: ClassVar[Sender] = Sender.SERVER
    re: int
    server: str = ""
    version: str = ""
    state: str = "standalone"
    cluster: list[str] = field(default_factory=list)
    heartbeat: float = 0.0
    max_frame: int = 0


@dataclass(frozen=True, slots=True)
class Refused(Event):
    METHOD: ClassVar[str] = "refused"
    SENDER: ClassVar[Sender] = Sender.SERVER
    re: int
    code: int
    text: str = ""


# --- connection-level, both directions ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat(Event):
    METHOD: ClassVar[str] = "heartbeat"
    SENDER: ClassVar[Sender] = Sender.BOTH


@dataclass(frozen=True, slots=True)
class Close(Event):
    """Close the connection; ``code`` 200 is a normal close, anything else a hard error."""

    METHOD: ClassVar[str] = "close"
    SENDER: ClassVar[Sender] = Sender.BOTH
    code: int = 200
    text: str = ""


@dataclass(frozen=True, slots=True)
class CloseOk(Event):
    METHOD: ClassVar[str] = "close-ok"
    SENDER: ClassVar[Sender] = Sender.BOTH


# --- requests (client -> server) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExchangeDeclare(Event):
    METHOD: ClassVar[str] = "exchange.declare"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    exchange: str
    type: str = "direct"
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    passive: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExchangeDelete(Event):
    METHOD: ClassVar[str] = "exchange.delete"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    exchange: str
    if_unused: bool = False


@dataclass(frozen=True, slots=True)
class QueueDeclare(Event):
    METHOD: ClassVar[str] = "queue.declare"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str = ""
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    passive: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueDelete(Event):
    METHOD: ClassVar[str] = "queue.delete"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str
    if_unused: bool = False
    if_empty: bool = False


@dataclass(frozen=True, slots=True)
class QueuePurge(Event):
    METHOD: ClassVar[str] = "queue.purge"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str


@dataclass(frozen=True, slots=True)
class OffsetStore(Event):
    """Keep ``offset`` under ``name`` in stream queue ``queue`` (survives restarts)."""

    METHOD: ClassVar[str] = "offset.store"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str
    name: str
    offset: int


@dataclass(frozen=True, slots=True)
class OffsetQuery(Event):
    """The offset stored under ``name`` in stream queue ``queue``."""

    METHOD: ClassVar[str] = "offset.query"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str
    name: str


@dataclass(frozen=True, slots=True)
class StreamFetch(Event):
    """Read the stored records of stream queue ``queue`` from offset ``start``
    (up to ``end``, exclusive; None: what the stream holds), about ``max_bytes``
    of them at most, in one ``stream.records`` reply. Reading changes nothing on
    the broker: no consumer, no deliveries, no acks."""

    METHOD: ClassVar[str] = "stream.fetch"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str
    start: int
    end: int | None = None
    max_bytes: int = 1048576


@dataclass(frozen=True, slots=True)
class HaHeartbeat(Event):
    """An HA node's heartbeat to its peer (on a connection opened with role "ha-peer")."""

    METHOD: ClassVar[str] = "ha.heartbeat"
    SENDER: ClassVar[Sender] = Sender.BOTH
    node: str
    role: str
    state: str
    epoch: int
    vhost: str


@dataclass(frozen=True, slots=True)
class HaSwitchover(Event):
    """Ask the active node of an HA pair to hand mastership to its passive peer."""

    METHOD: ClassVar[str] = "ha.switchover"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class HaSync(Event):
    """Replication from the active node: journal records, framed as in a segment,
    up to position ``upto``; ``reset`` starts a snapshot (the passive drops its
    durable state first)."""

    METHOD: ClassVar[str] = "ha.sync"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    upto: int
    data: bytes
    reset: bool = False
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class HaHandover(Event):
    """The active node hands over (a planned switchover): it has closed its clients,
    journaled every delivery mark and ack, and appended ``upto`` records in term
    ``epoch``; a passive node that holds exactly those takes over without flagging
    its messages ``redelivered`` (docs/ha.md, "Takeover flags what may have been
    seen")."""

    METHOD: ClassVar[str] = "ha.handover"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    upto: int
    epoch: int


@dataclass(frozen=True, slots=True)
class HaSynced(Event):
    """The passive node holds (and has committed) every record up to ``upto``; with
    ``applied``, it has applied them (its broker holds them) but not yet committed."""

    METHOD: ClassVar[str] = "ha.synced"
    SENDER: ClassVar[Sender] = Sender.SERVER
    upto: int
    applied: bool = False


@dataclass(frozen=True, slots=True)
class PeerMessage(Event):
    """One exchange-peering message (``peer.hello``, ``peer.forward``, ...) as a plain
    map, both ways on a connection opened with ``hello`` {role: "peer-link"}; see
    docs/peering.md for the maps."""

    METHOD: ClassVar[str] = "peer"
    SENDER: ClassVar[Sender] = Sender.BOTH
    msg: dict[str, Any]


@dataclass(frozen=True, slots=True)
class QueueBind(Event):
    METHOD: ClassVar[str] = "queue.bind"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str
    exchange: str
    key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueUnbind(Event):
    METHOD: ClassVar[str] = "queue.unbind"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str
    exchange: str
    key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)  # per-message: not frozen, as frozen init costs 4x; never mutate
class Publish(Event):
    """Publish one message. ``confirm`` asks for an ``ok`` once the broker holds it;
    ``mandatory`` asks for a ``returned`` when it reaches no queue."""

    METHOD: ClassVar[str] = "publish"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    exchange: str
    key: str
    body: bytes
    headers: Headers = field(default_factory=dict)
    props: Props = field(default_factory=dict)
    mandatory: bool = False
    confirm: bool = False


@dataclass(frozen=True, slots=True)
class PublishColumns(Event):
    """``publish.batch`` with its messages as columns: ``count`` messages whose
    routing keys and bodies lie end to end in ``keys`` / ``bodies``, with
    ``count + 1`` little-endian unsigned 32-bit positions (the first 0) in
    ``key_ends`` / ``body_ends`` where value ``i`` spans ``ends[i]:ends[i + 1]``
    (Arrow's string and binary layout, as ``stream.records``); ``extras`` holds
    ``[i, headers, props]`` for each message that has any. Message ``i`` is request
    ``id + i``; the reply is ``publish.batch``'s. A writer holding Arrow columns
    (the Spark sink) sends them without a Python object per message."""

    METHOD: ClassVar[str] = "publish.columns"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    exchange: str
    count: int
    keys: bytes
    key_ends: bytes
    bodies: bytes
    body_ends: bytes
    extras: list[Any] = field(default_factory=list)
    mandatory: bool = False
    persistent: bool = False


@dataclass(frozen=True, slots=True)
class Consume(Event):
    METHOD: ClassVar[str] = "consume"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str
    tag: str = ""
    prefetch: int = 0
    no_ack: bool = False
    exclusive: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    #: a JMS message selector (docs/selectors.md); "" = none
    selector: str = ""


@dataclass(frozen=True, slots=True)
class PublishBatch(Event):
    """Publish many messages to ``exchange`` in one frame, confirmed. Message ``i``
    of ``msgs`` (``[key, body]`` or ``[key, body, headers, props]``) is request
    ``id + i``: its publish key, and how a reply names it."""

    METHOD: ClassVar[str] = "publish.batch"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    exchange: str
    msgs: list[Any]
    mandatory: bool = False
    persistent: bool = False


@dataclass(frozen=True, slots=True)
class Cancel(Event):
    METHOD: ClassVar[str] = "cancel"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    tag: str


@dataclass(slots=True)  # per-message: not frozen, as frozen init costs 4x; never mutate
class Ack(Event):
    METHOD: ClassVar[str] = "ack"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    dtag: int
    multiple: bool = False


@dataclass(frozen=True, slots=True)
class Nack(Event):
    METHOD: ClassVar[str] = "nack"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    dtag: int
    multiple: bool = False
    requeue: bool = True


@dataclass(frozen=True, slots=True)
class Reject(Event):
    METHOD: ClassVar[str] = "reject"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    dtag: int
    requeue: bool = True


@dataclass(frozen=True, slots=True)
class Get(Event):
    METHOD: ClassVar[str] = "get"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    queue: str
    no_ack: bool = False


@dataclass(frozen=True, slots=True)
class Status(Event):
    METHOD: ClassVar[str] = "status"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int


@dataclass(frozen=True, slots=True)
class Trace(Event):
    """Turn the broker's trace into the stream queue ``amq.trace`` on or off."""

    METHOD: ClassVar[str] = "trace"
    SENDER: ClassVar[Sender] = Sender.CLIENT
    id: int
    enabled: bool


# --- replies and pushes (server -> client) ------------------------------------------


@dataclass(slots=True)  # per-message (publish confirms): not frozen; never mutate
class Ok(Event):
    """Success; ``info`` holds what the request returns (see docs/protocol.md)."""

    METHOD: ClassVar[str] = "ok"
    SENDER: ClassVar[Sender] = Sender.SERVER
    re: int
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Error(Event):
    """A soft error: request ``re`` failed; the connection stays open.
    ``re`` is None when the failed frame carried no usable id."""

    METHOD: ClassVar[str] = "error"
    SENDER: ClassVar[Sender] = Sender.SERVER
    re: int | None
    code: int
    text: str = ""


@dataclass(frozen=True, slots=True)
class Returned(Event):
    """A mandatory publish reached no queue (code 312 NO_ROUTE)."""

    METHOD: ClassVar[str] = "returned"
    SENDER: ClassVar[Sender] = Sender.SERVER
    re: int
    code: int
    text: str = ""


@dataclass(frozen=True, slots=True)
class Nacked(Event):
    """The broker did not take responsibility for a confirmed publish."""

    METHOD: ClassVar[str] = "nacked"
    SENDER: ClassVar[Sender] = Sender.SERVER
    re: int
    code: int
    text: str = ""


@dataclass(slots=True)  # per-message: not frozen, as frozen init costs 4x; never mutate
class Deliver(Event):
    """A message pushed to consumer ``ctag`` with delivery tag ``dtag``."""

    METHOD: ClassVar[str] = "deliver"
    SENDER: ClassVar[Sender] = Sender.SERVER
    ctag: str
    dtag: int
    exchange: str
    key: str
    body: bytes
    headers: Headers = field(default_factory=dict)
    props: Props = field(default_factory=dict)
    redelivered: bool = False
    queue: str = ""
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class GetOk(Event):
    METHOD: ClassVar[str] = "get-ok"
    SENDER: ClassVar[Sender] = Sender.SERVER
    re: int
    dtag: int
    exchange: str
    key: str
    body: bytes
    headers: Headers = field(default_factory=dict)
    props: Props = field(default_factory=dict)
    redelivered: bool = False
    remaining: int = 0
    queue: str = ""


@dataclass(frozen=True, slots=True)
class StreamRecords(Event):
    """The reply to ``stream.fetch``: ``count`` records from offset ``first``, as
    columns. ``keys``, ``exchanges`` and ``bodies`` hold the values end to end;
    each ``*_ends`` holds ``count + 1`` little-endian unsigned 32-bit positions
    (the first 0) where value ``i`` spans ``ends[i]:ends[i + 1]``. ``extras``
    holds ``[i, headers, props]`` for each record that has headers or properties.
    ``dropped``: offsets of the asked range retention removed (below ``first``)."""

    METHOD: ClassVar[str] = "stream.records"
    SENDER: ClassVar[Sender] = Sender.SERVER
    re: int
    first: int
    count: int
    keys: bytes
    key_ends: bytes
    exchanges: bytes
    exchange_ends: bytes
    bodies: bytes
    body_ends: bytes
    extras: list[Any] = field(default_factory=list)
    dropped: int = 0
    kept_first: int = 0
    kept_next: int = 0


@dataclass(frozen=True, slots=True)
class GetEmpty(Event):
    METHOD: ClassVar[str] = "get-empty"
    SENDER: ClassVar[Sender] = Sender.SERVER
    re: int


@dataclass(frozen=True, slots=True)
class Cancelled(Event):
    """The server cancelled consumer ``tag`` (its queue was deleted, ...)."""

    METHOD: ClassVar[str] = "cancelled"
    SENDER: ClassVar[Sender] = Sender.SERVER
    tag: str
    code: int = 0
    text: str = ""


@dataclass(frozen=True, slots=True)
class Blocked(Event):
    """The server stopped reading this connection's frames: an alarm is raised
    (``reason``: "low on memory", "low on disk") and the connection publishes.
    What was sent before stays accepted; publish nothing more until ``unblocked``."""

    METHOD: ClassVar[str] = "blocked"
    SENDER: ClassVar[Sender] = Sender.SERVER
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Unblocked(Event):
    """The alarm that blocked this connection cleared: the server reads it again."""

    METHOD: ClassVar[str] = "unblocked"
    SENDER: ClassVar[Sender] = Sender.SERVER


# --- local pseudo-events (never on the wire) ----------------------------------------


@dataclass(frozen=True, slots=True)
class BadRequest(Event):
    """A well-framed request with a usable ``id`` that could not be understood
    (unknown method, missing or ill-typed field). The server answers ``error``
    with ``code`` for request ``id`` and carries on."""

    id: int
    code: int
    text: str


@dataclass(frozen=True, slots=True)
class EndOfStream(Event):
    """The other end closed its side of the byte stream (``receive_data(b"")``)."""


REQUESTS: tuple[type[Event], ...] = (
    Hello,
    ExchangeDeclare,
    ExchangeDelete,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueBind,
    QueueUnbind,
    Publish,
    Consume,
    Cancel,
    Ack,
    Nack,
    Reject,
    Get,
    Status,
    OffsetStore,
    OffsetQuery,
    StreamFetch,
    PublishBatch,
    PublishColumns,
    Trace,
    HaHeartbeat,
    HaSync,
    HaHandover,
    HaSwitchover,
    PeerMessage,
)
REPLIES: tuple[type[Event], ...] = (
    Welcome,
    Refused,
    Ok,
    Error,
    Returned,
    Nacked,
    Deliver,
    GetOk,
    GetEmpty,
    StreamRecords,
    Cancelled,
    Blocked,
    Unblocked,
    HaSynced,
)
WIRE_EVENTS: tuple[type[Event], ...] = (*REQUESTS, *REPLIES, Heartbeat, Close, CloseOk)
BY_METHOD: dict[str, type[Event]] = {cls.METHOD: cls for cls in WIRE_EVENTS}
