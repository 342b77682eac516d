"""AMQP 0-9-1 errors: every one carries the reply code to send and says whether it
closes a channel or the whole connection.

The split follows the AMQP 0-9-1 spec's constants and RabbitMQ: the "soft" codes
(311, 312, 313, 403, 404, 405, 406) close one channel with ``channel.close``; every
other code closes the connection with ``connection.close``. A soft code raised on
channel 0 still closes the connection (there is no channel to close).
"""

from __future__ import annotations

from ..errors import LocalProtocolError, ProtocolError, ReplyCode

#: Codes that close only the channel they happened on (AMQP "soft errors").
CHANNEL_CODES = frozenset(
    {
        ReplyCode.CONTENT_TOO_LARGE,
        ReplyCode.NO_ROUTE,
        ReplyCode.NO_CONSUMERS,
        ReplyCode.ACCESS_REFUSED,
        ReplyCode.NOT_FOUND,
        ReplyCode.RESOURCE_LOCKED,
        ReplyCode.PRECONDITION_FAILED,
    }
)
#: Codes that close the connection (AMQP "hard errors").
CONNECTION_CODES = frozenset(
    {
        ReplyCode.CONNECTION_FORCED,
        ReplyCode.INVALID_PATH,
        ReplyCode.FRAME_ERROR,
        ReplyCode.SYNTAX_ERROR,
        ReplyCode.COMMAND_INVALID,
        ReplyCode.CHANNEL_ERROR,
        ReplyCode.UNEXPECTED_FRAME,
        ReplyCode.RESOURCE_ERROR,
        ReplyCode.NOT_ALLOWED,
        ReplyCode.NOT_IMPLEMENTED,
        ReplyCode.INTERNAL_ERROR,
    }
)


def is_connection_error(code: int) -> bool:
    """True when ``code`` closes the connection (any code not known as soft does)."""
    return code not in CHANNEL_CODES


class AmqpError(ProtocolError):
    """The other end broke AMQP 0-9-1 (or a request failed): reply with ``code``.

    ``channel`` is where it happened (0 = the connection); ``class_id`` and
    ``method_id`` name the method that failed, as ``channel.close`` and
    ``connection.close`` carry them (0 when no method is to blame).
    """

    def __init__(
        self,
        text: str,
        code: int,
        *,
        channel: int = 0,
        class_id: int = 0,
        method_id: int = 0,
    ) -> None:
        super().__init__(text, code)
        self.channel = channel
        self.class_id = class_id
        self.method_id = method_id

    @property
    def closes_connection(self) -> bool:
        """True for a hard error, or any error on channel 0."""
        return self.channel == 0 or is_connection_error(self.code)


class ProtocolHeaderMismatch(AmqpError):
    """The other end does not speak AMQP 0-9-1: a server answers with its own
    protocol header and closes the socket (no ``connection.close`` is possible)."""

    def __init__(self, text: str, received: bytes) -> None:
        super().__init__(text, ReplyCode.FRAME_ERROR)
        self.received = received


class AmqpLocalError(LocalProtocolError):
    """We tried to send something AMQP 0-9-1 does not allow (a bug on our side)."""

    def __init__(self, text: str, code: int = ReplyCode.INTERNAL_ERROR) -> None:
        super().__init__(text, code)


def syntax_error(text: str) -> AmqpError:
    """A frame whose fields do not decode (502, closes the connection)."""
    return AmqpError(text, ReplyCode.SYNTAX_ERROR)
