"""amqlite.link over real loopback TCP, where it reads and writes the socket directly
(its plain-TCP path, see ``WireLink._plain_fd``): every byte arrives once, in order,
both ways, also when a write is partial (more than the socket buffers take) and a
read fills ``RECEIVE_SIZE``; the end of the stream and a reset are reported as
the trio path reports them; a TLS stream never takes that path."""

from __future__ import annotations

import socket
import ssl
import struct

import trio
import trio.lowlevel
import trio.testing

from amqlite.link import RECEIVE_SIZE, WireLink

from .waiting import wait_until


class Recorder:
    """A :class:`~amqlite.link.WireProtocol` that keeps every byte it is fed."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.feeds = 0

    def receive_data(self, data: bytes | bytearray) -> None:
        self.data += data
        self.feeds += 1

    def send_heartbeat(self) -> bytes:
        return b""


async def _tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted: list[trio.SocketStream] = []

        async def accept() -> None:
            accepted.append(await listeners[0].accept())

        nursery.start_soon(accept)
        ours = await trio.open_tcp_stream("127.0.0.1", port)
    await listeners[0].aclose()
    return ours, accepted[0]


def _payload(n: int) -> bytes:
    """``n`` bytes that differ at every offset (a lost, doubled or swapped chunk shows)."""
    return b"".join(struct.pack(">I", i) for i in range((n + 3) // 4))[:n]


async def _read_all(stream: trio.SocketStream) -> bytes:
    got = bytearray()
    while chunk := await stream.receive_some(65536):
        got += chunk
    return bytes(got)


async def test_writes_larger_than_the_socket_buffers_arrive_whole_and_in_order() -> None:
    ours, theirs = await _tcp_pair()
    link = WireLink(ours, Recorder())
    assert link._plain_fd() >= 0  # the path under test
    chunks = [_payload(3 * RECEIVE_SIZE), b"tail", _payload(5000)]
    received: list[bytes] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:

            async def peer() -> None:
                received.append(await _read_all(theirs))

            nursery.start_soon(peer)

            async def reader() -> None:
                for chunk in chunks:  # more than one write, some partial
                    link.out += chunk
                    link.kick()
                    await trio.lowlevel.checkpoint()
                await link.wait_flushed()

            await link.run(reader)
    assert received == [b"".join(chunks)]
    assert link.error is None


async def test_reads_take_everything_sent_then_the_end_of_the_stream() -> None:
    ours, theirs = await _tcp_pair()
    recorder = Recorder()
    link = WireLink(ours, recorder)
    sent = _payload(4 * RECEIVE_SIZE + 123)
    ends: list[bool] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:

            async def peer() -> None:
                await theirs.send_all(sent[:100])
                # the reader takes a short read, then waits for more
                await wait_until(lambda: len(recorder.data) == 100, "the first read")
                await theirs.send_all(sent[100:])
                await theirs.aclose()

            nursery.start_soon(peer)

            async def reader() -> None:
                while await link.receive():
                    pass
                ends.append(True)

            await link.run(reader)
    assert bytes(recorder.data) == sent
    assert ends == [True] and link.error is None


async def test_a_reset_fails_the_link_with_the_reason() -> None:
    ours, theirs = await _tcp_pair()
    recorder = Recorder()
    link = WireLink(ours, recorder, remote_address="peer")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:

            async def peer() -> None:
                await theirs.send_all(b"x")
                linger = struct.pack("ii", 1, 0)  # close with a reset, not a FIN
                theirs.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                await wait_until(lambda: recorder.data == b"x", "the byte before the reset")
                await theirs.aclose()

            nursery.start_soon(peer)

            async def reader() -> None:
                while await link.receive():
                    pass

            await link.run(reader)
    assert link.error is not None
    assert link.error.text == "connection to peer lost (connection reset by peer)"


async def test_other_streams_take_the_trio_path() -> None:
    memory, _ = trio.testing.memory_stream_pair()
    assert WireLink(memory, Recorder())._plain_fd() == -1
    tcp, other = await _tcp_pair()
    wrapped = trio.SSLStream(tcp, ssl.create_default_context())
    assert WireLink(wrapped, Recorder())._plain_fd() == -1
    await tcp.aclose()
    await other.aclose()
