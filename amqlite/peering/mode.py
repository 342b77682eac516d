"""Peering modes (with their OpenAMQ ``cluster_mta`` numbers) and overflow policies.

Both are parsed once, from TOML or the command line, with an error naming the key.
"""

from __future__ import annotations

from enum import Enum

from amqlite.errors import ConfigError


class PeeringMode(Enum):
    """How a link moves messages; the values are OpenAMQ's ``mode`` numbers."""

    SUBSCRIBE = 1  # local bindings are mirrored remotely; remote messages flow here
    PUBLISH = 2  # every local publish goes to the remote exchange too (where it is wanted)
    FORWARD = 3  # a local publish goes remotely only when no local queue took it

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def dialer_sends(self) -> bool:
        """True when messages flow from the dialing end to the accepting end."""
        return self is not PeeringMode.SUBSCRIBE


_MODES = {
    **{str(m.value): m for m in PeeringMode},
    **{m.label: m for m in PeeringMode},
}


def parse_mode(value: object, key: str = "mode") -> PeeringMode:
    """``1``/``"1"``/``"subscribe"``, ``2``/``"publish"``, ``3``/``"forward"``
    (case and surrounding blanks ignored); anything else raises
    :class:`~amqlite.errors.ConfigError` naming ``key``."""
    if isinstance(value, PeeringMode):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    elif isinstance(value, str):
        text = value.strip().lower()
    else:
        text = None
    mode = _MODES.get(text) if text is not None else None
    if mode is None:
        raise ConfigError(
            key,
            f"expected 1 or 'subscribe', 2 or 'publish', 3 or 'forward', got {value!r}",
        )
    return mode


class OverflowPolicy(Enum):
    """What a link does when what waits to be sent would pass ``buffer_bytes``."""

    BLOCK = "block"  # refuse the message: the shell applies back-pressure
    SPILL = "spill"  # hand the overflow to the spill store (on disk, in the shell)
    DROP_OLDEST = "drop-oldest"  # drop the oldest unacknowledged messages, and count them


def parse_overflow(value: object, key: str = "overflow") -> OverflowPolicy:
    """``"block"``, ``"spill"`` or ``"drop-oldest"`` (``drop_oldest`` too)."""
    if isinstance(value, OverflowPolicy):
        return value
    if isinstance(value, str):
        text = value.strip().lower().replace("_", "-")
        for policy in OverflowPolicy:
            if policy.value == text:
                return policy
    raise ConfigError(key, f"expected 'block', 'spill' or 'drop-oldest', got {value!r}")
