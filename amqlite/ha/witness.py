"""The witness of an HA pair, sans-IO: the lease it holds and the maps it trades.

A pair that names a witness (``[cluster] witness = "host:port"``) asks it for a
**lease**: the right to confirm persistent messages without the peer holding them,
for one node in one epoch, for ``ttl`` seconds from the request. The witness is a
third voter: two nodes cannot tell a dead peer from a cut link, the witness can
say which of them it last heard.

:class:`WitnessLedger` is the witness's whole decision (``amqlite witness`` is its
trio shell). Its rules:

- the node that holds the lease renews it (same or higher epoch) whenever it asks;
- another node gets it only for a **higher** epoch, only once the holder's lease has
  **expired**, and never while the holder says it confirms **alone** (``stale``: the
  other node lacks messages the holder confirmed; granting would lose them);
- every answer carries the lease as it stands (holder, epoch, stale), so a refused
  node learns the epoch to beat or that it was superseded.

A node counts its lease from the instant it **sent** the request, the witness from
the instant it **received** it: the node's lease always ends first, so no two nodes
ever both believe they hold it.

The maps are plain CBOR maps in the broker's framing (4-byte big-endian length,
then the map): ``hello`` / ``welcome`` | ``refused``, then ``lease`` requests and
answers correlated by ``id`` / ``re``. :class:`FrameReader` splits the byte stream.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum
from typing import Any

import cbor2

from .errors import HaError

_LEN = struct.Struct(">I")
#: A witness frame is tiny; anything bigger is not the witness protocol.
MAX_WITNESS_FRAME = 64 * 1024


class Promise(Enum):
    """What a master promises about a confirmed persistent message when its peer is
    silent (``status`` reports it)."""

    SERVE = "serve"  # no witness, on_peer_silence = "serve": confirm on the local disk
    HOLD = "hold"  # no witness, on_peer_silence = "hold": confirm only what the peer holds
    WITNESS = "witness"  # confirm alone only under the witness's lease


class WitnessProtocolError(HaError):
    """A witness frame or map that breaks the protocol."""


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """Ask for (or renew) the lease for ``node`` in ``epoch`` for ``ttl`` seconds;
    ``alone`` says the node would confirm without its peer holding the messages."""

    id: int
    node: str
    epoch: int
    ttl: float
    alone: bool

    def to_map(self) -> dict[str, Any]:
        return {
            "m": "lease",
            "id": self.id,
            "node": self.node,
            "epoch": self.epoch,
            "ttl_ms": round(self.ttl * 1000),
            "alone": self.alone,
        }

    @classmethod
    def from_map(cls, data: dict[Any, Any]) -> LeaseRequest:
        ttl_ms = _field(data, "ttl_ms", int)
        if ttl_ms <= 0:
            raise WitnessProtocolError(f"lease ttl_ms must be positive, got {ttl_ms!r}")
        node = _field(data, "node", str)
        if not node:
            raise WitnessProtocolError("lease node must be non-empty text")
        epoch = _field(data, "epoch", int)
        if epoch < 0:
            raise WitnessProtocolError(f"lease epoch must not be negative, got {epoch!r}")
        return cls(
            id=_field(data, "id", int),
            node=node,
            epoch=epoch,
            ttl=ttl_ms / 1000,
            alone=_field(data, "alone", bool),
        )


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    """The witness's answer to request ``re``: ``granted`` or not, and the lease as
    it now stands (``holder`` None: never granted)."""

    re: int
    granted: bool
    holder: str | None
    epoch: int
    stale: bool
    text: str = ""

    def to_map(self) -> dict[str, Any]:
        return {
            "m": "lease",
            "re": self.re,
            "granted": self.granted,
            "holder": self.holder,
            "epoch": self.epoch,
            "stale": self.stale,
            "text": self.text,
        }

    @classmethod
    def from_map(cls, data: dict[Any, Any]) -> LeaseAnswer:
        holder = data.get("holder")
        if holder is not None and not isinstance(holder, str):
            raise WitnessProtocolError(f"lease holder must be text or null, got {holder!r}")
        text = data.get("text", "")
        return cls(
            re=_field(data, "re", int),
            granted=_field(data, "granted", bool),
            holder=holder,
            epoch=_field(data, "epoch", int),
            stale=_field(data, "stale", bool),
            text=text if isinstance(text, str) else "",
        )


@dataclass(frozen=True, slots=True)
class Lease:
    """What the witness keeps (``until`` is on the witness's clock)."""

    holder: str | None = None
    epoch: int = 0
    until: float = 0.0
    stale: bool = False


class WitnessLedger:
    """The witness's lease and its rules (see the module docstring). ``now`` comes
    in with every request; :attr:`durable` is what the shell persists (holder,
    epoch, stale), written before the answer goes out."""

    def __init__(self, holder: str | None = None, epoch: int = 0, stale: bool = False,
                 *, now: float = 0.0, restart_ttl: float = 0.0) -> None:  # fmt: skip
        # after a restart the old lease counts as held for one more ttl: the holder
        # may still be confirming under it
        until = now + restart_ttl if holder is not None else 0.0
        self.lease = Lease(holder, epoch, until, stale)

    @property
    def durable(self) -> tuple[str | None, int, bool]:
        lease = self.lease
        return lease.holder, lease.epoch, lease.stale

    def request(self, req: LeaseRequest, now: float) -> LeaseAnswer:
        lease = self.lease
        reason = self._refusal(req, now)
        if reason:
            return LeaseAnswer(req.id, False, lease.holder, lease.epoch, lease.stale, reason)
        self.lease = Lease(req.node, req.epoch, now + req.ttl, req.alone)
        return LeaseAnswer(req.id, True, req.node, req.epoch, req.alone)

    def _refusal(self, req: LeaseRequest, now: float) -> str:
        lease = self.lease
        if lease.holder is None:
            return ""
        if req.node == lease.holder:
            if req.epoch < lease.epoch:
                return f"epoch {req.epoch} is older than the lease's ({lease.epoch})"
            return ""
        if req.epoch <= lease.epoch:
            return f"node {lease.holder!r} holds the lease in epoch {lease.epoch} >= {req.epoch}"
        if now < lease.until:
            return f"node {lease.holder!r} holds the lease for {lease.until - now:.3f} s more"
        if lease.stale:
            return (
                f"node {lease.holder!r} confirmed messages without its peer "
                f"(epoch {lease.epoch}); a takeover would lose them"
            )
        return ""


def hello_map(login: str, password: str, node: str) -> dict[str, Any]:
    return {"m": "hello", "login": login, "password": password, "node": node}


def encode_frame(data: dict[str, Any]) -> bytes:
    payload = cbor2.dumps(data)
    return _LEN.pack(len(payload)) + payload


class FrameReader:
    """Bytes in, maps out (sans-IO): :meth:`feed`, then :meth:`next_map` or
    :meth:`maps`."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_map(self) -> dict[Any, Any] | None:
        """The next complete frame's map, or None until more bytes come; raises
        :class:`WitnessProtocolError` on a frame too big or not a CBOR map."""
        buf = self._buffer
        if len(buf) < 4:
            return None
        (n,) = _LEN.unpack_from(buf, 0)
        if n > MAX_WITNESS_FRAME:
            raise WitnessProtocolError(f"witness frame of {n} bytes is too big")
        if len(buf) < 4 + n:
            return None
        payload = bytes(buf[4 : 4 + n])
        del buf[: 4 + n]
        try:
            data = cbor2.loads(payload)
        except (cbor2.CBORDecodeError, ValueError) as exc:
            raise WitnessProtocolError(f"witness frame is not CBOR: {exc}") from None
        if not isinstance(data, dict):
            raise WitnessProtocolError("a witness frame must be a CBOR map")
        return data

    def maps(self) -> list[dict[Any, Any]]:
        """Every complete frame so far (as :meth:`next_map`)."""
        out: list[dict[Any, Any]] = []
        while (data := self.next_map()) is not None:
            out.append(data)
        return out


def _field(data: dict[Any, Any], name: str, kind: type) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WitnessProtocolError(f"witness field {name!r} must be {kind.__name__}, got {value!r}")
    return value
