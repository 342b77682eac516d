"""The heartbeat two nodes of a pair send each other: "here is my state".

It travels as a plain map (CBOR on the peer link); :meth:`Heartbeat.from_map`
validates a received map and names the first problem it finds. Unknown keys are
ignored so that a newer peer may add fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import HeartbeatError
from .states import HaEvent, HaRole, HaState

_FIELDS = ("node", "role", "state", "epoch", "vhost")
_E = TypeVar("_E", HaRole, HaState)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One node's announcement: who it is, what it is configured as, what state it
    is in, the epoch it holds (its term while active) and the vhost it serves."""

    node_id: str
    role: HaRole
    state: HaState
    epoch: int
    vhost: str

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not self.node_id:
            raise HeartbeatError(f"heartbeat node id must be non-empty text, got {self.node_id!r}")
        if not isinstance(self.role, HaRole):
            raise HeartbeatError(f"heartbeat role must be an HaRole, got {self.role!r}")
        if not isinstance(self.state, HaState):
            raise HeartbeatError(f"heartbeat state must be an HaState, got {self.state!r}")
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 0:
            raise HeartbeatError(
                f"heartbeat epoch must be a non-negative integer, got {self.epoch!r}"
            )
        if not isinstance(self.vhost, str) or not self.vhost:
            raise HeartbeatError(f"heartbeat vhost must be non-empty text, got {self.vhost!r}")
        if self.state.is_starting and self.state is not self.role.starting_state:
            raise HeartbeatError(
                f"heartbeat from node {self.node_id!r} says state {self.state.value!r} "
                f"but role {self.role.value!r}: a starting node's state is its role"
            )

    @property
    def event(self) -> HaEvent:
        """The event this heartbeat fires at the node that hears it."""
        return HaEvent.for_peer(self.state)

    def to_map(self) -> dict[str, Any]:
        """Plain data for the wire: text, text, text, int, text."""
        return {
            "node": self.node_id,
            "role": self.role.value,
            "state": self.state.value,
            "epoch": self.epoch,
            "vhost": self.vhost,
        }

    @classmethod
    def from_map(cls, data: object) -> Heartbeat:
        """The heartbeat in ``data``; raises :class:`HeartbeatError` naming the
        first missing or bad field."""
        if not isinstance(data, dict):
            raise HeartbeatError(f"a heartbeat must be a map, got {type(data).__name__}")
        missing = [name for name in _FIELDS if name not in data]
        if missing:
            raise HeartbeatError(f"heartbeat is missing field(s): {', '.join(missing)}")
        return cls(
            node_id=_text(data, "node"),
            role=_enum(HaRole, data, "role"),
            state=_enum(HaState, data, "state"),
            epoch=data["epoch"],
            vhost=_text(data, "vhost"),
        )


def _text(data: dict[Any, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str):
        raise HeartbeatError(f"heartbeat field {name!r} must be text, got {value!r}")
    return value


def _enum(kind: type[_E], data: dict[Any, Any], name: str) -> _E:
    value = data[name]
    try:
        return kind(value)
    except (ValueError, TypeError):
        choices = ", ".join(repr(member.value) for member in kind)
        raise HeartbeatError(
            f"heartbeat field {name!r} must be one of {choices}, got {value!r}"
        ) from None
