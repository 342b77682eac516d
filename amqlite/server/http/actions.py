"""The management API's changes, run as a client's requests are.

Each HTTP action opens a broker session on the vhost, runs protocol request
events through the same :class:`~amqlite.server.dispatch.RequestDispatcher` a
native client's go through (permissions, the exchange's peering hook, the broker
call), waits for its ok at the node's one durability barrier (the journal and,
on an HA pair, the passive node: :meth:`NodeStorage.when_durable`), lets the
node's pump hand any pushes it caused to their connections, and closes the
session (which requeues what a ``get`` left unacked). Nothing here touches the
broker's state any other way. On an HA pair a change asks for service as a
client's hello does (``HaView.admit``): a passive node refuses it (503), unless its
peer went silent, when the request is the client vote that promotes it.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from amqlite.auth import AuthenticatedUser
from amqlite.errors import ReplyCode
from amqlite.protocol import events as ev

from ..dispatch import RequestDispatcher
from ..endpoints.client import DURABLE_REQUESTS

if TYPE_CHECKING:
    from amqlite.broker import Session

    from ..context import NodeView
    from ..storage import NodeStorage

__all__ = ["ActionSession", "NotServing", "open_action_session"]

#: node states in which the broker takes changes (not a passive or starting HA node)
SERVING_STATES = frozenset({"standalone", "active"})


class NotServing(Exception):
    """The node takes no changes now (a passive or starting HA node): HTTP 503."""


class ActionSession:
    """One broker session for the requests of one HTTP action."""

    def __init__(self, node: NodeView, session: Session, dispatcher: RequestDispatcher) -> None:
        self._node = node
        self.session = session
        self._dispatcher = dispatcher
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    async def request(self, event: ev.Event) -> ev.Event | None:
        """Run ``event``; its reply, once durable when it promises durability (a
        disk that dropped the message turns the ok into a 506 error)."""
        node = self._node
        reply = self._dispatcher.handle(event, trio.current_time())
        node.pump()
        storage = node.storage
        if isinstance(reply, ev.Ok) and type(event) in DURABLE_REQUESTS and storage is not None:
            first, last = self.session.journal_span
            if last:
                done = trio.Event()
                lost: list[str] = []

                def released(reason: str | None) -> None:
                    if reason is not None:
                        lost.append(reason)
                    done.set()

                storage.when_durable(first, last, released)
                await done.wait()
                if lost:
                    return ev.Error(reply.re, ReplyCode.RESOURCE_ERROR, lost[0])
        elif type(reply) is ev.GetOk and storage is not None:
            await _replicated(storage, self._dispatcher.got_id)
        return reply


async def _replicated(storage: NodeStorage, journal_id: int) -> None:
    """HA: wait until the passive node holds message ``journal_id`` (0: transient),
    as a push to a consumer waits (endpoints/client.py ``_hold_get``)."""
    if not storage.get_held(journal_id, False):
        return
    done = trio.Event()

    def check() -> None:  # (held no more once replication stopped, too)
        if not storage.get_held(journal_id, False):
            done.set()

    storage.when_replicated(check)
    try:
        await done.wait()
    finally:
        storage.discard_waiter(check)


@asynccontextmanager
async def open_action_session(
    node: NodeView, user: AuthenticatedUser, vhost: str
) -> AsyncIterator[ActionSession]:
    """A session of ``user`` (as :meth:`Authenticator.authorize` gave it for
    ``vhost``) for the duration of the block; closed after it, whatever happens."""
    ha = node.ha
    if ha is not None:
        # a change is a request for service, as a client's hello: on a passive node
        # whose peer went silent it is the client vote that promotes it (docs/ha.md)
        deadline = trio.current_time() + 2 * ha.config.failover_timeout_ms / 1000
        admitted, why = await ha.admit(deadline)
        if not admitted:
            raise NotServing(f"node {node.node_id} is {node.state}: {why}")
    elif node.state not in SERVING_STATES:
        raise NotServing(f"node {node.node_id} is {node.state}: it takes no changes")
    session = node.broker.open_session(vhost, owner=None)
    peered = node.peering.hook_for(vhost) if node.peering is not None else None
    dispatcher = RequestDispatcher(session, user, vhost, node.status, peered=peered)
    try:
        yield ActionSession(node, session, dispatcher)
    finally:
        session.close(trio.current_time())
        node.pump()
