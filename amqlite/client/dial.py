"""Opening a connection: try each server address in order, say hello, get welcomed.

An address is skipped when it cannot be reached, does not answer in time, or
refuses with 360 NOT_ACTIVE (a passive HA node). Any other refusal (bad login,
unknown vhost) is final: another address would say the same.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from amqlite.errors import AmqliteError, ConnectionClosed, ConnectionRefused, ReplyCode, code_name
from amqlite.link import DialFailed, FramedLink
from amqlite.link import dial as dial_link
from amqlite.protocol import events as ev

from .addresses import Address

HELLO_ID = 1

#: How a TCP stream to ``(host, port)`` is opened; tests put in-memory brokers here.
open_stream: Callable[[str, int], Awaitable[trio.abc.Stream]] = trio.open_tcp_stream


@dataclass(frozen=True, slots=True)
class HelloParams:
    """What we say in ``hello``."""

    vhost: str = "/"
    login: str = "guest"
    password: str = field(default="guest", repr=False)
    client_name: str = ""
    heartbeat: float = 0.0
    role: str = "client"
    #: kept across reconnects so the broker recognises publishes sent again
    instance: str = ""

    def hello(self) -> ev.Hello:
        return ev.Hello(
            id=HELLO_ID,
            vhost=self.vhost,
            login=self.login,
            password=self.password,
            client=self.client_name,
            heartbeat=float(self.heartbeat),
            role=self.role,
            instance=self.instance,
        )


@dataclass(slots=True)
class Dialed:
    """A link past the handshake; its protocol connection may hold bytes that
    followed the welcome."""

    link: FramedLink
    welcome: ev.Welcome
    address: Address


class _Skip(Exception):
    """This address failed in a way that sends us to the next one."""

    def __init__(self, reason: str, refused_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.refused_code = refused_code


def handshake_error(exc: DialFailed) -> AmqliteError:
    """What the application sees of a failed handshake: ConnectionRefused for a
    refusal, ConnectionClosed for the rest."""
    if exc.refused:
        return ConnectionRefused(exc.text, exc.code)
    return ConnectionClosed(exc.text, exc.code)


async def _try_address(
    address: Address, limit_s: float, params: HelloParams, tls: ssl.SSLContext | None
) -> Dialed:
    try:
        link, welcome = await dial_link(
            address.host,
            address.port,
            params.hello(),
            timeout=limit_s,
            open_stream=open_stream,
            ssl_context=tls if address.tls else None,
        )
    except DialFailed as exc:
        if not exc.refused:
            raise _Skip(exc.text) from None
        if exc.code == ReplyCode.NOT_ACTIVE:
            raise _Skip(f"passive HA node: {exc.text}", exc.code) from None
        raise ConnectionRefused(exc.text, exc.code) from None
    return Dialed(link, welcome, address)


async def dial(
    addresses: list[Address],
    params: HelloParams,
    connect_timeout: float,
    tls: ssl.SSLContext | None = None,
) -> Dialed:
    """The first address that welcomes us. When none does, raises ConnectionRefused
    (some server refused) or ConnectionClosed (none reachable), naming every address
    and why it failed (a TLS failure names its reason: ``TLS: certificate verify
    failed: ...``). Addresses with ``tls`` are dialed with the ``tls`` context."""
    failures: list[tuple[Address, _Skip]] = []
    timeout = connect_timeout if connect_timeout and connect_timeout > 0 else math.inf
    for address in addresses:
        try:
            return await _try_address(address, timeout, params, tls)
        except _Skip as skip:
            failures.append((address, skip))
        except ConnectionRefused as exc:
            text = f"{address} refused the connection: {exc.code} {code_name(exc.code)}: {exc.text}"
            raise ConnectionRefused(text, exc.code) from None
    text = "cannot connect to " + ", ".join(f"{a} ({s.reason})" for a, s in failures)
    refused = [s.refused_code for _, s in failures if s.refused_code is not None]
    err: AmqliteError = ConnectionRefused(text, refused[0]) if refused else ConnectionClosed(text)
    raise err


@dataclass(frozen=True, slots=True)
class Dialer:
    """Everything needed to dial again: the server list (in order), ``hello`` and
    the per-address limit, the TLS context for the addresses that use TLS."""

    addresses: tuple[Address, ...]
    params: HelloParams
    connect_timeout: float
    tls: ssl.SSLContext | None = None

    async def dial(self) -> Dialed:
        return await dial(list(self.addresses), self.params, self.connect_timeout, self.tls)
