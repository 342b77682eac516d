"""The AMQP 0-9-1 bench clients, for RabbitMQ and for amqlite's AMQP listener
(``amqlite-amqp``) alike: pika's asynchronous ``SelectConnection``, its fastest
Python path, with every connection of a run on one shared I/O loop (one thread),
as amqlite's bench clients share one trio loop.

The run mirrors :class:`amqlite_bench.systems.AmqliteTarget`: one connection for
the publisher (it also declares and deletes), one per consumer; one queue per
consumer (the default exchange for one, a fanout exchange for more); manual acks,
``basic_qos(prefetch_count=1000)``. Acks are coalesced the way amqlite's client
does it: one ``basic_ack(multiple=True)`` for the last tag of each batch of
deliveries the loop hands over. The publisher writes in batches of
:data:`~amqlite_bench.plan.BATCH` and waits while more than
:data:`HIGH_WATER` bytes are unsent; paced runs send what is due once per
:data:`~amqlite_bench.plan.TICK`; confirmed runs keep at most ``plan.confirm``
publishes unconfirmed (``confirm_delivery``).

pika is imported when a run starts (a dependency of the harness:
``pip install -e benchmarks/``).
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from itertools import count
from typing import Any

from .errors import BenchError
from .plan import BATCH, STAMP_HEADER, TICK, ClientReport, new_histogram
from .procstat import own_cpu_seconds
from .scenarios import Scenario

#: Unsent bytes on the publisher's connection above which it waits for the socket.
HIGH_WATER = 1 << 20
PREFETCH = 1000
PROGRESS_INTERVAL = 0.25

_run_ids = count(1)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


class _Consumer:
    __slots__ = (
        "ack_pending", "acked", "channel", "connection", "done_ns", "expected", "hist", "last", "n",
    )  # fmt: skip

    def __init__(self, expected: int, stamped: bool) -> None:
        self.expected = expected
        self.hist = new_histogram() if stamped else None
        self.n = 0
        self.last = 0
        self.acked = 0
        self.done_ns = 0
        self.ack_pending = False
        self.channel: Any = None
        self.connection: Any = None


class _PikaRun:
    """One run's connections and counters, driven by pika callbacks on one loop."""

    def __init__(
        self,
        pika: Any,
        address: str,
        auth: dict[str, str],
        scenario: Scenario,
        emit: Any,
        system: str = "rabbitmq",
    ) -> None:
        self.pika = pika
        self.system = system
        self.ioloop = importlib.import_module("pika.adapters.select_connection").IOLoop()
        self.host, self.port = _split(address)
        self.auth = auth
        self.scenario = scenario
        self.plan = scenario.plan
        self.emit = emit
        base = f"bench.{scenario.name}.{os.getpid()}.{next(_run_ids)}"
        self.queues = [f"{base}.q{i}" for i in range(scenario.queues)]
        self.exchange = f"{base}.fanout" if scenario.queues > 1 else ""
        self.key = "" if self.exchange else self.queues[0]
        self.consumers = [_Consumer(self.plan.messages, self.plan.stamp) for _ in self.queues]
        self.connections: list[Any] = []
        self.pub_conn: Any = None
        self.pub: Any = None
        self.body = b"x" * self.plan.body_size
        self.props = pika.BasicProperties(delivery_mode=2) if self.plan.persistent else None
        self.published = 0
        self.confirmed_upto = 0
        self.confirmed_singles: set[int] = set()
        self.first_ns = 0
        self.last_ns = 0
        self.start_time = 0.0
        self.cpu0 = 0.0
        self.cpu1 = 0.0
        self.ready = 0
        self.finished = False
        self.closing = False
        self.error: str | None = None

    # --- plumbing ----------------------------------------------------------------

    def run(self) -> ClientReport:
        self._open("bench-publisher", self._on_publisher_channel)
        self.ioloop.call_later(PROGRESS_INTERVAL, self._progress)
        self.ioloop.start()
        if self.error is not None:
            raise BenchError(f"{self.system} {self.scenario.name}: {self.error}")
        hist = None
        if self.plan.stamp:
            hist = new_histogram()
            for c in self.consumers:
                assert c.hist is not None
                hist.add(c.hist)
        return ClientReport(
            published=self.published,
            consumed=sum(c.n for c in self.consumers),
            first_ns=self.first_ns,
            last_ns=self.last_ns,
            done_ns=max(c.done_ns for c in self.consumers),
            client_cpu_s=self.cpu1 - self.cpu0,
            hist=hist,
        )

    def _open(self, name: str, on_channel: Callable[[Any], None]) -> Any:
        pika, auth = self.pika, self.auth
        params = pika.ConnectionParameters(
            host=self.host,
            port=self.port,
            virtual_host=auth.get("vhost", "/"),
            credentials=pika.PlainCredentials(
                auth.get("login", "guest"), auth.get("password", "guest")
            ),
            connection_attempts=1,
            client_properties={"connection_name": name},
        )

        def opened(conn: Any) -> None:
            conn.channel(on_open_callback=self._guard(on_channel))

        conn = self.pika.SelectConnection(
            parameters=params,
            on_open_callback=self._guard(opened),
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
            custom_ioloop=self.ioloop,
        )
        self.connections.append(conn)
        return conn

    def _guard(self, fn: Callable[..., None]) -> Callable[..., None]:
        """Callbacks that raise end the run with the error instead of vanishing."""

        def call(*args: Any) -> None:
            try:
                fn(*args)
            except Exception as exc:
                self._fail(f"{type(exc).__name__}: {exc}")

        return call

    def _fail(self, why: str) -> None:
        if self.error is None:
            self.error = why
        self._shutdown()

    def _on_open_error(self, conn: Any, err: Any) -> None:
        self._fail(f"cannot connect to {self.host}:{self.port}: {err!r}")

    def _on_closed(self, conn: Any, reason: Any) -> None:
        if conn in self.connections:
            self.connections.remove(conn)
        if not self.closing and not self.finished:
            self._fail(f"the broker closed a connection: {reason!r}")
        elif not any(c.is_open or c.is_closing for c in self.connections):
            self.ioloop.stop()

    def _on_channel_closed(self, channel: Any, reason: Any) -> None:
        if not self.closing and not self.finished:
            self._fail(f"the broker closed a channel: {reason!r}")

    def _shutdown(self) -> None:
        self.closing = True
        open_ = [c for c in self.connections if c.is_open]
        for c in open_:
            c.close()
        if not any(c.is_open or c.is_closing for c in self.connections):
            self.ioloop.stop()

    def _progress(self) -> None:
        if self.finished or self.closing:
            return
        self.emit.progress(self.published, sum(c.n for c in self.consumers))
        self.ioloop.call_later(PROGRESS_INTERVAL, self._guard(self._progress))

    # --- set-up: publisher channel, declarations, consumers --------------------------

    def _on_publisher_channel(self, channel: Any) -> None:
        self.pub = channel
        self.pub_conn = channel.connection
        channel.add_on_close_callback(self._on_channel_closed)
        if self.plan.confirm:
            channel.confirm_delivery(self._guard(self._on_confirm), callback=self._declare)
        else:
            self._declare(None)

    def _declare(self, _frame: Any) -> None:
        # pika runs a channel's RPCs one after another: the last one's reply comes last
        ch = self.pub
        durable = self.plan.persistent
        done = self._guard(self._open_consumers)
        for i, name in enumerate(self.queues):
            last = i == len(self.queues) - 1 and not self.exchange
            ch.queue_declare(name, durable=durable, callback=done if last else None)
        if self.exchange:
            ch.exchange_declare(self.exchange, exchange_type="fanout", durable=durable)
            for i, name in enumerate(self.queues):
                last = i == len(self.queues) - 1
                ch.queue_bind(name, self.exchange, routing_key="", callback=done if last else None)

    def _open_consumers(self, _frame: Any) -> None:
        for i in range(len(self.queues)):
            self._open(f"bench-consumer-{i}", self._consumer_channel(i))

    def _consumer_channel(self, i: int) -> Callable[[Any], None]:
        c = self.consumers[i]

        def on_channel(channel: Any) -> None:
            c.channel = channel
            c.connection = channel.connection
            channel.add_on_close_callback(self._on_channel_closed)
            channel.basic_qos(prefetch_count=PREFETCH)
            channel.basic_consume(
                self.queues[i],
                self._on_message(c),
                auto_ack=False,
                callback=self._guard(self._consumer_ready),
            )

        return on_channel

    def _consumer_ready(self, _frame: Any) -> None:
        self.ready += 1
        if self.ready == len(self.consumers):
            self.emit.started()
            self.cpu0 = own_cpu_seconds()
            self.first_ns = time.perf_counter_ns()
            self.start_time = time.monotonic()
            if self.plan.rate is None:
                self._pump()
            else:
                self._tick()

    # --- consuming --------------------------------------------------------------------

    def _on_message(self, c: _Consumer) -> Callable[..., None]:
        hist = c.hist
        clock = time.perf_counter_ns
        call_later = self.ioloop.call_later

        def flush() -> None:
            c.ack_pending = False
            if c.last > c.acked and c.channel.is_open:
                c.acked = c.last
                c.channel.basic_ack(c.last, multiple=True)

        def on_message(channel: Any, method: Any, props: Any, body: bytes) -> None:
            c.n += 1
            c.last = method.delivery_tag
            if hist is not None:
                hist.record_value(max(1, (clock() - int(props.headers[STAMP_HEADER])) // 1000))
            if c.n >= c.expected:
                c.done_ns = clock()
                flush()
                self._maybe_finished()
            elif not c.ack_pending:
                c.ack_pending = True
                call_later(0, flush)  # after this read's deliveries: one ack for all

        return on_message

    # --- publishing -----------------------------------------------------------------

    def _send(self, k: int) -> None:
        publish = self.pub.basic_publish
        exchange, key, body = self.exchange, self.key, self.body
        if self.plan.stamp:
            props_for = self.pika.BasicProperties
            clock = time.perf_counter_ns
            for _ in range(k):
                publish(exchange, key, body, props_for(headers={STAMP_HEADER: clock()}))
        else:
            props = self.props
            for _ in range(k):
                publish(exchange, key, body, props)
        self.published += k
        if self.published >= self.plan.messages and not self.plan.confirm:
            self.last_ns = time.perf_counter_ns()

    def _pump(self) -> None:
        """Publish as fast as the socket (and the confirm window) allow."""
        if self.closing:
            return
        total = self.plan.messages
        k = min(BATCH, total - self.published)
        if self.plan.confirm:
            k = min(k, self.plan.confirm - (self.published - self._confirmed()))
        if k > 0:
            self._send(k)
        if self.published >= total or (self.plan.confirm and k <= 0):
            return  # done, or the next confirm calls _pump again
        if self.pub_conn._get_write_buffer_size() > HIGH_WATER:
            self.ioloop.call_later(0.0005, self._guard(self._pump))
        else:
            self.ioloop.call_later(0, self._guard(self._pump))

    def _tick(self) -> None:
        if self.closing:
            return
        rate = self.plan.rate
        assert rate is not None
        total = self.plan.messages
        now = time.monotonic()
        due = min(total, int((now - self.start_time) * rate) + 1)
        if due > self.published:
            self._send(due - self.published)
        if self.published < total:
            next_due = self.start_time + self.published / rate
            delay = max(next_due - time.monotonic(), TICK)
            self.ioloop.call_later(delay, self._guard(self._tick))

    def _confirmed(self) -> int:
        return self.confirmed_upto + len(self.confirmed_singles)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, self.pika.spec.Basic.Nack):
            self._fail(f"the broker nacked publish {method.delivery_tag}")
            return
        tag = method.delivery_tag
        singles = self.confirmed_singles
        if method.multiple:
            if tag > self.confirmed_upto:
                self.confirmed_upto = tag
                if singles:
                    self.confirmed_singles = {t for t in singles if t > tag}
        elif tag == self.confirmed_upto + 1:
            self.confirmed_upto = tag
        elif tag > self.confirmed_upto:
            singles.add(tag)
        while self.confirmed_upto + 1 in self.confirmed_singles:
            self.confirmed_upto += 1
            self.confirmed_singles.discard(self.confirmed_upto)
        if self._confirmed() >= self.plan.messages:
            self.last_ns = time.perf_counter_ns()
            self._maybe_finished()
        elif self.published < self.plan.messages:
            self._pump()

    # --- the end ----------------------------------------------------------------------

    def _maybe_finished(self) -> None:
        if self.finished or any(c.n < c.expected for c in self.consumers):
            return
        if self.plan.confirm and self._confirmed() < self.plan.messages:
            return
        self.finished = True
        self.cpu1 = own_cpu_seconds()
        self.emit.finished()
        self.emit.progress(self.published, sum(c.n for c in self.consumers))
        self._cleanup()

    def _cleanup(self) -> None:
        ch = self.pub
        for c in self.consumers:
            if c.connection is not None and c.connection.is_open:
                c.connection.close()
        done = self._guard(lambda _frame: self._shutdown())
        for i, name in enumerate(self.queues):
            last = i == len(self.queues) - 1 and not self.exchange
            ch.queue_delete(name, callback=done if last else None)
        if self.exchange:
            ch.exchange_delete(self.exchange, callback=done)


def run_pika(
    address: str, auth: dict[str, str], scenario: Scenario, emit: Any, system: str = "rabbitmq"
) -> ClientReport:
    """Run ``scenario`` with pika against the AMQP 0-9-1 broker at ``address``
    (RabbitMQ, or amqlite's AMQP listener); ``system`` names it in errors."""
    pika = importlib.import_module("pika")
    return _PikaRun(pika, address, auth, scenario, emit, system).run()
