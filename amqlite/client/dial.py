"""Opening a connection: try each server address in order, say hello, get welcomed.

An address is skipped when it cannot be reached, does not answer in time, or
refuses with 360 NOT_ACTIVE (a passive HA node). Any other refusal (bad login,
unknown vhost) is final: another address would say the same.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from amqlite.errors import (
    AmqliteError,
    ConnectionClosed,
    ConnectionRefused,
    ProtocolError,
    ReplyCode,
    code_name,
)
from amqlite.protocol import NEED_DATA, Connection, Role
from amqlite.protocol import events as ev

from .addresses import Address

HELLO_ID = 1
_RECEIVE_SIZE = 256 * 1024

#: How a TCP stream to ``(host, port)`` is opened; tests put in-memory brokers here.
open_stream: Callable[[str, int], Awaitable[trio.abc.Stream]] = trio.open_tcp_stream


@dataclass(frozen=True, slots=True)
class HelloParams:
    """What we say in ``hello``."""

    vhost: str = "/"
    login: str = "guest"
    password: str = "guest"
    client_name: str = ""
    heartbeat: float = 0.0
    role: str = "client"
    #: kept across reconnects so the broker recognises publishes sent again
    instance: str = ""


@dataclass(slots=True)
class Dialed:
    """A stream past the handshake; ``proto`` may hold bytes that followed the welcome."""

    stream: trio.abc.Stream
    proto: Connection
    welcome: ev.Welcome
    address: Address


class _Skip(Exception):
    """This address failed in a way that sends us to the next one."""

    def __init__(self, reason: str, refused_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.refused_code = refused_code


def describe_os_error(exc: BaseException) -> str:
    """A short reason for a failed TCP connect: ``connection refused``, ``unknown host``..."""
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    causes: list[BaseException] = [exc]
    group = exc.__cause__
    if isinstance(group, BaseExceptionGroup):
        causes = list(group.exceptions)
    for c in causes:
        if isinstance(c, ConnectionRefusedError):
            return "connection refused"
        if isinstance(c, TimeoutError):
            return "timed out"
    for c in causes:
        if isinstance(c, OSError) and c.strerror:
            return c.strerror.lower()
    return str(exc) or type(exc).__name__


async def handshake(stream: trio.abc.Stream, params: HelloParams) -> tuple[Connection, ev.Welcome]:
    """Send ``hello`` and read up to ``welcome``; raises ConnectionRefused on ``refused``."""
    proto = Connection(Role.CLIENT)
    hello = ev.Hello(
        id=HELLO_ID,
        vhost=params.vhost,
        login=params.login,
        password=params.password,
        client=params.client_name,
        heartbeat=float(params.heartbeat),
        role=params.role,
        instance=params.instance,
    )
    await stream.send_all(proto.send(hello))
    while True:
        event = proto.next_event()
        if event is NEED_DATA:
            data = await stream.receive_some(_RECEIVE_SIZE)
            proto.receive_data(data)  # type: ignore[arg-type]  # bytearray works too
            continue
        t = type(event)
        if t is ev.Welcome:
            assert isinstance(event, ev.Welcome)
            return proto, event
        if t is ev.Refused:
            assert isinstance(event, ev.Refused)
            raise ConnectionRefused(event.text or "refused", event.code)
        if t is ev.Close:
            assert isinstance(event, ev.Close)
            raise ConnectionClosed(f"closed during the handshake: {event.text}", event.code)
        if t is ev.EndOfStream:
            raise ConnectionClosed("the server closed the connection during the handshake")
        # heartbeats before the welcome are fine; anything else was rejected by proto


async def _try_address(address: Address, limit_s: float, params: HelloParams) -> Dialed:
    with trio.move_on_after(limit_s) as scope:
        try:
            stream: trio.abc.Stream = await open_stream(address.host, address.port)
        except OSError as exc:
            raise _Skip(describe_os_error(exc)) from None
        try:
            proto, welcome = await handshake(stream, params)
        except ConnectionRefused as exc:
            await trio.aclose_forcefully(stream)
            if exc.code == ReplyCode.NOT_ACTIVE:
                raise _Skip(f"passive HA node: {exc.text}", exc.code) from None
            raise
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await trio.aclose_forcefully(stream)
            raise _Skip(describe_os_error(exc)) from None
        except (ConnectionClosed, ProtocolError) as exc:
            await trio.aclose_forcefully(stream)
            raise _Skip(exc.text) from None
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return Dialed(stream, proto, welcome, address)
    assert scope.cancelled_caught
    raise _Skip(f"no answer within {limit_s:g}s")


async def dial(addresses: list[Address], params: HelloParams, connect_timeout: float) -> Dialed:
    """The first address that welcomes us. When none does, raises ConnectionRefused
    (some server refused) or ConnectionClosed (none reachable), naming every address
    and why it failed."""
    failures: list[tuple[Address, _Skip]] = []
    timeout = connect_timeout if connect_timeout and connect_timeout > 0 else math.inf
    for address in addresses:
        try:
            return await _try_address(address, timeout, params)
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
    the per-address limit."""

    addresses: tuple[Address, ...]
    params: HelloParams
    connect_timeout: float

    async def dial(self) -> Dialed:
        return await dial(list(self.addresses), self.params, self.connect_timeout)
