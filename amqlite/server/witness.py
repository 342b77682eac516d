"""``amqlite witness``: the third voter of an HA pair, a tiny trio process.

It holds one lease (:class:`~amqlite.ha.WitnessLedger`: holder, epoch, whether the
holder confirms alone) and keeps it in a small state file, replaced atomically
and fsynced (:func:`~amqlite.store.durable_file.write_durably`) **before** the
answer that changed it goes out: a restarted witness never forgets a grant a
node acted on. After a restart the lease in the file counts as held for one more
lease time (the longest ``ttl`` asked), since its holder may still be confirming
under it.

Protocol: the broker's framing (4-byte big-endian length, one CBOR map). A node
opens with ``hello`` {login, password, node}; the login must be a user of the
witness's ``--config`` carrying the ``cluster`` tag (without users configured:
guest, from loopback only, as on a broker); the answer is ``welcome`` or
``refused`` {code, text}. Then ``lease`` requests, each answered in order.
"""

from __future__ import annotations

import json
import os
from typing import Any

import structlog
import trio

from amqlite.auth import Authenticator
from amqlite.errors import ReplyCode
from amqlite.ha.witness import (
    FrameReader,
    LeaseRequest,
    WitnessLedger,
    WitnessProtocolError,
    encode_frame,
)
from amqlite.store.durable_file import read_if_present, write_durably

log = structlog.get_logger("amqlite.witness")

#: a node that has not said hello within this time is dropped
HELLO_TIMEOUT = 10.0


class WitnessState:
    """The state file: ``{"holder", "epoch", "stale", "ttl"}`` as JSON."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        data = read_if_present(self.path)
        if data is None:
            return {"holder": None, "epoch": 0, "stale": False, "ttl": 0.0}
        try:
            state = json.loads(data)
            holder = state["holder"]
            if holder is not None and not isinstance(holder, str):
                raise ValueError("holder")
            return {
                "holder": holder,
                "epoch": int(state["epoch"]),
                "stale": bool(state["stale"]),
                "ttl": float(state.get("ttl", 0.0)),
            }
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"witness state file {self.path} is damaged: {exc}") from None

    def save(self, holder: str | None, epoch: int, stale: bool, ttl: float) -> None:
        """Blocks on the disk: run in a worker thread."""
        data = {"holder": holder, "epoch": epoch, "stale": stale, "ttl": ttl}
        write_durably(self.path, json.dumps(data).encode())


class WitnessService:
    """The listener, the ledger and its state file."""

    def __init__(self, state_path: str, authenticator: Authenticator) -> None:
        self.state = WitnessState(state_path)
        self.auth = authenticator
        self.ledger: WitnessLedger | None = None
        self._ttl = 0.0
        self._lock = trio.Lock()  # one request at a time: decide, store, answer
        self.requests = 0

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        saved = await trio.to_thread.run_sync(self.state.load)
        self._ttl = saved["ttl"]
        self.ledger = WitnessLedger(
            saved["holder"],
            saved["epoch"],
            saved["stale"],
            now=trio.current_time(),
            restart_ttl=self._ttl,
        )
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        log.info(
            "witness_listening",
            host=host,
            port=bound,
            state=self.state.path,
            holder=saved["holder"],
            epoch=saved["epoch"],
            stale=saved["stale"],
        )
        task_status.started(bound)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        remote = stream.socket.getpeername()
        remote_host = str(remote[0])
        reader = FrameReader()
        node = ""
        try:
            with trio.fail_after(HELLO_TIMEOUT):
                hello = await self._next(stream, reader)
            node = await self._login(stream, hello, remote_host)
            if not node:
                return
            while True:
                data = await self._next(stream, reader)
                if data.get("m") != "lease":
                    raise WitnessProtocolError(f"unexpected witness method {data.get('m')!r}")
                request = LeaseRequest.from_map(data)
                answer = await self._decide(request)
                await stream.send_all(encode_frame(answer.to_map()))
        except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError, trio.TooSlowError):
            pass
        except WitnessProtocolError as exc:
            log.warning("witness_protocol_error", remote=remote_host, node=node, error=exc.text)
            frame = encode_frame({"m": "error", "code": int(exc.code), "text": exc.text})
            with trio.move_on_after(1):
                await stream.send_all(frame)
        finally:
            if node:
                log.info("witness_node_gone", node=node, remote=remote_host)
            await trio.aclose_forcefully(stream)

    async def _next(self, stream: trio.SocketStream, reader: FrameReader) -> dict[Any, Any]:
        while True:
            data = reader.next_map()
            if data is not None:
                return data
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise EOFError
            reader.feed(chunk)

    async def _login(self, stream: trio.SocketStream, hello: dict[Any, Any], remote: str) -> str:
        """The node id of a node allowed in ("" when refused, after saying why)."""
        if hello.get("m") != "hello":
            raise WitnessProtocolError("a witness connection must open with hello")
        login, password, node = hello.get("login"), hello.get("password"), hello.get("node")
        if not all(isinstance(v, str) for v in (login, password, node)) or not node:
            raise WitnessProtocolError("hello needs login, password and node (text)")
        assert isinstance(login, str) and isinstance(password, str) and isinstance(node, str)
        refused = await trio.to_thread.run_sync(
            self.auth.check_credentials, login, password, remote
        )
        text = ""
        if refused is not None:
            text, reason = refused.text, refused.log_reason
        else:
            user = self.auth.management_user(login)
            if user is None or not user.has_tag("cluster"):
                text = f"access refused: the witness needs the 'cluster' tag (user {login!r})"
                reason = text
        if text:
            log.warning("witness_login_refused", remote=remote, node=node, reason=reason)
            frame = {"m": "refused", "code": int(ReplyCode.ACCESS_REFUSED), "text": text}
            await stream.send_all(encode_frame(frame))
            return ""
        await stream.send_all(encode_frame({"m": "welcome"}))
        log.info("witness_node_connected", node=node, remote=remote)
        return node

    async def _decide(self, request: LeaseRequest) -> Any:
        async with self._lock:
            ledger = self.ledger
            assert ledger is not None
            before, ttl_before = ledger.durable, self._ttl
            answer = ledger.request(request, trio.current_time())
            self.requests += 1
            if answer.granted:
                self._ttl = max(self._ttl, request.ttl)
            after = ledger.durable
            if after != before or self._ttl != ttl_before:
                holder, epoch, stale = after
                await trio.to_thread.run_sync(self.state.save, holder, epoch, stale, self._ttl)
                log.info(
                    "witness_lease_changed",
                    holder=holder,
                    epoch=epoch,
                    stale=stale,
                    previous_holder=before[0],
                    previous_epoch=before[1],
                )
            if not answer.granted:
                log.debug("witness_lease_refused", node=request.node, reason=answer.text)
            return answer


def default_state_path(port: int) -> str:
    return os.path.join("amqlite-data", f"witness-{port}.json")
