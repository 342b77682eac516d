"""The remote's address list (``primary:port,backup:port``) and the link's place in it.

A link tries the addresses in order and moves to the next one on every failure, so
a remote HA pair that failed over is found on its backup, and the primary again
when the pair fails back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from amqlite.errors import ConfigError


class Address(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str, key: str = "host") -> Address:
    """``host:port`` or ``[v6]:port``; a missing or bad port raises ConfigError."""
    item = text.strip()
    if item.startswith("["):
        host, sep, rest = item[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigError(key, f"expected '[host]:port', got {text!r}")
        port_text = rest[1:]
    else:
        host, sep, port_text = item.rpartition(":")
        if not sep or ":" in host:
            raise ConfigError(key, f"expected 'host:port', got {text!r}")
    if not host:
        raise ConfigError(key, f"missing host in {text!r}")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(key, f"port must be 1-65535, got {port_text!r} in {text!r}")
    return Address(host, int(port_text))


def parse_addresses(value: str | Iterable[str], key: str = "host") -> tuple[Address, ...]:
    """``"primary:5555,backup:6666"`` (or a list of such strings) -> addresses in order."""
    items = value.split(",") if isinstance(value, str) else list(value)
    addresses = tuple(parse_address(item, key) for item in items if item.strip())
    if not addresses:
        raise ConfigError(key, "expected at least one 'host:port'")
    return addresses


class AddressRing:
    """Where the next connection attempt goes."""

    __slots__ = ("_addresses", "_index")

    def __init__(self, addresses: Iterable[Address]) -> None:
        self._addresses = tuple(addresses)
        if not self._addresses:
            raise ValueError("a dialing link needs at least one address")
        self._index = 0

    @property
    def current(self) -> Address:
        return self._addresses[self._index]

    def advance(self) -> Address:
        """Move to the next address (wrapping round) and return it."""
        self._index = (self._index + 1) % len(self._addresses)
        return self.current

    def __len__(self) -> int:
        return len(self._addresses)
