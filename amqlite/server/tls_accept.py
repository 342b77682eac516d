"""The server's side of TLS on a listener with ``tls = true`` (docs/tls.md).

:func:`accept_tls` turns an accepted TCP stream into a :class:`trio.SSLStream`
past its handshake, or closes it with one log line saying why: the first bytes
are not a TLS ClientHello (a plain-text client on a TLS port: ``tls_expected``),
the handshake failed (``tls_handshake_failed`` with the reason: no client
certificate, no common version...) or did not finish within the bound
(``tls_handshake_timeout``). Each connection does this in its own task, so a slow
or wrong client costs only its own socket.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable

import structlog
import trio

from amqlite.tls import TLS_HANDSHAKE_BYTE, describe_tls_error

#: How long a client may take from connect to the end of the TLS handshake.
TLS_HANDSHAKE_TIMEOUT = 10.0
#: Bytes read to tell a ClientHello from plain text.
_PEEK_SIZE = 4096

log = structlog.get_logger("amqlite.server")

#: Given what a plain-text client sent on a TLS port, the plain bytes to answer
#: before closing (the native listener sends a ``refused``), or b"".
PlainReply = Callable[[bytes], bytes]


class _Prefixed(trio.abc.Stream):
    """A stream whose first read returns bytes already read from it (the peeked
    ClientHello), so the TLS layer sees the stream from its first byte."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self.stream = stream
        self._prefix = prefix

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            return data
        return await self.stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def accept_tls(
    stream: trio.abc.Stream,
    context: ssl.SSLContext,
    *,
    remote: str,
    listener: str,
    plain_reply: PlainReply | None = None,
    timeout: float = TLS_HANDSHAKE_TIMEOUT,  # noqa: ASYNC109 (a timeout is logged and closes)
) -> trio.SSLStream[trio.abc.Stream] | None:
    """``stream`` past a server-side TLS handshake, or None (logged; the socket is
    closed). ``listener`` (``native``, ``amqp``) names the port in the log lines."""
    with trio.move_on_after(timeout):
        try:
            first = await stream.receive_some(_PEEK_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            first = b""
        if not first:
            await trio.aclose_forcefully(stream)
            return None
        if first[0] != TLS_HANDSHAKE_BYTE:
            log.warning(
                "tls_expected",
                remote=remote,
                listener=listener,
                reason="the client does not speak TLS on this TLS port",
            )
            reply = plain_reply(bytes(first)) if plain_reply is not None else b""
            if reply:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(reply)
            await trio.aclose_forcefully(stream)
            return None
        prefixed: trio.abc.Stream = _Prefixed(stream, bytes(first))
        tls_stream = trio.SSLStream(prefixed, context, server_side=True)
        try:
            await tls_stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.warning(
                "tls_handshake_failed",
                remote=remote,
                listener=listener,
                reason=describe_tls_error(exc),
            )
            await trio.aclose_forcefully(tls_stream)
            return None
        return tls_stream
    log.warning("tls_handshake_timeout", remote=remote, listener=listener, timeout_s=timeout)
    await trio.aclose_forcefully(stream)
    return None
