"""A sans-IO AMQP 0-9-1 connection, either end, in the h11 style::

    conn = AmqpConnection(Role.SERVER)
    conn.receive_data(data)
    while (event := conn.next_event()) is not NEED_DATA:
        ...  # ProtocolHeaderReceived, MethodReceived, ContentReceived, HeartbeatReceived
    sock.send(conn.send_method(0, ConnectionStart(...)))

The connection does the framing, content assembly, the handshake order, channel
bookkeeping and tune negotiation; it decides nothing about auth, routing or
replies. A broken rule raises :class:`~amqlite.amqp.errors.AmqpError` from
``next_event`` with the reply code; ``send_close_for(error)`` turns it into the
``channel.close`` or ``connection.close`` it calls for (after which incoming
frames on what was closed are dropped until ``close-ok``). Sending what the state
does not allow raises :class:`~amqlite.amqp.errors.AmqpLocalError`.
"""

from __future__ import annotations

import struct

from ..errors import ReplyCode
from . import methods as m
from .content import ContentAssembler
from .errors import AmqpError, AmqpLocalError, ProtocolHeaderMismatch
from .events import (
    ContentReceived,
    Event,
    HeartbeatReceived,
    MethodReceived,
    ProtocolHeaderReceived,
    Role,
)
from .frames import (
    DEFAULT_FRAME_MAX,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    NEED_DATA,
    PROTOCOL_HEADER,
    BodyFrame,
    FrameReader,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
    ProtocolHeaderFrame,
    _NeedData,
    encode_content,
    encode_heartbeat_frame,
    encode_method_frame,
)
from .methods import encode_deliver_args
from .properties import BasicProperties, decode_header_payload, encode_header_payload
from .spec import Method, Sender, decode_method
from .states import (
    CHANNEL_TRANSITIONS,
    CONNECTION_TRANSITIONS,
    ChannelState,
    ChannelTrigger,
    ConnState,
    ConnTrigger,
    channel_error_code,
    connection_error_code,
)

_FRAME_HEAD = struct.Struct(">BHI")  # type, channel, payload size
_DELIVER_IDS = b"\x00\x3c\x00\x3c"  # basic.deliver: class 60, method 60
_FRAME_END = b"\xce"
_FRAME_END_HEAD_2 = b"\xce\x02"  # a frame's end, then a header frame's type

#: RabbitMQ's default channel_max.
DEFAULT_CHANNEL_MAX = 2047
_MAX_CHANNEL = 65535


def _publish_keeps_the_channel_open() -> bool:
    """The fast path (:meth:`AmqpConnection._fast_publish`) skips the channel
    table's steps for a publish; they must lead from OPEN back to OPEN."""
    state = ChannelState.OPEN
    for trigger in (
        ChannelTrigger.RECV_CONTENT_METHOD,
        ChannelTrigger.RECV_HEADER,
        ChannelTrigger.RECV_BODY_LAST,
    ):
        state = CHANNEL_TRANSITIONS[(state, trigger)]
    empty = CHANNEL_TRANSITIONS[
        (
            CHANNEL_TRANSITIONS[(ChannelState.OPEN, ChannelTrigger.RECV_CONTENT_METHOD)],
            ChannelTrigger.RECV_HEADER_LAST,
        )
    ]
    traffic = CONNECTION_TRANSITIONS[(ConnState.OPEN, ConnTrigger.RECV_TRAFFIC)]
    sent = CONNECTION_TRANSITIONS[(ConnState.OPEN, ConnTrigger.SEND_TRAFFIC)]
    content = CHANNEL_TRANSITIONS[(ChannelState.OPEN, ChannelTrigger.SEND_CONTENT)]
    return state is empty is content is ChannelState.OPEN and traffic is sent is ConnState.OPEN


assert _publish_keeps_the_channel_open()

T, CT, C = ConnTrigger, ChannelTrigger, ChannelState

# The states the per-message paths compare with, as module constants: on Python 3.11
# an enum member looked up on its class (``ConnState.OPEN``) costs as much as a
# short function call, and next_event, _fast_publish and send_deliver made six a
# message.
_CONN_OPEN = ConnState.OPEN
_CHANNEL_OPEN = ChannelState.OPEN
_SERVER = Sender.SERVER

_HANDSHAKE: dict[type[Method], ConnTrigger] = {
    m.ConnectionStart: T.START,
    m.ConnectionStartOk: T.START_OK,
    m.ConnectionSecure: T.SECURE,
    m.ConnectionSecureOk: T.SECURE_OK,
    m.ConnectionTune: T.TUNE,
    m.ConnectionTuneOk: T.TUNE_OK,
    m.ConnectionOpen: T.OPEN,
    m.ConnectionOpenOk: T.OPEN_OK,
}
_CHANNEL_RECV: dict[type[Method], ChannelTrigger] = {
    m.ChannelOpen: CT.RECV_OPEN,
    m.ChannelOpenOk: CT.RECV_OPEN_OK,
    m.ChannelClose: CT.RECV_CLOSE,
    m.ChannelCloseOk: CT.RECV_CLOSE_OK,
}
_CHANNEL_SEND: dict[type[Method], ChannelTrigger] = {
    m.ChannelOpen: CT.SEND_OPEN,
    m.ChannelOpenOk: CT.SEND_OPEN_OK,
    m.ChannelClose: CT.SEND_CLOSE,
    m.ChannelCloseOk: CT.SEND_CLOSE_OK,
}


def _fit(text: str, code: int) -> str:
    """``text`` as RabbitMQ writes a reply text, ``FRAME_ERROR - what``: the code's
    name in front (unless there already), cut to a short string (255 bytes)."""
    try:
        name = ReplyCode(code).name
    except ValueError:
        name = ""
    if name and not text.startswith(name):
        text = f"{name} - {text}"
    raw = text.encode("utf-8")
    return text if len(raw) <= 255 else raw[:255].decode("utf-8", "ignore")


#: ``basic.publish`` methods decoded by the receive fast path, by their payload.
#: Why: a publisher mostly sends to the same exchange and routing key, so the same
#: method payload comes again and again; decoding it (and building the frozen, so
#: shareable, method) was about 1.5 us of every publish. At most
#: ``_PUBLISHES_MAX`` kept (it starts again when full); only valid publishes are
#: kept, so errors still come from the general decoder. Checked with the rest of
#: the fast path by ``tests/amqp/test_fast_content.py`` (hypothesis).
_PUBLISHES: dict[bytes, m.BasicPublish] = {}
_PUBLISHES_MAX = 512


class AmqpConnection:
    """One AMQP 0-9-1 connection's protocol state (see the module docstring).

    ``frame_max`` and ``channel_max`` are this end's limits (a server offers them
    in ``connection.tune``); after ``tune-ok`` they hold the negotiated values, as
    does ``heartbeat``. ``max_body_size`` (0 = none) refuses larger incoming
    messages with 406 on their channel, at their content header;
    ``max_body_setting`` names the setting in that error's text.
    """

    def __init__(
        self,
        role: Role,
        *,
        frame_max: int = DEFAULT_FRAME_MAX,
        channel_max: int = DEFAULT_CHANNEL_MAX,
        max_body_size: int = 0,
        max_body_setting: str = "",
    ) -> None:
        self.role = role
        self.state = ConnState.AWAIT_PROTOCOL_HEADER
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = 0
        self.max_body_size = max_body_size
        self.max_body_setting = max_body_setting
        self._peer_sender = Sender.CLIENT if role is Role.SERVER else Sender.SERVER
        self._own_sender = Sender.SERVER if role is Role.SERVER else Sender.CLIENT
        self._reader = FrameReader(
            max_frame_size=frame_max, expect_protocol_header=role is Role.SERVER
        )
        self._tune: m.ConnectionTune | None = None
        self._channels: dict[int, ChannelState] = {}
        self._assemblers: dict[int, ContentAssembler] = {}

    # --- state ---------------------------------------------------------------------------

    def channel_state(self, channel: int) -> ChannelState:
        return self._channels.get(channel, ChannelState.CLOSED)

    @property
    def open_channels(self) -> list[int]:
        """Channels not CLOSED, in number order."""
        return sorted(self._channels)

    def _conn_step(self, trigger: ConnTrigger, *, local: bool, what: str) -> None:
        new = CONNECTION_TRANSITIONS.get((self.state, trigger))
        if new is None:
            text = f"{what} not allowed in connection state {self.state.value}"
            if local:
                raise AmqpLocalError(text, ReplyCode.COMMAND_INVALID)
            raise AmqpError(text, connection_error_code(self.state, trigger))
        self.state = new

    def _channel_step(
        self,
        channel: int,
        trigger: ChannelTrigger,
        *,
        local: bool,
        what: str,
        method: Method | None,
    ) -> ChannelState:
        state = self._channels.get(channel, C.CLOSED)
        new = CHANNEL_TRANSITIONS.get((state, trigger))
        if new is None:
            text = f"{what} not allowed on channel {channel} in state {state.value}"
            if local:
                raise AmqpLocalError(text, ReplyCode.COMMAND_INVALID)
            raise AmqpError(
                text,
                channel_error_code(state, trigger),
                channel=channel,
                class_id=method.CLASS_ID if method else 0,
                method_id=method.METHOD_ID if method else 0,
            )
        if new is C.CLOSED:
            self._channels.pop(channel, None)
            self._assemblers.pop(channel, None)
        else:
            self._channels[channel] = new
        return state

    # --- receiving -----------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> None:
        self._reader.receive_data(data)

    def next_event(self) -> Event | _NeedData:
        """The next event, or :data:`NEED_DATA`; raises :class:`AmqpError`."""
        if self.state is _CONN_OPEN:
            fast = self._fast_publish()
            if fast is not None:
                return fast
        while True:
            frame = self._reader.next_frame()
            if isinstance(frame, _NeedData):
                return NEED_DATA
            event: Event | None
            if isinstance(frame, ProtocolHeaderFrame):
                self._conn_step(T.PROTOCOL_HEADER, local=False, what="protocol header")
                event = ProtocolHeaderReceived()
            elif isinstance(frame, HeartbeatFrame):
                self._conn_step(T.RECV_HEARTBEAT, local=False, what="heartbeat")
                event = HeartbeatReceived()
            elif frame.channel == 0:
                if not isinstance(frame, MethodFrame):
                    raise AmqpError("content frame on channel 0", ReplyCode.UNEXPECTED_FRAME)
                event = self._receive_connection_method(frame.method)
            else:
                event = self._receive_channel_frame(frame)
            if event is not None:
                return event

    def _fast_publish(self) -> ContentReceived | None:
        """A whole ``basic.publish`` in its usual shape on an open channel, taken in
        one step (:meth:`FrameReader.peek_publish` says why); None: go the general
        way, which takes the same bytes to the same event, or raises."""
        peek = self._reader.peek_publish()
        if peek is None or self._own_sender is not _SERVER:
            return None
        channel, method_payload, header_payload, body, end = peek
        if (
            self._channels.get(channel) is not _CHANNEL_OPEN
            or channel > (self.channel_max or _MAX_CHANNEL)
            or (self.max_body_size and len(body) > self.max_body_size)
        ):
            return None
        method: Method | None = _PUBLISHES.get(method_payload)
        try:
            if method is None:
                method = decode_method(method_payload)
                if type(method) is m.BasicPublish:
                    if len(_PUBLISHES) >= _PUBLISHES_MAX:
                        _PUBLISHES.clear()
                    _PUBLISHES[method_payload] = method
            class_id, _size, properties = decode_header_payload(header_payload)
        except AmqpError:
            return None
        if type(method) is not m.BasicPublish or class_id != m.BasicPublish.CLASS_ID:
            return None
        self._reader.skip_to(end)
        return ContentReceived(channel, method, properties, body)

    def _check_sender(self, method: Method, channel: int) -> None:
        if method.SENDER is self._own_sender:
            raise AmqpError(
                f"{method.NAME} is sent by the {method.SENDER.value} only",
                ReplyCode.COMMAND_INVALID,
                channel=channel,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )

    def _receive_connection_method(self, method: Method) -> Event | None:
        if method.CLASS_ID != m.ConnectionClose.CLASS_ID:
            raise AmqpError(
                f"{method.NAME} on channel 0",
                ReplyCode.COMMAND_INVALID,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        self._check_sender(method, 0)
        kind = type(method)
        if kind is m.ConnectionClose:
            trigger = T.RECV_CLOSE
        elif kind is m.ConnectionCloseOk:
            trigger = T.RECV_CLOSE_OK
        elif self.state is ConnState.CLOSE_SENT:
            trigger = T.RECV_TRAFFIC  # read and dropped
        else:
            trigger = _HANDSHAKE.get(kind, T.RECV_TRAFFIC)
        dropping = self.state is ConnState.CLOSE_SENT and trigger is T.RECV_TRAFFIC
        try:
            self._conn_step(trigger, local=False, what=method.NAME)
        except AmqpError as exc:
            exc.class_id, exc.method_id = method.CLASS_ID, method.METHOD_ID
            raise
        if dropping:
            return None
        if isinstance(method, m.ConnectionTune):
            self._tune = method
        elif isinstance(method, m.ConnectionTuneOk):
            self._negotiate(method)
        return MethodReceived(0, method)

    def _receive_channel_frame(self, frame: MethodFrame | HeaderFrame | BodyFrame) -> Event | None:
        channel = frame.channel
        if self.state is ConnState.CLOSE_SENT:
            self._conn_step(T.RECV_TRAFFIC, local=False, what="channel frame")
            return None
        # the connection's step, looked up here so the text of its error is only
        # made when there is one (this runs for every frame)
        moved = CONNECTION_TRANSITIONS.get((self.state, T.RECV_TRAFFIC))
        if moved is None:
            self._conn_step(T.RECV_TRAFFIC, local=False, what=f"a frame on channel {channel}")
        else:
            self.state = moved
        if channel > (self.channel_max or _MAX_CHANNEL):
            raise AmqpError(
                f"channel {channel} is above the negotiated channel_max ({self.channel_max})",
                ReplyCode.NOT_ALLOWED,
                channel=channel,
            )
        state = self._channels.get(channel, C.CLOSED)
        closing = state is C.CLOSE_SENT
        if isinstance(frame, MethodFrame):
            return self._receive_channel_method(channel, frame.method, closing)
        if isinstance(frame, HeaderFrame):
            trigger = CT.RECV_HEADER_LAST if frame.body_size == 0 else CT.RECV_HEADER
            self._require(channel, state, trigger, "content header")
            if closing:
                self._drop(channel, trigger)
                return None
            content = self._assemblers[channel].header(
                frame.class_id, frame.body_size, frame.properties
            )
        else:
            if state is C.AWAIT_BODY:
                content = self._assemblers[channel].body(frame.payload)
                trigger = CT.RECV_BODY if content is None else CT.RECV_BODY_LAST
            else:
                content, trigger = None, CT.RECV_BODY
            self._require(channel, state, trigger, "content body")
            if closing:
                self._drop(channel, trigger)
                return None
        self._channel_step(channel, trigger, local=False, what="content", method=None)
        if content is None:
            return None
        return ContentReceived(channel, content.method, content.properties, content.body)

    def _require(
        self, channel: int, state: ChannelState, trigger: ChannelTrigger, what: str
    ) -> None:
        """Raise as the channel table would, without moving (the frame is checked
        before the assembler sees it); ``state`` is the channel's."""
        if (state, trigger) not in CHANNEL_TRANSITIONS:
            self._channel_step(channel, trigger, local=False, what=what, method=None)

    def _drop(self, channel: int, trigger: ChannelTrigger) -> None:
        self._channel_step(channel, trigger, local=False, what="frame", method=None)

    def _receive_channel_method(self, channel: int, method: Method, closing: bool) -> Event | None:
        if method.CLASS_ID == m.ConnectionClose.CLASS_ID:
            raise AmqpError(
                f"{method.NAME} on channel {channel}",
                ReplyCode.COMMAND_INVALID,
                channel=channel,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        self._check_sender(method, channel)
        trigger = _CHANNEL_RECV.get(type(method))
        if trigger is None:
            trigger = CT.RECV_CONTENT_METHOD if method.CONTENT else CT.RECV_METHOD
        self._channel_step(channel, trigger, local=False, what=method.NAME, method=method)
        if closing and trigger not in (CT.RECV_CLOSE, CT.RECV_CLOSE_OK):
            return None
        if trigger is CT.RECV_CONTENT_METHOD:
            assembler = self._assemblers.get(channel)
            if assembler is None:
                assembler = ContentAssembler(channel, self.max_body_size, self.max_body_setting)
                self._assemblers[channel] = assembler
            assembler.start(method)
            return None
        return MethodReceived(channel, method)

    def _negotiate(self, tune_ok: m.ConnectionTuneOk) -> None:
        """Settle frame_max, channel_max and heartbeat from tune-ok against the
        tune offered (530 when the other end asks for more than was offered)."""
        offered = self._tune or m.ConnectionTune(self.channel_max, self.frame_max, 0)
        frame_max = tune_ok.frame_max or offered.frame_max
        channel_max = tune_ok.channel_max or offered.channel_max
        problem = None
        if offered.frame_max and frame_max > offered.frame_max:
            problem = f"frame_max {frame_max} is above the {offered.frame_max} offered"
        elif frame_max and frame_max < FRAME_MIN_SIZE:
            problem = f"frame_max {frame_max} is below the minimum {FRAME_MIN_SIZE}"
        elif offered.channel_max and channel_max > offered.channel_max:
            problem = f"channel_max {channel_max} is above the {offered.channel_max} offered"
        if problem is not None:
            raise AmqpError(
                problem,
                ReplyCode.NOT_ALLOWED,
                class_id=tune_ok.CLASS_ID,
                method_id=tune_ok.METHOD_ID,
            )
        self.frame_max, self.channel_max = frame_max, channel_max
        self.heartbeat = tune_ok.heartbeat
        self._reader.max_frame_size = frame_max

    # --- sending -------------------------------------------------------------------------

    def send_protocol_header(self) -> bytes:
        """The client's opening 8 bytes."""
        if self.role is not Role.CLIENT:
            raise AmqpLocalError("only a client sends the protocol header")
        self._conn_step(T.PROTOCOL_HEADER, local=True, what="protocol header")
        return PROTOCOL_HEADER

    def send_heartbeat(self) -> bytes:
        self._conn_step(T.SEND_HEARTBEAT, local=True, what="heartbeat")
        return encode_heartbeat_frame()

    def send_method(self, channel: int, method: Method) -> bytes:
        """One method without content (use :meth:`send_content` for the others)."""
        if method.SENDER is self._peer_sender:
            raise AmqpLocalError(f"{method.NAME} is sent by the {method.SENDER.value} only")
        if method.CONTENT:
            raise AmqpLocalError(f"{method.NAME} carries content: use send_content")
        is_connection_class = method.CLASS_ID == m.ConnectionClose.CLASS_ID
        if (channel == 0) != is_connection_class:
            raise AmqpLocalError(f"{method.NAME} on channel {channel}")
        if channel == 0:
            kind = type(method)
            if kind is m.ConnectionClose:
                trigger = T.SEND_CLOSE
            elif kind is m.ConnectionCloseOk:
                trigger = T.SEND_CLOSE_OK
            else:
                trigger = _HANDSHAKE.get(kind, T.SEND_TRAFFIC)
            self._conn_step(trigger, local=True, what=method.NAME)
            if isinstance(method, m.ConnectionTune):
                self._tune = method
                self._reader.max_frame_size = method.frame_max
            elif isinstance(method, m.ConnectionTuneOk):
                self._negotiate(method)
        else:
            self._check_channel_number(channel)
            self._conn_step(T.SEND_TRAFFIC, local=True, what=method.NAME)
            channel_trigger = _CHANNEL_SEND.get(type(method), CT.SEND_METHOD)
            self._channel_step(
                channel, channel_trigger, local=True, what=method.NAME, method=method
            )
        return encode_method_frame(channel, method)

    def send_content(
        self, channel: int, method: Method, properties: BasicProperties, body: bytes
    ) -> bytes:
        """A content-bearing method with its header and body frames, split by the
        negotiated frame_max."""
        if not method.CONTENT:
            raise AmqpLocalError(f"{method.NAME} carries no content: use send_method")
        if method.SENDER is self._peer_sender:
            raise AmqpLocalError(f"{method.NAME} is sent by the {method.SENDER.value} only")
        self._check_channel_number(channel)
        self._conn_step(T.SEND_TRAFFIC, local=True, what=method.NAME)
        self._channel_step(channel, CT.SEND_CONTENT, local=True, what=method.NAME, method=method)
        return encode_content(channel, method, properties, body, self.frame_max)

    def send_deliver(
        self,
        channel: int,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties: BasicProperties,
        body: bytes,
    ) -> bytes:
        """``send_content(channel, BasicDeliver(...), properties, body)``, the
        broker's one call per message delivered, in one step when the channel is
        open and the body fits one frame: no method object, no table steps (they
        lead from OPEN to OPEN), one join. It exists because those cost about a
        third of the codec's time per delivery; anything else (and every error) goes
        through :meth:`send_content`. tests/amqp/test_fast_content.py checks both
        give the same bytes or the same error."""
        if (
            self.state is _CONN_OPEN
            and self._own_sender is _SERVER
            and self._channels.get(channel) is _CHANNEL_OPEN
            and (not self.frame_max or len(body) + FRAME_OVERHEAD <= self.frame_max)
        ):
            args = encode_deliver_args(
                consumer_tag, delivery_tag, redelivered, exchange, routing_key
            )
            if args is not None:
                header = encode_header_payload(len(body), properties)
                parts = [
                    _FRAME_HEAD.pack(1, channel, len(args) + 4),
                    _DELIVER_IDS,
                    args,
                    _FRAME_END_HEAD_2,
                    channel.to_bytes(2, "big"),
                    len(header).to_bytes(4, "big"),
                    header,
                    _FRAME_END,
                ]
                if body:
                    parts += (_FRAME_HEAD.pack(3, channel, len(body)), body, _FRAME_END)
                return b"".join(parts)
        deliver = m.BasicDeliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
        return self.send_content(channel, deliver, properties, body)

    def send_close_for(self, error: AmqpError) -> bytes:
        """What ``error`` calls for: ``channel.close`` for a soft error on an open
        channel, ``connection.close`` otherwise, or (a server facing a wrong
        protocol header) our own protocol header, after which the socket closes.
        ``b""`` means no frame can be sent (before ``connection.start``, or while
        already closing): close the socket."""
        if isinstance(error, ProtocolHeaderMismatch):
            return PROTOCOL_HEADER if self.role is Role.SERVER else b""
        text = _fit(error.text, error.code)
        closes_connection = error.closes_connection or (
            (self.channel_state(error.channel), CT.SEND_CLOSE) not in CHANNEL_TRANSITIONS
        )
        if closes_connection and (self.state, T.SEND_CLOSE) not in CONNECTION_TRANSITIONS:
            return b""  # before connection.start, or already closing: just drop the socket
        if closes_connection:
            close: Method = m.ConnectionClose(error.code, text, error.class_id, error.method_id)
            return self.send_method(0, close)
        close = m.ChannelClose(error.code, text, error.class_id, error.method_id)
        return self.send_method(error.channel, close)

    def _check_channel_number(self, channel: int) -> None:
        if not 0 < channel <= (self.channel_max or _MAX_CHANNEL):
            raise AmqpLocalError(f"channel {channel} is outside 1..{self.channel_max}")
