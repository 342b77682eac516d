"""Errors of the peering core, rooted in :mod:`amqlite.errors`.

Remote faults (a malformed or out-of-place peering message) are
:class:`PeeringProtocolError`; the link turns them into a ``Disconnect`` action
itself, so a shell only sees them when it calls :func:`amqlite.peering.wire.from_map`
directly. A shell calling a link method the link's state does not allow is a bug
on our side: :class:`LinkStateError`.
"""

from __future__ import annotations

from amqlite.errors import LocalProtocolError, RemoteProtocolError, ReplyCode


class PeeringProtocolError(RemoteProtocolError):
    """The remote end of a link sent a malformed or unexpected peering message."""

    code = ReplyCode.SYNTAX_ERROR


class LinkStateError(LocalProtocolError):
    """A (state, event) pair missing from the link transition table."""

    code = ReplyCode.INTERNAL_ERROR
