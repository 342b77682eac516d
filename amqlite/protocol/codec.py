"""CBOR maps <-> protocol events, with validation.

A frame is one CBOR map whose ``m`` key names the method; the other keys are the
event's fields (see :mod:`amqlite.protocol.events`). Fields left at their default
are omitted on the wire. Decoding checks every field's type: a frame we cannot
trust never reaches the broker.

The hot paths (``publish`` in, ``deliver`` out) are written by hand. A delivery
splices a cached encoding of the message's fields (computed once per message,
however many consumers receive it) after a few hand-encoded bytes, so fan-out
does not re-encode bodies.
"""

from __future__ import annotations

import array
import dataclasses
import itertools
import struct
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any, Protocol, cast, get_args, get_origin

import cbor2

from amqlite.errors import ReplyCode

from . import events as ev
from .cbor import MAP_HEADS, TEXT, bytes_head, head, uint

Checker = Callable[[Any], bool]

_SCALARS = (str, int, float, bool, bytes, type(None))

#: Message properties and their wire types (see docs/protocol.md).
PROPERTY_TYPES: dict[str, type] = {
    "message_id": str,
    "correlation_id": str,
    "timestamp": int,
    "expiration": int,
    "priority": int,
    "persistent": bool,
    "reply_to": str,
    "content_type": str,
    "content_encoding": str,
    "group_id": str,
    "type": str,
    "user_id": str,
    "app_id": str,
    "cluster_id": str,
}


class FieldError(Exception):
    """A field failed validation; ``text`` says which and why."""

    def __init__(self, text: str, code: int = ReplyCode.SYNTAX_ERROR) -> None:
        super().__init__(text)
        self.text = text
        self.code = code


def check_headers(value: Any) -> str | None:
    """None when ``value`` is a valid headers map, else the reason."""
    if type(value) is not dict:
        return "must be a map"
    for k, v in value.items():
        if type(k) is not str:
            return "keys must be text"
        if not isinstance(v, _SCALARS):
            return f"value of {k!r} must be a scalar (text, number, bool, bytes, null)"
        if len(k) > 63 and len(k.encode()) > SHORT_TEXT_MAX:
            return f"key {k[:40]!r}... is longer than {SHORT_TEXT_MAX} bytes ({_SHORT_WHY})"
        if type(v) is int and not -(2**63) <= v < 2**64:
            return f"value of {k!r} must fit in 64 bits (-2^63 to 2^64 - 1)"
    return None


#: The longest name, routing key, header key or text property, in UTF-8 bytes: an
#: AMQP short string's (RabbitMQ's limit too). A message or a name beyond it could
#: not be handed to an AMQP client; it is refused where it comes in.
SHORT_TEXT_MAX = 255
_SHORT_WHY = "an AMQP short string"
_SHORT_TEXT = f"text of at most {SHORT_TEXT_MAX} bytes"


def check_props(value: Any) -> str | None:
    """None when ``value`` is a valid properties map, else the reason."""
    if type(value) is not dict:
        return "must be a map"
    for k, v in value.items():
        t = PROPERTY_TYPES.get(k)
        if type(v) is not t:  # checked per message (publish, deliver): one test when valid
            if t is None:
                return f"unknown property {k!r}"
            return f"property {k!r} must be {t.__name__}"
        if t is str:
            text = cast(str, v)
            if len(text) > 63 and k != "group_id" and len(text.encode()) > SHORT_TEXT_MAX:
                return (
                    f"property {k!r} is longer than {SHORT_TEXT_MAX} bytes (an AMQP short string)"
                )
        elif t is int and k in PROPERTY_MAX:
            n = cast(int, v)
            if n < 0:
                return f"property {k!r} must not be negative"
            if n > PROPERTY_MAX[k]:
                return f"property {k!r} must be at most {PROPERTY_MAX[k]} ({_INT_LIMITS[k]})"
    return None


#: The integer properties' largest values: what every consumer can be handed (an
#: AMQP consumer's priority is an octet and its timestamp a date, at most
#: 9999-12-31; the Spark reader's columns are 64-bit signed). Anything larger is
#: refused at the publish, not left to fail each consumer it is delivered to.
PROPERTY_MAX = {
    "priority": 255,
    "timestamp": 253_402_300_799_999,
    "expiration": 2**63 - 1,
}
_INT_LIMITS = {
    "priority": "an AMQP octet",
    "timestamp": "milliseconds since 1970: 9999-12-31T23:59:59.999Z",
    "expiration": "milliseconds, a signed 64-bit integer",
}


def _is_str(v: Any) -> bool:
    return type(v) is str


#: fields holding a name or a routing key: AMQP short strings (SHORT_TEXT_MAX)
_SHORT_TEXT_FIELDS = frozenset(("exchange", "key", "queue"))


def is_short_text(v: Any) -> bool:
    """Text of at most SHORT_TEXT_MAX bytes (an AMQP short string: a name, a routing
    key); the UTF-8 length is worked out only for text long enough to need it."""
    return type(v) is str and (len(v) <= 63 or len(v.encode()) <= SHORT_TEXT_MAX)


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _is_bytes(v: Any) -> bool:
    return type(v) is bytes


def _is_float(v: Any) -> bool:
    return type(v) is float or type(v) is int


_PLAIN_SCALARS = (str, int, float, bool, bytes, type(None))
MAX_NESTING = 8


_SCALAR_TYPES = frozenset(_PLAIN_SCALARS)


def _is_plain(v: Any, depth: int) -> bool:
    """Plain data only: scalars, lists and text-keyed maps, at most MAX_NESTING deep.

    cbor2 turns CBOR tags into datetimes, sets, big numbers and even
    self-referencing containers; none of that may reach the broker. (Loops, not
    generators, and scalars checked in place: peering batches run through here.)"""
    scalars = _SCALAR_TYPES
    t = type(v)
    if t in scalars:
        return True
    if depth >= MAX_NESTING:
        return False
    if t is list:
        for x in v:  # noqa: SIM110 (a loop: all() with a generator costs 3x here)
            if type(x) not in scalars and not _is_plain(x, depth + 1):
                return False
        return True
    if t is dict:
        for k, x in v.items():
            if type(k) is not str or (type(x) not in scalars and not _is_plain(x, depth + 1)):
                return False
        return True
    return False


def _is_str_map(v: Any) -> bool:
    return type(v) is dict and _is_plain(v, 0)


def _is_plain_rows(v: list[Any], depth: int) -> bool:
    """``_is_plain(v, depth)`` for a list, with the lists in it (the rows of a
    ``peer.forwards`` map) and their empty maps checked in place rather than by a
    call each. Same verdict."""
    if depth + 2 >= MAX_NESTING:
        return _is_plain(v, depth)
    scalars = _SCALAR_TYPES
    for x in v:
        t = type(x)
        if t in scalars:
            continue
        if t is not list:
            if not _is_plain(x, depth + 1):
                return False
            continue
        for y in x:  # a row's fields
            ty = type(y)
            if ty in scalars or (ty is dict and not y):
                continue
            if not _is_plain(y, depth + 2):
                return False
    return True


def _is_plain_peer_map(v: Any) -> bool:
    """``_is_str_map`` for a ``peer`` frame's map, with the levels below a batch's
    list of maps (their lists, e.g. ``path`` and the rows of a ``peer.forwards``,
    and their maps, often empty) checked in place rather than by a call each: a
    peering frame holds thousands of them. Same verdict as ``_is_str_map``."""
    if type(v) is not dict:
        return False
    scalars = _SCALAR_TYPES
    for k, x in v.items():
        if type(k) is not str:
            return False
        t = type(x)
        if t in scalars:
            continue
        if t is not list:
            if not _is_plain(x, 1):
                return False
            continue
        if x and type(x[0]) is list:  # one peer.forwards' rows
            if not _is_plain_rows(x, 1):
                return False
            continue
        for item in x:  # depth 1 (a batch's msgs): usually maps
            if type(item) is not dict:
                if type(item) not in scalars and not _is_plain(item, 2):
                    return False
                continue
            for ik, iv in item.items():  # depth 2: a peering message's fields
                if type(ik) is not str:
                    return False
                it = type(iv)
                if it in scalars:
                    continue
                if it is list:
                    if not _is_plain_rows(iv, 3):  # e.g. a peer.forwards' rows
                        return False
                elif it is dict:
                    if iv and not _is_plain(iv, 3):
                        return False
                else:
                    return False
    return True


def _peer_from_map(m: dict[Any, Any]) -> ev.PeerMessage:
    msg = m.get("msg")
    if not _is_plain_peer_map(msg):
        raise FieldError("peer: field 'msg' is not a plain map")  # the general path says more
    return ev.PeerMessage(cast(dict[str, Any], msg))


def _is_str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _checker_for(name: str, tp: Any) -> tuple[Checker, str]:
    if name == "msgs":
        what = "a list of [key, body(, headers, props)]"
        return (lambda v: batch_messages_error(v) is None), what
    if name == "extras":
        return (lambda v: _extras_error(v, None) is None), "a list of [index, headers, props]"
    if name == "headers":
        return (lambda v: check_headers(v) is None), "a map of text to scalars"
    if name == "props":
        return (lambda v: check_props(v) is None), "a map of known properties"
    simple: dict[Any, tuple[Checker, str]] = {
        str: (_is_str, "text"),
        int: (_is_int, "an integer"),
        bool: (_is_bool, "a boolean"),
        bytes: (_is_bytes, "bytes"),
        float: (_is_float, "a number"),
    }
    if tp is str and name in _SHORT_TEXT_FIELDS:
        return is_short_text, _SHORT_TEXT
    if tp in simple:
        return simple[tp]
    origin = get_origin(tp)
    if origin is dict:
        return _is_str_map, f"a map with text keys and plain values (nested < {MAX_NESTING})"
    if origin is list:
        return _is_str_list, "a list of text"
    if origin is types.UnionType and type(None) in get_args(tp):
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        check, what = _checker_for(name, inner)
        return (lambda v: v is None or check(v)), f"{what} or null"
    raise TypeError(f"no wire checker for {name}: {tp!r}")  # pragma: no cover


_MISSING = object()


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    check: Checker
    what: str
    required: bool
    default: Any


def _spec(cls: type[ev.Event]) -> tuple[_FieldSpec, ...]:
    out = []
    for f in dataclasses.fields(cast(Any, cls)):
        check, what = _checker_for(f.name, f.type)
        if f.default is not dataclasses.MISSING:
            required, default = False, f.default
        elif f.default_factory is not dataclasses.MISSING:
            required, default = False, f.default_factory()
        else:
            required, default = True, _MISSING
        out.append(_FieldSpec(f.name, check, what, required, default))
    return tuple(out)


_SPECS: dict[type[ev.Event], tuple[_FieldSpec, ...]] = {c: _spec(c) for c in ev.WIRE_EVENTS}


def event_from_map(cls: type[ev.Event], m: dict[Any, Any]) -> ev.Event:
    """Build ``cls`` from a decoded frame, checking every field; raises FieldError."""
    fast = _FAST_DECODERS.get(cls)
    if fast is not None:
        return fast(m)
    kwargs: dict[str, Any] = {}
    for spec in _SPECS[cls]:
        v = m.get(spec.name, _MISSING)
        if v is _MISSING:
            if spec.required:
                raise FieldError(f"{cls.METHOD}: missing field {spec.name!r}")
            continue
        if not spec.check(v):
            raise FieldError(f"{cls.METHOD}: field {spec.name!r} must be {spec.what}")
        kwargs[spec.name] = v
    return cls(**kwargs)


def _publish_from_map(m: dict[Any, Any]) -> ev.Publish:
    try:
        rid = m["id"]
        exchange = m["exchange"]
        body = m["body"]
    except KeyError as exc:
        raise FieldError(f"publish: missing field {exc.args[0]!r}") from None
    key = m.get("key", _MISSING)
    n = len(m)  # as if with a key: the shortcuts below count on the five usual keys
    if key is _MISSING:
        key = ""
        n += 1
    if type(rid) is not int:
        raise FieldError("publish: field 'id' must be an integer")
    if type(exchange) is not str:
        raise FieldError("publish: field 'exchange' must be text")
    if not is_short_text(exchange):
        raise FieldError(
            f"publish: field 'exchange' must be text of at most {SHORT_TEXT_MAX} bytes"
        )
    if type(key) is not str:
        raise FieldError("publish: field 'key' must be text")
    if not is_short_text(key):
        raise FieldError(f"publish: field 'key' must be {_SHORT_TEXT}")
    if type(body) is not bytes:
        raise FieldError("publish: field 'body' must be bytes")
    if n == 5:  # m, id, exchange, key, body: nothing optional to look at
        return ev.Publish(rid, exchange, key, body, {}, {}, False, False)
    get = m.get
    if n == 6:  # and props alone, valid (a grouped message): the rest are defaults
        props = get("props")
        if type(props) is dict and check_props(props) is None:
            return ev.Publish(rid, exchange, key, body, {}, props, False, False)
    elif n == 7 and get("confirm") is True:  # props and confirm: a persistent publish
        props = get("props")
        if type(props) is dict and check_props(props) is None:
            return ev.Publish(rid, exchange, key, body, {}, props, False, True)
    headers = get("headers")
    if headers is None:
        headers = {}
    elif (why := check_headers(headers)) is not None:
        raise FieldError(f"publish: field 'headers' {why}")
    props = get("props")
    if props is None:
        props = {}
    elif (why := check_props(props)) is not None:
        raise FieldError(f"publish: field 'props' {why}")
    mandatory = get("mandatory", False)
    confirm = get("confirm", False)
    if type(mandatory) is not bool or type(confirm) is not bool:
        raise FieldError("publish: fields 'mandatory' and 'confirm' must be booleans")
    return ev.Publish(rid, exchange, key, body, headers, props, mandatory, confirm)


#: The map a decoded ``deliver`` without headers or properties, or a bare ``ok``,
#: holds: one shared empty dict instead of two new ones per message (a measurable
#: part of a consumer's cost). Events are values: nobody mutates one.
EMPTY: dict[str, Any] = {}


def _deliver_from_map(m: dict[Any, Any]) -> ev.Deliver:
    get = m.get
    ctag, dtag, exchange, key, body = (
        get("ctag"),
        get("dtag"),
        get("exchange"),
        get("key"),
        get("body"),
    )
    if (
        type(ctag) is not str
        or type(dtag) is not int
        or type(exchange) is not str
        or type(key) is not str
        or type(body) is not bytes
    ):
        raise FieldError("deliver: 'ctag', 'exchange', 'key' must be text, 'dtag' an integer "
                         "and 'body' bytes")  # fmt: skip
    headers = get("headers")
    if headers is None:
        headers = EMPTY
    elif check_headers(headers) is not None:
        raise FieldError("deliver: bad 'headers'")
    props = get("props")
    if props is None:
        props = EMPTY
    elif check_props(props) is not None:
        raise FieldError("deliver: bad 'props'")
    redelivered = get("redelivered", False)
    queue = get("queue", "")
    offset = get("offset")
    if type(redelivered) is not bool or type(queue) is not str:
        raise FieldError("deliver: bad 'redelivered' or 'queue'")
    if offset is not None and type(offset) is not int:
        raise FieldError("deliver: 'offset' must be an integer")
    return ev.Deliver(ctag, dtag, exchange, key, body, headers, props, redelivered, queue, offset)


_Deliver = ev.Deliver  # a global, not a module attribute, per message


def _plain_deliver(m: dict[Any, Any]) -> ev.Deliver:
    """:func:`_deliver_from_map` for the usual map (``m``, ``ctag``, ``dtag``,
    ``exchange``, ``key``, ``body``), with the fewest steps: a consumer's per-message
    path. Any other map goes to the checked decoder."""
    if len(m) == 6:
        try:
            ctag = m["ctag"]
            dtag = m["dtag"]
            exchange = m["exchange"]
            key = m["key"]
            body = m["body"]
        except KeyError:
            pass
        else:
            if (
                type(ctag) is str
                and type(dtag) is int
                and type(exchange) is str
                and type(key) is str
                and type(body) is bytes
            ):
                return _Deliver(ctag, dtag, exchange, key, body, EMPTY, EMPTY, False, "", None)
    return _deliver_from_map(m)


def _bare_ok(m: dict[Any, Any]) -> ev.Ok | None:
    """An ``ok`` without ``info`` (a publish confirm, mostly); None for any other
    map, which the checked decoder then reads."""
    if len(m) == 2:
        re = m.get("re")
        if type(re) is int:
            return ev.Ok(re, EMPTY)
    return None


def _ack_from_map(m: dict[Any, Any]) -> ev.Ack:
    rid = m.get("id")
    dtag = m.get("dtag")
    multiple = m.get("multiple", False)
    if type(rid) is not int or type(dtag) is not int or type(multiple) is not bool:
        raise FieldError("ack: 'id' and 'dtag' must be integers and 'multiple' a boolean")
    return ev.Ack(rid, dtag, multiple)


_BARE_OK = cbor2.dumps({"m": "ok", "re": 0})[:-1]  # what the server writes, up to the id
_UINT_WIDTHS = {0x18: 1, 0x19: 2, 0x1A: 4, 0x1B: 8}


def encode_bare_ok(re: int) -> bytes:
    """``encode(Ok(re, {}))`` by hand, for ``0 <= re < 2**64`` (what
    :func:`read_bare_ok` reads): the server sends one per confirmed publish, and
    building the map for ``cbor2`` cost more than the rest of the reply;
    tests/protocol/test_protocol_fast_paths.py checks it against :func:`encode`."""
    enc = uint(re)
    return _LEN.pack(len(_BARE_OK) + len(enc)) + _BARE_OK + enc


_BARE_OK_HEADS = {
    n: struct.pack(">I", len(_BARE_OK) + n) + _BARE_OK for n in (1, 2, 3, 5, 9)
}  # by the id's length


def encode_bare_oks(res: list[int]) -> bytes:
    """``encode_bare_ok`` of each of ``res`` (each ``0 <= re < 2**64``), joined: the
    confirms one commit releases for one connection."""
    heads = _BARE_OK_HEADS
    parts = []
    for re in res:
        enc = uint(re)
        parts.append(heads[len(enc)])
        parts.append(enc)
    return b"".join(parts)


def read_bare_ok(buf: bytes | bytearray, start: int, end: int) -> ev.Ok | None:
    """The bare ``ok`` in ``buf[start:end]``, read without a CBOR decoder, when it
    is the map the server writes (``{"m": "ok", "re": id}``, in that order, with an
    unsigned ``re``): a publisher's per-message frame, 10 to 18 bytes, whose CBOR
    decoding (a dict per confirm) cost more than the rest of its handling. None
    for anything else, which the other paths then decode."""
    at = start + len(_BARE_OK)
    if end <= at or not buf.startswith(_BARE_OK, start):
        return None
    first = buf[at]
    if first < 24:
        return ev.Ok(first, EMPTY) if end == at + 1 else None
    if end != at + 1 + _UINT_WIDTHS.get(first, -1):
        return None
    return ev.Ok(int.from_bytes(buf[at + 1 : end], "big"), EMPTY)


#: a bare ok frame with a 32-bit id, up to the id: its length prefix, the map up to
#: ``re``'s value, and the head of a 32-bit unsigned integer (read_bare_ok_run)
_BARE_OK_LEAD32 = struct.pack(">I", len(_BARE_OK) + 5) + _BARE_OK + b"\x1a"
_BARE_OK_FRAME32 = len(_BARE_OK_LEAD32) + 4


def read_bare_ok_run(
    buf: bytes | bytearray, pos: int, size: int, room: int, max_frame: int, res: list[int]
) -> int:
    """Read on from ``pos`` (a frame's length prefix) while the frames are bare oks
    (what :func:`read_bare_ok` reads), at most ``room`` of them, each whole in
    ``buf[:size]``; each one's ``re`` goes to ``res``. Returns where the frames read
    end (``pos`` when none). For each frame read, :func:`read_bare_ok` of its bytes
    gives ``Ok(re, {})``. It reads none when ``max_frame`` is under the largest bare
    ok's size (the frame loop then refuses the long ones).

    Why it exists: a confirmed publisher's replies are runs of bare oks (the
    confirms one commit releases), and an ``Ok`` event a confirm, made and handled
    one by one, was about a seventh of the persistent bench client's instructions
    per message; :meth:`Connection.events_with_deliver_runs` reads the rest of a
    run with this (a 32-bit id, the usual one past the first 65,536 requests: one
    compare and one unpack a frame), and the client settles the run's confirms in
    one call. tests/protocol/test_protocol_fast_paths.py checks it against
    read_bare_ok."""
    lead = _BARE_OK_LEAD32
    whole = _BARE_OK_FRAME32
    add = res.append
    unpack = _LEN.unpack_from
    if max_frame < len(_BARE_OK) + 9:
        return pos
    while room > 0:
        if buf.startswith(lead, pos) and pos + whole <= size:
            add(_UNPACK32(buf, pos + whole - 4)[0])
            pos += whole
            room -= 1
            continue
        if size - pos < 4:
            break
        (n,) = unpack(buf, pos)
        end = pos + 4 + n
        # any other id width (the first 65,536 requests): read_bare_ok itself
        ok = read_bare_ok(buf, pos + 4, end) if end <= size else None
        if ok is None:
            break
        add(ok.re)
        pos = end
        room -= 1
    return pos


_PUBLISH_ROUTES: dict[bytes, tuple[str, str]] = {}  # encoded route -> exchange, key
_TEXT_WIDTHS = {0x78: 1, 0x79: 2}
_BYTES_WIDTHS = {0x58: 1, 0x59: 2, 0x5A: 4}
# a head's argument read in place (no slice) by its width: (width, unpack_from)
_UNPACK = {
    1: struct.Struct(">B"),
    2: struct.Struct(">H"),
    4: struct.Struct(">I"),
    8: struct.Struct(">Q"),
}
_UINT_READS = {h: (w, _UNPACK[w].unpack_from) for h, w in _UINT_WIDTHS.items()}
_UNPACK16 = _UNPACK[2].unpack_from
_UNPACK32 = _UNPACK[4].unpack_from
_BYTES_READS = {h: (w, _UNPACK[w].unpack_from) for h, w in _BYTES_WIDTHS.items()}


def read_plain_publish(buf: bytes | bytearray, start: int, end: int) -> ev.Publish | None:
    """The ``publish`` in ``buf[start:end]``, read without a CBOR decoder, when it is
    the map :func:`encode_publish` writes for a publish without headers,
    properties, ``mandatory`` or ``confirm`` (``{"m": "publish", "id", "exchange",
    "key", "body"}``, in that order, an unsigned ``id``), or for a confirmed
    persistent one (the same, then ``"props": {"persistent": true}, "confirm":
    true``), or for one with a small ``props`` map alone or with ``confirm`` true
    (:func:`read_props`: a grouped message's), or for one with a small ``headers``
    map alone (the same reader, checked as headers: a selected message's); None for
    anything else, which the other paths then decode (and refuse if it is bad).

    Why it exists: a publish is the server's per-message frame, and its CBOR
    decoding (a dict of five or seven keys, then the field checks) was the largest
    part of the broker's time per transient message.
    tests/protocol/test_protocol_fast_paths.py checks it against the checked
    decoder, for the client's frames and for altered ones."""
    grouped = persistent = False
    body_end = end
    if (
        buf.startswith(_PUBLISH_HEAD, start)
        or (grouped := buf.startswith(_PROPS_PUBLISH_HEAD, start))
        or (
            persistent := buf.startswith(_PERSISTENT_HEAD, start)
            and buf.endswith(_PERSISTENT_TAIL, start, end)
        )
    ):
        # The usual frame, read in one go: an id of up to 32 bits, the route of the
        # frame before, a body of up to 64 KiB ending the frame. The general path
        # below reads the same frame the same way, in more steps (a call, tuples and
        # a look-up each), which cost about 0.4 us of a broker's 5.5 a message;
        # anything else falls through to it. Likewise a grouped message's (the
        # props head): the body, then a props pair whose encoding was read before
        # (_PROPS_READ), the very map the general path would return for it. And a
        # confirmed persistent one's (the persistent head, the tail cut off: the
        # body ends where the tail starts), every persistent message's frame.
        if persistent:
            body_end = end - len(_PERSISTENT_TAIL)
        at = start + _PUBLISH_HEAD_LEN
        if at < end:
            rid = buf[at]
            if rid < 24:
                at += 1
            elif rid == 0x1A and at + 5 <= end:
                (rid,) = _UNPACK32(buf, at + 1)
                at += 5
            elif rid == 0x19 and at + 3 <= end:
                (rid,) = _UNPACK16(buf, at + 1)
                at += 3
            else:
                rid = -1
            last_route, names = _LAST_ROUTE[0]
            if rid >= 0 and buf.startswith(last_route, at, end):
                at += len(last_route)
                size = buf[at] if at < end else 0
                if size == 0x58 and at + 2 <= end:
                    size = buf[at + 1]
                    at += 2
                elif 0x40 <= size < 0x58:
                    size -= 0x40
                    at += 1
                elif size == 0x59 and at + 3 <= end:
                    (size,) = _UNPACK16(buf, at + 1)
                    at += 3
                else:
                    size = -1
                if persistent:
                    if at + size == body_end and size >= 0:
                        body = buf[at:body_end]
                        if type(body) is not bytes:
                            body = bytes(body)
                        return ev.Publish(
                            rid, names[0], names[1], body, {}, {"persistent": True}, False, True
                        )
                elif not grouped:
                    if at + size == end:  # (never with size -1: at < end here)
                        body = buf[at:end]
                        if type(body) is not bytes:
                            body = bytes(body)
                        return ev.Publish(rid, names[0], names[1], body, {}, {}, False, False)
                elif size >= 0 and buf.startswith(_K_PROPS, at + size, end):
                    stop = at + size + len(_K_PROPS)
                    if end - stop <= _PROPS_MAX:
                        props = _PROPS_READ.get(bytes(buf[stop:end]))
                        if props is not None:
                            body = buf[at : at + size]
                            if type(body) is not bytes:
                                body = bytes(body)
                            return ev.Publish(
                                rid, names[0], names[1], body, {}, props, False, False
                            )
                elif size >= 0 and buf.startswith(_K_HEADERS, at + size, end):
                    # a selected message's (headers alone, read before: _HEADERS_READ)
                    stop = at + size + len(_K_HEADERS)
                    if end - stop <= _PROPS_MAX:
                        headers = _HEADERS_READ.get(bytes(buf[stop:end]))
                        if headers is not None:
                            body = buf[at : at + size]
                            if type(body) is not bytes:
                                body = bytes(body)
                            return ev.Publish(
                                rid, names[0], names[1], body, headers, {}, False, False
                            )
    # what follows the body: nothing; {"persistent": true} and confirm (a confirmed
    # persistent publish's tail, cut off here); or a small props map (read_props),
    # perhaps then confirm
    persistent = props_after = False
    if buf.startswith(_PUBLISH_HEAD, start):
        at, confirm = start + len(_PUBLISH_HEAD), False
    elif buf.startswith(_PERSISTENT_HEAD, start) and buf.endswith(_PERSISTENT_TAIL, start, end):
        at, confirm, persistent = start + len(_PERSISTENT_HEAD), True, True
        end -= len(_PERSISTENT_TAIL)
    elif buf.startswith(_PROPS_PUBLISH_HEAD, start):
        at, confirm, props_after = start + len(_PROPS_PUBLISH_HEAD), False, True
    elif buf.startswith(_PERSISTENT_HEAD, start) and buf.endswith(_CONFIRM, start, end):
        at, confirm, props_after = start + len(_PERSISTENT_HEAD), True, True
        end -= len(_CONFIRM)
    else:
        return None
    if at >= end:
        return None
    first = buf[at]
    if first < 24:
        rid = first
        at += 1
    else:
        read = _UINT_READS.get(first)  # (width, its unpack_from)
        if read is None or at + 1 + read[0] > end:
            return None
        (rid,) = read[1](buf, at + 1)
        at += 1 + read[0]
    got = _route_body(buf, at, end)
    if got is None:
        return None
    (exchange, key), body, stop = got
    if props_after and not confirm and buf.startswith(_K_HEADERS, stop, end):
        # a headers pair alone, last (a selected message's): as props below, the
        # one dict kept for its encoding (_HEADERS_READ; a broker never changes a
        # message's headers: a dead-lettered copy gets a new map)
        at = stop + len(_K_HEADERS)
        if end - at > _PROPS_MAX:
            return None
        enc = buf[at:end]
        if type(enc) is not bytes:
            enc = bytes(enc)
        headers = _HEADERS_READ.get(enc) or _read_small_map(enc, True)
        if headers is None:
            return None
        return ev.Publish(rid, exchange, key, body, headers, {}, False, False)
    if props_after:
        # the props pair, last: the map read_props reads, as the one dict kept for
        # its encoding (shared by every message spelled so, not copied as
        # read_props copies it): a broker never changes a message's props, and
        # a delivery finds the encoding of a shared map by its identity
        # (_PROPS_PAIRS) instead of encoding the map again. The same six lines as
        # read_plain_deliver's, inlined in both on purpose: a call a message showed
        at = stop + len(_K_PROPS)
        if end - at > _PROPS_MAX or not buf.startswith(_K_PROPS, stop):
            return None
        enc = buf[at:end]
        if type(enc) is not bytes:
            enc = bytes(enc)
        props = _PROPS_READ.get(enc) or _read_props(enc)
        if props is None:
            return None
    elif stop != end:
        return None
    else:
        props = {"persistent": True} if persistent else {}
    return ev.Publish(rid, exchange, key, body, {}, props, False, confirm)


#: a small properties map's encoding -> the map (read_props; bounded)
_PROPS_READ: dict[bytes, dict[str, Any]] = {}
#: the id of a map in _PROPS_READ whose encoding is what cbor2 writes for it -> the
#: map and its ``props`` pair (:func:`_message_pairs`); cleared with _PROPS_READ
_PROPS_PAIRS: dict[int, tuple[dict[str, Any], bytes]] = {}
_PROPS_MAX = 64  # the longest props encoding read_props looks at


def read_props(buf: bytes | bytearray, at: int, end: int) -> dict[str, Any] | None:
    """The properties map encoded in exactly ``buf[at:end]``, when it is a map of one
    to four entries with short text keys (under 24 bytes) and values that are short
    text, unsigned integers or booleans, and :func:`check_props` finds it valid (a
    grouped message's ``{"group_id": ...}``, a persistent one's, a priority);
    None for anything else, which the checked decoder then reads (or refuses).

    Why it exists: a grouped message's props made its publish (on the broker) and
    its delivery (on the consumer) take ``cbor2.loads`` and the general path,
    about 1.5 us a message more on each side than a plain message. Each call
    returns a new dict (a remembered map is copied: props are handed to users;
    :func:`read_plain_publish`, a broker's reader, shares it instead).
    tests/protocol/test_protocol_fast_paths.py checks it against ``cbor2.loads``."""
    if end - at > _PROPS_MAX or at >= end:
        return None
    enc = bytes(buf[at:end])
    known = _PROPS_READ.get(enc) or _read_props(enc)
    return None if known is None else dict(known)


def _read_props(enc: bytes) -> dict[str, Any] | None:
    """:func:`read_props` of all of ``enc`` (at most _PROPS_MAX bytes), not yet
    remembered: parsed, checked and remembered (the map itself is returned, which
    callers must not change)."""
    return _read_small_map(enc, False)


#: a small headers map's encoding -> the map (read_plain_publish: a selected
#: message's ``{"k": 3}``; bounded, cleared with _PROPS_READ)
_HEADERS_READ: dict[bytes, dict[str, Any]] = {}


def _read_small_map(enc: bytes, headers: bool) -> dict[str, Any] | None:
    """The map of one to four entries with short text keys and short text, unsigned
    integer or boolean values encoded in all of ``enc``, checked as a props map
    (``headers`` False: remembered in _PROPS_READ) or a headers map (True:
    _HEADERS_READ); None for anything else."""
    if not enc:
        return None
    h = enc[0]
    if not 0xA1 <= h <= 0xA4:
        return None
    count = h - 0xA0
    size = len(enc)
    props: dict[str, Any] = {}
    i = 1
    value: Any
    try:
        for _ in range(count):
            h = enc[i]
            if not 0x60 <= h < 0x78:
                return None
            stop = i + 1 + h - 0x60
            if stop > size:
                return None
            name = enc[i + 1 : stop].decode()
            i = stop
            h = enc[i]
            if h < 24:
                value = h
                i += 1
            elif 0x60 <= h < 0x78:
                stop = i + 1 + h - 0x60
                if stop > size:
                    return None
                value = enc[i + 1 : stop].decode()
                i = stop
            elif h == 0xF5 or h == 0xF4:
                value = h == 0xF5
                i += 1
            else:
                read = _UINT_READS.get(h)  # (width, its unpack_from)
                if read is None or i + 1 + read[0] > size:
                    return None
                (value,) = read[1](enc, i + 1)
                i += 1 + read[0]
            props[name] = value
    except (IndexError, UnicodeDecodeError):
        return None
    if i != size or len(props) != count:
        return None
    if headers:
        if check_headers(props) is not None:
            return None
        if len(_HEADERS_READ) >= 4096:
            _HEADERS_READ.clear()
        _HEADERS_READ[enc] = props
        return props
    if check_props(props) is not None:
        return None
    if len(_PROPS_READ) >= 4096:
        _PROPS_READ.clear()
        _PROPS_PAIRS.clear()
    _PROPS_READ[enc] = props
    if cbor2.dumps(props) == enc:  # (not when a width is longer than it needs to be)
        _PROPS_PAIRS[id(props)] = (props, _K_PROPS + enc)
    return props


_CTAGS: dict[bytes, str] = {}  # an encoded consumer tag -> the tag
#: the ``props`` pair (key and map) of the last delivery :func:`read_plain_deliver`
#: read in its first branch, and the remembered map (from _PROPS_READ) it encodes
_LAST_PROPS: list[tuple[bytes, dict[str, Any]]] = [(b"", {})]


def last_props() -> tuple[bytes, dict[str, Any]]:
    """The encoded ``props`` pair of the last delivery with properties
    :func:`read_plain_deliver` read from the consumer tag and route of the frame
    before, and the map it encodes (not to be changed): the frame end
    :func:`read_deliver_run` reads on with as ``props_tail``."""
    return _LAST_PROPS[0]


def read_plain_deliver(buf: bytes | bytearray, start: int, end: int) -> dict[str, Any] | None:
    """The map of the ``deliver`` in ``buf[start:end]``, read without a CBOR decoder,
    when it is the map :func:`encode_deliver` writes for a first delivery without
    headers, properties or offset (``{"m": "deliver", "ctag", "dtag", "exchange",
    "key", "body"}``, in that order, an unsigned ``dtag``), or for one whose only
    property is ``persistent`` (``"props": {"persistent": true}`` last): the very map
    ``cbor2.loads`` gives, which the client's plain-map path takes as it is; or for
    one with a small ``props`` map last (:func:`read_props`: a grouped message's).
    None for anything else, which the other paths then decode.

    Why it exists: a consumer's per-message frame, whose CBOR decoding was the
    largest part of a transient consumer's time per message. The consumer tag and
    the route are decoded once (bounded caches).
    tests/protocol/test_protocol_fast_paths.py checks it against ``cbor2.loads``."""
    # The usual frame, read in one go: the consumer tag and the route of the
    # frame before, a tag of up to 32 bits, a body of up to 64 KiB ending the
    # frame (read_plain_publish's first branch, for the same reason: the
    # general path below, a call and tuples more, cost a consumer about 0.3 us
    # a message); anything else falls through to it. Its head and the consumer
    # tag of the frame before are one compare (_LAST_DELIVER_HEAD: a compare
    # fewer a message than the head, then the tag).
    grouped = False
    head, ctag = _LAST_DELIVER_HEAD[0]
    at = -1
    if buf.startswith(head, start, end):
        at = start + len(head)
    elif buf.startswith(_PERSISTENT_DELIVER_HEAD, start):
        # (and a grouped message's, with a props pair after the body whose encoding
        # was read before: the map below, as the general path builds it)
        last_tag, ctag = _LAST_CTAG[0]
        if buf.startswith(last_tag, start + _DELIVER_HEAD_LEN, end):
            grouped = True
            at = start + _DELIVER_HEAD_LEN + len(last_tag)
    if at >= 0:
        dtag = buf[at] if at < end else -1
        if dtag < 24:
            at += 1
        elif dtag == 0x1A and at + 5 <= end:
            (dtag,) = _UNPACK32(buf, at + 1)
            at += 5
        elif dtag == 0x19 and at + 3 <= end:
            (dtag,) = _UNPACK16(buf, at + 1)
            at += 3
        elif dtag == 0x18 and at + 2 <= end:
            dtag = buf[at + 1]
            at += 2
        else:
            dtag = -1
        last_route, names = _LAST_ROUTE[0]
        if dtag >= 0 and buf.startswith(last_route, at, end):
            at += len(last_route)
            size = buf[at] if at < end else 0
            if size == 0x58 and at + 2 <= end:
                size = buf[at + 1]
                at += 2
            elif 0x40 <= size < 0x58:
                size -= 0x40
                at += 1
            elif size == 0x59 and at + 3 <= end:
                (size,) = _UNPACK16(buf, at + 1)
                at += 3
            else:
                size = -1
            if not grouped:
                if at + size == end:  # (never with size -1: at < end here)
                    body = buf[at:end]
                    return {
                        "m": "deliver",
                        "ctag": ctag,
                        "dtag": dtag,
                        "exchange": names[0],
                        "key": names[1],
                        "body": body if type(body) is bytes else bytes(body),
                    }
            elif size >= 0 and buf.startswith(_K_PROPS, at + size, end):
                stop = at + size + len(_K_PROPS)
                if end - stop <= _PROPS_MAX:
                    props_enc = bytes(buf[stop:end])
                    # (read and remembered at the first miss: a persistent
                    # delivery's map, which the general path below reads without
                    # remembering it, took both paths every time until round 14)
                    known = _PROPS_READ.get(props_enc) or _read_props(props_enc)
                    if known is not None:
                        if known is not _LAST_PROPS[0][1]:  # (read_deliver_run's)
                            _LAST_PROPS[0] = (_K_PROPS + props_enc, known)
                        body = buf[at : at + size]
                        return {
                            "m": "deliver",
                            "ctag": ctag,
                            "dtag": dtag,
                            "exchange": names[0],
                            "key": names[1],
                            "body": body if type(body) is bytes else bytes(body),
                            "props": dict(known),
                        }
    props = False  # or a small props map after the body (read_props)
    if buf.startswith(_DELIVER_HEAD, start):
        persistent = False
    elif buf.startswith(_PERSISTENT_DELIVER_HEAD, start):
        if buf.endswith(_PERSISTENT_PROPS, start, end):
            persistent = True
            end -= len(_PERSISTENT_PROPS)
        else:
            persistent = False
            props = True
    else:
        return None
    at = start + len(_DELIVER_HEAD)
    last_tag, ctag = _LAST_CTAG[0]
    if buf.startswith(last_tag, at):  # the consumer of the frame before (see _LAST_ROUTE)
        at += len(last_tag)
    else:
        got = _read_ctag(buf, at, end)
        if got is None:
            return None
        at, ctag = got
    if at >= end:
        return None
    first = buf[at]
    if first < 24:
        dtag = first
        at += 1
    else:
        read = _UINT_READS.get(first)  # (width, its unpack_from)
        if read is None or at + 1 + read[0] > end:
            return None
        (dtag,) = read[1](buf, at + 1)
        at += 1 + read[0]
    rest = _route_body(buf, at, end)
    if rest is None:
        return None
    (exchange, key), body, stop = rest
    if props:
        # the props pair, last: read_props inlined (a grouped delivery is a
        # consumer's per-message frame, and two calls a message showed), a copy of
        # the map kept for its encoding
        at = stop + len(_K_PROPS)
        if end - at > _PROPS_MAX or not buf.startswith(_K_PROPS, stop):
            return None
        enc = buf[at:end]
        if type(enc) is not bytes:
            enc = bytes(enc)
        known = _PROPS_READ.get(enc) or _read_props(enc)
        if known is None:
            return None
        if known is not _LAST_PROPS[0][1]:  # (read_deliver_run's, as above)
            _LAST_PROPS[0] = (_K_PROPS + enc, known)
        return {
            "m": "deliver",
            "ctag": ctag,
            "dtag": dtag,
            "exchange": exchange,
            "key": key,
            "body": body,
            "props": dict(known),
        }
    if stop != end:
        return None
    if persistent:
        enc = _PERSISTENT_PROPS[len(_K_PROPS) :]
        known = _PROPS_READ.get(enc) or _read_props(enc)
        if known is not None and known is not _LAST_PROPS[0][1]:
            _LAST_PROPS[0] = (_PERSISTENT_PROPS, known)
        return {
            "m": "deliver",
            "ctag": ctag,
            "dtag": dtag,
            "exchange": exchange,
            "key": key,
            "body": body,
            "props": {"persistent": True},
        }
    return {
        "m": "deliver",
        "ctag": ctag,
        "dtag": dtag,
        "exchange": exchange,
        "key": key,
        "body": body,
    }


#: the last consumer tag :func:`_read_ctag` read (encoded, with the ``dtag`` key
#: after it) and the tag (set below, at first the empty tag)
_LAST_CTAG: list[tuple[bytes, str]] = []


def _read_ctag(buf: bytes | bytearray, at: int, end: int) -> tuple[int, str] | None:
    """Where a deliver's consumer tag and the ``dtag`` key after it end, from ``at``,
    and the tag; None for anything else."""
    if at >= end:
        return None
    h = buf[at]
    if 0x60 <= h < 0x78:
        tag_end = at + 1 + h - 0x60
    else:
        width = _TEXT_WIDTHS.get(h)
        if width is None:
            return None
        tag_end = at + 1 + width + int.from_bytes(buf[at + 1 : at + 1 + width], "big")
    if tag_end >= end or not buf.startswith(_K_DTAG, tag_end):
        return None
    encoded = bytes(buf[at:tag_end])
    ctag = _CTAGS.get(encoded)
    if ctag is None:
        try:
            ctag = cbor2.loads(encoded)
        except Exception:  # cbor2 raises several types for bad input
            return None
        if type(ctag) is not str:
            return None
        if len(_CTAGS) >= _ROUTE_CACHE_MAX:
            _CTAGS.clear()
        _CTAGS[encoded] = ctag
    _LAST_CTAG[0] = (encoded + _K_DTAG, ctag)
    _LAST_DELIVER_HEAD[0] = (_DELIVER_HEAD + encoded + _K_DTAG, ctag)
    return tag_end + len(_K_DTAG), ctag


_ROUTES_READ: dict[bytes, tuple[str, str]] = {}  # an encoded route -> exchange, key
_TEXT_WIDTHS = {0x78: 1, 0x79: 2}
_BYTES_WIDTHS = {0x58: 1, 0x59: 2, 0x5A: 4}


def _route_body(
    buf: bytes | bytearray, at: int, end: int
) -> tuple[tuple[str, str], bytes, int] | None:
    """The ``exchange``, ``key`` and ``body`` pairs :func:`_route_prefix` and a
    bytes head write, from ``at`` (the body ending at or before ``end``), and where
    the body ends; None for anything else. The route's two strings come from a
    bounded cache of the route's bytes."""
    last_route, names = _LAST_ROUTE[0]
    if buf.startswith(last_route, at):
        # the route of the frame before (the usual case): a complete encoding of
        # the three pairs found at ``at`` reads as those pairs (CBOR items end
        # where their heads say), so no parse and no look-up
        at += len(last_route)
    else:
        got = _read_route(buf, at, end)
        if got is None:
            return None
        at, names = got
    if at >= end:
        return None
    h = buf[at]
    if 0x40 <= h < 0x58:
        size = h - 0x40
        at += 1
    else:
        read = _BYTES_READS.get(h)  # (width, its unpack_from)
        if read is None or at + 1 + read[0] > end:
            return None
        (size,) = read[1](buf, at + 1)
        at += 1 + read[0]
    stop = at + size
    if stop > end:
        return None
    body = buf[at:stop]
    return names, body if type(body) is bytes else bytes(body), stop


def read_run_publish(
    buf: bytes | bytearray, start: int, end: int, rid: int, route: bytes
) -> bytes | None:
    """The body of the publish in ``buf[start:end]`` when it is a plain one (no
    headers, properties, ``mandatory`` or ``confirm``) with id ``rid`` and the
    encoded route ``route`` (what :data:`_LAST_ROUTE` holds: the ``exchange``,
    ``key`` and ``body`` keys and the names between them), its body under 64 KiB;
    else None. Then :func:`read_plain_publish` of the same bytes gives ``Publish(rid,
    exchange, key, body)`` for the route's names.

    Why it exists: a publisher sends its messages as a run of such frames, ids one
    after the other on one route; :meth:`Connection.events_with_publish_runs`
    reads the rest of a run with this, one ``bytes`` a message instead of a
    ``Publish`` event (whose construction was a twentieth of a broker's time per
    transient message). tests/protocol/test_protocol_fast_paths.py checks it
    against read_plain_publish."""
    if not buf.startswith(_PUBLISH_HEAD, start):
        return None
    at = start + _PUBLISH_HEAD_LEN
    if at >= end:
        return None
    got = buf[at]
    if got < 24:
        at += 1
    elif got == 0x1A and at + 5 <= end:
        (got,) = _UNPACK32(buf, at + 1)
        at += 5
    elif got == 0x19 and at + 3 <= end:
        (got,) = _UNPACK16(buf, at + 1)
        at += 3
    else:
        return None
    if got != rid or not buf.startswith(route, at, end):
        return None
    at += len(route)
    if at >= end:
        return None
    size = buf[at]
    if size == 0x58 and at + 2 <= end:
        size = buf[at + 1]
        at += 2
    elif 0x40 <= size < 0x58:
        size -= 0x40
        at += 1
    elif size == 0x59 and at + 3 <= end:
        (size,) = _UNPACK16(buf, at + 1)
        at += 3
    else:
        return None
    if at + size != end:
        return None
    body = buf[at:end]
    return body if type(body) is bytes else bytes(body)


def read_deliver_run(
    buf: bytes | bytearray,
    pos: int,
    size: int,
    room: int,
    max_frame: int,
    dtags: list[int],
    bodies: list[bytes],
    props_tail: bytes = b"",
) -> int:
    """Read on from ``pos`` (a frame's length prefix) while the frames are plain
    deliveries for the consumer tag and route of the one :func:`read_plain_deliver`
    read last (its first branch's frame: :data:`_LAST_DELIVER_HEAD`, a tag of up to
    32 bits, :data:`_LAST_ROUTE`, a body under 64 KiB ending the frame), at most
    ``room`` frames, each whole in ``buf[:size]`` and at most ``max_frame`` bytes;
    each frame's tag goes to ``dtags`` and its body to ``bodies``. Returns where
    the frames read end (``pos`` when none). For each frame read,
    :func:`read_plain_deliver` of its bytes gives the map of that consumer tag,
    route, tag and body.

    With ``props_tail`` (the ``props`` pair :func:`last_props` gives), the frames
    read are deliveries whose body is followed by that pair, ending the frame (a
    7-entry map: a persistent message's ``{"persistent": true}``);
    :func:`read_plain_deliver` of each gives the same map with ``props``, the
    map :func:`last_props` gives. (Since round 14: persistent deliveries took a
    map and the frame loop a message.)

    Why it exists: a consumer's deliveries arrive as runs of such frames, and a
    call to read_plain_deliver and a map a message (with the frame loop's checks
    around the call) were about a third of a transient consumer's time per
    message; :meth:`Connection.events_with_deliver_runs` reads the rest of a run
    with this, in one loop, a tag and a ``bytes`` a message.
    tests/protocol/test_protocol_fast_paths.py checks it against
    read_plain_deliver."""
    head = _LAST_DELIVER_HEAD[0][0]
    plen = len(props_tail)
    if plen:  # the map has a seventh entry, props, last
        head = MAP_HEADS[7] + head[1:]
    route = _LAST_ROUTE[0][0]
    after_head = 4 + len(head)
    route_len = len(route)
    unpack = _LEN.unpack_from
    add_tag = dtags.append
    add_body = bodies.append
    # The frame before's size and, when its tag took 32 bits, its route and body
    # length head (``tail``): a frame of the same size whose tag takes 32 bits and
    # whose bytes after the tag start with ``tail`` has the same body length, so it
    # is read with one compare after the head (the usual frame of a run: a tag
    # past 16 bits, one body size); any other goes the step-by-step way below.
    same_n = -1
    tail = b""
    tail_len = 0
    while room > 0 and size - pos >= 4:
        (n,) = unpack(buf, pos)
        end = pos + 4 + n
        if end > size or n > max_frame or not buf.startswith(head, pos + 4, end):
            break
        at = pos + after_head
        if (
            n == same_n
            and buf[at] == 0x1A
            and buf.startswith(tail, at + 5, end)
            and (not plen or buf.startswith(props_tail, end - plen))
        ):
            add_tag(_UNPACK32(buf, at + 1)[0])
            add_body(bytes(buf[at + tail_len : end - plen]))
            pos = end
            room -= 1
            continue
        if at >= end:
            break
        dtag = buf[at]
        wide = dtag == 0x1A
        if dtag < 24:
            at += 1
        elif wide and at + 5 <= end:
            (dtag,) = _UNPACK32(buf, at + 1)
            at += 5
        elif dtag == 0x19 and at + 3 <= end:
            (dtag,) = _UNPACK16(buf, at + 1)
            at += 3
        elif dtag == 0x18 and at + 2 <= end:
            dtag = buf[at + 1]
            at += 2
        else:
            break
        if not buf.startswith(route, at, end):
            break
        tail_at = at
        at += route_len
        if at >= end:
            break
        length = buf[at]
        if length == 0x58 and at + 2 <= end:
            length = buf[at + 1]
            at += 2
        elif 0x40 <= length < 0x58:
            length -= 0x40
            at += 1
        elif length == 0x59 and at + 3 <= end:
            (length,) = _UNPACK16(buf, at + 1)
            at += 3
        else:
            break
        if at + length != end - plen or (plen and not buf.startswith(props_tail, at + length)):
            break
        add_tag(dtag)
        add_body(bytes(buf[at : end - plen]))
        if wide:
            same_n = n
            tail = bytes(buf[tail_at:at])
            tail_len = 5 + len(tail)
        else:
            same_n = -1
        pos = end
        room -= 1
    return pos


def last_deliver() -> tuple[str, tuple[str, str]]:
    """The consumer tag and the route (exchange, key) :func:`read_plain_deliver`
    read last: those of the frames :func:`read_deliver_run` reads on."""
    return _LAST_DELIVER_HEAD[0][1], _LAST_ROUTE[0][1]


def last_route() -> tuple[bytes, tuple[str, str]]:
    """The encoded route the publish reader read last, and its exchange and key."""
    return _LAST_ROUTE[0]


#: the last route :func:`_read_route` read, and its names (set below, at first the
#: empty exchange and key)
_LAST_ROUTE: list[tuple[bytes, tuple[str, str]]] = []


def _read_route(buf: bytes | bytearray, at: int, end: int) -> tuple[int, tuple[str, str]] | None:
    """Where the ``exchange``, ``key`` and ``body`` keys :func:`_route_prefix` writes
    end, from ``at``, and the exchange and key; None for anything else."""
    route_at = at
    if not buf.startswith(_K_EXCHANGE, at):
        return None
    at += len(_K_EXCHANGE)
    for follow in (_K_KEY, _K_BODY):  # skip the exchange's text, then the key's
        if at >= end:
            return None
        h = buf[at]
        if 0x60 <= h < 0x78:
            at += 1 + h - 0x60
        elif h == 0x78 and at + 1 < end:  # (up to 255 bytes: a longer one is refused)
            at += 2 + buf[at + 1]
        else:
            return None
        if at >= end or not buf.startswith(follow, at):
            return None
        at += len(follow)
    route = bytes(buf[route_at:at])
    names = _ROUTES_READ.get(route)
    if names is None:
        try:
            decoded = cbor2.loads(MAP_HEADS[3] + route + b"\x40")
        except Exception:  # cbor2 raises several types for bad input
            return None
        exchange, key = decoded.get("exchange"), decoded.get("key")
        if len(decoded) != 3 or type(exchange) is not str or type(key) is not str:
            return None
        if len(_ROUTES_READ) >= _ROUTE_CACHE_MAX:
            _ROUTES_READ.clear()
        names = _ROUTES_READ[route] = (exchange, key)
    _LAST_ROUTE[0] = (route, names)
    return at, names


# --- publish.batch and stream.records ---------------------------------------------


def batch_messages_error(msgs: Any) -> str | None:
    """None when ``msgs`` is a valid ``publish.batch`` list, else the reason."""
    if type(msgs) is not list or not msgs:
        return "must be a non-empty list"
    for i, m in enumerate(msgs):
        if type(m) is not list:
            return f"message {i} must be a list"
        n = len(m)
        if n == 2:
            if type(m[0]) is not str or type(m[1]) is not bytes:
                return f"message {i}: key must be text and body bytes"
            if not is_short_text(m[0]):
                return f"message {i}: key is longer than {SHORT_TEXT_MAX} bytes"
            continue
        if n != 4 or type(m[0]) is not str or type(m[1]) is not bytes:
            return f"message {i} must be [key, body] or [key, body, headers, props]"
        if not is_short_text(m[0]):
            return f"message {i}: key is longer than {SHORT_TEXT_MAX} bytes"
        h, p = m[2], m[3]
        if h is not None and (why := check_headers(h)) is not None:
            return f"message {i}: headers {why}"
        if p is not None and (why := check_props(p)) is not None:
            return f"message {i}: props {why}"
    return None


def _publish_batch_from_map(m: dict[Any, Any]) -> ev.PublishBatch:
    get: Callable[..., Any] = m.get
    rid, exchange, msgs = get("id"), get("exchange"), get("msgs")
    if type(rid) is not int:
        raise FieldError("publish.batch: field 'id' must be an integer")
    if type(exchange) is not str:
        raise FieldError("publish.batch: field 'exchange' must be text")
    if not is_short_text(exchange):
        raise FieldError(
            f"publish.batch: field 'exchange' must be text of at most {SHORT_TEXT_MAX} bytes"
        )
    if (why := batch_messages_error(msgs)) is not None:
        raise FieldError(f"publish.batch: field 'msgs' {why}")
    mandatory = m.get("mandatory", False)
    persistent = m.get("persistent", False)
    if type(mandatory) is not bool or type(persistent) is not bool:
        raise FieldError("publish.batch: fields 'mandatory' and 'persistent' must be booleans")
    return ev.PublishBatch(rid, exchange, msgs, mandatory, persistent)


def _publish_columns_from_map(m: dict[Any, Any]) -> ev.PublishColumns:
    get: Callable[..., Any] = m.get
    rid, exchange, count = get("id"), get("exchange"), get("count")
    if type(rid) is not int:
        raise FieldError("publish.columns: field 'id' must be an integer")
    if type(exchange) is not str:
        raise FieldError("publish.columns: field 'exchange' must be text")
    if not is_short_text(exchange):
        raise FieldError(
            f"publish.columns: field 'exchange' must be text of at most {SHORT_TEXT_MAX} bytes"
        )
    if type(count) is not int or count < 1:
        raise FieldError("publish.columns: field 'count' must be an integer >= 1")
    keys, key_ends = get("keys"), get("key_ends")
    bodies, body_ends = get("bodies"), get("body_ends")
    why = _ends_error("key", key_ends, keys, count) or _ends_error("body", body_ends, bodies, count)
    if why is not None:
        raise FieldError(f"publish.columns: {why}")
    extras = get("extras", [])
    if (why := _extras_error(extras, count)) is not None:
        raise FieldError(f"publish.columns: field 'extras' {why}")
    mandatory = get("mandatory", False)
    persistent = get("persistent", False)
    if type(mandatory) is not bool or type(persistent) is not bool:
        raise FieldError("publish.columns: fields 'mandatory' and 'persistent' must be booleans")
    return ev.PublishColumns(
        rid, exchange, count, keys, key_ends, bodies, body_ends, extras, mandatory, persistent
    )


def batch_rows(b: ev.PublishBatch | ev.PublishColumns) -> list[list[Any]]:
    """The messages of a ``publish.batch`` (its ``msgs``) or of a
    ``publish.columns`` in that form: ``[key, body]`` or ``[key, body, headers,
    props]``."""
    if type(b) is ev.PublishBatch:
        return b.msgs
    assert type(b) is ev.PublishColumns
    keys, bodies = batch_columns(b)
    rows: list[list[Any]] = [list(kb) for kb in zip(keys, bodies, strict=True)]
    for i, h, p in b.extras:
        rows[i] = [keys[i], bodies[i], h, p]
    return rows


def publish_columns(
    rid: int, exchange: str, rows: list[Any], *, mandatory: bool = False, persistent: bool = False
) -> ev.PublishColumns:
    """The ``publish.columns`` holding ``rows`` (non-empty; each ``[key, body]`` or
    ``[key, body, headers, props]``, as ``publish.batch``'s ``msgs``)."""
    keys, key_ends = _text_column([r[0] for r in rows])
    bodies = [r[1] for r in rows]
    body_ends = array.array(_ENDS, [0])
    body_ends.extend(itertools.accumulate(map(len, bodies)))
    extras = [
        [i, r[2] or None, r[3] or None] for i, r in enumerate(rows) if len(r) > 2 and (r[2] or r[3])
    ]
    return ev.PublishColumns(
        rid,
        exchange,
        len(rows),
        keys,
        key_ends,
        b"".join(bodies),
        _ends_bytes(body_ends),
        extras,
        mandatory,
        persistent,
    )


def batch_columns(b: ev.PublishColumns) -> tuple[list[str], list[bytes]]:
    """The routing keys and bodies of a ``publish.columns`` (its ``extras`` aside)."""
    blob, bodies = b.keys, b.bodies
    text = blob.decode()
    ends = ends_array(b.key_ends)
    if len(text) == len(blob):  # ASCII: byte positions are character positions
        keys = [text[x:y] for x, y in itertools.pairwise(ends)]
    else:
        keys = [blob[x:y].decode() for x, y in itertools.pairwise(ends)]
    body_list = [bodies[x:y] for x, y in itertools.pairwise(ends_array(b.body_ends))]
    return keys, body_list


_ENDS = "I"  # array type of the *_ends columns: unsigned 32 bits
_SWAP = sys.byteorder != "little"


def ends_array(data: bytes) -> array.array[int]:
    """A ``*_ends`` column of ``stream.records`` as integers."""
    a = array.array(_ENDS)
    a.frombytes(data)
    if _SWAP:  # pragma: no cover - big-endian hosts
        a.byteswap()
    return a


def _ends_bytes(ends: array.array[int]) -> bytes:
    if _SWAP:  # pragma: no cover - big-endian hosts
        ends = array.array(_ENDS, ends)
        ends.byteswap()
    return ends.tobytes()


def _ends_error(name: str, ends: Any, values: Any, count: int) -> str | None:
    if type(ends) is not bytes or type(values) is not bytes:
        return f"'{name}' and its ends must be bytes"
    if len(ends) != 4 * (count + 1):
        return f"'{name}_ends' must hold count + 1 positions"
    a = ends_array(ends)
    if a[0] != 0 or a[-1] != len(values):
        return f"'{name}_ends' must run from 0 to the length of '{name}'"
    if count > 1:
        positions = a.tolist()
        if positions != sorted(positions):  # (sorting a sorted list: one pass, in C)
            return f"'{name}_ends' must not decrease"
    if name != "body":  # text: each value UTF-8 on its own
        try:
            if len(values.decode()) != len(values):
                for x, y in itertools.pairwise(a):
                    values[x:y].decode()
        except UnicodeDecodeError:
            return f"'{name}s' must be UTF-8 text, value by value"
        if len(values) > SHORT_TEXT_MAX and any(
            y - x > SHORT_TEXT_MAX for x, y in itertools.pairwise(a)
        ):
            return f"each of '{name}s' must be at most {SHORT_TEXT_MAX} bytes"
    return None


def _extras_error(extras: Any, count: int | None) -> str | None:
    if type(extras) is not list:
        return "must be a list"
    last = -1
    for x in extras:
        if type(x) is not list or len(x) != 3 or type(x[0]) is not int:
            return "entries must be [index, headers, props]"
        i, h, p = x
        if i <= last or (count is not None and i >= count):
            return "indexes must increase and name records of the reply"
        last = i
        if h is not None and check_headers(h) is not None:
            return f"record {i}: bad headers"
        if p is not None and check_props(p) is not None:
            return f"record {i}: bad props"
    return None


def _stream_records_from_map(m: dict[Any, Any]) -> ev.StreamRecords:
    get: Callable[..., Any] = m.get
    ints = [get(k) for k in ("re", "first", "count")]
    if any(type(v) is not int or v < 0 for v in ints):
        raise FieldError("stream.records: 're', 'first' and 'count' must be integers >= 0")
    re, first, count = ints
    more = [get("dropped", 0), get("kept_first", 0), get("kept_next", 0)]
    if any(type(v) is not int or v < 0 for v in more):
        raise FieldError("stream.records: 'dropped', 'kept_first', 'kept_next' must be >= 0")
    columns: dict[str, Any] = {}
    for name in ("keys", "exchanges", "bodies"):
        single = "key" if name == "keys" else name[:-1] if name == "exchanges" else "body"
        values, ends = get(name), get(f"{single}_ends")
        why = _ends_error(single, ends, values, count)
        if why is not None:
            raise FieldError(f"stream.records: {why}")
        columns[name] = values
        columns[f"{single}_ends"] = ends
    extras = get("extras", [])
    if (why := _extras_error(extras, count)) is not None:
        raise FieldError(f"stream.records: field 'extras' {why}")
    return ev.StreamRecords(
        re,
        first,
        count,
        columns["keys"],
        columns["key_ends"],
        columns["exchanges"],
        columns["exchange_ends"],
        columns["bodies"],
        columns["body_ends"],
        extras,
        *more,
    )


def _text_column(values: list[str]) -> tuple[bytes, bytes]:
    joined = "".join(values)
    blob = joined.encode()
    ends = array.array(_ENDS, [0])
    if len(blob) == len(joined):  # all ASCII: a character is a byte
        ends.extend(itertools.accumulate(map(len, values)))
    else:
        ends.extend(itertools.accumulate(len(v.encode()) for v in values))
    return blob, _ends_bytes(ends)


#: What a ``stream.records`` frame adds to its columns, at most (keys, integers,
#: the map), and what each record adds (its three end positions).
RECORDS_OVERHEAD = 512
RECORD_OVERHEAD = 12


def stream_records(
    re: int,
    first: int,
    messages: list[Any],
    *,
    dropped: int,
    kept_first: int,
    kept_next: int,
) -> ev.StreamRecords:
    """The ``stream.records`` reply holding ``messages`` (broker messages with
    ``exchange``, ``routing_key``, ``body``, ``headers``, ``properties``) from
    offset ``first``, as columns."""
    keys, key_ends = _text_column([m.routing_key for m in messages])
    exchanges, exchange_ends = _text_column([m.exchange for m in messages])
    bodies = [m.body for m in messages]
    body_ends = array.array(_ENDS, [0])
    body_ends.extend(itertools.accumulate(map(len, bodies)))
    extras = [
        [i, m.headers or None, m.properties or None]
        for i, m in enumerate(messages)
        if m.headers or m.properties
    ]
    return ev.StreamRecords(
        re,
        first,
        len(messages),
        keys,
        key_ends,
        exchanges,
        exchange_ends,
        b"".join(bodies),
        _ends_bytes(body_ends),
        extras,
        dropped,
        kept_first,
        kept_next,
    )


def records_size(r: ev.StreamRecords) -> int:
    """About the size of ``r``'s frame (the extras estimated)."""
    return (
        RECORDS_OVERHEAD
        + len(r.keys)
        + len(r.exchanges)
        + len(r.bodies)
        + RECORD_OVERHEAD * r.count
        + (len(cbor2.dumps(r.extras)) if r.extras else 0)
    )


# The per-message decoders :class:`~amqlite.protocol.Connection` runs while OPEN,
# before the general path: each returns the event the general path would give, or
# raises FieldError / returns None to leave the frame to it.
decode_publish = _publish_from_map
decode_deliver = _plain_deliver
decode_ok = _bare_ok
decode_ack = _ack_from_map
decode_peer = _peer_from_map

_FAST_DECODERS: dict[type[ev.Event], Callable[[dict[Any, Any]], ev.Event]] = {
    ev.Publish: _publish_from_map,
    ev.Deliver: _deliver_from_map,
    ev.Ack: _ack_from_map,
    ev.PublishBatch: _publish_batch_from_map,
    ev.PublishColumns: _publish_columns_from_map,
    ev.StreamRecords: _stream_records_from_map,
}


def event_to_map(event: ev.Event) -> dict[str, Any]:
    """The frame map for ``event``, with default-valued fields left out."""
    m: dict[str, Any] = {"m": event.METHOD}
    for spec in _SPECS[type(event)]:
        v = getattr(event, spec.name)
        if spec.required or v != spec.default:
            m[spec.name] = v
    return m


# --- framing -----------------------------------------------------------------------

_LEN = struct.Struct(">I")


def frame(payload: bytes) -> bytes:
    """Prefix a CBOR payload with its 4-byte big-endian length."""
    return _LEN.pack(len(payload)) + payload


def encode(event: ev.Event) -> bytes:
    """One complete frame (length prefix included) for ``event``."""
    if type(event) is ev.Publish:
        return frame(cbor2.dumps(_publish_map(event)))
    return frame(cbor2.dumps(event_to_map(event)))


def _publish_map(p: ev.Publish) -> dict[str, Any]:
    m: dict[str, Any] = {
        "m": "publish",
        "id": p.id,
        "exchange": p.exchange,
        "key": p.key,
        "body": p.body,
    }
    if p.headers:
        m["headers"] = p.headers
    if p.props:
        m["props"] = p.props
    if p.mandatory:
        m["mandatory"] = True
    if p.confirm:
        m["confirm"] = True
    return m


# --- deliveries: the server's hot path -----------------------------------------------


class WireMessage(Protocol):
    """What a delivery needs from a broker message. ``wire`` caches the encoded
    message fields; the broker leaves it None and the codec fills it once."""

    exchange: str
    routing_key: str
    body: bytes
    headers: dict[str, Any]
    properties: dict[str, Any]
    wire: bytes | None


_K_EXCHANGE = cbor2.dumps("exchange")
_K_KEY = cbor2.dumps("key")
_K_BODY = cbor2.dumps("body")
_LAST_ROUTE.append((_K_EXCHANGE + cbor2.dumps("") + _K_KEY + cbor2.dumps("") + _K_BODY, ("", "")))
_K_HEADERS = cbor2.dumps("headers")
_K_PROPS = cbor2.dumps("props")


_ROUTE_CACHE: dict[tuple[str, str], bytes] = {}
_ROUTE_CACHE_MAX = 4096


def _route_prefix(exchange: str, key: str) -> bytes:
    """The encoded ``exchange``, ``key`` pairs and the ``body`` key: the same for
    every message on one route, so cached (bounded)."""
    route = (exchange, key)
    prefix = _ROUTE_CACHE.get(route)
    if prefix is None:
        ex, k = exchange.encode(), key.encode()
        prefix = b"".join(
            (_K_EXCHANGE, head(TEXT, len(ex)), ex, _K_KEY, head(TEXT, len(k)), k, _K_BODY)
        )
        if len(_ROUTE_CACHE) >= _ROUTE_CACHE_MAX:
            _ROUTE_CACHE.clear()
        _ROUTE_CACHE[route] = prefix
    return prefix


_PAIR_CACHE: dict[tuple[bytes, str, type, str | int], bytes] = {}
_PAIR_CACHE_MAX = 4096
_PAIR_CACHE_TEXT = 64  # longest text value kept in the cache


def _map_pair(key: bytes, m: dict[str, Any]) -> bytes:
    """``key + cbor2.dumps(m)``: the encoded ``headers`` or ``props`` pair
    (``key`` is :data:`_K_HEADERS` or :data:`_K_PROPS`) of a message.

    Fast path: a one-entry map with a short text or an integer value (a message's
    ``group_id``, a selector's key) is remembered (bounded, like the route
    prefixes): the same few maps come with many messages, and a look-up costs a
    third of encoding them. Only text keys and values of exactly ``str``, ``int`` or
    ``bool`` (a persistent message's ``{"persistent": True}``) use the cache, and the
    value's type is part of the cache key, so ``True`` or ``1.0``, equal to ``1`` as
    dict keys, never find ``1``'s bytes;
    tests/protocol/test_protocol_fast_paths.py checks it against ``cbor2.dumps``."""
    if len(m) == 1:
        for k, v in m.items():  # the one entry (a loop: cheaper than unpacking items())
            t = type(v)
            if type(k) is str and (
                t is int or t is bool or (t is str and len(v) <= _PAIR_CACHE_TEXT)
            ):
                entry = (key, k, t, v)
                pair = _PAIR_CACHE.get(entry)
                if pair is None:
                    if len(_PAIR_CACHE) >= _PAIR_CACHE_MAX:
                        _PAIR_CACHE.clear()
                    pair = _PAIR_CACHE[entry] = key + cbor2.dumps(m)
                return pair
    return key + cbor2.dumps(m)


#: the route and body size of the last message _message_pairs encoded, and the start
#: of its pairs for them (the route's, then the body's head)
_LAST_PAIRS_START: list[tuple[str, str, int, bytes]] = [("", "", -1, b"")]


def _message_pairs(msg: WireMessage) -> bytes:
    """The encoded (key, value) pairs of a message's fields, cached on the message
    (``msg.wire``): computed once per message however many consumers get it.

    The pair count is not stored: it is 3, plus one for non-empty headers and one
    for non-empty properties (see :func:`_pair_count`).
    """
    wire = msg.wire
    if wire is None:
        body = msg.body
        exchange, key, size = msg.exchange, msg.routing_key, len(body)
        last = _LAST_PAIRS_START[0]
        if last[2] == size and last[1] == key and last[0] == exchange:
            # the route and body size of the message before (a run's messages):
            # their encoded start, one concatenation; tests/protocol/
            # test_protocol_fast_paths.py checks it against the pieces
            wire = last[3] + body
        else:
            start = _route_prefix(exchange, key) + bytes_head(size)
            _LAST_PAIRS_START[0] = (exchange, key, size, start)
            wire = start + body
        if msg.headers:
            wire += _map_pair(_K_HEADERS, msg.headers)
        props = msg.properties
        if props:
            # a map read_plain_publish shares (a grouped message's, on a broker):
            # its encoding as read, found by the map's identity (the entry holds
            # the map, so no other map can have its id while the entry is there);
            # tests/protocol/test_protocol_fast_paths.py checks it is _map_pair's
            known = _PROPS_PAIRS.get(id(props))
            if known is not None and known[0] is props:
                wire += known[1]
            else:
                wire += _map_pair(_K_PROPS, props)
        msg.wire = wire
    return wire


def _pair_count(msg: WireMessage) -> int:
    return 3 + (1 if msg.headers else 0) + (1 if msg.properties else 0)


_K_M_DELIVER = cbor2.dumps("m") + cbor2.dumps("deliver")
_K_M_GETOK = cbor2.dumps("m") + cbor2.dumps("get-ok")
_K_CTAG = cbor2.dumps("ctag")
_K_DTAG = cbor2.dumps("dtag")
#: what a plain delivery starts with (read_plain_deliver)
_DELIVER_HEAD = MAP_HEADS[6] + _K_M_DELIVER + _K_CTAG
_DELIVER_HEAD_LEN = len(_DELIVER_HEAD)
_LAST_CTAG.append((cbor2.dumps("") + _K_DTAG, ""))
#: a plain delivery's head with the consumer tag of _LAST_CTAG (set with it), and the tag
_LAST_DELIVER_HEAD: list[tuple[bytes, str]] = [(_DELIVER_HEAD + _LAST_CTAG[0][0], "")]
#: and a persistent one's, whose only property is ``persistent``, then its end
_PERSISTENT_DELIVER_HEAD = MAP_HEADS[7] + _K_M_DELIVER + _K_CTAG
_PERSISTENT_PROPS = _K_PROPS + cbor2.dumps({"persistent": True})
_K_RE = cbor2.dumps("re")
_K_REMAINING = cbor2.dumps("remaining")
_K_QUEUE = cbor2.dumps("queue")
_K_OFFSET = cbor2.dumps("offset")
_REDELIVERED = cbor2.dumps("redelivered") + b"\xf5"
_CTAG_CACHE: dict[str, bytes] = {}


def encode_deliver(
    ctag: str, dtag: int, redelivered: bool, msg: WireMessage, offset: int | None = None
) -> bytes:
    """One ``deliver`` frame, built without re-encoding the message body; ``offset``
    for a message from a stream queue."""
    pairs = msg.wire or _message_pairs(msg)
    ctag_enc = _CTAG_CACHE.get(ctag) or _ctag_lead(ctag)
    n = _pair_count(msg) + 3
    if offset is not None:
        if redelivered:
            lead = MAP_HEADS[n + 2] + ctag_enc + uint(dtag) + _REDELIVERED
        else:
            lead = MAP_HEADS[n + 1] + ctag_enc + uint(dtag)
        lead += _K_OFFSET + uint(offset)
    elif redelivered:
        lead = MAP_HEADS[n + 1] + ctag_enc + uint(dtag) + _REDELIVERED
    else:
        lead = MAP_HEADS[n] + ctag_enc + uint(dtag)
    return _LEN.pack(len(lead) + len(pairs)) + lead + pairs


class WireDelivery(Protocol):
    """What :func:`append_deliveries` reads of a delivery (the broker's ``Delivery``)."""

    ctag: str
    dtag: int
    redelivered: bool
    offset: int | None

    @property
    def message(self) -> WireMessage: ...


#: the last consumer tag and map size append_deliveries saw, and the frame's start
#: for them: the map head, ``m``, ``ctag`` and the ``dtag`` key
_LAST_LEAD: list[tuple[str, int, bytes]] = [("", -1, b"")]
_TAG8 = tuple(uint(n) for n in range(0x100))  # uint(n) for a small delivery tag
_TAG16 = struct.Struct(">BH").pack  # (0x19, n): uint(n) below 0x10000
_TAG32 = struct.Struct(">BI").pack  # (0x1A, n): uint(n) below 0x100000000


def append_deliveries(out: bytearray, deliveries: Iterable[WireDelivery]) -> None:
    """Append :func:`encode_deliver`'s frame of each delivery to ``out``.

    Why it exists beside :func:`encode_deliver`: a broker sends a frame a message,
    and one call a delivery (with its own calls to count the pairs, encode the tag
    and join the frame from three pieces) was a tenth of its time per transient
    message. Here a first delivery (not redelivered, not from a stream) of a
    consumer tag seen just before reuses that tag's encoded start, and the frame's
    pieces go into ``out`` one after the other; every other delivery takes
    :func:`encode_deliver`. tests/protocol/test_protocol_fast_paths.py checks the
    bytes are encode_deliver's."""
    pack = _LEN.pack
    last_ctag, last_n, last_lead = _LAST_LEAD[0]
    tag8 = _TAG8
    for d in deliveries:
        msg = d.message
        dtag = d.dtag
        if d.redelivered or d.offset is not None or not 0 <= dtag < 0x100000000:
            out += encode_deliver(d.ctag, dtag, d.redelivered, msg, d.offset)
            continue
        pairs = msg.wire or _message_pairs(msg)
        n = 6 + (1 if msg.headers else 0) + (1 if msg.properties else 0)
        ctag = d.ctag
        if ctag != last_ctag or n != last_n:
            last_ctag, last_n = ctag, n
            last_lead = MAP_HEADS[n] + _ctag_lead(ctag)
            _LAST_LEAD[0] = (ctag, n, last_lead)
        if dtag < 0x100:
            tag = tag8[dtag]
        elif dtag < 0x10000:
            tag = _TAG16(0x19, dtag)
        else:
            tag = _TAG32(0x1A, dtag)
        out += pack(len(last_lead) + len(tag) + len(pairs))
        out += last_lead
        out += tag
        out += pairs


def _ctag_lead(ctag: str) -> bytes:
    """``m``, ``ctag`` and the ``dtag`` key of a deliver frame to ``ctag`` (cached)."""
    ctag_enc = _CTAG_CACHE.get(ctag)
    if ctag_enc is None:
        if len(_CTAG_CACHE) > 4096:
            _CTAG_CACHE.clear()
        ctag_enc = _CTAG_CACHE[ctag] = _K_M_DELIVER + _K_CTAG + cbor2.dumps(ctag) + _K_DTAG
    return ctag_enc


def encode_get_ok(
    re: int, dtag: int, redelivered: bool, remaining: int, queue: str, msg: WireMessage
) -> bytes:
    """One ``get-ok`` frame (the message fields spliced from the same cache)."""
    pairs = msg.wire or _message_pairs(msg)
    n = _pair_count(msg) + 5
    lead = (
        _K_M_GETOK
        + _K_RE
        + uint(re)
        + _K_DTAG
        + uint(dtag)
        + _K_REMAINING
        + uint(remaining)
        + _K_QUEUE
        + cbor2.dumps(queue)
    )
    if redelivered:
        n += 1
        lead += _REDELIVERED
    payload = MAP_HEADS[n] + lead + pairs
    return _LEN.pack(len(payload)) + payload


# --- peering: a ``peer`` frame around a map the peering layer encoded ---------------

_PEER_HEAD = b"\xa2" + cbor2.dumps("m") + cbor2.dumps("peer") + cbor2.dumps("msg")


def encode_peer(msg: bytes) -> bytes:
    """One ``peer`` frame whose ``msg`` is ``msg``, one CBOR-encoded map (what
    :func:`encode` gives for ``PeerMessage(cbor2.loads(msg))``)."""
    return _LEN.pack(len(_PEER_HEAD) + len(msg)) + _PEER_HEAD + msg


# --- the client's hot path: publish and ack frames ------------------------------------
# Written by hand because a client publishes and acks per message: these are the
# bytes :func:`encode` writes for the same ``Publish`` / ``Ack`` (the same keys in
# the same order; tests/protocol/test_protocol_fast_paths.py checks it), at a
# fraction of the cost. :meth:`Connection.send_publish` and ``send_ack`` call them.

_K_M_PUBLISH = cbor2.dumps("m") + cbor2.dumps("publish")
_K_M_ACK = cbor2.dumps("m") + cbor2.dumps("ack")
_K_ID = cbor2.dumps("id")
_MANDATORY = cbor2.dumps("mandatory") + b"\xf5"
_CONFIRM = cbor2.dumps("confirm") + b"\xf5"
#: a confirmed persistent publish's frame without headers, around its fields
#: (read_plain_publish)
_PERSISTENT_HEAD = MAP_HEADS[7] + _K_M_PUBLISH + _K_ID
_PERSISTENT_TAIL = _K_PROPS + cbor2.dumps({"persistent": True}) + _CONFIRM
_MULTIPLE = cbor2.dumps("multiple") + b"\xf5"
_PUBLISH_HEAD = MAP_HEADS[5] + _K_M_PUBLISH + _K_ID
_PUBLISH_HEAD_LEN = len(_PUBLISH_HEAD)
#: a publish with props alone (a grouped message's), its props last (read_plain_publish)
_PROPS_PUBLISH_HEAD = MAP_HEADS[6] + _K_M_PUBLISH + _K_ID
_ACK_HEAD = MAP_HEADS[3] + _K_M_ACK + _K_ID
_ACK_MULTIPLE_HEAD = MAP_HEADS[4] + _K_M_ACK + _K_ID


def encode_publish(
    rid: int,
    exchange: str,
    key: str,
    body: bytes,
    headers: dict[str, Any] | None,
    props: dict[str, Any] | None,
    mandatory: bool,
    confirm: bool,
) -> bytes:
    """One ``publish`` frame: ``encode(Publish(rid, exchange, key, body, headers or
    {}, props or {}, mandatory, confirm))``, by hand."""
    rid_enc = uint(rid)
    route = _route_prefix(exchange, key)
    size = len(body)
    body_head = bytes_head(size)
    size += len(rid_enc) + len(route) + len(body_head)
    if not (headers or props or mandatory or confirm):
        size += len(_PUBLISH_HEAD)
        return b"".join((_LEN.pack(size), _PUBLISH_HEAD, rid_enc, route, body_head, body))
    n = 5
    tail = b""
    if headers:
        tail += _map_pair(_K_HEADERS, headers)
        n += 1
    if props:
        tail += _map_pair(_K_PROPS, props)
        n += 1
    if mandatory:
        tail += _MANDATORY
        n += 1
    if confirm:
        tail += _CONFIRM
        n += 1
    lead = MAP_HEADS[n] + _K_M_PUBLISH + _K_ID
    size += len(lead) + len(tail)
    return b"".join((_LEN.pack(size), lead, rid_enc, route, body_head, body, tail))


#: the length, head and a 32-bit id of a plain publish frame, in one pack
#: (append_plain_publish)
_PLAIN_PUBLISH_LEAD32 = struct.Struct(f">I{_PUBLISH_HEAD_LEN}sBI").pack
#: a plain publish's route and body head (``_route_prefix`` and ``bytes_head``) by
#: exchange, key and body size: the same for every message of one route and size
#: (bounded like _ROUTE_CACHE)
_PLAIN_MIDDLE_CACHE: dict[tuple[str, str, int], bytes] = {}


def _new_middle(exchange: str, key: str, n: int) -> bytes:
    """The route and body head of a publish (a miss of _PLAIN_MIDDLE_CACHE), remembered."""
    middle = _route_prefix(exchange, key) + bytes_head(n)
    if len(_PLAIN_MIDDLE_CACHE) >= _ROUTE_CACHE_MAX:
        _PLAIN_MIDDLE_CACHE.clear()
    _PLAIN_MIDDLE_CACHE[(exchange, key, n)] = middle
    return middle


def encode_confirm_publish(
    rid: int, exchange: str, key: str, body: bytes, persistent: bool, limit: int
) -> bytes | None:
    """What ``encode_publish(rid, exchange, key, body, None, {"persistent": True} if
    persistent else None, False, True)`` returns, unless its payload is longer than
    ``limit`` bytes: then None.

    Why it exists: a confirmed publish without headers or other properties is the
    persistent bench's per-message send, and encode_publish built its props pair,
    its map head and its pieces for each (about a seventh of that client's
    instructions a message); here the frame is the head and a 32-bit id in one
    pack, the remembered route and body head (as append_plain_publish's), the
    body and a constant tail, joined once (the caller may keep the frame, to send
    it again after a reconnect). tests/protocol/test_protocol_fast_paths.py checks
    it against encode_publish."""
    n = len(body)
    middle = _PLAIN_MIDDLE_CACHE.get((exchange, key, n)) or _new_middle(exchange, key, n)
    if persistent:
        head, tail = _PERSISTENT_HEAD, _PERSISTENT_TAIL
    else:
        head, tail = _PROPS_PUBLISH_HEAD, _CONFIRM  # (five entries and confirm: six)
    if 0x10000 <= rid < 0x100000000:
        size = _PUBLISH_HEAD_LEN + 5 + len(middle) + n + len(tail)
        if size > limit:
            return None
        return b"".join((_PLAIN_PUBLISH_LEAD32(size, head, 0x1A, rid), middle, body, tail))
    rid_enc = uint(rid)
    size = _PUBLISH_HEAD_LEN + len(rid_enc) + len(middle) + n + len(tail)
    if size > limit:
        return None
    return b"".join((_LEN.pack(size), head, rid_enc, middle, body, tail))


def append_plain_publish(
    out: bytearray, rid: int, exchange: str, key: str, body: bytes, limit: int
) -> bool:
    """Append what ``encode_publish(rid, exchange, key, body, None, None, False,
    False)`` returns to ``out`` and return True, unless its payload is longer than
    ``limit`` bytes: then append nothing and return False.

    Why it exists: a client's plain transient publish (no headers, props, mandatory
    or confirm) is the bench's per-message send; this writes it into the link's
    buffer in three appends (an id of 32 bits, the usual one after the first
    65,536 publishes, packed with the length and head; the route and body head,
    remembered per route and body size; the body) instead of building the pieces,
    joining them into a frame and copying that. tests/protocol/
    test_protocol_fast_paths.py checks it against ``encode_publish``."""
    n = len(body)
    middle = _PLAIN_MIDDLE_CACHE.get((exchange, key, n)) or _new_middle(exchange, key, n)
    if 0x10000 <= rid < 0x100000000:
        size = _PUBLISH_HEAD_LEN + 5 + len(middle) + n
        if size > limit:
            return False
        out += _PLAIN_PUBLISH_LEAD32(size, _PUBLISH_HEAD, 0x1A, rid)
    else:
        rid_enc = uint(rid)
        size = _PUBLISH_HEAD_LEN + len(rid_enc) + len(middle) + n
        if size > limit:
            return False
        out += _LEN.pack(size) + _PUBLISH_HEAD + rid_enc
    out += middle
    out += body
    return True


#: the ``props`` pair of a valid one-entry props map, by (name, value type, value):
#: a value's type is part of the key, so ``True`` never finds ``1``'s bytes
#: (append_props_publish; bounded like _ROUTE_CACHE). Keyed by value, never by the
#: map's identity: a caller's dict may change between two publishes.
_VALID_PROPS_PAIRS: dict[tuple[str, type, str | int], bytes] = {}
_PROPS_PUBLISH_HEAD_LEN = len(_PROPS_PUBLISH_HEAD)


def append_props_publish(
    out: bytearray,
    rid: int,
    exchange: str,
    key: str,
    body: bytes,
    props: dict[str, Any],
    limit: int,
) -> bool:
    """Append what ``encode_publish(rid, exchange, key, body, None, props, False,
    False)`` returns to ``out`` and return True, when ``props`` is a one-entry map
    with a text name and a short text, integer or boolean value that
    :func:`check_props` finds valid, and the payload is at most ``limit`` bytes;
    otherwise append nothing and return False (the caller takes the general path,
    which checks the map and raises).

    Why it exists beside :func:`append_plain_publish`: a grouped message's publish
    (``properties={"group_id": ...}``, no headers) is the groups bench's
    per-message send, and the general path (check_props, encode_publish's join,
    the frame's copy into the link's buffer) cost the client about 1 us a message
    more than a plain one. The map's pair is remembered by its value once checked
    (never by the dict's identity: dicts change).
    tests/protocol/test_protocol_fast_paths.py checks it against ``encode_publish``."""
    if type(props) is not dict or len(props) != 1:
        return False
    pair = b""
    for name, value in props.items():  # the one entry (a loop: cheaper than unpacking)
        t = type(value)
        if type(name) is not str or not (
            t is int or t is bool or (t is str and len(value) <= _PAIR_CACHE_TEXT)
        ):
            return False
        entry = (name, t, value)
        known = _VALID_PROPS_PAIRS.get(entry)
        if known is None:
            if check_props(props) is not None:
                return False
            known = _K_PROPS + cbor2.dumps(props)
            if len(_VALID_PROPS_PAIRS) >= _ROUTE_CACHE_MAX:
                _VALID_PROPS_PAIRS.clear()
            _VALID_PROPS_PAIRS[entry] = known
        pair = known
    n = len(body)
    middle = _PLAIN_MIDDLE_CACHE.get((exchange, key, n))
    if middle is None:
        middle = _route_prefix(exchange, key) + bytes_head(n)
        if len(_PLAIN_MIDDLE_CACHE) >= _ROUTE_CACHE_MAX:
            _PLAIN_MIDDLE_CACHE.clear()
        _PLAIN_MIDDLE_CACHE[(exchange, key, n)] = middle
    rid_enc = _TAG32(0x1A, rid) if 0x10000 <= rid < 0x100000000 else uint(rid)
    size = _PROPS_PUBLISH_HEAD_LEN + len(rid_enc) + len(middle) + n + len(pair)
    if size > limit:
        return False
    out += _LEN.pack(size) + _PROPS_PUBLISH_HEAD + rid_enc
    out += middle
    out += body
    out += pair
    return True


def encode_ack(rid: int, dtag: int, multiple: bool) -> bytes:
    """One ``ack`` frame: ``encode(Ack(rid, dtag, multiple))``, by hand."""
    if multiple:
        payload = _ACK_MULTIPLE_HEAD + uint(rid) + _K_DTAG + uint(dtag) + _MULTIPLE
    else:
        payload = _ACK_HEAD + uint(rid) + _K_DTAG + uint(dtag)
    return _LEN.pack(len(payload)) + payload
