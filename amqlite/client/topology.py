"""What a connection declared, kept so a reconnect can declare it again.

Sans-IO bookkeeping: exchanges, queues and bindings this connection declared, in
the order it declared them, minus what it deleted or unbound since (deleting an
exchange or a queue drops its bindings, as the broker does). A queue the server
named (declared with ``""``) is recorded under the name it got, flagged
``server_named``: a reconnect first asks for that name again, and when the server
will not create it (``amq.`` names are reserved) declares a fresh one and calls
:meth:`Topology.renamed`, which rewrites the bindings that follow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from amqlite.protocol import events as ev

Declaration = ev.ExchangeDeclare | ev.QueueDeclare | ev.QueueBind


@dataclass(frozen=True, slots=True)
class Declared:
    """One recorded declaration; ``event.id`` is stale (give it a fresh one)."""

    event: Declaration
    server_named: bool = False


class Topology:
    """The declarations to replay, in order."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[Declared] = []

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Declared]:
        return iter(list(self._entries))

    def __getitem__(self, index: int) -> Declared:
        return self._entries[index]

    @property
    def queues(self) -> list[str]:
        return [d.event.queue for d in self._entries if type(d.event) is ev.QueueDeclare]

    # --- recording ------------------------------------------------------------------

    def exchange_declared(self, req: ev.ExchangeDeclare) -> None:
        if not any(_is_exchange(d.event, req.exchange) for d in self._entries):
            self._entries.append(Declared(req))

    def exchange_deleted(self, name: str) -> None:
        self._entries = [
            d
            for d in self._entries
            if not _is_exchange(d.event, name)
            and not (type(d.event) is ev.QueueBind and d.event.exchange == name)
        ]

    def queue_declared(self, req: ev.QueueDeclare, name: str) -> None:
        """``req`` succeeded and the queue is called ``name`` (the server's pick when
        ``req.queue`` was empty)."""
        if name and not any(_is_queue(d.event, name) for d in self._entries):
            self._entries.append(Declared(replace(req, queue=name), server_named=not req.queue))

    def queue_deleted(self, name: str) -> None:
        self._entries = [d for d in self._entries if not _touches_queue(d.event, name)]

    def queue_auto_deleted(self, name: str) -> None:
        """Our last consumer on ``name`` was cancelled: an auto-delete queue is gone."""
        for d in self._entries:
            if _is_queue(d.event, name):
                assert isinstance(d.event, ev.QueueDeclare)
                if d.event.auto_delete:
                    self.queue_deleted(name)
                return

    def bound(self, req: ev.QueueBind) -> None:
        key = _binding_key(req)
        if not any(_binding_key(d.event) == key for d in self._entries):
            self._entries.append(Declared(req))

    def unbound(self, queue: str, exchange: str, key: str, arguments: dict[str, Any]) -> None:
        gone = ("bind", queue, exchange, key, _frozen(arguments))
        self._entries = [d for d in self._entries if _binding_key(d.event) != gone]

    def renamed(self, old: str, new: str) -> None:
        """The queue recorded as ``old`` is now called ``new``."""
        out: list[Declared] = []
        for d in self._entries:
            e = d.event
            if _touches_queue(e, old):
                assert not isinstance(e, ev.ExchangeDeclare)
                d = Declared(replace(e, queue=new), d.server_named)
            out.append(d)
        self._entries = out


def _is_exchange(e: Declaration, name: str) -> bool:
    return type(e) is ev.ExchangeDeclare and e.exchange == name


def _is_queue(e: Declaration, name: str) -> bool:
    return type(e) is ev.QueueDeclare and e.queue == name


def _touches_queue(e: Declaration, name: str) -> bool:
    return (type(e) is ev.QueueDeclare or type(e) is ev.QueueBind) and e.queue == name


def _binding_key(e: Declaration) -> tuple[Any, ...] | None:
    if type(e) is not ev.QueueBind:
        return None
    return ("bind", e.queue, e.exchange, e.key, _frozen(e.arguments))


def _frozen(arguments: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in arguments.items()))
