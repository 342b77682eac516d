"""Content assembly: a content-bearing method (basic.publish, basic.deliver,
basic.return, basic.get-ok), then one header frame, then body frames until the
header's body size is reached, make one message.

The order itself (no method while a body is pending, no body before its header)
is the channel state machine's (:mod:`~amqlite.amqp.states`); this class checks
what the order cannot: the header names the method's class, the body size is
within the limit, and the body frames add up to exactly the declared size.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ReplyCode
from .errors import AmqpError
from .properties import BasicProperties
from .spec import Method


@dataclass(frozen=True, slots=True)
class Content:
    """One assembled message: its method, properties and body."""

    method: Method
    properties: BasicProperties
    body: bytes


class ContentAssembler:
    """Collects one channel's incoming message. ``max_body_size`` (0 = no limit)
    refuses larger bodies with 406 on the channel, as RabbitMQ's max_message_size
    does (in its words; ``max_body_setting`` names the setting in the text)."""

    __slots__ = (
        "_channel",
        "_chunks",
        "_method",
        "_properties",
        "_received",
        "_size",
        "max_body_setting",
        "max_body_size",
    )

    def __init__(self, channel: int, max_body_size: int = 0, max_body_setting: str = "") -> None:
        self.max_body_size = max_body_size
        self.max_body_setting = max_body_setting
        self._method: Method | None = None
        self._properties: BasicProperties | None = None
        self._size = 0
        self._received = 0
        self._chunks: list[bytes] = []
        self._channel = channel

    def start(self, method: Method) -> None:
        self._method = method
        self._properties = None
        self._chunks = []
        self._size = self._received = 0

    def header(self, class_id: int, body_size: int, properties: BasicProperties) -> Content | None:
        """Take the header; returns the message at once when its body is empty."""
        method = self._expect_method()
        if class_id != method.CLASS_ID:
            raise AmqpError(
                f"content header for class {class_id} after {method.NAME}",
                ReplyCode.UNEXPECTED_FRAME,
                channel=self._channel,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if self.max_body_size and body_size > self.max_body_size:
            setting = f" ({self.max_body_setting})" if self.max_body_setting else ""
            raise AmqpError(
                f"message size {body_size} is larger than configured max size "
                f"{self.max_body_size}{setting}",
                ReplyCode.PRECONDITION_FAILED,
                channel=self._channel,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        self._properties = properties
        self._size = body_size
        return self._finish() if body_size == 0 else None

    def body(self, payload: bytes) -> Content | None:
        """Take one body frame; returns the message once the body is complete."""
        method = self._expect_method()
        self._received += len(payload)
        if self._received > self._size:
            raise AmqpError(
                f"body frames carry {self._received} bytes, the header said {self._size}",
                ReplyCode.FRAME_ERROR,
                channel=self._channel,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        self._chunks.append(payload)
        return self._finish() if self._received == self._size else None

    @property
    def expects_body(self) -> bool:
        return self._properties is not None

    def _expect_method(self) -> Method:
        assert self._method is not None, "the channel state machine let a frame through"
        return self._method

    def _finish(self) -> Content:
        method, props = self._expect_method(), self._properties
        assert props is not None
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._method = self._properties = None
        self._chunks = []
        return Content(method, props, body)
