"""A publisher in its own process: ``python -m amqlite_bench.worker`` (spec on stdin).

The spec is one JSON object ``{"system", "address", "auth", "route", "plan"}``;
the worker publishes the plan, then prints one JSON line on stdout: the
:class:`~amqlite_bench.plan.PublishTally` plus ``cpu_s``, the CPU time this
process used. Used by ``amqlite bench --clients split``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio

from .plan import PublishPlan, PublishTally, Route
from .procstat import own_cpu_seconds
from .systems import make_target


def worker_spec(
    system: str, address: str, auth: dict[str, str], route: Route, plan: PublishPlan
) -> dict[str, Any]:
    return {
        "system": system,
        "address": address,
        "auth": auth,
        "route": route.to_json(),
        "plan": plan.to_json(),
    }


def main() -> int:
    spec = json.loads(sys.stdin.read())
    target = make_target(spec["system"], spec["address"], **spec.get("auth", {}))
    route = Route.from_json(spec["route"])
    plan = PublishPlan.from_json(spec["plan"])
    tally = PublishTally()
    trio.run(target.publish, route, plan, tally)
    print(json.dumps({**tally.to_json(), "cpu_s": own_cpu_seconds()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
