"""Whether one published message goes out on one link: a pure decision.

Checked cheapest first; the first rule that holds wins:

1. the end does not send (a ``subscribe`` dialer, or the acceptor of a
   ``publish``/``forward`` link, only receives)       -> RECEIVES_ONLY
2. the remote broker is already on the message's path -> REMOTE_ON_PATH (loop avoided)
3. one more hop would pass ``max_hops``               -> HOPS_EXHAUSTED
4. ``forward`` mode and a local queue took the message -> DELIVERED_LOCALLY
5. the remote exchange would route it nowhere          -> NO_INTEREST
6. otherwise                                           -> SEND
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Protocol

from .mode import PeeringMode


class Decision(Enum):
    SEND = "send"
    RECEIVES_ONLY = "receives-only"
    REMOTE_ON_PATH = "remote-on-path"
    HOPS_EXHAUSTED = "hops-exhausted"
    DELIVERED_LOCALLY = "delivered-locally"
    NO_INTEREST = "no-interest"


class _Interest(Protocol):
    def matches(self, routing_key: str, headers: Mapping[str, Any]) -> bool: ...


def decide(
    *,
    sends: bool,
    mode: PeeringMode,
    routed_locally: bool,
    remote_node: str | None,
    path: tuple[str, ...],
    hops: int,
    max_hops: int,
    interest: _Interest,
    routing_key: str,
    headers: Mapping[str, Any],
) -> Decision:
    """Should this end send the message? ``remote_node`` is None until the remote's
    hello has been seen (the receiver's own loop check still applies then)."""
    if not sends:
        return Decision.RECEIVES_ONLY
    if remote_node is not None and remote_node in path:
        return Decision.REMOTE_ON_PATH
    if hops + 1 > max_hops:
        return Decision.HOPS_EXHAUSTED
    if mode is PeeringMode.FORWARD and routed_locally:
        return Decision.DELIVERED_LOCALLY
    if not interest.matches(routing_key, headers):
        return Decision.NO_INTEREST
    return Decision.SEND
