"""The systems under test behind one interface: amqlite and the raw-trio relay.

A :class:`Target` sets up a route for a run (queues, bindings), publishes a
:class:`~amqlite_bench.plan.PublishPlan` into it, consumes from it, and tears
it down. Both targets take the same plan and fill the same tallies, so a
scenario is written once (:mod:`amqlite_bench.scenarios`).
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractAsyncContextManager
from itertools import count
from typing import Any, Protocol

import trio

from amqlite import Connection, connect
from amqlite.client.addresses import parse_address

from .plan import (
    GROUP,
    GROUPS,
    SELECT,
    SELECT_HEADER,
    SELECT_SHARES,
    STAMP_HEADER,
    ConsumeTally,
    PublishPlan,
    PublishTally,
    Route,
    SharedCount,
    drive_publisher,
)
from .relayclient import RelayPublisher
from .relayclient import consume as relay_consume

AMQLITE = "amqlite"
RAW_TRIO = "raw-trio"
#: amqlite's AMQP 0-9-1 listener (``amqlite server --amqp-port``), driven with the
#: same pika client code as RabbitMQ (:mod:`amqlite_bench.pikaclient`), not by a
#: :class:`Target` here.
AMQLITE_AMQP = "amqlite-amqp"
#: The client driver of RabbitMQ and of amqlite-amqp: pika's SelectConnection.
PIKA = "pika"
#: amqlite over TLS: a broker of its own with a TLS-only native listener (a
#: throwaway CA made by trustme at run time), driven by the amqlite client over
#: ``amqlites://`` exactly as ``amqlite`` is over plain TCP.
AMQLITE_TLS = "amqlite-tls"

#: Prefetch (credit) of every amqlite consumer in the benchmarks.
PREFETCH = 1000

_run_ids = count(1)


class Target(Protocol):
    """One system under test."""

    system: str
    address: str
    #: keyword arguments for :func:`make_target` besides the system and address
    auth: dict[str, str]

    async def prepare(self, scenario: str, queues: int, *, durable: bool = False) -> Route: ...

    async def cleanup(self, route: Route) -> None: ...

    async def consume(
        self,
        route: Route,
        index: int,
        tally: ConsumeTally,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None: ...

    async def publish(self, route: Route, plan: PublishPlan, tally: PublishTally) -> None: ...


class AmqliteTarget:
    """An amqlite broker (or a server list) reached with :mod:`amqlite.client`.

    One queue per consumer, each on its own connection, manual acks, prefetch
    :data:`PREFETCH`. One queue: the default exchange, keyed by the queue name.
    More: a fanout exchange bound to every queue. ``ca``: the servers are
    ``amqlites://`` addresses whose certificates are verified against this file.
    """

    system = AMQLITE

    def __init__(
        self,
        servers: str,
        *,
        vhost: str = "/",
        login: str = "guest",
        password: str = "guest",
        ca: str = "",
    ) -> None:
        self.address = servers
        self.auth = {"vhost": vhost, "login": login, "password": password}
        if ca:
            self.auth["ca"] = ca

    def _connect(
        self, name: str, max_in_flight: int = 1000
    ) -> AbstractAsyncContextManager[Connection]:
        auth = self.auth
        return connect(
            self.address,
            vhost=auth["vhost"],
            login=auth["login"],
            password=auth["password"],
            client_name=name,
            max_in_flight=max_in_flight,
            ca=auth.get("ca"),
        )

    async def prepare(self, scenario: str, queues: int, *, durable: bool = False) -> Route:
        base = f"bench.{scenario}.{os.getpid()}.{next(_run_ids)}"
        names = tuple(f"{base}.q{i}" for i in range(queues))
        async with self._connect("bench-setup") as conn:
            for name in names:
                await conn.declare_queue(name, durable=durable)
            if queues == 1:
                return Route("", names[0], names)
            exchange = f"{base}.fanout"
            await conn.declare_exchange(exchange, "fanout")
            for name in names:
                await conn.bind(name, exchange, "")
            return Route(exchange, "", names)

    async def cleanup(self, route: Route) -> None:
        async with self._connect("bench-cleanup") as conn:
            for name in route.queues:
                await conn.delete_queue(name)
            if route.exchange:
                await conn.delete_exchange(route.exchange)

    async def consume(
        self,
        route: Route,
        index: int,
        tally: ConsumeTally,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with self._connect(f"bench-consumer-{index}") as c:
            queue = route.queues[index % len(route.queues)]
            consumer = await c.consume(queue, prefetch=PREFETCH, selector=tally.selector or "")
            task_status.started()
            if tally.shared is not None:
                await _consume_shared(consumer, tally, tally.shared)
                return
            hist = tally.hist
            expected = tally.expected
            clock = time.perf_counter_ns
            n = 0
            if hist is None:
                async for d in consumer:
                    await d.ack()
                    n += 1
                    if n % 256 == 0 or n >= expected:
                        tally.consumed = n
                        if n >= expected:
                            break
            else:
                async for d in consumer:
                    hist.record_value(max(1, (clock() - d.headers[STAMP_HEADER]) // 1000))
                    await d.ack()
                    n += 1
                    tally.consumed = n
                    if n >= expected:
                        break
            tally.done_ns = clock()

    async def publish(self, route: Route, plan: PublishPlan, tally: PublishTally) -> None:
        async with self._connect("bench-publisher", max(1, plan.confirm)) as conn:
            publish = conn.publish
            exchange, key = route.exchange, route.key
            body = b"x" * plan.body_size
            clock = time.perf_counter_ns
            persistent = plan.persistent
            shares = [{SELECT_HEADER: v} for v in range(SELECT_SHARES)]
            groups = [{"group_id": f"g{v}"} for v in range(GROUPS)]

            async def send_batch(k: int) -> None:
                if plan.confirm:  # a window of plan.confirm outstanding (max_in_flight)
                    publish_nowait = conn.publish_nowait
                    for _ in range(k):
                        await publish_nowait(exchange, key, body, persistent=persistent)
                elif plan.stamp:
                    for _ in range(k):
                        await publish(exchange, key, body, headers={STAMP_HEADER: clock()})
                elif plan.pattern == SELECT:
                    first = tally.published
                    for i in range(first, first + k):
                        await publish(exchange, key, body, headers=shares[i % SELECT_SHARES])
                elif plan.pattern == GROUP:
                    first = tally.published
                    for i in range(first, first + k):
                        await publish(exchange, key, body, properties=groups[i % GROUPS])
                else:
                    for _ in range(k):
                        await publish(exchange, key, body)

            await drive_publisher(plan, send_batch, tally)
            if plan.confirm:
                await conn.wait_for_confirms()
                tally.last_ns = clock()


async def _consume_shared(consumer: Any, tally: ConsumeTally, shared: SharedCount) -> None:
    """Consume until the consumers together have every message (which consumer has
    which group is the broker's choice), then stop."""
    reached = shared.event()
    async with trio.open_nursery() as nursery:

        async def stop() -> None:
            await reached.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(stop)
        async for d in consumer:
            await d.ack()
            tally.consumed += 1
            shared.consumed += 1
            if shared.consumed >= shared.expected:
                tally.done_ns = time.perf_counter_ns()
                reached.set()
                break


class RelayTarget:
    """The raw-trio relay (:mod:`amqlite_bench.baseline`): every consumer
    connection gets every message, so the queues are only names."""

    system = RAW_TRIO

    def __init__(self, address: str) -> None:
        self.address = address
        self.auth: dict[str, str] = {}
        parsed = parse_address(address)
        self._host, self._port = parsed.host, parsed.port

    async def prepare(self, scenario: str, queues: int, *, durable: bool = False) -> Route:
        return Route("", scenario, tuple(f"relay-{i}" for i in range(queues)))

    async def cleanup(self, route: Route) -> None:
        return None

    async def consume(
        self,
        route: Route,
        index: int,
        tally: ConsumeTally,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await relay_consume(self._host, self._port, tally, task_status=task_status)

    async def publish(self, route: Route, plan: PublishPlan, tally: PublishTally) -> None:
        pub = await RelayPublisher.connect(self._host, self._port)
        try:
            exchange, key = route.exchange, route.key
            body = b"x" * plan.body_size
            clock = time.perf_counter_ns
            publish = pub.publish

            async def send_batch(k: int) -> None:
                if plan.stamp:
                    for _ in range(k):
                        publish(exchange, key, body, {STAMP_HEADER: clock()})
                else:
                    for _ in range(k):
                        publish(exchange, key, body)
                await pub.flush()

            await drive_publisher(plan, send_batch, tally)
        finally:
            await pub.aclose()


def make_target(system: str, address: str, **auth: str) -> Target:
    if system == AMQLITE:
        return AmqliteTarget(address, **auth)
    if system == RAW_TRIO:
        return RelayTarget(address)
    raise ValueError(f"unknown system {system!r}")
