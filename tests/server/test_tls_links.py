"""The node's own links over TLS, in-process: the HA peer link (``server.tls``)
and a peering link (``tls = true``), each verifying the remote's certificate
against ``[tls] ca`` and the dialed host name; a wrong CA keeps the link down and
says why."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from structlog.testing import capture_logs

import amqlite
from amqlite.config import Config, PeeringConfig, load_config
from amqlite.peering import PeeringMode, parse_addresses
from amqlite.server import BrokerNode
from tests.waiting import wait_until

from ..tls_certs import TlsFiles

DEADLINE = 10.0


async def wait_for(predicate: Callable[[], bool]) -> None:
    await wait_until(predicate, deadline=DEADLINE)


def _tls(files: TlsFiles, ca: Path | None = None) -> dict[str, Any]:
    return {
        "server.tls": True,
        "tls.cert": str(files.cert),
        "tls.key": str(files.key),
        "tls.ca": str(ca or files.ca),
    }


def _pair_config(tmp_path: Path, role: str, files: TlsFiles, ca: Path | None = None) -> Config:
    return load_config(
        overrides={
            "server.host": "127.0.0.1",
            "server.port": 0,
            "server.data_dir": str(tmp_path / role),
            "cluster.role": role,
            "cluster.heartbeat_ms": 50,
            "cluster.failover_timeout_ms": 300,
        }
        | _tls(files, ca)
    )


def _point_at_each_other(primary: BrokerNode, backup: BrokerNode) -> None:
    for node in (primary, backup):
        assert node.ha is not None
        node.ha.config = dataclasses.replace(
            node.ha.config,
            primary_peer=f"127.0.0.1:{primary.port}",
            backup_peer=f"127.0.0.1:{backup.port}",
        )
        node.cluster_addresses = node.ha.config.addresses


async def test_an_ha_pair_replicates_over_tls(
    tmp_path: Path, tls_files: TlsFiles, nursery: trio.Nursery
) -> None:
    primary = BrokerNode(_pair_config(tmp_path, "primary", tls_files))
    backup = BrokerNode(_pair_config(tmp_path, "backup", tls_files))
    await nursery.start(backup.run)
    await nursery.start(primary.run)
    _point_at_each_other(primary, backup)
    await wait_for(lambda: primary.state == "active" and backup.state == "passive")
    servers = f"amqlites://127.0.0.1:{primary.port},amqlites://127.0.0.1:{backup.port}"
    with trio.fail_after(DEADLINE):
        async with amqlite.connect(servers, ca=str(tls_files.ca), reconnect=False) as conn:
            await conn.declare_queue("jobs", durable=True)
            for i in range(10):
                await conn.publish("", "jobs", f"m{i}", persistent=True, confirm=True)
    assert backup.ha is not None and backup.ha.syncs_received > 0
    vhost = backup.broker.vhost("/")
    assert vhost is not None
    # the passive node holds them in its journal's state (its broker follows the
    # topology only, docs/ha.md)
    journal = backup.storage.journal  # type: ignore[union-attr]
    assert journal is not None
    await wait_for(
        lambda: "jobs" in vhost.queues and len(journal.state.messages("/", "jobs")) == 10
    )
    assert all(c.link.stream.__class__ is trio.SSLStream for c in primary.connections)
    for node in (primary, backup):  # status: the listener and the peer link speak TLS
        status = node.status()
        assert status["tls"] == {
            "native": True,
            "amqp": None,
            "verify": "peer",
            "min_version": "1.2",
        }
        assert status["ha"]["tls"] is True
    primary.stop()
    backup.stop()


async def test_an_ha_peer_with_a_certificate_from_another_ca_is_not_linked(
    tmp_path: Path, tls_files: TlsFiles, nursery: trio.Nursery
) -> None:
    # the primary trusts only other_ca: the backup's certificate fails verification
    primary = BrokerNode(_pair_config(tmp_path, "primary", tls_files, tls_files.other_ca))
    backup = BrokerNode(_pair_config(tmp_path, "backup", tls_files, tls_files.other_ca))
    with capture_logs() as logs:
        await nursery.start(backup.run)
        await nursery.start(primary.run)
        _point_at_each_other(primary, backup)
        assert primary.ha is not None
        await wait_for(lambda: primary.ha is not None and primary.ha.tls_error != "")
    assert "TLS: certificate verify failed: unable to get local issuer certificate" in (
        primary.ha.tls_error
    )
    assert not primary.ha.link_up
    failed = [r for r in logs if r["event"] == "ha_link_tls_failed"]
    assert failed and "certificate verify failed" in failed[0]["error"]
    primary.stop()
    backup.stop()


def _node_config(files: TlsFiles, *links: PeeringConfig, ca: Path | None = None) -> Config:
    base = {"server.host": "127.0.0.1", "server.port": 0, "storage.persist": False}
    config = load_config(overrides=base | _tls(files, ca))
    return dataclasses.replace(config, cluster_mta=links)


def _link(host: str, port: int) -> PeeringConfig:
    return PeeringConfig(
        name="x",
        host=parse_addresses(f"{host}:{port}"),
        mode=PeeringMode.PUBLISH,
        login="guest",
        password="guest",
        tls=True,
    )


def _links(node: BrokerNode) -> list[dict[str, Any]]:
    assert node.peering is not None
    return node.peering.status()


async def test_a_peering_link_carries_messages_over_tls(
    tls_files: TlsFiles, nursery: trio.Nursery
) -> None:
    b = BrokerNode(_node_config(tls_files))
    await nursery.start(b.run)
    url_b = f"amqlites://127.0.0.1:{b.port}"
    ca = str(tls_files.ca)
    async with amqlite.connect(url_b, ca=ca) as conn:
        await conn.declare_exchange("x", "topic", durable=True)
    a = BrokerNode(_node_config(tls_files, _link("localhost", b.port)))
    await nursery.start(a.run)
    await wait_for(lambda: bool(_links(a)) and _links(a)[0]["state"] == "up")
    with trio.fail_after(DEADLINE):
        async with (
            amqlite.connect(f"amqlites://127.0.0.1:{a.port}", ca=ca) as ca_conn,
            amqlite.connect(url_b, ca=ca) as cb_conn,
        ):
            q = (await cb_conn.declare_queue("", exclusive=True)).name
            await cb_conn.bind(q, "x", "orders.*")
            await wait_for(lambda: _links(a)[0]["interest_size"] == 1)
            await ca_conn.publish("x", "orders.new", b"across sites")
            consumer = await cb_conn.consume(q, no_ack=True)
            async for delivery in consumer:
                assert delivery.body == b"across sites"
                break
    # status: the dialer dials over TLS, the acceptor's connection came over TLS
    assert [(x["role"], x["tls"]) for x in _links(a)] == [("dialer", True)]
    assert [(x["role"], x["tls"]) for x in _links(b)] == [("acceptor", True)]
    a.stop()
    b.stop()


async def test_a_peering_link_to_a_wrong_host_name_stays_down_and_says_why(
    tls_files: TlsFiles, nursery: trio.Nursery
) -> None:
    wrong = dataclasses.replace(
        tls_files, cert=tls_files.wrong_host_cert, key=tls_files.wrong_host_key
    )
    b = BrokerNode(_node_config(wrong))  # its certificate names elsewhere.example only
    await nursery.start(b.run)
    a = BrokerNode(_node_config(tls_files, _link("127.0.0.1", b.port)))
    await nursery.start(a.run)
    await wait_for(lambda: bool(_links(a)) and "TLS: " in _links(a)[0]["last_error"])
    link = _links(a)[0]
    assert link["state"] != "up"
    assert "IP address mismatch" in link["last_error"]
    a.stop()
    b.stop()
