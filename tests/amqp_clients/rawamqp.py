"""A raw AMQP client over a blocking socket, for what real clients never send:
our sans-IO core plays the client and the test writes any bytes it likes."""

from __future__ import annotations

import socket
import time

from amqlite.amqp import NEED_DATA, AmqpConnection, Event, Method, MethodReceived, Role
from amqlite.amqp import methods as m

from .conftest import WAIT


class RawAmqp:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.proto = AmqpConnection(Role.CLIENT)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive_raw(self) -> bytes:
        """Everything until the server closes (bounded by WAIT)."""
        got = b""
        deadline = time.monotonic() + WAIT
        while chunk := self.sock.recv(65536):
            got += chunk
            assert time.monotonic() < deadline
        return got

    def next_event(self) -> Event:
        while (event := self.proto.next_event()) is NEED_DATA:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the server closed the connection")
            self.proto.receive_data(data)
        assert not isinstance(event, type(NEED_DATA))
        return event

    def next_method(self) -> Method:
        event = self.next_event()
        assert isinstance(event, MethodReceived), event
        return event.method

    def handshake(self, *, heartbeat: int = 0) -> None:
        self.send(self.proto.send_protocol_header())
        start = self.next_method()
        assert isinstance(start, m.ConnectionStart)
        ok = m.ConnectionStartOk({"product": "raw"}, "PLAIN", b"\0guest\0guest", "en_US")
        self.send(self.proto.send_method(0, ok))
        tune = self.next_method()
        assert isinstance(tune, m.ConnectionTune)
        self.send(self.proto.send_method(0, m.ConnectionTuneOk(0, tune.frame_max, heartbeat)))
        self.send(self.proto.send_method(0, m.ConnectionOpen("/")))
        assert isinstance(self.next_method(), m.ConnectionOpenOk)

    def open_channel(self, number: int) -> None:
        self.send(self.proto.send_method(number, m.ChannelOpen()))
        assert isinstance(self.next_method(), m.ChannelOpenOk)

    def request(self, channel: int, method: Method) -> Event:
        self.send(self.proto.send_method(channel, method))
        return self.next_event()

    def close(self) -> None:
        self.sock.close()
