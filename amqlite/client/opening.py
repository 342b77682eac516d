"""Opening a client connection and owning its tasks: :func:`connect`."""

from __future__ import annotations

import dataclasses
import secrets
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from amqlite.link import DialFailed, open_link
from amqlite.tls import client_context

from .addresses import Address, parse_addresses
from .connection import Connection
from .dial import Dialed, Dialer, HelloParams, handshake_error
from .link import Disconnected, Reconnected
from .policy import ReconnectPolicy, resolve_policy


@asynccontextmanager
async def connect(
    servers: str | list[str] = "127.0.0.1:5555",
    *,
    vhost: str = "/",
    login: str = "guest",
    password: str = "guest",
    client_name: str = "",
    heartbeat: float = 5.0,
    connect_timeout: float = 5.0,
    max_in_flight: int = 1000,
    close_timeout: float = 5.0,
    reconnect: bool | ReconnectPolicy | None = None,
    on_disconnect: Callable[[Disconnected], object] | None = None,
    on_reconnect: Callable[[Reconnected], object] | None = None,
    role: str = "client",
    tls: bool = False,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[Connection]:
    """Connect to the first server of ``servers`` (``"host:port,host:port"``) that
    welcomes us; close the connection when the block exits.

    Addresses that cannot be reached, time out, or belong to a passive HA node
    (360) are skipped; when none welcomes us this raises ConnectionRefused or
    ConnectionClosed naming each address and why (the first connect is one pass
    through the list, without retries). ``heartbeat`` is the interval we ask for
    (the server's welcome decides; 0 turns heartbeats off). ``max_in_flight``
    bounds the confirms :meth:`Connection.publish_nowait` leaves outstanding. A
    publish or ack failure nothing has reported yet is raised when the block exits
    normally. ``role="monitor"`` opens a connection that may only ask for
    ``status``, which even a passive HA node accepts.

    ``reconnect`` decides what happens when the server goes away later: ``None``
    (the default) reconnects when ``servers`` names more than one address (an HA
    pair: fail over), ``True`` always (a single server that may restart), ``False``
    never (calls raise ConnectionClosed), or a :class:`ReconnectPolicy` for other
    backoff and give-up times. See :class:`Connection` for what a reconnect
    restores. ``on_disconnect`` / ``on_reconnect`` are called (synchronously, in
    the connection's task) when the link breaks and when it is back.

    TLS: ``amqlites://host:port`` entries, or ``tls=True`` for every entry, are
    dialed over TLS. The server's certificate is verified against ``ca`` (a PEM
    file; None: the system's trust store) and the host name dialed; ``cert`` (and
    ``key``, when not in the same file) is a client certificate for a server with
    ``verify = "mutual"``. ``ssl_context`` replaces all of these. A verification
    failure is a ConnectionClosed naming it (``TLS: certificate verify failed:
    certificate has expired``).
    """
    addresses = parse_addresses(servers)
    if tls:
        addresses = [dataclasses.replace(a, tls=True) for a in addresses]
    context = ssl_context
    if context is None and any(a.tls for a in addresses):
        context = client_context(ca=ca or "", cert=cert or "", key=key or "")
    policy = resolve_policy(reconnect, len(addresses))
    # A client that reconnects sends unconfirmed publishes again: the instance token
    # (the same on every link) lets the broker route each of them only once.
    instance = secrets.token_hex(8) if policy is not None else ""
    params = HelloParams(vhost, login, password, client_name, heartbeat, role, instance)
    dialer = Dialer(tuple(addresses), params, connect_timeout, context)
    dialed = await dialer.dial()
    conn = Connection(
        dialed,
        max_in_flight=max_in_flight,
        close_timeout=close_timeout,
        dialer=dialer if policy is not None else None,
        policy=policy,
        on_disconnect=on_disconnect,
        on_reconnect=on_reconnect,
    )
    async with conn.running() as running:
        yield running


@asynccontextmanager
async def connect_stream(
    stream: trio.abc.Stream,
    *,
    vhost: str = "/",
    login: str = "guest",
    password: str = "guest",
    client_name: str = "",
    heartbeat: float = 5.0,
    max_in_flight: int = 1000,
    close_timeout: float = 5.0,
    remote_address: str = "stream",
) -> AsyncIterator[Connection]:
    """Like :func:`connect` over a stream that is already open (a tunnel, an
    in-memory pair in tests). No failover and no reconnect: a refusal raises
    ConnectionRefused, a lost stream ConnectionClosed."""
    params = HelloParams(vhost, login, password, client_name, heartbeat)
    try:
        link, welcome = await open_link(stream, params.hello(), remote_address=remote_address)
    except BaseException as exc:
        await trio.aclose_forcefully(stream)
        if isinstance(exc, DialFailed):
            raise handshake_error(exc) from None
        raise
    address = Address(remote_address, 0)
    conn = Connection(
        Dialed(link, welcome, address),
        max_in_flight=max_in_flight,
        close_timeout=close_timeout,
    )
    async with conn.running() as running:
        yield running
