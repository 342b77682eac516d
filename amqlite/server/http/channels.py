"""The browser channels on the HTTP listener: ``/ws`` (a WebSocket) and ``/poll``
(HTTP long polling), and the JS client at ``/js/amqlite.js`` (docs/browser.md).

Both carry JSON frames of the native protocol's methods (:mod:`amqlite.browser`)
for one broker session per page (:class:`~..endpoints.BrowserEndpoint`), opened
with the broker's own users as a native ``hello`` is: the password is checked
once (scrypt in a worker thread), the HA pair admits the client (a passive node
refuses with 360, or promotes itself on the client vote) and the node's
connection limits count it.

- ``/ws``: the first frame is ``hello`` ``{"m": "hello", "id", "login",
  "password", "vhost", "client"}``, answered ``welcome`` or ``refused``; then
  requests in, replies and deliveries out, each text message one frame or a JSON
  array of frames (binary messages: the same in CBOR, ``body`` as bytes).
- ``/poll``: ``POST /poll/open`` (the hello's fields) answers the welcome with a
  ``session`` token; the page sends it as ``X-Amqlite-Session`` with ``POST
  /poll/send`` (a frame or an array of frames; 204) and ``GET
  /poll/recv?ack=N&wait=S``, which is held until frames after ``N`` wait (or ``S``
  seconds, at most ``POLL_WAIT``) and answers ``{"last": M, "frames": [...]}``;
  the frames up to ``ack`` are forgotten, the rest sent again. ``POST
  /poll/close`` ends the session; ``[http] poll_idle`` seconds without a poll end
  it too.

**Origins.** A page's origin must be the listener's own or one of ``[http]
allowed_origins``: the WebSocket's ``Origin`` is checked before it is accepted
(403 otherwise); the polling channel answers CORS (and its preflight) for those
origins only, and refuses every other ``Origin`` with 403. A poll session is bound
to the origin that opened it: its token sent from another origin is refused (403).
"""

from __future__ import annotations

import contextlib
import math
import secrets
from typing import TYPE_CHECKING, Any

import cbor2
import structlog
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from amqlite.auth import AuthenticatedUser
from amqlite.browser import FrameError, Outbox, codec
from amqlite.errors import AmqliteError, ReplyCode
from amqlite.web import STATIC_DIR

from ..dispatch import RequestDispatcher
from ..endpoints.browser import BrowserEndpoint

if TYPE_CHECKING:
    from amqlite.broker.alarms import Resource

    from ..context import NodeView

__all__ = ["POLL_WAIT", "BrowserChannels", "BrowserConnection"]

#: the longest a poll is held
POLL_WAIT = 25.0
#: bytes of frames one WebSocket message or poll answer carries, about
BATCH_BYTES = 256 * 1024
#: poll sessions per node (the oldest idle one goes past it)
MAX_POLL_SESSIONS = 4096
SESSION_HEADER = "x-amqlite-session"
_WS_CLOSE_POLICY = 1008
_WS_CLOSE_GOING_AWAY = 1001

log = structlog.get_logger("amqlite.http")


class Refusal(Exception):
    """A session the node will not open: ``code`` (a reply code) and ``text``."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


#: refusal codes -> HTTP status of ``POST /poll/open``
_OPEN_STATUS: dict[int, int] = {
    ReplyCode.ACCESS_REFUSED: 403,
    ReplyCode.NOT_ACTIVE: 503,
    ReplyCode.NOT_FOUND: 404,
    ReplyCode.SYNTAX_ERROR: 400,
}


class BrowserConnection:
    """One browser session in the node's connections: its outbox, its endpoint
    (once open) and how the channel is woken."""

    role = "client"

    def __init__(self, node: NodeView, kind: str, remote: str, host: str, tls: bool) -> None:
        self.node = node
        self.kind = kind
        self.remote_address = remote
        self.remote_host = host
        self.tls = tls
        self.user = ""
        self.origin: str | None = None
        self.token = ""
        self.outbox = Outbox()
        self.endpoint: BrowserEndpoint | None = None
        self.closing: tuple[int, str] | None = None
        self.last_seen = trio.current_time()
        self.polls = 0  # polls held now
        self._wake = trio.Event()
        self._released = False

    def wake(self) -> None:
        self._wake.set()

    async def wait(self) -> None:
        """Until frames wait, the session is closed or :meth:`wake` is called."""
        await self._wake.wait()
        self._wake = trio.Event()

    def close_from_server(self, code: int, text: str) -> None:
        """Close the session (shutdown, HA fencing, the management API): the page
        gets ``close`` {code, text}, then the channel ends."""
        if self.closing is not None or self._released:
            return
        self.closing = (code, text)
        self.outbox.add(codec.notice("close", code=code, text=text))
        # the broker session ends now (its unacked messages go back to their
        # queues); the page still gets what waits in the outbox, then the close
        self.release()

    def alarms_changed(self, raised: frozenset[Resource]) -> None:
        """Publishes are refused while an alarm is raised (the endpoint checks)."""

    def info(self) -> dict[str, Any] | None:
        return self.endpoint.info() if self.endpoint is not None else None

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """The channel is gone: close the broker session, leave the node."""
        if self._released:
            return
        self._released = True
        if self.endpoint is not None:
            self.endpoint.closed(trio.current_time())
            self.node.remove_connection(self)
        self.wake()


def _own_origin(scope: dict[str, Any]) -> str | None:
    host = None
    for key, value in scope.get("headers", ()):
        if key == b"host":
            host = value.decode("latin-1").lower()
    if host is None:
        return None
    scheme = scope.get("scheme", "http")
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    return f"{scheme}://{host}"


class BrowserChannels:
    """The routes of both channels and their poll sessions."""

    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.allowed = frozenset(node.config.http.allowed_origins)
        self.max_frame = 2 * node.config.server.max_frame_bytes  # JSON and base64 cost
        self.sessions: dict[str, BrowserConnection] = {}
        self.idle = node.config.http.poll_idle
        self.ws_heartbeat = node.config.http.ws_heartbeat
        self._script = (STATIC_DIR / "amqlite.js").read_bytes()

    def routes(self) -> list[Route | WebSocketRoute]:
        return [
            WebSocketRoute("/ws", self.websocket),
            Route("/poll/open", self.poll_open, methods=["POST", "OPTIONS"]),
            Route("/poll/send", self.poll_send, methods=["POST", "OPTIONS"]),
            Route("/poll/recv", self.poll_recv, methods=["GET", "OPTIONS"]),
            Route("/poll/close", self.poll_close, methods=["POST", "OPTIONS"]),
            Route("/js/amqlite.js", self.script),
        ]

    # --- origins -----------------------------------------------------------------------

    def origin_allowed(self, scope: dict[str, Any]) -> tuple[bool, str | None]:
        """(may this request go on, the ``Origin`` it came with). No ``Origin``
        (not a cross-origin browser request) is allowed: the session token guards."""
        origin = None
        for key, value in scope.get("headers", ()):
            if key == b"origin":
                origin = value.decode("latin-1").lower()
        if origin is None:
            return True, None
        return origin in self.allowed or origin == _own_origin(scope), origin

    @staticmethod
    def _cors(origin: str | None) -> dict[str, str]:
        if origin is None:
            return {}
        return {"access-control-allow-origin": origin, "vary": "Origin"}

    def _refuse_origin(self, origin: str | None) -> Response:
        reason = f"origin {origin!r} is not allowed ([http] allowed_origins)"
        log.warning("browser_origin_refused", origin=origin)
        return JSONResponse({"error": "access_refused", "reason": reason}, status_code=403)

    def _preflight(self, request: Request) -> Response | None:
        """The answer to a CORS preflight or a refused origin (None: go on)."""
        ok, origin = self.origin_allowed(dict(request.scope))
        if not ok:
            return self._refuse_origin(origin)
        if request.method == "OPTIONS":
            headers = {
                **self._cors(origin),
                "access-control-allow-methods": "GET, POST",
                "access-control-allow-headers": f"content-type, {SESSION_HEADER}",
                "access-control-max-age": "600",
            }
            return Response(status_code=204, headers=headers)
        return None

    # --- opening a session -------------------------------------------------------------

    async def open_session(self, conn: BrowserConnection, hello: Any) -> dict[str, Any]:
        """Authenticate ``hello`` (a parsed JSON object) and open ``conn``'s
        session; the welcome's fields. Refusal when the node will not."""
        if type(hello) is not dict:
            raise Refusal(ReplyCode.SYNTAX_ERROR, "the hello must be a JSON object")
        login = hello.get("login", "guest")
        password = hello.get("password", "guest")
        vhost = hello.get("vhost", "/")
        client = hello.get("client", "")
        if not all(type(v) is str for v in (login, password, vhost, client)):
            raise Refusal(ReplyCode.SYNTAX_ERROR, "login, password, vhost and client must be text")
        node = self.node
        auth = node.authenticator
        args = (login, password, vhost, conn.remote_host)
        if auth.guest_only:
            result = auth.authenticate(*args)
        else:
            result = await trio.to_thread.run_sync(auth.authenticate, *args)
        if not isinstance(result, AuthenticatedUser):
            log.warning(
                "connection_refused",
                remote=conn.remote_address,
                channel=conn.kind,
                login=login,
                vhost=vhost,
                code=result.code,
                reason=result.log_reason,
            )
            raise Refusal(result.code, result.text)
        if node.ha is not None:
            deadline = trio.current_time() + 2 * node.ha.config.failover_timeout_ms / 1000
            admitted, why = await node.ha.admit(deadline)
            if not admitted:
                raise Refusal(ReplyCode.NOT_ACTIVE, f"node {node.node_id} is {node.state}: {why}")
        reached = node.admit_connection(conn, result.name)
        if reached is not None:
            raise Refusal(reached.code, reached.text)
        try:
            session = node.broker.open_session(vhost, owner=None)
        except AmqliteError as exc:
            node.remove_connection(conn)
            raise Refusal(exc.code, exc.text) from None
        peered = node.peering.hook_for(vhost) if node.peering is not None else None
        dispatcher = RequestDispatcher(session, result, vhost, node.status, peered=peered)
        endpoint = BrowserEndpoint(
            node, conn, session, dispatcher, conn.outbox,
            user=result.name, vhost=vhost, client=client, connected_at=trio.current_time(),
        )  # fmt: skip
        session.owner = endpoint
        conn.user = result.name
        conn.endpoint = endpoint
        node.add_connection(conn)
        log.info(
            "connection_opened",
            remote=conn.remote_address,
            user=result.name,
            vhost=vhost,
            client=client,
            role="client",
            channel=conn.kind,
        )
        return {
            "server": node.node_id,
            "version": node.version,
            "state": node.state,
            "cluster": node.cluster_addresses,
            "max_frame": self.max_frame,
        }

    def _run(self, conn: BrowserConnection, value: Any) -> None:
        """Run one parsed frame (or an array of them) on ``conn``'s session."""
        endpoint = conn.endpoint
        if endpoint is None or conn.closing is not None:
            return
        frames = value if type(value) is list else [value]
        now = trio.current_time()
        try:
            for frame in frames:
                try:
                    event = codec.decode_request(frame)
                except FrameError as exc:
                    log.info(
                        "bad_request", remote=conn.remote_address, code=exc.code, text=exc.text
                    )
                    endpoint.send_text(exc.reply)
                    continue
                endpoint.handle(event, now)
        finally:
            self.node.pump()

    # --- the WebSocket -----------------------------------------------------------------

    async def websocket(self, ws: WebSocket) -> None:
        scope = dict(ws.scope)
        ok, origin = self.origin_allowed(scope)
        if not ok:
            log.warning("browser_origin_refused", origin=origin, channel="ws")
            await ws.close(_WS_CLOSE_POLICY)  # before the accept: HTTP 403
            return
        await ws.accept()
        host, port = (scope.get("client") or ("", 0))[:2]
        remote = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        conn = BrowserConnection(self.node, "ws", remote, str(host), scope.get("scheme") == "wss")
        try:
            if not await self._ws_hello(ws, conn):
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._ws_writer, ws, conn, nursery.cancel_scope)
                await self._ws_reader(ws, conn)
                nursery.cancel_scope.cancel()
        except WebSocketDisconnect:
            pass
        finally:
            conn.release()
            if ws.application_state is WebSocketState.CONNECTED:
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    code, _ = conn.closing or (1000, "")
                    await _ws_close(ws, _WS_CLOSE_GOING_AWAY if code else 1000)

    async def _ws_receive(self, ws: WebSocket) -> Any:
        """The next frame's JSON value; None when the page went away."""
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        text = message.get("text")
        if text is not None:
            return codec.parse(text)
        try:
            return cbor2.loads(message.get("bytes") or b"")
        except Exception as exc:  # cbor2 raises many kinds on bad input
            raise FrameError(None, ReplyCode.SYNTAX_ERROR, f"not CBOR: {exc}") from None

    async def _ws_hello(self, ws: WebSocket, conn: BrowserConnection) -> bool:
        timeout = self.node.config.limits.handshake_timeout
        with trio.move_on_after(timeout):
            try:
                hello = await self._ws_receive(ws)
            except FrameError as exc:
                await ws.send_text(exc.reply)
                return False
            if hello is None:
                return False
            rid = hello.get("id") if type(hello) is dict else None
            try:
                if type(hello) is not dict or hello.get("m") != "hello":
                    raise Refusal(ReplyCode.UNEXPECTED_FRAME, "send 'hello' first")
                welcome = await self.open_session(conn, hello)
            except Refusal as exc:
                refused = codec.notice("refused", re=rid, code=exc.code, text=exc.text)
                await ws.send_text(refused)
                await _ws_close(ws, _WS_CLOSE_POLICY)
                return False
            await ws.send_text(
                codec.notice(
                    "welcome", re=rid, channel="ws", heartbeat=self.ws_heartbeat, **welcome
                )
            )
            return True
        log.warning("handshake_timeout", remote=conn.remote_address, listener="ws")
        return False

    async def _ws_reader(self, ws: WebSocket, conn: BrowserConnection) -> None:
        silence = 3 * self.ws_heartbeat or math.inf
        while conn.closing is None:
            try:
                with trio.move_on_after(silence) as waited:
                    value = await self._ws_receive(ws)
            except FrameError as exc:
                if conn.endpoint is not None:
                    conn.endpoint.send_text(exc.reply)
                continue
            if waited.cancelled_caught:
                # a page that vanished without closing (a closed laptop, a dropped
                # network): its session and unacked messages go now, not when TCP
                # gives up minutes later
                log.info("browser_session_silent", remote=conn.remote_address, seconds=silence)
                conn.close_from_server(ReplyCode.CONNECTION_FORCED, "no heartbeat from the page")
                break
            if value is None:
                return
            if type(value) is dict and value.get("m") == "heartbeat":
                continue  # it lives: that is all a heartbeat says
            self._run(conn, value)
        await trio.sleep_forever()  # the writer ends the channel after the close frame

    async def _ws_writer(
        self, ws: WebSocket, conn: BrowserConnection, scope: trio.CancelScope
    ) -> None:
        outbox = conn.outbox
        quiet = self.ws_heartbeat or math.inf
        while True:
            with trio.move_on_after(quiet) as waited:
                await conn.wait()
            if waited.cancelled_caught:  # nothing to send for a while: say we live
                await ws.send_text(_HEARTBEAT)
                continue
            while len(outbox):
                frames = outbox.take(BATCH_BYTES)
                if conn.endpoint is not None:
                    conn.endpoint.taken()
                await ws.send_text(frames[0] if len(frames) == 1 else f"[{','.join(frames)}]")
            if conn.closing is not None or conn.endpoint is None:
                scope.cancel()
                return

    # --- long polling ------------------------------------------------------------------

    def _poll_session(self, request: Request) -> tuple[BrowserConnection | None, Response | None]:
        """The session a poll request names, or the error to answer."""
        early = self._preflight(request)
        if early is not None:
            return None, early
        _, origin = self.origin_allowed(dict(request.scope))
        cors = self._cors(origin)
        token = request.headers.get(SESSION_HEADER, "")
        conn = self.sessions.get(token) if token else None
        now = trio.current_time()
        if conn is not None and conn.polls == 0 and now - conn.last_seen > self.idle:
            self._end(conn, "expired")
            conn = None
        if conn is None:
            reason = (
                "no session: open one with POST /poll/open"
                if not token
                else ("no such session (it expired or was closed): open a new one")
            )
            body = {"error": "not_authorised", "reason": reason}
            return None, JSONResponse(body, status_code=401, headers=cors)
        if origin is not None and origin != conn.origin:
            log.warning("browser_session_origin_refused", origin=origin, session_origin=conn.origin)
            reason = "this session was opened from another origin"
            body = {"error": "access_refused", "reason": reason}
            return None, JSONResponse(body, status_code=403, headers=cors)
        conn.last_seen = now
        return conn, None

    async def _read_body(self, request: Request) -> bytes | None:
        """The body, or None past the largest frame."""
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_frame:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, cors: dict[str, str]) -> Response:
        reason = f"the body is larger than {self.max_frame} bytes"
        # the rest of the body is left unread, so this connection cannot carry another
        # request: say so, or a keep-alive client sends its next one into the close
        headers = {**cors, "connection": "close"}
        return JSONResponse(
            {"error": "too_large", "reason": reason}, status_code=413, headers=headers
        )

    async def poll_open(self, request: Request) -> Response:
        early = self._preflight(request)
        if early is not None:
            return early
        _, origin = self.origin_allowed(dict(request.scope))
        cors = self._cors(origin)
        body = await self._read_body(request)
        if body is None:
            return self._too_large(cors)
        host, port = request.client if request.client is not None else ("", 0)
        remote = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        conn = BrowserConnection(self.node, "poll", remote, host, request.url.scheme == "https")
        try:
            try:
                hello = codec.parse(body)
            except FrameError as exc:
                raise Refusal(exc.code, exc.text) from None
            welcome = await self.open_session(conn, hello)
        except Refusal as exc:
            status = _OPEN_STATUS.get(exc.code, 403)
            body_json = {"error": "refused", "code": exc.code, "reason": exc.text}
            return JSONResponse(body_json, status_code=status, headers=cors)
        conn.origin = origin
        conn.token = secrets.token_urlsafe(32)
        self._make_room()
        self.sessions[conn.token] = conn
        welcome = {"m": "welcome", "session": conn.token, "channel": "poll", **welcome}
        welcome["idle"] = self.idle
        return JSONResponse(welcome, headers=cors)

    def _make_room(self) -> None:
        while len(self.sessions) >= MAX_POLL_SESSIONS:
            idle = [c for c in self.sessions.values() if c.polls == 0]
            if not idle:
                break
            self._end(min(idle, key=lambda c: c.last_seen), "evicted")

    async def poll_send(self, request: Request) -> Response:
        conn, error = self._poll_session(request)
        if conn is None:
            assert error is not None
            return error
        cors = self._cors(conn.origin)
        body = await self._read_body(request)
        if body is None:
            return self._too_large(cors)
        try:
            value = codec.parse(body)
        except FrameError as exc:
            body_json = {"error": "bad_request", "reason": exc.text}
            return JSONResponse(body_json, status_code=400, headers=cors)
        self._run(conn, value)
        return Response(status_code=204, headers=cors)

    async def poll_recv(self, request: Request) -> Response:
        conn, error = self._poll_session(request)
        if conn is None:
            assert error is not None
            return error
        cors = self._cors(conn.origin)
        try:
            ack = int(request.query_params.get("ack", "0"))
            wait = float(request.query_params.get("wait", str(POLL_WAIT)))
            if not math.isfinite(wait):
                raise ValueError
        except ValueError:
            reason = "ack must be an integer and wait a number of seconds"
            return JSONResponse({"error": "bad_request", "reason": reason}, 400, headers=cors)
        outbox = conn.outbox
        outbox.ack(ack)
        if conn.endpoint is not None:
            conn.endpoint.taken()
        conn.polls += 1
        try:
            with trio.move_on_after(min(max(wait, 0.0), POLL_WAIT)):
                while not outbox.after(ack, 1) and conn.closing is None:
                    await conn.wait()
                    if conn.released:
                        break
        finally:
            conn.polls -= 1
            conn.last_seen = trio.current_time()
        frames = outbox.after(ack, BATCH_BYTES)
        last = frames[-1][0] if frames else ack
        text = f'{{"last":{last},"frames":[{",".join(f for _, f in frames)}]}}'
        if conn.closing is not None and last >= outbox.last_seq:
            self._end(conn, "closed by the server")
        return Response(text, media_type="application/json", headers=cors)

    async def poll_close(self, request: Request) -> Response:
        conn, error = self._poll_session(request)
        if conn is None:
            assert error is not None
            return error
        self._end(conn, "closed by the page")
        return Response(status_code=204, headers=self._cors(conn.origin))

    def _end(self, conn: BrowserConnection, why: str) -> None:
        self.sessions.pop(conn.token, None)
        if conn.endpoint is not None:
            log.info("poll_session_ended", remote=conn.remote_address, user=conn.user, why=why)
        conn.release()

    async def run(self) -> None:
        """End poll sessions left idle (runs beside the listener)."""
        while True:
            await trio.sleep(1.0)
            now = trio.current_time()
            for conn in list(self.sessions.values()):
                if conn.polls == 0 and now - conn.last_seen > self.idle:
                    self._end(conn, "expired")

    # --- the JS client -----------------------------------------------------------------

    async def script(self, request: Request) -> Response:
        headers = {
            "access-control-allow-origin": "*",  # a page on any origin may import it
            "cache-control": "no-cache",
            "x-content-type-options": "nosniff",
        }
        return Response(self._script, media_type="text/javascript; charset=utf-8", headers=headers)


_HEARTBEAT = '{"m":"heartbeat"}'


async def _ws_close(ws: WebSocket, code: int) -> None:
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await ws.close(code)  # (unless the page closed it already)
