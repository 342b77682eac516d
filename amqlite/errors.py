"""One root error for amqlite, and the reply codes shared with the wire protocol.

Reply codes are data: the same numbers travel in ``error``, ``refused``,
``return``, ``nack`` and ``close`` frames and are raised by the client as
:class:`AmqliteError` subclasses. The numbers follow AMQP 0-9-1 where AMQP has
one; ``NOT_ACTIVE`` is ours (a passive HA node sends clients to the next address).

Soft errors fail one request and leave the connection open; hard errors close the
connection after the error frame has been sent (see :func:`is_hard`).
"""

from __future__ import annotations

from enum import IntEnum


class ReplyCode(IntEnum):
    """Reply codes carried on the wire."""

    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    NOT_ACTIVE = 360
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


_HARD = frozenset(
    {
        ReplyCode.CONNECTION_FORCED,
        ReplyCode.FRAME_ERROR,
        ReplyCode.UNEXPECTED_FRAME,
        ReplyCode.INTERNAL_ERROR,
    }
)


def is_hard(code: int) -> bool:
    """True when an error with this code closes the connection."""
    return code in _HARD


def code_name(code: int) -> str:
    """``404`` -> ``"NOT_FOUND"``; unknown numbers come back as digits."""
    try:
        return ReplyCode(code).name
    except ValueError:
        return str(code)


class AmqliteError(Exception):
    """Root of every error amqlite raises; carries a reply code and a human text."""

    code: int = ReplyCode.INTERNAL_ERROR

    def __init__(self, text: str, code: int | None = None) -> None:
        super().__init__(text)
        self.text = text
        if code is not None:
            self.code = int(code)

    def __str__(self) -> str:
        return f"{self.code} {code_name(self.code)}: {self.text}"


class ProtocolError(AmqliteError):
    """The wire protocol was broken. ``code`` is the reply to send."""

    code = ReplyCode.FRAME_ERROR


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol does not allow (a bug on our side)."""


class RemoteProtocolError(ProtocolError):
    """The other end sent something the protocol does not allow."""


class BrokerError(AmqliteError):
    """A request the broker refuses: 404 missing entity, 406 mismatch, 403 denied..."""

    code = ReplyCode.PRECONDITION_FAILED


class NotFound(BrokerError):
    code = ReplyCode.NOT_FOUND


class PreconditionFailed(BrokerError):
    code = ReplyCode.PRECONDITION_FAILED


class AccessRefused(BrokerError):
    code = ReplyCode.ACCESS_REFUSED


class ResourceLocked(BrokerError):
    code = ReplyCode.RESOURCE_LOCKED


class NotAllowed(BrokerError):
    code = ReplyCode.NOT_ALLOWED


class ConfigError(AmqliteError):
    """A bad configuration: ``key`` names the offending setting."""

    code = ReplyCode.PRECONDITION_FAILED

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason

    def __str__(self) -> str:
        return f"config error: {self.key}: {self.reason}"


class ConnectionRefused(AmqliteError):
    """The server refused the handshake (bad login, unknown vhost, not active)."""

    code = ReplyCode.ACCESS_REFUSED


class ConnectionClosed(AmqliteError):
    """The connection is closed (by us, by the other end, or lost)."""

    code = ReplyCode.CONNECTION_FORCED


class PublishReturned(AmqliteError):
    """A mandatory publish reached no queue and came back."""

    code = ReplyCode.NO_ROUTE


class PublishNacked(AmqliteError):
    """The broker did not take responsibility for a publish (e.g. a full queue)."""

    code = ReplyCode.PRECONDITION_FAILED


def error_for(code: int, text: str) -> AmqliteError:
    """The most specific error class for a reply code received on the wire."""
    cls: type[AmqliteError] = _BY_CODE.get(code, BrokerError)
    return cls(text, code)


_BY_CODE: dict[int, type[AmqliteError]] = {
    ReplyCode.NOT_FOUND: NotFound,
    ReplyCode.PRECONDITION_FAILED: PreconditionFailed,
    ReplyCode.ACCESS_REFUSED: AccessRefused,
    ReplyCode.RESOURCE_LOCKED: ResourceLocked,
    ReplyCode.NOT_ALLOWED: NotAllowed,
    ReplyCode.NO_ROUTE: PublishReturned,
    ReplyCode.CONNECTION_FORCED: ConnectionClosed,
    ReplyCode.FRAME_ERROR: ProtocolError,
    ReplyCode.SYNTAX_ERROR: ProtocolError,
    ReplyCode.COMMAND_INVALID: ProtocolError,
    ReplyCode.UNEXPECTED_FRAME: ProtocolError,
}
