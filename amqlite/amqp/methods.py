"""Every AMQP 0-9-1 method RabbitMQ clients use, as frozen dataclasses.

Grouped by AMQP class; a class is named after its AMQP class and verb
(``basic.publish`` -> :class:`BasicPublish`). Field names are the spec's with
dashes as underscores (``global`` is ``global_``, exchange ``type`` is
``exchange_type``); reserved fields (``ticket``, ``insist``, ``out_of_band``...) are
kept so every method encodes byte for byte as other clients do. ``tx.*`` decodes
too: whether it is served is the broker's choice. The ``access`` class (30), gone
from 0-9-1 in practice, is not here: it decodes as unknown (540).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from .spec import (
    Bit,
    Long,
    LongBytes,
    LongLong,
    LongStr,
    Method,
    Octet,
    Sender,
    Short,
    ShortStr,
    Table,
    add_fast_path,
    method,
)

# --- connection (10) ------------------------------------------------------------


@method(10, 10, "connection.start", Sender.SERVER, synchronous=True)
@dataclass(frozen=True, slots=True)
class ConnectionStart(Method):
    """``connection.start``."""

    version_major: Octet = 0
    version_minor: Octet = 9
    server_properties: Table = field(default_factory=dict)
    mechanisms: LongStr = "PLAIN"
    locales: LongStr = "en_US"


@method(10, 11, "connection.start-ok", Sender.CLIENT)
@dataclass(frozen=True, slots=True)
class ConnectionStartOk(Method):
    """``connection.start-ok``."""

    client_properties: Table = field(default_factory=dict)
    mechanism: ShortStr = "PLAIN"
    response: LongBytes = b""
    locale: ShortStr = "en_US"


@method(10, 20, "connection.secure", Sender.SERVER, synchronous=True)
@dataclass(frozen=True, slots=True)
class ConnectionSecure(Method):
    """``connection.secure``."""

    challenge: LongBytes = b""


@method(10, 21, "connection.secure-ok", Sender.CLIENT)
@dataclass(frozen=True, slots=True)
class ConnectionSecureOk(Method):
    """``connection.secure-ok``."""

    response: LongBytes = b""


@method(10, 30, "connection.tune", Sender.SERVER, synchronous=True)
@dataclass(frozen=True, slots=True)
class ConnectionTune(Method):
    """``connection.tune``."""

    channel_max: Short = 0
    frame_max: Long = 0
    heartbeat: Short = 0


@method(10, 31, "connection.tune-ok", Sender.CLIENT)
@dataclass(frozen=True, slots=True)
class ConnectionTuneOk(Method):
    """``connection.tune-ok``."""

    channel_max: Short = 0
    frame_max: Long = 0
    heartbeat: Short = 0


@method(10, 40, "connection.open", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class ConnectionOpen(Method):
    """``connection.open``."""

    virtual_host: ShortStr = "/"
    capabilities: ShortStr = ""
    insist: Bit = False


@method(10, 41, "connection.open-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ConnectionOpenOk(Method):
    """``connection.open-ok``."""

    known_hosts: ShortStr = ""


@method(10, 50, "connection.close", Sender.BOTH, synchronous=True)
@dataclass(frozen=True, slots=True)
class ConnectionClose(Method):
    """``connection.close``."""

    reply_code: Short = 200
    reply_text: ShortStr = ""
    class_id: Short = 0
    method_id: Short = 0


@method(10, 51, "connection.close-ok", Sender.BOTH)
@dataclass(frozen=True, slots=True)
class ConnectionCloseOk(Method):
    """``connection.close-ok``."""


@method(10, 60, "connection.blocked", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ConnectionBlocked(Method):
    """``connection.blocked``."""

    reason: ShortStr = ""


@method(10, 61, "connection.unblocked", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ConnectionUnblocked(Method):
    """``connection.unblocked``."""


@method(10, 70, "connection.update-secret", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class ConnectionUpdateSecret(Method):
    """``connection.update-secret``."""

    new_secret: LongBytes = b""
    reason: ShortStr = ""


@method(10, 71, "connection.update-secret-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ConnectionUpdateSecretOk(Method):
    """``connection.update-secret-ok``."""


# --- channel (20) ---------------------------------------------------------------


@method(20, 10, "channel.open", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class ChannelOpen(Method):
    """``channel.open``."""

    out_of_band: ShortStr = ""


@method(20, 11, "channel.open-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ChannelOpenOk(Method):
    """``channel.open-ok``."""

    channel_id: LongBytes = b""


@method(20, 20, "channel.flow", Sender.BOTH, synchronous=True)
@dataclass(frozen=True, slots=True)
class ChannelFlow(Method):
    """``channel.flow``."""

    active: Bit = True


@method(20, 21, "channel.flow-ok", Sender.BOTH)
@dataclass(frozen=True, slots=True)
class ChannelFlowOk(Method):
    """``channel.flow-ok``."""

    active: Bit = True


@method(20, 40, "channel.close", Sender.BOTH, synchronous=True)
@dataclass(frozen=True, slots=True)
class ChannelClose(Method):
    """``channel.close``."""

    reply_code: Short = 200
    reply_text: ShortStr = ""
    class_id: Short = 0
    method_id: Short = 0


@method(20, 41, "channel.close-ok", Sender.BOTH)
@dataclass(frozen=True, slots=True)
class ChannelCloseOk(Method):
    """``channel.close-ok``."""


# --- exchange (40) --------------------------------------------------------------


@method(40, 10, "exchange.declare", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class ExchangeDeclare(Method):
    """``exchange.declare``."""

    ticket: Short = 0
    exchange: ShortStr = ""
    exchange_type: ShortStr = "direct"
    passive: Bit = False
    durable: Bit = False
    auto_delete: Bit = False
    internal: Bit = False
    nowait: Bit = False
    arguments: Table = field(default_factory=dict)


@method(40, 11, "exchange.declare-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ExchangeDeclareOk(Method):
    """``exchange.declare-ok``."""


@method(40, 20, "exchange.delete", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class ExchangeDelete(Method):
    """``exchange.delete``."""

    ticket: Short = 0
    exchange: ShortStr = ""
    if_unused: Bit = False
    nowait: Bit = False


@method(40, 21, "exchange.delete-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ExchangeDeleteOk(Method):
    """``exchange.delete-ok``."""


@method(40, 30, "exchange.bind", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class ExchangeBind(Method):
    """``exchange.bind``."""

    ticket: Short = 0
    destination: ShortStr = ""
    source: ShortStr = ""
    routing_key: ShortStr = ""
    nowait: Bit = False
    arguments: Table = field(default_factory=dict)


@method(40, 31, "exchange.bind-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ExchangeBindOk(Method):
    """``exchange.bind-ok``."""


@method(40, 40, "exchange.unbind", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class ExchangeUnbind(Method):
    """``exchange.unbind``."""

    ticket: Short = 0
    destination: ShortStr = ""
    source: ShortStr = ""
    routing_key: ShortStr = ""
    nowait: Bit = False
    arguments: Table = field(default_factory=dict)


@method(40, 51, "exchange.unbind-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ExchangeUnbindOk(Method):
    """``exchange.unbind-ok``."""


# --- queue (50) -----------------------------------------------------------------


@method(50, 10, "queue.declare", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class QueueDeclare(Method):
    """``queue.declare``."""

    ticket: Short = 0
    queue: ShortStr = ""
    passive: Bit = False
    durable: Bit = False
    exclusive: Bit = False
    auto_delete: Bit = False
    nowait: Bit = False
    arguments: Table = field(default_factory=dict)


@method(50, 11, "queue.declare-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class QueueDeclareOk(Method):
    """``queue.declare-ok``."""

    queue: ShortStr = ""
    message_count: Long = 0
    consumer_count: Long = 0


@method(50, 20, "queue.bind", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class QueueBind(Method):
    """``queue.bind``."""

    ticket: Short = 0
    queue: ShortStr = ""
    exchange: ShortStr = ""
    routing_key: ShortStr = ""
    nowait: Bit = False
    arguments: Table = field(default_factory=dict)


@method(50, 21, "queue.bind-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class QueueBindOk(Method):
    """``queue.bind-ok``."""


@method(50, 30, "queue.purge", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class QueuePurge(Method):
    """``queue.purge``."""

    ticket: Short = 0
    queue: ShortStr = ""
    nowait: Bit = False


@method(50, 31, "queue.purge-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class QueuePurgeOk(Method):
    """``queue.purge-ok``."""

    message_count: Long = 0


@method(50, 40, "queue.delete", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class QueueDelete(Method):
    """``queue.delete``."""

    ticket: Short = 0
    queue: ShortStr = ""
    if_unused: Bit = False
    if_empty: Bit = False
    nowait: Bit = False


@method(50, 41, "queue.delete-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class QueueDeleteOk(Method):
    """``queue.delete-ok``."""

    message_count: Long = 0


@method(50, 50, "queue.unbind", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class QueueUnbind(Method):
    """``queue.unbind``."""

    ticket: Short = 0
    queue: ShortStr = ""
    exchange: ShortStr = ""
    routing_key: ShortStr = ""
    arguments: Table = field(default_factory=dict)


@method(50, 51, "queue.unbind-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class QueueUnbindOk(Method):
    """``queue.unbind-ok``."""


# --- basic (60) -----------------------------------------------------------------


@method(60, 10, "basic.qos", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class BasicQos(Method):
    """``basic.qos``."""

    prefetch_size: Long = 0
    prefetch_count: Short = 0
    global_: Bit = False


@method(60, 11, "basic.qos-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class BasicQosOk(Method):
    """``basic.qos-ok``."""


@method(60, 20, "basic.consume", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class BasicConsume(Method):
    """``basic.consume``."""

    ticket: Short = 0
    queue: ShortStr = ""
    consumer_tag: ShortStr = ""
    no_local: Bit = False
    no_ack: Bit = False
    exclusive: Bit = False
    nowait: Bit = False
    arguments: Table = field(default_factory=dict)


@method(60, 21, "basic.consume-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class BasicConsumeOk(Method):
    """``basic.consume-ok``."""

    consumer_tag: ShortStr = ""


@method(60, 30, "basic.cancel", Sender.BOTH, synchronous=True)
@dataclass(frozen=True, slots=True)
class BasicCancel(Method):
    """``basic.cancel``."""

    consumer_tag: ShortStr = ""
    nowait: Bit = False


@method(60, 31, "basic.cancel-ok", Sender.BOTH)
@dataclass(frozen=True, slots=True)
class BasicCancelOk(Method):
    """``basic.cancel-ok``."""

    consumer_tag: ShortStr = ""


@method(60, 40, "basic.publish", Sender.CLIENT, content=True)
@dataclass(frozen=True, slots=True)
class BasicPublish(Method):
    """``basic.publish``."""

    ticket: Short = 0
    exchange: ShortStr = ""
    routing_key: ShortStr = ""
    mandatory: Bit = False
    immediate: Bit = False


@method(60, 50, "basic.return", Sender.SERVER, content=True)
@dataclass(frozen=True, slots=True)
class BasicReturn(Method):
    """``basic.return``."""

    reply_code: Short = 312
    reply_text: ShortStr = ""
    exchange: ShortStr = ""
    routing_key: ShortStr = ""


@method(60, 60, "basic.deliver", Sender.SERVER, content=True)
@dataclass(frozen=True, slots=True)
class BasicDeliver(Method):
    """``basic.deliver``."""

    consumer_tag: ShortStr = ""
    delivery_tag: LongLong = 0
    redelivered: Bit = False
    exchange: ShortStr = ""
    routing_key: ShortStr = ""


@method(60, 70, "basic.get", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class BasicGet(Method):
    """``basic.get``."""

    ticket: Short = 0
    queue: ShortStr = ""
    no_ack: Bit = False


@method(60, 71, "basic.get-ok", Sender.SERVER, content=True)
@dataclass(frozen=True, slots=True)
class BasicGetOk(Method):
    """``basic.get-ok``."""

    delivery_tag: LongLong = 0
    redelivered: Bit = False
    exchange: ShortStr = ""
    routing_key: ShortStr = ""
    message_count: Long = 0


@method(60, 72, "basic.get-empty", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class BasicGetEmpty(Method):
    """``basic.get-empty``."""

    cluster_id: ShortStr = ""


@method(60, 80, "basic.ack", Sender.BOTH)
@dataclass(frozen=True, slots=True)
class BasicAck(Method):
    """``basic.ack``."""

    delivery_tag: LongLong = 0
    multiple: Bit = False


@method(60, 90, "basic.reject", Sender.CLIENT)
@dataclass(frozen=True, slots=True)
class BasicReject(Method):
    """``basic.reject``."""

    delivery_tag: LongLong = 0
    requeue: Bit = True


@method(60, 100, "basic.recover-async", Sender.CLIENT)
@dataclass(frozen=True, slots=True)
class BasicRecoverAsync(Method):
    """``basic.recover-async``."""

    requeue: Bit = False


@method(60, 110, "basic.recover", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class BasicRecover(Method):
    """``basic.recover``."""

    requeue: Bit = False


@method(60, 111, "basic.recover-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class BasicRecoverOk(Method):
    """``basic.recover-ok``."""


@method(60, 120, "basic.nack", Sender.BOTH)
@dataclass(frozen=True, slots=True)
class BasicNack(Method):
    """``basic.nack``."""

    delivery_tag: LongLong = 0
    multiple: Bit = False
    requeue: Bit = True


# --- confirm (85) ---------------------------------------------------------------


@method(85, 10, "confirm.select", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class ConfirmSelect(Method):
    """``confirm.select``."""

    nowait: Bit = False


@method(85, 11, "confirm.select-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class ConfirmSelectOk(Method):
    """``confirm.select-ok``."""


# --- tx (90) --------------------------------------------------------------------


@method(90, 10, "tx.select", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class TxSelect(Method):
    """``tx.select``."""


@method(90, 11, "tx.select-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class TxSelectOk(Method):
    """``tx.select-ok``."""


@method(90, 20, "tx.commit", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class TxCommit(Method):
    """``tx.commit``."""


@method(90, 21, "tx.commit-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class TxCommitOk(Method):
    """``tx.commit-ok``."""


@method(90, 30, "tx.rollback", Sender.CLIENT, synchronous=True)
@dataclass(frozen=True, slots=True)
class TxRollback(Method):
    """``tx.rollback``."""


@method(90, 31, "tx.rollback-ok", Sender.SERVER)
@dataclass(frozen=True, slots=True)
class TxRollbackOk(Method):
    """``tx.rollback-ok``."""


# --- fast paths: the methods of every message --------------------------------------------

_DELIVER_MIDDLE = struct.Struct(">QB")  # delivery-tag, then the redelivered bit's octet
_SHORT = struct.Struct(">H")


def _encode_deliver_args(d: BasicDeliver) -> bytes | None:
    """basic.deliver's arguments, once per delivery; None: the compiled codec's case."""
    return encode_deliver_args(
        d.consumer_tag, d.delivery_tag, d.redelivered, d.exchange, d.routing_key
    )


def encode_deliver_args(
    consumer_tag: Any, delivery_tag: Any, redelivered: Any, exchange: Any, routing_key: Any
) -> bytes | None:
    """:func:`_encode_deliver_args` from the values, without a :class:`BasicDeliver`
    (``AmqpConnection.send_deliver``); None: the compiled codec's case."""
    try:
        tag = consumer_tag.encode("utf-8")
        exchange = exchange.encode("utf-8")
        key = routing_key.encode("utf-8")
        middle = _DELIVER_MIDDLE.pack(delivery_tag, 1 if redelivered else 0)
    except (AttributeError, TypeError, struct.error, UnicodeEncodeError):
        return None
    if len(tag) > 255 or len(exchange) > 255 or len(key) > 255:
        return None
    return b"".join(
        (
            bytes((len(tag),)),
            tag,
            middle,
            bytes((len(exchange),)),
            exchange,
            bytes((len(key),)),
            key,
        )
    )


def _decode_publish_args(data: bytes, offset: int) -> list[Any] | None:
    """basic.publish's arguments, once per message published; None: the compiled
    codec's case (it finds and names the error, if any)."""
    size = len(data)
    start = offset + 2  # after the ticket
    if start >= size:
        return None
    exchange_end = start + 1 + data[start]
    if exchange_end >= size:
        return None
    key_end = exchange_end + 1 + data[exchange_end]
    if key_end + 1 != size:  # the bits' octet is the last byte
        return None
    try:
        exchange = data[start + 1 : exchange_end].decode("utf-8")
        key = data[exchange_end + 1 : key_end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    bits = data[key_end]
    return [_SHORT.unpack_from(data, offset)[0], exchange, key, bool(bits & 1), bool(bits & 2)]


add_fast_path(BasicDeliver, encode_args=_encode_deliver_args)
add_fast_path(BasicPublish, decode_args=_decode_publish_args)
