"""A promotion writes its epoch in a worker thread: the event loop keeps running
meanwhile, no client is served before the epoch is on disk, and status shows the
new epoch only with the state it belongs to."""

from __future__ import annotations

import dataclasses
import socket
import threading
from pathlib import Path

import trio

import amqlite
from amqlite.ha import HaState
from amqlite.server import BrokerNode

from .test_pair_inprocess import pair_config, wait_for


async def test_a_promotion_serves_no_client_before_its_epoch_is_stored(tmp_path: Path) -> None:
    node = BrokerNode(pair_config(tmp_path, "primary"))  # type: ignore[arg-type]
    ha = node.ha
    assert ha is not None
    with socket.socket() as s:  # a loopback port nobody listens on: the peer is gone
        s.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{s.getsockname()[1]}"
    ha.config = dataclasses.replace(ha.config, backup_peer=gone)
    entered, gate = threading.Event(), threading.Event()
    writers: list[int] = []
    store = ha._persist_epoch

    def slow_persist(epoch: int) -> None:
        writers.append(threading.get_ident())
        entered.set()
        gate.wait(10)  # a slow disk
        store(epoch)

    ha._persist_epoch = slow_persist  # type: ignore[method-assign]
    served = trio.Event()

    async def client() -> None:
        async with amqlite.connect(f"127.0.0.1:{node.port}", connect_timeout=10) as conn:
            assert conn.server_state == "active"
            served.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        nursery.start_soon(client)  # held while starting; promotes once the peer is silent
        await wait_for(entered.is_set)
        machine = ha.machine
        assert machine is not None and machine.state is HaState.ACTIVE  # decided...
        with trio.move_on_after(0.3):  # ...the loop runs (this very wait proves it)...
            await served.wait()
        assert not served.is_set() and node.state != "active"  # ...but serves nobody yet
        # status pairs the state shown with its stored epoch, not the one being written
        shown = node.status()
        assert shown["state"] == shown["ha"]["state"] == node.state
        assert shown["ha"]["epoch"] < machine.epoch
        gate.set()
        with trio.fail_after(10):
            await served.wait()
        assert node.state == "active"
        shown = node.status()
        assert (shown["state"], shown["ha"]["state"]) == ("active", "active")
        assert shown["ha"]["epoch"] == machine.epoch
        assert writers and writers[0] != threading.get_ident()  # written off the loop
        stored = (tmp_path / "primary" / "HA_EPOCH").read_text("ascii")
        assert int(stored) == machine.epoch
        node.stop()
