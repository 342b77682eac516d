"""Server lists: ``"host:port,host:port"``, tried in order.

IPv6 hosts go in brackets (``[::1]:5555``); a missing port means 5555. An entry
written ``amqlites://host:port`` is dialed over TLS (``amqlite://`` is plain).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORT = 5555
TLS_SCHEME = "amqlites://"
PLAIN_SCHEME = "amqlite://"


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    #: dial over TLS (written ``amqlites://host:port``)
    tls: bool = False

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(text: str) -> Address:
    """``"host:port"`` -> :class:`Address`; raises ValueError naming the bad part."""
    item = text.strip()
    tls = item.lower().startswith(TLS_SCHEME)
    if tls:
        item = item[len(TLS_SCHEME) :]
    elif item.lower().startswith(PLAIN_SCHEME):
        item = item[len(PLAIN_SCHEME) :]
    elif "://" in item:
        raise ValueError(f"bad server address {text!r}: the scheme is amqlite:// or amqlites://")
    item = item.rstrip("/")
    if not item:
        raise ValueError("empty server address")
    if item.startswith("["):
        host, sep, rest = item[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad server address {text!r} (IPv6 is written [host]:port)")
        port_text = rest[1:]
    elif item.count(":") == 1:
        host, _, port_text = item.partition(":")
    elif ":" in item:
        raise ValueError(f"bad server address {text!r} (IPv6 is written [host]:port)")
    else:
        host, port_text = item, ""
    if not host:
        raise ValueError(f"bad server address {text!r}: no host")
    if not port_text:
        return Address(host, DEFAULT_PORT, tls)
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad server address {text!r}: port must be a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad server address {text!r}: port out of range")
    return Address(host, port, tls)


def parse_addresses(servers: str | list[str] | tuple[str, ...]) -> list[Address]:
    """A comma-separated server list (or a list of entries) in the order given."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [parse_address(item) for item in items if item.strip()]
    if not out:
        raise ValueError("no server address given")
    return out
