"""A run's clients in their own process: ``python -m amqlite_bench.clientproc``.

Every system's clients can run this way, and a peer's always do (pika and nats-py
bring their own event loops): one process holds the publisher and every consumer
of one run, as the bench process does with ``--clients shared``.

The spec is one JSON object on stdin, ``{"system", "driver", "address", "auth",
"scenario", "stall_timeout"}``. The process writes JSON lines on stdout:

- ``{"event": "started"}`` once the consumers are subscribed, as the publisher starts;
- ``{"event": "progress", "published": P, "consumed": C}`` a few times a second;
- ``{"event": "finished"}`` as soon as every message is in (before the clean-up);
- ``{"event": "report", ...}`` last: a :class:`~amqlite_bench.plan.ClientReport`.

On failure it prints one line on stderr and exits 1.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio

from .errors import BenchError
from .peers import INSTALL_HINT
from .plan import ClientReport
from .scenarios import Scenario, run_clients
from .systems import AMQLITE, PIKA, RAW_TRIO, make_target

#: RabbitMQ's driver (the peer's name) is pika's, as is amqlite-amqp's (``pika``).
RABBITMQ_DRIVER = "rabbitmq"
NATS_DRIVER = "nats"
TRIO_DRIVERS = (AMQLITE, RAW_TRIO)
PIKA_DRIVERS = (PIKA, RABBITMQ_DRIVER)
DRIVERS: tuple[str, ...] = (*TRIO_DRIVERS, PIKA, RABBITMQ_DRIVER, NATS_DRIVER)


class LineEmitter:
    """Writes the event lines the parent reads (see the module docstring)."""

    def __init__(self, out: Any = None) -> None:
        self._out = out if out is not None else sys.stdout

    def _emit(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()

    def started(self) -> None:
        self._emit({"event": "started"})

    def progress(self, published: int, consumed: int) -> None:
        self._emit({"event": "progress", "published": published, "consumed": consumed})

    def finished(self) -> None:
        self._emit({"event": "finished"})

    def report(self, report: ClientReport) -> None:
        self._emit({"event": "report", **report.to_json()})


def client_spec(
    system: str,
    driver: str,
    address: str,
    auth: dict[str, str],
    scenario: Scenario,
    stall_timeout: float,
) -> dict[str, Any]:
    return {
        "system": system,
        "driver": driver,
        "address": address,
        "auth": auth,
        "scenario": scenario.to_json(),
        "stall_timeout": stall_timeout,
    }


def run_spec(spec: dict[str, Any], emit: LineEmitter) -> ClientReport:
    """Run the clients ``spec`` describes; the report is also emitted."""
    driver = spec["driver"]
    scenario = Scenario.from_json(spec["scenario"])
    if driver in TRIO_DRIVERS:
        target = make_target(driver, spec["address"], **spec.get("auth", {}))
        target.system = spec["system"]

        def progress(done: int, total: int) -> None:
            emit.progress(-1, done)

        report = trio.run(
            lambda: run_clients(
                target,
                scenario,
                stall_timeout=float(spec["stall_timeout"]),
                on_progress=progress,
                on_started=emit.started,
                on_finished=emit.finished,
            )
        )
    elif driver in PIKA_DRIVERS:
        from .pikaclient import run_pika

        report = run_pika(spec["address"], spec.get("auth", {}), scenario, emit, spec["system"])
    elif driver == NATS_DRIVER:
        from .natsclient import run_nats

        report = run_nats(spec["address"], scenario, emit)
    else:
        raise BenchError(f"unknown client driver {driver!r} (known: {', '.join(DRIVERS)})")
    emit.report(report)
    return report


def main() -> int:
    spec = json.loads(sys.stdin.read())
    what = f"{spec.get('system')} {spec.get('scenario', {}).get('name')}"
    try:
        run_spec(spec, LineEmitter())
    except BenchError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1
    except ImportError as exc:
        print(f"{what}: {exc} ({INSTALL_HINT})", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:
        print(f"{what}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
