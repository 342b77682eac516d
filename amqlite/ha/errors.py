"""Errors of the HA core. All are fatal to the pair's configuration except
:class:`HeartbeatError` (one malformed heartbeat: log it and drop it).

A heartbeat that is well formed but not from our peer (another vhost, our own node
id) is not an error: the machine answers it with a ``RefusedHeartbeat`` action.
"""

from __future__ import annotations

from ..errors import AmqliteError, ReplyCode


class HaError(AmqliteError):
    """Root of the HA core's errors."""

    code = ReplyCode.PRECONDITION_FAILED


class IllegalTransition(HaError):
    """A (state, event) pair missing from the transition table.

    Binary Star treats these as fatal configuration errors: the shell should log
    the text and stop the node rather than guess who is master.
    """

    code = ReplyCode.NOT_ALLOWED

    def __init__(self, state: str, event: str, reason: str) -> None:
        super().__init__(f"HA state {state!r} cannot take event {event!r}: {reason}")
        self.state = state
        self.event = event
        self.reason = reason


class HaConfigError(HaError):
    """The peer's heartbeat shows the pair is misconfigured (both nodes have the same
    role). Fatal, like :class:`IllegalTransition`."""


class HeartbeatError(HaError):
    """A heartbeat map that is malformed (missing field, wrong type, bad value)."""

    code = ReplyCode.SYNTAX_ERROR
