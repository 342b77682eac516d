"""The peers ``amqlite bench --vs`` compares against, had through ``scripts/peers``.

``peers.sh`` in this package (what ``scripts/peers`` runs) is the one implementation
of starting and stopping RabbitMQ and NATS (private state directories, non-default
loopback ports, pids recorded, stopped by pid); the bench only calls it, with bash.
A peer that is already running (``status``) is used as it is and left running; one
the bench started is stopped when it ends.

The bench never installs a server (``start --no-install``): a missing one, or a
missing Python client library, makes that peer unavailable with a one-line reason.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import trio

RABBITMQ = "rabbitmq"
NATS = "nats"
PEERS: tuple[str, ...] = (RABBITMQ, NATS)

#: The Python client each peer's bench clients need (module, pip name).
CLIENT_LIBRARIES = {RABBITMQ: ("pika", "pika"), NATS: ("nats", "nats-py")}
#: How to have them: the harness's own dependencies (benchmarks/pyproject.toml).
INSTALL_HINT = "pip install -e benchmarks/"

#: The script that runs the peers, shipped in this package (``scripts/peers`` runs it too).
PEERS_SCRIPT = Path(__file__).resolve().with_name("peers.sh")
START_TIMEOUT = 150.0
STOP_TIMEOUT = 60.0

_STATUS = re.compile(r"^(?P<name>\S+) (?P<state>running|stopped)(?P<rest>.*)$")


class PeerUnavailable(Exception):
    """This peer cannot be had; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class Peer:
    """A running peer: where it listens, its server's pid, whether we started it,
    and the bench client driver that talks to it (its name, unless told)."""

    name: str
    address: str
    pid: int
    state_dir: str
    started_here: bool
    driver: str = ""

    def fsyncs_every_write(self) -> bool:
        """Whether the peer confirms a persistent message only once it is fsynced
        (NATS JetStream only with ``sync_interval: always``; see scripts/peers)."""
        if self.name != NATS:
            return True
        try:
            return Path(self.state_dir, "sync").read_text().strip() == "always"
        except OSError:
            return False


def missing_client(name: str) -> str | None:
    """Why the bench clients for ``name`` cannot run here, or None when they can."""
    module, package = CLIENT_LIBRARIES[name]
    if importlib.util.find_spec(module) is None:
        return f"the Python client {package} is not installed ({INSTALL_HINT})"
    return None


def parse_status(text: str, name: str) -> dict[str, str] | None:
    """The ``key=value`` fields of ``name``'s ``running`` line, or None when stopped."""
    for line in text.splitlines():
        m = _STATUS.match(line.strip())
        if m and m["name"] == name:
            if m["state"] != "running":
                return None
            fields = dict(kv.split("=", 1) for kv in m["rest"].split() if "=" in kv)
            return fields
    return None


async def _script(*args: str, limit: float) -> tuple[int, str, str]:
    if not PEERS_SCRIPT.exists():
        raise PeerUnavailable(f"{PEERS_SCRIPT} is missing (reinstall amqlite-bench)")
    with trio.move_on_after(limit) as scope:
        result = await trio.run_process(
            ["bash", str(PEERS_SCRIPT), *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    if scope.cancelled_caught:
        raise PeerUnavailable(f"scripts/peers {' '.join(args)} took more than {limit:g} s")
    return (
        result.returncode,
        result.stdout.decode(errors="replace"),
        result.stderr.decode(errors="replace"),
    )


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].removeprefix("peers: ") if lines else ""


def _peer_from(name: str, fields: dict[str, str], started_here: bool) -> Peer:
    try:
        return Peer(name, fields["address"], int(fields["pid"]), fields["dir"], started_here)
    except (KeyError, ValueError):
        raise PeerUnavailable(f"scripts/peers gave an unreadable status: {fields}") from None


async def start_peer(name: str) -> Peer:
    """The running ``name`` peer (started now when it was not running)."""
    if name not in PEERS:
        raise PeerUnavailable(f"unknown peer {name!r} (known: {', '.join(PEERS)})")
    why = missing_client(name)
    if why is not None:
        raise PeerUnavailable(why)
    code, out, _ = await _script("status", name, limit=30)
    fields = parse_status(out, name)
    if fields is not None:
        return _peer_from(name, fields, started_here=False)
    code, out, err = await _script("start", "--no-install", name, limit=START_TIMEOUT)
    fields = parse_status(out, name)
    if code == 0 and fields is not None:
        return _peer_from(name, fields, started_here=True)
    raise PeerUnavailable(_last_line(err) or f"scripts/peers start exited with {code}")


async def stop_peer(peer: Peer) -> None:
    """Stop ``peer`` if this bench started it (by the pids scripts/peers recorded)."""
    if not peer.started_here:
        return
    with trio.CancelScope(shield=True):
        try:
            code, _, err = await _script("stop", peer.name, limit=STOP_TIMEOUT)
        except PeerUnavailable as exc:
            print(f"bench: stopping {peer.name} failed: {exc}", file=sys.stderr)
            return
        if code != 0:
            print(f"bench: stopping {peer.name} failed: {_last_line(err)}", file=sys.stderr)
