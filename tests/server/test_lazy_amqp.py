"""A node imports AMQP 0-9-1 (``amqlite.amqp``'s method tables) only when it serves it.

The tables are about a tenth of a second of a broker's start, so a node restarted
without ``[amqp]`` (the usual HA or backlog restart) should not pay for them; a
node that serves AMQP must still hand its channels their pushes (the pump's owners).
"""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import sys
from amqlite.config import load_config
from amqlite.server.node import BrokerNode
overrides = {"server.port": 0, "storage.persist": False}
if sys.argv[1] == "on":
    overrides["amqp.port"] = 0
node = BrokerNode(load_config(None, overrides))
owners = sorted(t.__name__ for t in node._push_owners)
print("amqlite.amqp" in sys.modules, ",".join(owners))
"""


def _probe(amqp: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, amqp], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_node_without_amqp_does_not_import_it() -> None:
    assert _probe("off") == "False BrowserEndpoint,ClientEndpoint,PeeringQueue"


def test_a_node_serving_amqp_pushes_to_its_channels() -> None:
    assert _probe("on") == "True AmqpChannel,BrowserEndpoint,ClientEndpoint,PeeringQueue"
