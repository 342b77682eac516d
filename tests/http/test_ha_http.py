"""The HTTP listener on an HA pair of real processes: readiness follows the
node's state, a passive node refuses changes (until its peer is silent: then a
change is the client vote that promotes it), and what the active node took over
HTTP (a durable queue, a persistent message) is on the backup after a kill -9."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.waiting import wait_until

from ..e2e.test_ha_pair import Pair, ha_pair

pytestmark = pytest.mark.e2e


def _url(pair: Pair, side: str) -> str:
    listening = next(
        r for r in reversed(pair.procs[side].log_lines) if r.get("event") == "server_listening"
    )
    return f"http://{listening['http']}"


def _client(pair: Pair, side: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=_url(pair, side), auth=("guest", "guest"), timeout=10)


def _ha_state(metrics: str) -> str:
    for family in text_string_to_metric_families(metrics):
        if family.name == "amqlite_ha_state":
            return next(s.labels["state"] for s in family.samples if s.value == 1)
    raise AssertionError("no amqlite_ha_state")


async def test_readiness_changes_and_replication_of_http_actions(tmp_path: Path) -> None:
    async with ha_pair(tmp_path, extra="[http]\nport = 0\n") as pair:
        await pair.start("primary")
        await pair.start("backup")
        await pair.wait_states("active", "passive")
        async with _client(pair, "primary") as primary, _client(pair, "backup") as backup:
            assert (await primary.get("/health/ready")).status_code == 200
            not_ready = await backup.get("/health/ready")
            assert not_ready.status_code == 503 and not_ready.json()["state"] == "passive"
            assert (await backup.get("/health/live")).status_code == 200
            refused = await backup.put("/api/queues/%2F/orders", json={"durable": True})
            assert refused.status_code == 503 and "passive" in refused.json()["reason"]
            ha = (await primary.get("/api/ha")).json()
            assert (ha["state"], ha["peer_state"]) == ("active", "passive")
            assert _ha_state((await primary.get("/metrics")).text) == "active"
            assert _ha_state((await backup.get("/metrics")).text) == "passive"

            assert (
                await primary.put("/api/queues/%2F/orders", json={"durable": True})
            ).status_code == 201
            published = await primary.post(
                "/api/exchanges/%2F/amq.default/publish",
                json={"routing_key": "orders", "payload": "o1", "properties": {"delivery_mode": 2}},
            )
            assert published.json() == {"routed": True}  # the passive node holds it

            await pair.kill("primary")
            # reads never promote the backup: a change is a request for service, and
            # the first one after the primary's silence is the client vote
            assert (await backup.get("/api/queues/%2F/orders")).status_code == 200

            async def taken_over() -> bool:  # another process: polled
                response = await backup.put("/api/queues/%2F/orders", json={})
                return response.status_code == 204

            await wait_until(taken_over, "the backup's take-over", deadline=20, every=0.05)
            assert (await backup.get("/health/ready")).json()["state"] == "active"
            queue = (await backup.get("/api/queues/%2F/orders")).json()
            assert queue["messages"] == 1 and queue["durable"] is True
            got = (await backup.post("/api/queues/%2F/orders/get", json={"count": 1})).json()
            assert got[0]["payload"] == "o1"
