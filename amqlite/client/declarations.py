"""Exchange, queue and binding requests, and ``status``: the topology half of a
:class:`~amqlite.client.Connection` (mixed into it)."""

from __future__ import annotations

from typing import Any

from amqlite.protocol import events as ev

from .delivery import QueueInfo
from .replies import ReplyHook
from .topology import Topology


class Declarations:
    """Requests that shape the broker. Successful declarations and bindings are
    recorded in ``_topology`` (deletes and unbinds remove them) so a reconnect can
    declare them again."""

    _topology: Topology

    def _new_id(self) -> int:  # pragma: no cover - provided by Connection
        raise NotImplementedError

    async def _call(
        self, event: Any, hook: ReplyHook | None = None
    ) -> ev.Event:  # pragma: no cover
        raise NotImplementedError

    async def declare_exchange(
        self,
        name: str,
        type: str = "direct",
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        passive: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        req = ev.ExchangeDeclare(
            self._new_id(),
            name,
            type,
            durable,
            auto_delete,
            internal,
            passive,
            dict(arguments or {}),
        )
        await self._call(req)
        if not passive:
            self._topology.exchange_declared(req)

    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        await self._call(ev.ExchangeDelete(self._new_id(), name, if_unused))
        self._topology.exchange_deleted(name)

    async def declare_queue(
        self,
        name: str = "",
        *,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        passive: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> QueueInfo:
        req = ev.QueueDeclare(
            self._new_id(), name, durable, exclusive, auto_delete, passive, dict(arguments or {})
        )
        reply = await self._call(req)
        info = reply.info if isinstance(reply, ev.Ok) else {}
        actual = str(info.get("queue", name))
        if not passive:
            self._topology.queue_declared(req, actual)
        return QueueInfo(
            name=actual,
            messages=int(info.get("messages", 0)),
            consumers=int(info.get("consumers", 0)),
        )

    async def delete_queue(
        self, name: str, *, if_unused: bool = False, if_empty: bool = False
    ) -> int:
        """Delete a queue; returns how many messages it held."""
        reply = await self._call(ev.QueueDelete(self._new_id(), name, if_unused, if_empty))
        self._topology.queue_deleted(name)
        return _info_int(reply, "messages")

    async def purge_queue(self, name: str) -> int:
        """Drop a queue's ready messages; returns how many."""
        return _info_int(await self._call(ev.QueuePurge(self._new_id(), name)), "messages")

    async def bind(
        self, queue: str, exchange: str, key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        req = ev.QueueBind(self._new_id(), queue, exchange, key, dict(arguments or {}))
        await self._call(req)
        self._topology.bound(req)

    async def unbind(
        self, queue: str, exchange: str, key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        args = dict(arguments or {})
        await self._call(ev.QueueUnbind(self._new_id(), queue, exchange, key, args))
        self._topology.unbound(queue, exchange, key, args)

    async def status(self) -> dict[str, Any]:
        """The broker's status map (node, vhosts with exchanges and queues, connections)."""
        reply = await self._call(ev.Status(self._new_id()))
        return dict(reply.info) if isinstance(reply, ev.Ok) else {}

    async def switchover(self, within: float = 10.0) -> dict[str, Any]:
        """Ask this (active) HA node to hand over to its passive peer (needs a
        connection opened with ``role="monitor"``); ``within`` seconds for the peer to
        catch up and take over (the server enforces it). Returns {active, passive}."""
        reply = await self._call(ev.HaSwitchover(self._new_id(), within))
        return dict(reply.info) if isinstance(reply, ev.Ok) else {}

    async def trace(self, enabled: bool) -> bool:
        """Turn the broker's trace (one record per publish, delivery and ack in the
        stream queue ``amq.trace``) on or off; returns whether it is now on."""
        reply = await self._call(ev.Trace(self._new_id(), enabled))
        return bool(reply.info.get("enabled")) if isinstance(reply, ev.Ok) else enabled


def _info_int(reply: ev.Event, key: str) -> int:
    if isinstance(reply, ev.Ok):
        return int(reply.info.get(key, 0))
    return 0
