"""A sans-IO protocol connection: bytes in, events out; events in, bytes out.

::

    conn = Connection(Role.SERVER)
    conn.receive_data(data)            # b"" means the other end closed its side
    while (event := conn.next_event()) is not NEED_DATA:
        ...
    wire_bytes = conn.send(Ok(re=7))

No sockets, no clock, no event loop. Broken frames raise
:class:`~amqlite.errors.RemoteProtocolError` carrying the reply code to send in the
closing ``close`` frame; a well-framed request with a usable ``id`` that cannot be
understood comes back as :class:`~amqlite.protocol.events.BadRequest` so the server
can fail that one request and carry on.
"""

import struct
import sys
from collections.abc import Callable, Iterable
from typing import Any, Final

import cbor2

from amqlite.errors import LocalProtocolError, RemoteProtocolError, ReplyCode

from . import codec
from . import events as ev
from .states import ConnState, Trigger, next_state, trigger_of

DEFAULT_MAX_FRAME: Final = 4 * 1024 * 1024


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()

_LEN = struct.Struct(">I")
_COMPACT_AT = 256 * 1024
_GATHER_AS_BYTES = 64 * 1024  # a longer rest of a frame is gathered in a bytearray
_BARE_OK_MAX = 19  # a bare ok is shorter (see codec.read_bare_ok)
_CLOSED = ConnState.CLOSED  # an Enum attribute look-up costs ~0.1 us: not per frame

_HotDecoder = Callable[[dict[Any, Any]], ev.Event | None]

_HOT_DECODERS: dict[ev.Role, dict[str, _HotDecoder]] = {
    ev.Role.SERVER: {
        "publish": codec.decode_publish,
        "ack": codec.decode_ack,
        "peer": codec.decode_peer,
    },
    ev.Role.CLIENT: {
        "deliver": codec.decode_deliver,
        "ok": codec.decode_ok,
        "peer": codec.decode_peer,
    },
}

#: A ``deliver`` frame's map in its usual shape, as :meth:`Connection.events_with_deliver_maps`
#: hands it on: exactly the keys ``m``, ``ctag`` (str), ``dtag`` (int), ``exchange``
#: (str), ``key`` (str) and ``body`` (bytes), and perhaps ``props`` (valid
#: properties: a message group's ``group_id``, say), checked.
DeliverMap = dict[str, Any]


class PublishRun:
    """Plain publishes read in a row, as :meth:`Connection.events_with_publish_runs`
    hands them on: ``Publish(first_id + i, exchange, key, bodies[i])`` for each ``i``
    (no headers, properties, ``mandatory`` or ``confirm``), in that order."""

    __slots__ = ("bodies", "exchange", "first_id", "key")

    def __init__(self, first_id: int, exchange: str, key: str, bodies: list[bytes]) -> None:
        self.first_id = first_id
        self.exchange = exchange
        self.key = key
        self.bodies = bodies

    def publishes(self) -> list[ev.Publish]:
        """The run as the events :meth:`Connection.events` gives for it."""
        rid, exchange, key = self.first_id, self.exchange, self.key
        return [ev.Publish(rid + i, exchange, key, b) for i, b in enumerate(self.bodies)]

    def __repr__(self) -> str:
        return f"PublishRun({self.first_id}, {self.exchange!r}, {self.key!r}, {self.bodies!r})"


class DeliverRun:
    """Plain deliveries read in a row, as :meth:`Connection.events_with_deliver_runs`
    hands them on: for each ``i`` the :data:`DeliverMap` ``{"m": "deliver", "ctag":
    ctag, "dtag": dtags[i], "exchange": exchange, "key": key, "body": bodies[i]}``,
    in that order, with ``"props": props`` last when ``props`` is not None (one
    properties map for the whole run, e.g. a persistent message's ``{"persistent":
    True}``; each map's own copy); at least two."""

    __slots__ = ("bodies", "ctag", "dtags", "exchange", "key", "props")

    def __init__(
        self,
        ctag: str,
        exchange: str,
        key: str,
        dtags: list[int],
        bodies: list[bytes],
        props: dict[str, Any] | None = None,
    ) -> None:
        self.ctag = ctag
        self.exchange = exchange
        self.key = key
        self.dtags = dtags
        self.bodies = bodies
        self.props = props

    def maps(self) -> list[DeliverMap]:
        """The run as the maps :meth:`Connection.events_with_deliver_maps` gives for it."""
        ctag, exchange, key, props = self.ctag, self.exchange, self.key, self.props
        maps: list[DeliverMap] = [
            {"m": "deliver", "ctag": ctag, "dtag": t, "exchange": exchange, "key": key, "body": b}
            for t, b in zip(self.dtags, self.bodies, strict=True)
        ]
        if props is not None:
            for one in maps:
                one["props"] = dict(props)  # each its own copy, as the reader gives
        return maps

    def __repr__(self) -> str:
        props = "" if self.props is None else f", {self.props!r}"
        return (
            f"DeliverRun({self.ctag!r}, {self.exchange!r}, {self.key!r}, "
            f"{self.dtags!r}, {self.bodies!r}{props})"
        )


class OkRun:
    """Bare oks read in a row (``{"m": "ok", "re": re}``, no ``info``: a confirmed
    publisher's confirms), as :meth:`Connection.events_with_deliver_runs` hands them
    on: ``Ok(re, {})`` for each of ``res``, in that order; at least two."""

    __slots__ = ("res",)

    def __init__(self, res: list[int]) -> None:
        self.res = res

    def events(self) -> list[ev.Ok]:
        """The run as the events :meth:`Connection.events_with_deliver_maps` gives for it."""
        return [ev.Ok(re, codec.EMPTY) for re in self.res]

    def __repr__(self) -> str:
        return f"OkRun({self.res!r})"


def _valid_props(props: Any) -> bool:
    return type(props) is dict and codec.check_props(props) is None


_OWN_SENDER = {ev.Role.CLIENT: ev.Sender.CLIENT, ev.Role.SERVER: ev.Sender.SERVER}
_REMOTE_SENDER = {ev.Role.CLIENT: ev.Sender.SERVER, ev.Role.SERVER: ev.Sender.CLIENT}


def _foreign_protocol_hint(prefix: bytes) -> str:
    if prefix.startswith(b"AMQP"):
        return " (this looks like an AMQP 0-9-1 client; this port speaks amqlite's CBOR protocol)"
    if prefix[:4] in (b"GET ", b"POST", b"PUT ", b"HEAD", b"HTTP", b"DELE", b"OPTI", b"PATC"):
        return " (this looks like HTTP; this port speaks amqlite's CBOR protocol)"
    if prefix[:1] == b"\x16":
        return " (this looks like TLS; this port speaks plain amqlite)"
    return ""


class Connection:
    """One end of an amqlite connection (``Role.CLIENT`` or ``Role.SERVER``)."""

    def __init__(
        self,
        role: ev.Role,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME,
        remote_max_frame_size: int | None = None,
    ) -> None:
        self.role: Final = role
        self.max_frame_size = max_frame_size
        self.remote_max_frame_size = remote_max_frame_size
        self._own: Final = _OWN_SENDER[role]
        self._remote: Final = _REMOTE_SENDER[role]
        self._state = ConnState.HANDSHAKE
        # (frame class -> next state) for the current state, looked up in the one
        # table and memoised: Enum hashing is too slow to do per message.
        self._memo: dict[type[ev.Event], ConnState | None] = {}
        # per-message methods decoded without the general checks, only while the
        # table keeps an OPEN connection OPEN on any operation (set by _set_state)
        self._hot: dict[str, _HotDecoder] = {}
        # a usual deliver map may be handed on as it is (events_with_deliver_maps):
        # set with _hot, on a client
        self._maps_ok = False
        # a bare ok (a publish confirm) read from its bytes; set with _hot, on a client
        self._read_ok: Callable[[bytes | bytearray, int, int], ev.Event | None] | None = None
        self._read_max = 0
        self._buf: bytes | bytearray = b""  # the chunk being decoded, or chunks gathered
        self._pos = 0
        self._eof = False
        self._error: RemoteProtocolError | None = None
        self._one: list[ev.Event] = []  # next_event's batch of one
        # the per-message senders skip the table in this state: OPEN for their role
        # (send_deliver and send_get_ok on a server, send_publish and send_ack on a
        # client), no state for the other role, which then fails the table's check
        self._server_open = ConnState.OPEN if role is ev.Role.SERVER else None
        self._client_open = ConnState.OPEN if role is ev.Role.CLIENT else None

    @property
    def state(self) -> ConnState:
        return self._state

    @property
    def buffered(self) -> int:
        """Bytes received and not yet turned into events."""
        return len(self._buf) - self._pos

    # --- receiving ----------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed bytes from the other end; ``b""`` marks the end of the stream."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise LocalProtocolError("receive_data after end of stream")
        buf, pos = self._buf, self._pos
        if pos == len(buf):
            # everything before was decoded: take the chunk as it is (no copy; and
            # cbor2 reads slices of bytes faster than slices of a bytearray)
            self._buf = data if type(data) is bytes else bytes(data)
            self._pos = 0
        elif type(buf) is bytes and len(buf) - pos <= _GATHER_AS_BYTES:
            # a frame continues in this chunk: the usual case, as bytes again
            self._buf = buf[pos:] + data
            self._pos = 0
        elif type(buf) is bytearray:
            if pos >= _COMPACT_AT and pos * 2 >= len(buf):
                del buf[:pos]
                self._pos = 0
            buf += data
        else:  # a large frame arrives over many chunks: gather them in place
            gathered = bytearray(memoryview(buf)[pos:])
            gathered += data
            self._buf = gathered
            self._pos = 0

    def _set_state(self, state: ConnState) -> None:
        if state is not self._state:
            self._state = state
            self._memo = {}
            stays_open = next_state(state, Trigger.OPERATION) is state is ConnState.OPEN
            self._hot = _HOT_DECODERS[self.role] if stays_open else {}
            client = stays_open and self.role is ev.Role.CLIENT
            self._maps_ok = client
            # the role's per-message frame read from its bytes, no CBOR decoder: a
            # client's bare oks (up to _BARE_OK_MAX bytes), a server's plain publishes
            self._read_ok = (
                (codec.read_bare_ok if client else codec.read_plain_publish) if stays_open else None
            )
            self._read_max = _BARE_OK_MAX if client else sys.maxsize

    def _next_state(self, cls: type[ev.Event]) -> ConnState | None:
        try:
            return self._memo[cls]
        except KeyError:
            new = self._memo[cls] = next_state(self._state, trigger_of(cls))
            return new

    def _fail(self, code: int, text: str) -> RemoteProtocolError:
        self._set_state(next_state(self._state, Trigger.PROTOCOL_ERROR) or ConnState.ERROR)
        self._error = RemoteProtocolError(text, code)
        return self._error

    def next_event(self) -> ev.Event | _NeedData:
        """The next event from the other end, or ``NEED_DATA`` when a frame is incomplete."""
        one = self._one
        self._decode(one, 1, False)
        return one.pop() if one else NEED_DATA

    def events(self, limit: int = sys.maxsize) -> list[ev.Event]:
        """The events :meth:`next_event` would return one by one, in one call: every
        complete frame buffered now, or up to ``limit``. A batch ends after an
        ``EndOfStream`` and after an event that changed the connection's state, so
        that the caller answers it (a ``welcome`` to a ``hello``) before the frames
        behind it are checked against the new state: ask again for those. A protocol
        error behind events of the batch is raised by the next call; after the
        ``EndOfStream``, every call returns it again."""
        out: list[ev.Event] = []
        self._decode(out, limit, False)
        return out

    def events_with_deliver_maps(self, limit: int = sys.maxsize) -> list[ev.Event | DeliverMap]:
        """:meth:`events` for a client, except that a ``deliver`` frame in its usual
        shape comes as its map (a :data:`DeliverMap`), not as an ``ev.Deliver``: a
        consumer then builds one object per message, not two. Any other deliver frame
        comes as the event (or its error), as from :meth:`events`."""
        out: list[ev.Event | DeliverMap] = []
        self._decode(out, limit, True)
        return out

    def events_with_deliver_runs(
        self, limit: int = sys.maxsize
    ) -> list[ev.Event | DeliverMap | DeliverRun | OkRun]:
        """:meth:`events_with_deliver_maps`, except that plain deliveries in a row
        (one consumer tag, one route; no properties, or the same small properties
        map, as persistent messages have) come as one :class:`DeliverRun`;
        ``limit`` counts frames (a run's each). Expanding each run
        (:meth:`DeliverRun.maps`) gives what :meth:`events_with_deliver_maps` gives.

        Why it exists: a consumer's messages arrive as such runs, and a map a
        message, read by a call a frame, was about a third of a transient
        consumer's time per message; the client takes a run's deliveries in one
        go (``Consumer.push_run``). Likewise bare oks in a row (a publisher's
        confirms) come as one :class:`OkRun` (since round 14), which the client
        settles in one go (``ConfirmWindow.confirm_run``).
        tests/protocol/test_protocol_fast_paths.py checks the expansion against
        :meth:`events_with_deliver_maps`."""
        out: list[ev.Event | DeliverMap | DeliverRun | OkRun] = []
        self._decode(out, limit, True, True)
        return out

    def events_with_publish_runs(
        self, limit: int = sys.maxsize
    ) -> tuple[list[ev.Event | PublishRun], int]:
        """:meth:`events` for a server, except that plain publishes in a row (no
        headers, properties, ``mandatory`` or ``confirm``; one route; ids one after
        the other) come as one :class:`PublishRun`; and the frames read (``limit``
        counts frames, a run's each). Expanding each run (``PublishRun.publishes``)
        gives what :meth:`events` gives.

        Why it exists: a publisher's messages arrive as such runs, and a ``Publish``
        event a message, handled one by one (the request loop, the endpoint, the
        dispatcher's checks, the session, the routing), was about a third of a
        broker's time per transient message; the server takes a run's messages
        through those once (``RequestDispatcher.publish_run``).
        tests/protocol/test_protocol_fast_paths.py checks the expansion against
        :meth:`events`."""
        out: list[ev.Event | PublishRun] = []
        self._decode(out, limit, False, True)
        count = len(out)
        for e in out:
            if type(e) is PublishRun:
                count += len(e.bodies) - 1
        return out, count

    def _decode(self, out: list[Any], limit: int, maps: bool, runs: bool = False) -> None:
        """The frame splitter, for :meth:`events` and :meth:`next_event`: decode up to
        ``limit`` events into ``out``. While the connection is OPEN, the per-message
        frames (publish and ack in, deliver and bare ok out) take their role's decoder
        in ``_hot`` first, one call a frame (a bare ok, a plain deliver or a plain
        publish is read from its bytes, without cbor2, before that); every other
        frame, and any the hot decoder leaves, takes the checked path through the
        state table."""
        if self._error is not None:
            raise self._error
        append = out.append
        buf = self._buf
        size = len(buf)
        pos = self._pos
        state = self._state
        closed = state is _CLOSED
        hot = self._hot
        read_ok = self._read_ok
        read_max = self._read_max
        read_deliver = codec.read_plain_deliver
        plain = maps and self._maps_ok  # usual deliver maps are handed on as they are
        max_frame = self.max_frame_size
        loads = cbor2.loads
        unpack = _LEN.unpack_from
        count = 0
        try:
            while count < limit:
                if size - pos < 4 or closed:
                    self._pos = pos
                    self._at_end(out)
                    return
                (n,) = unpack(buf, pos)
                end = pos + 4 + n
                if end > size or n > max_frame:
                    self._pos = pos
                    self._at_end(out)
                    return
                if read_ok is not None:
                    if n < read_max:
                        ok = read_ok(buf, pos + 4, end)
                        if ok is not None:
                            pos = end
                            count += 1
                            if (
                                runs
                                and type(ok) is ev.Publish
                                and not ok.props
                                and not ok.headers
                                and not ok.confirm
                                and not ok.mandatory
                            ):
                                # the frames after it that continue the run (see
                                # events_with_publish_runs)
                                rid = ok.id + 1
                                exchange, key = ok.exchange, ok.key
                                route, names = codec.last_route()
                                bodies = [ok.body]
                                if names[0] == exchange and names[1] == key:
                                    read_run = codec.read_run_publish
                                    add = bodies.append
                                    while count < limit and size - pos >= 4:
                                        (n,) = unpack(buf, pos)
                                        end = pos + 4 + n
                                        if end > size or n > max_frame:
                                            break
                                        body = read_run(buf, pos + 4, end, rid, route)
                                        if body is None:
                                            break
                                        add(body)
                                        rid += 1
                                        pos = end
                                        count += 1
                                append(PublishRun(ok.id, exchange, key, bodies))
                                continue
                            if runs and type(ok) is ev.Ok and count < limit:
                                # the bare oks after it (see events_with_deliver_runs)
                                res = [ok.re]
                                pos = codec.read_bare_ok_run(
                                    buf, pos, size, limit - count, max_frame, res
                                )
                                if len(res) > 1:
                                    count += len(res) - 1
                                    append(OkRun(res))
                                    continue
                            append(ok)
                            continue
                    elif plain:
                        # a plain delivery's map from its bytes: what loads gives below
                        m = read_deliver(buf, pos + 4, end)
                        if m is not None:
                            pos = end
                            count += 1
                            if runs and count < limit:
                                # the frames after it that continue the run (see
                                # events_with_deliver_runs); with properties (a 7th
                                # entry), the frames that end as this one does
                                ctag, names = codec.last_deliver()
                                props = m.get("props")
                                tail = b""
                                same = True
                                if props is not None:
                                    tail, known = codec.last_props()
                                    same = (
                                        tail != b""
                                        and props == known
                                        and buf.startswith(tail, end - len(tail), end)
                                    )
                                if (
                                    same
                                    and ctag == m["ctag"]
                                    and names[0] == m["exchange"]
                                    and names[1] == m["key"]
                                ):
                                    dtags = [m["dtag"]]
                                    bodies = [m["body"]]
                                    pos = codec.read_deliver_run(
                                        buf,
                                        pos,
                                        size,
                                        limit - count,
                                        max_frame,
                                        dtags,
                                        bodies,
                                        tail,
                                    )
                                    if len(dtags) > 1:
                                        count += len(dtags) - 1
                                        append(
                                            DeliverRun(
                                                ctag, names[0], names[1], dtags, bodies, props
                                            )
                                        )
                                        continue
                            append(m)
                            continue
                try:
                    m = loads(buf[pos + 4 : end])
                except Exception as exc:  # cbor2 raises several types for bad input
                    self._pos = end
                    code, text = ReplyCode.FRAME_ERROR, f"malformed CBOR frame: {exc}"
                    raise self._fail(code, text) from None
                pos = end
                count += 1
                if (
                    plain
                    and type(m) is dict
                    and (len(m) == 6 or (len(m) == 7 and _valid_props(m.get("props"))))
                    and m.get("m") == "deliver"
                    and type(m.get("ctag")) is str
                    and type(m.get("dtag")) is int
                    and type(m.get("exchange")) is str
                    and type(m.get("key")) is str
                    and type(m.get("body")) is bytes
                ):
                    # the fields codec._plain_deliver reads, with their types, and
                    # perhaps valid props (a grouped message's group_id): the map is
                    # the message, no event is built (a fifth of a consumer's time per
                    # message); tests/protocol/test_protocol_fast_paths.py checks it
                    # against the checked decoder
                    append(m)
                    continue
                if hot and type(m) is dict:
                    method = m.get("m")
                    decode = hot.get(method) if type(method) is str else None
                    if decode is not None:
                        try:
                            event = decode(m)
                        except codec.FieldError:
                            event = None  # the checked path reports it with the right severity
                        if event is not None:
                            append(event)
                            continue
                self._pos = pos
                append(self._event_from_map(m))
                if self._state is not state:
                    return
            self._pos = pos
        except RemoteProtocolError:
            if not out:
                raise
            # the events before the error are the caller's; the next call raises it

    def _at_end(self, out: list[ev.Event]) -> None:
        """No complete frame at ``_pos``: nothing yet, the end of the stream, or a
        frame that is too large or cut short by the end of the stream."""
        if self._state is ConnState.CLOSED:
            if self._eof:
                out.append(ev.EndOfStream())
            return
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        if avail >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if n > self.max_frame_size:
                hint = _foreign_protocol_hint(bytes(buf[pos : pos + 4]))
                raise self._fail(
                    ReplyCode.FRAME_ERROR,
                    f"frame of {n} bytes exceeds the maximum of {self.max_frame_size}{hint}",
                )
        if not self._eof:
            return
        if avail == 0:
            out.append(ev.EndOfStream())
        elif avail < 4:
            raise self._fail(ReplyCode.FRAME_ERROR, "stream ended inside a frame header")
        else:
            raise self._fail(ReplyCode.FRAME_ERROR, "stream ended inside a frame")

    def _event_from_map(self, m: Any) -> ev.Event:
        if type(m) is not dict:
            raise self._fail(ReplyCode.FRAME_ERROR, "a frame must be one CBOR map")
        method = m.get("m")
        if type(method) is not str:
            raise self._fail(ReplyCode.SYNTAX_ERROR, "frame has no method name ('m' must be text)")
        cls = ev.BY_METHOD.get(method)
        rid: Any = m.get("id")
        soft_ok = self.role is ev.Role.SERVER and type(rid) is int and self._state is ConnState.OPEN
        if cls is None:
            if soft_ok:
                return ev.BadRequest(rid, ReplyCode.NOT_IMPLEMENTED, f"unknown method {method!r}")
            raise self._fail(ReplyCode.COMMAND_INVALID, f"unknown method {method!r}")
        if cls.SENDER is not self._remote and cls.SENDER is not ev.Sender.BOTH:
            raise self._fail(
                ReplyCode.COMMAND_INVALID,
                f"{method!r} is sent by a {cls.SENDER.value}, not by a {self._remote.value}",
            )
        new_state = self._next_state(cls)
        if new_state is None:
            if self._state is ConnState.HANDSHAKE:
                text = f"{method!r} before the handshake: send 'hello' first"
            else:
                text = f"{method!r} is not allowed while the connection is {self._state.value}"
            raise self._fail(ReplyCode.UNEXPECTED_FRAME, text)
        try:
            event = codec.event_from_map(cls, m)
        except codec.FieldError as exc:
            if soft_ok and trigger_of(cls) is Trigger.OPERATION:
                return ev.BadRequest(rid, exc.code, exc.text)
            raise self._fail(exc.code, exc.text) from None
        if new_state is not self._state:
            self._set_state(new_state)
        return event

    # --- sending ------------------------------------------------------------------

    def send_heartbeat(self) -> bytes:
        """The bytes of one ``heartbeat`` (what a link's watchdog sends)."""
        return self.send(ev.Heartbeat())

    def send(self, event: ev.Event) -> bytes:
        """The bytes for ``event``; raises LocalProtocolError if it is not ours to send."""
        cls = type(event)
        if cls.SENDER is not self._own and cls.SENDER is not ev.Sender.BOTH:
            raise LocalProtocolError(f"a {self.role.value} does not send {cls.METHOD!r}")
        new_state = self._next_state(cls)
        if new_state is None:
            raise LocalProtocolError(
                f"cannot send {cls.METHOD!r} while the connection is {self._state.value}"
            )
        try:
            data = codec.encode(event)
        except KeyError:  # a local pseudo-event (BadRequest, EndOfStream)
            raise LocalProtocolError(f"{cls.__name__} is not a wire event") from None
        limit = self.remote_max_frame_size
        if limit is not None and len(data) - 4 > limit:
            raise LocalProtocolError(
                f"{cls.METHOD!r} frame of {len(data) - 4} bytes exceeds the other end's maximum "
                f"of {limit}",
                ReplyCode.CONTENT_TOO_LARGE,
            )
        if new_state is not self._state:
            self._set_state(new_state)
        return data

    def send_deliver(
        self,
        ctag: str,
        dtag: int,
        redelivered: bool,
        msg: codec.WireMessage,
        offset: int | None = None,
    ) -> bytes:
        """A ``deliver`` frame (the fast path: the message is encoded once, cached);
        ``offset`` for a message from a stream queue."""
        if self._state is not self._server_open:
            self._check_fast(ev.Deliver)
        return codec.encode_deliver(ctag, dtag, redelivered, msg, offset)

    def append_deliveries(self, out: bytearray, deliveries: Iterable[codec.WireDelivery]) -> None:
        """:meth:`send_deliver` of each of ``deliveries``, appended to ``out``
        (:func:`codec.append_deliveries`: the same bytes, one call a batch); checked
        once, as send_deliver checks each."""
        if self._state is not self._server_open:
            self._check_fast(ev.Deliver)
        codec.append_deliveries(out, deliveries)

    def send_peer(self, msg: bytes) -> bytes:
        """A ``peer`` frame whose ``msg`` map is already CBOR-encoded (peering
        batches are encoded by hand); checked like :meth:`send`."""
        new_state = self._next_state(ev.PeerMessage)
        if new_state is None:
            raise LocalProtocolError(
                f"cannot send 'peer' while the connection is {self._state.value}"
            )
        data = codec.encode_peer(msg)
        limit = self.remote_max_frame_size
        if limit is not None and len(data) - 4 > limit:
            raise LocalProtocolError(
                f"'peer' frame of {len(data) - 4} bytes exceeds the other end's maximum of {limit}",
                ReplyCode.CONTENT_TOO_LARGE,
            )
        if new_state is not self._state:
            self._set_state(new_state)
        return data

    def send_ok(self, re: int) -> bytes:
        """An ``ok`` frame without ``info``: what ``send(Ok(re))`` gives, by hand (a
        server confirms each persistent publish with one)."""
        if self._state is not self._server_open or type(re) is not int or not 0 <= re < 1 << 64:
            return self.send(ev.Ok(re, {}))
        return codec.encode_bare_ok(re)

    def send_oks(self, res: list[int]) -> bytes:
        """``send_ok`` of each of ``res``, joined (the confirms one commit releases
        for this connection): the state is checked once."""
        if self._state is not self._server_open or not all(
            type(re) is int and 0 <= re < 1 << 64 for re in res
        ):
            return b"".join([self.send(ev.Ok(re, {})) for re in res])
        return codec.encode_bare_oks(res)

    def send_get_ok(
        self, re: int, dtag: int, redelivered: bool, remaining: int, queue: str,
        msg: codec.WireMessage,
    ) -> bytes:  # fmt: skip
        if self._state is not self._server_open:
            self._check_fast(ev.GetOk)
        return codec.encode_get_ok(re, dtag, redelivered, remaining, queue, msg)

    def send_publish(
        self,
        rid: int,
        exchange: str,
        key: str,
        body: bytes,
        headers: dict[str, Any] | None = None,
        props: dict[str, Any] | None = None,
        mandatory: bool = False,
        confirm: bool = False,
    ) -> bytes:
        """A ``publish`` frame: what ``send(Publish(...))`` gives, encoded by hand
        (a client publishes per message). ``headers`` and ``props`` must already
        be valid (:func:`~amqlite.protocol.check_headers`, ``check_props``)."""
        if self._state is not self._client_open:
            self._check_fast(ev.Publish)
        data = codec.encode_publish(rid, exchange, key, body, headers, props, mandatory, confirm)
        limit = self.remote_max_frame_size
        if limit is not None and len(data) - 4 > limit:
            raise LocalProtocolError(
                f"'publish' frame of {len(data) - 4} bytes exceeds the other end's "
                f"maximum of {limit}",
                ReplyCode.CONTENT_TOO_LARGE,
            )
        return data

    def append_plain_publish(
        self, out: bytearray, rid: int, exchange: str, key: str, body: bytes, limit: int
    ) -> bool:
        """Append ``send_publish(rid, exchange, key, body)``'s frame (no headers,
        props, mandatory or confirm) to ``out`` and return True; or, while not OPEN
        or when the payload is longer than ``limit`` or the other end's maximum,
        append nothing and return False (the caller takes ``send_publish``, which
        raises or changes state as it should).

        Why it exists: a client's transient publish is its per-message send; this
        skips the frame's join and copy (codec.append_plain_publish)."""
        if self._state is not self._client_open:
            return False
        remote = self.remote_max_frame_size
        if remote is not None and remote < limit:
            limit = remote
        return codec.append_plain_publish(out, rid, exchange, key, body, limit)

    def encode_confirm_publish(
        self, rid: int, exchange: str, key: str, body: bytes, persistent: bool, limit: int
    ) -> bytes | None:
        """``send_publish(rid, exchange, key, body, None, {"persistent": True} if
        persistent else None, False, True)``'s frame (a confirmed publish, no
        headers or other properties); or, while not OPEN or when the payload is
        longer than ``limit`` or the other end's maximum, None (the caller takes
        ``send_publish``, which raises or changes state as it should).

        Why it exists: a client's confirmed publish is its per-message send in
        the persistent bench; this skips the props pair and the pieces
        encode_publish builds a message (codec.encode_confirm_publish)."""
        if self._state is not self._client_open:
            return None
        remote = self.remote_max_frame_size
        if remote is not None and remote < limit:
            limit = remote
        return codec.encode_confirm_publish(rid, exchange, key, body, persistent, limit)

    def append_props_publish(
        self,
        out: bytearray,
        rid: int,
        exchange: str,
        key: str,
        body: bytes,
        props: dict[str, Any],
        limit: int,
    ) -> bool:
        """Append ``send_publish(rid, exchange, key, body, None, props)``'s frame to
        ``out`` and return True when ``props`` is a valid one-entry map
        (codec.append_props_publish: a grouped message's); otherwise, or while not
        OPEN or over ``limit`` or the other end's maximum, append nothing and return
        False (the caller takes the general path, which checks and raises).

        Why it exists: a grouped publish is the groups bench's per-message send;
        this skips check_props, the frame's join and its copy."""
        if self._state is not self._client_open:
            return False
        remote = self.remote_max_frame_size
        if remote is not None and remote < limit:
            limit = remote
        return codec.append_props_publish(out, rid, exchange, key, body, props, limit)

    def send_ack(self, rid: int, dtag: int, multiple: bool = False) -> bytes:
        """An ``ack`` frame: what ``send(Ack(rid, dtag, multiple))`` gives, by hand."""
        if self._state is not self._client_open:
            self._check_fast(ev.Ack)
        return codec.encode_ack(rid, dtag, multiple)

    def _check_fast(self, cls: type[ev.Event]) -> None:
        """What :meth:`send` checks, for the per-message senders outside OPEN."""
        if cls.SENDER is not self._own:
            raise LocalProtocolError(f"a {self.role.value} does not send {cls.METHOD!r}")
        new_state = self._next_state(cls)
        if new_state is None:
            raise LocalProtocolError(
                f"cannot send {cls.METHOD!r} while the connection is {self._state.value}"
            )
        self._set_state(new_state)
