"""The management API's route table: RabbitMQ's paths, amqlite's broker.

Reads map the node's status (cut to the user's vhosts unless the user has the
``monitoring`` tag, :func:`~amqlite.server.status_view.visible_status`) to
RabbitMQ's JSON (:mod:`.views`). Changes need the ``administrator`` tag and the
user's vhost permissions, and run as a client's requests do (:mod:`.actions`).

Errors are JSON ``{"error": ..., "reason": ...}`` as RabbitMQ's: 400 bad JSON
or a refused precondition, 401 no or wrong credentials (:mod:`.login`), 403 a
missing tag or permission, 404 an unknown vhost, exchange, queue or binding,
503 a node that takes no changes now (a passive HA node) or a publish while an
alarm blocks publishers.

Path segments arrive percent-encoded (``%2F`` is the vhost ``/``): the app runs
behind :class:`RawPath`, and every handler decodes its parameters itself.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from amqlite.auth import AuthenticatedUser, AuthRefused, require_tag
from amqlite.errors import AccessRefused, ReplyCode
from amqlite.protocol import events as ev
from amqlite.protocol.codec import SHORT_TEXT_MAX, is_short_text

from ..status_view import visible_status
from . import views
from .actions import SERVING_STATES, ActionSession, NotServing, open_action_session
from .login import USER_SCOPE_KEY
from .messages import BadMessage, message_json, publish_fields
from .rates import RateSampler

if TYPE_CHECKING:
    from ..context import NodeView

__all__ = ["ManagementApi", "RawPath"]

Handler = Callable[[Request], Awaitable[Response]]

#: broker reply codes -> HTTP status (RabbitMQ answers a refused precondition with 400)
_HTTP_STATUS: dict[int, int] = {
    ReplyCode.ACCESS_REFUSED: 403,
    ReplyCode.NOT_FOUND: 404,
    ReplyCode.RESOURCE_LOCKED: 400,
    ReplyCode.PRECONDITION_FAILED: 400,
    ReplyCode.NOT_ALLOWED: 400,
    ReplyCode.SYNTAX_ERROR: 400,
    ReplyCode.COMMAND_INVALID: 400,
    ReplyCode.RESOURCE_ERROR: 503,
}
_ACK_MODES = (
    "ack_requeue_true",
    "reject_requeue_true",
    "ack_requeue_false",
    "reject_requeue_false",
)
_MAX_GET = 1000


class ApiJson(JSONResponse):
    """JSON that also carries what the broker's maps may hold beyond JSON's types:
    bytes (a header or argument value) as text when UTF-8, else base64."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=False, separators=(",", ":"), default=_plain
        ).encode("utf-8")


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    return repr(value)


class ApiError(Exception):
    """Answered as ``{"error": error, "reason": reason}`` with ``status``."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason


def _not_found(what: str) -> ApiError:
    return ApiError(404, "Object Not Found", f"{what} not found")


def _error_response(exc: ApiError) -> ApiJson:
    return ApiJson({"error": exc.error, "reason": exc.reason}, status_code=exc.status)


class RawPath:
    """Route on the path as sent (``scope["raw_path"]``), still percent-encoded,
    so ``/api/queues/%2F/q`` keeps its vhost ``/`` in one segment."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path")
        if scope["type"] == "http" and raw:
            scope = {**scope, "path": raw.split(b"?", 1)[0].decode("latin-1")}
        await self.app(scope, receive, send)


#: the largest body :class:`ReadTheBody` reads before the app answers; a larger one
#: (or one sent chunked) goes to the app as it comes. It is read before the
#: credentials are checked, so it bounds what a client without them can make the
#: broker hold per connection: API bodies are far smaller
BODY_FIRST_MAX = 64 * 1024


class ReadTheBody:
    """Read a request's whole body (up to ``BODY_FIRST_MAX``) before the app sees
    the request, so that no answer goes out before the body is in: the connection
    can then carry the client's next request, whatever the answer.

    Why: hypercorn starts the next request on a keep-alive connection only once it
    has the whole of the last one; else it closes the connection when the response
    ends, without a ``Connection: close`` on it. An answer given before the body came
    (a 401, a 403 or a 404 refused before the handler reads the body) so closed
    the connection under a client that had sent its next request meanwhile (httpx,
    a browser): "server disconnected", and that request lost. Handlers read the body
    as before (``request.body()``), from what was read here."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = _content_length(scope) if scope["type"] == "http" else None
        if length is None or length == 0 or length > BODY_FIRST_MAX:
            await self.app(scope, receive, send)
            return
        parts: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                break
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        whole: list[Any] = [{"type": "http.request", "body": b"".join(parts), "more_body": False}]
        if message["type"] != "http.request":
            whole = [message]

        async def replay() -> Any:
            return whole.pop() if whole else await receive()

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    """The request's Content-Length, or None (none, chunked, or not a number)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _param(request: Request, name: str) -> str:
    return unquote(request.path_params[name], errors="strict")


def _exchange_name(request: Request) -> str:
    name = _param(request, "name")
    return "" if name == views.DEFAULT_EXCHANGE else name


def _short(what: str, text: str) -> str:
    """A name or binding key to declare: at most SHORT_TEXT_MAX bytes (an AMQP short
    string, as the native protocol checks), or 400. A longer one would make a queue
    or exchange no AMQP client can name."""
    if not is_short_text(text):
        raise ApiError(400, "bad_request", f"{what} must be at most {SHORT_TEXT_MAX} bytes")
    return text


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "false").lower() == "true"


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "bad_request", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "the body must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name, default)
    if kind is int and isinstance(value, bool):
        raise ApiError(400, "bad_request", f"{name} must be an integer")
    if not isinstance(value, kind):
        raise ApiError(400, "bad_request", f"{name} must be {_KIND_NAMES[kind]}")
    return value


_KIND_NAMES = {bool: "true or false", str: "a string", dict: "a JSON object", int: "an integer"}


def _refusal(reply: ev.Event | None) -> ApiError | None:
    if isinstance(reply, ev.Error | ev.Nacked):
        status = _HTTP_STATUS.get(reply.code, 500)
        error = {403: "access_refused", 404: "Object Not Found"}.get(status, "bad_request")
        return ApiError(status, error, reply.text)
    return None


#: how old a status the reads may answer from (a page polls several paths at once)
STATUS_MAX_AGE = 1.0


class ManagementApi:
    """The handlers, bound to one node and its rate sampler.

    Reads share one status map for up to ``STATUS_MAX_AGE`` seconds, so a page or a
    monitor asking several paths at once costs the node one status walk; a change
    made here drops it, so the next read shows the change."""

    def __init__(self, node: NodeView, rates: RateSampler) -> None:
        self.node = node
        self.rates = rates
        self._cached: tuple[float, dict[str, Any]] | None = None

    def node_status(self) -> dict[str, Any]:
        now = trio.current_time()
        cached = self._cached
        if cached is None or now - cached[0] > STATUS_MAX_AGE:
            cached = self._cached = (now, self.node.status())
        return cached[1]

    # --- plumbing --------------------------------------------------------------------

    def routes(self) -> list[Route]:
        def route(path: str, handler: Handler, methods: tuple[str, ...] = ("GET",)) -> Route:
            return Route(path, self._guarded(handler), methods=list(methods))

        a = "/api"
        q = f"{a}/queues/{{vhost}}/{{name}}"
        x = f"{a}/exchanges/{{vhost}}/{{name}}"
        b = f"{a}/bindings/{{vhost}}/e/{{source}}/q/{{destination}}"
        return [
            route(f"{a}/overview", self.get_overview),
            route(f"{a}/whoami", self.get_whoami),
            route(f"{a}/nodes", self.get_nodes),
            route(f"{a}/nodes/{{node}}", self.get_node),
            route(f"{a}/vhosts", self.get_vhosts),
            route(f"{a}/vhosts/{{vhost}}", self.get_vhost),
            route(f"{a}/exchanges", self.get_exchanges),
            route(f"{a}/exchanges/{{vhost}}", self.get_exchanges),
            route(x, self.get_exchange),
            route(x, self.put_exchange, ("PUT",)),
            route(x, self.delete_exchange, ("DELETE",)),
            route(f"{x}/bindings/source", self.get_exchange_bindings),
            route(f"{x}/publish", self.publish, ("POST",)),
            route(f"{a}/queues", self.get_queues),
            route(f"{a}/queues/{{vhost}}", self.get_queues),
            route(q, self.get_queue),
            route(q, self.put_queue, ("PUT",)),
            route(q, self.delete_queue, ("DELETE",)),
            route(f"{q}/bindings", self.get_queue_bindings),
            route(f"{q}/contents", self.purge_queue, ("DELETE",)),
            route(f"{q}/get", self.get_messages, ("POST",)),
            route(f"{a}/bindings", self.get_bindings),
            route(f"{a}/bindings/{{vhost}}", self.get_bindings),
            route(b, self.get_pair_bindings),
            route(b, self.post_binding, ("POST",)),
            route(f"{b}/{{props}}", self.get_binding),
            route(f"{b}/{{props}}", self.delete_binding, ("DELETE",)),
            route(f"{a}/connections", self.get_connections),
            route(f"{a}/connections/{{name}}", self.get_connection),
            route(f"{a}/connections/{{name}}", self.delete_connection, ("DELETE",)),
            route(f"{a}/health/checks/alarms", self.check_alarms),
            route(f"{a}/health/checks/local-alarms", self.check_alarms),
            route(f"{a}/health/checks/virtual-hosts", self.check_vhosts),
            route(f"{a}/health/checks/port-listener/{{port}}", self.check_port),
            route(f"{a}/health/checks/protocol-listener/{{protocol}}", self.check_protocol),
            route(f"{a}/health/checks/ready-to-serve-clients", self.check_serving),
            route(f"{a}/ha", self.get_ha),
            route(f"{a}/links", self.get_links),
            route(f"{a}/journal", self.get_journal),
        ]

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            change = request.method != "GET"
            if change:
                self._cached = None  # the next read must show it
            try:
                return await handler(request)
            except ApiError as exc:
                return _error_response(exc)
            except NotServing as exc:
                return _error_response(ApiError(503, "not_serving", str(exc)))
            except AccessRefused as exc:
                return _error_response(ApiError(403, "access_refused", exc.text))
            except UnicodeDecodeError:
                return _error_response(ApiError(400, "bad_request", "bad percent-encoding"))
            finally:
                if change:  # a read while it ran may have cached the state before it
                    self._cached = None

        return guarded

    @staticmethod
    def _user(request: Request) -> AuthenticatedUser:
        user: AuthenticatedUser = request.scope[USER_SCOPE_KEY]
        return user

    def _status(self, request: Request) -> dict[str, Any]:
        status = self.node_status()
        user = self._user(request)
        if user.has_tag("monitoring"):
            return status
        return visible_status(status, user)

    def _vhost(self, request: Request, status: dict[str, Any]) -> str:
        vhost = _param(request, "vhost")
        if not any(h["name"] == vhost for h in status.get("vhosts", [])):
            raise _not_found(f"vhost {vhost!r}")
        return vhost

    def _monitoring(self, request: Request, what: str) -> dict[str, Any]:
        user = self._user(request)
        require_tag(user, "monitoring", f"reading {what}")
        return self.node_status()

    # --- reads -----------------------------------------------------------------------

    async def get_overview(self, request: Request) -> Response:
        user = self._user(request)
        return ApiJson(views.overview(self._status(request), self.rates, user.name))

    async def get_whoami(self, request: Request) -> Response:
        user = self._user(request)
        return ApiJson({"name": user.name, "tags": sorted(user.tags)})

    async def get_nodes(self, request: Request) -> Response:
        return ApiJson([views.node_view(self._status(request))])

    async def get_node(self, request: Request) -> Response:
        status = self._status(request)
        if _param(request, "node") != status.get("node_id"):
            raise _not_found("node")
        return ApiJson(views.node_view(status))

    async def get_vhosts(self, request: Request) -> Response:
        return ApiJson(views.vhost_views(self._status(request), self.rates))

    async def get_vhost(self, request: Request) -> Response:
        status = self._status(request)
        vhost = self._vhost(request, status)
        found = [v for v in views.vhost_views(status, self.rates) if v["name"] == vhost]
        return ApiJson(found[0])

    async def get_exchanges(self, request: Request) -> Response:
        status = self._status(request)
        vhost = self._vhost(request, status) if "vhost" in request.path_params else None
        return ApiJson(views.exchange_views(status, vhost))

    async def get_exchange(self, request: Request) -> Response:
        status = self._status(request)
        vhost, name = self._vhost(request, status), _exchange_name(request)
        for ex in views.exchange_views(status, vhost):
            if ex["name"] == name:
                return ApiJson(ex)
        raise _not_found(f"exchange {name!r} in vhost {vhost!r}")

    async def get_queues(self, request: Request) -> Response:
        status = self._status(request)
        vhost = self._vhost(request, status) if "vhost" in request.path_params else None
        return ApiJson(views.queue_views(status, self.rates, vhost))

    def _queue(self, request: Request, status: dict[str, Any]) -> dict[str, Any]:
        vhost, name = self._vhost(request, status), _param(request, "name")
        for q in views.queue_views(status, self.rates, vhost):
            if q["name"] == name:
                return q
        raise _not_found(f"queue {name!r} in vhost {vhost!r}")

    async def get_queue(self, request: Request) -> Response:
        return ApiJson(self._queue(request, self._status(request)))

    async def get_bindings(self, request: Request) -> Response:
        status = self._status(request)
        vhost = self._vhost(request, status) if "vhost" in request.path_params else None
        return ApiJson(views.binding_views(status, vhost))

    async def get_exchange_bindings(self, request: Request) -> Response:
        status = self._status(request)
        vhost, name = self._vhost(request, status), _exchange_name(request)
        if not any(ex["name"] == name for ex in views.exchange_views(status, vhost)):
            raise _not_found(f"exchange {name!r} in vhost {vhost!r}")
        return ApiJson([b for b in views.binding_views(status, vhost) if b["source"] == name])

    async def get_queue_bindings(self, request: Request) -> Response:
        status = self._status(request)
        queue = self._queue(request, status)
        found = views.binding_views(status, queue["vhost"])
        return ApiJson([b for b in found if b["destination"] == queue["name"]])

    def _pair(self, request: Request, status: dict[str, Any]) -> list[dict[str, Any]]:
        vhost = self._vhost(request, status)
        source = _param(request, "source")
        source = "" if source == views.DEFAULT_EXCHANGE else source
        destination = _param(request, "destination")
        if not any(ex["name"] == source for ex in views.exchange_views(status, vhost)):
            raise _not_found(f"exchange {source!r} in vhost {vhost!r}")
        if not any(q["name"] == destination for q in views.queue_views(status, self.rates, vhost)):
            raise _not_found(f"queue {destination!r} in vhost {vhost!r}")
        return [
            b
            for b in views.binding_views(status, vhost)
            if b["source"] == source and b["destination"] == destination
        ]

    async def get_pair_bindings(self, request: Request) -> Response:
        return ApiJson(self._pair(request, self._status(request)))

    def _binding(self, request: Request, status: dict[str, Any]) -> dict[str, Any]:
        props = _param(request, "props")
        for b in self._pair(request, status):
            if b["properties_key"] == props:
                return b
        raise _not_found("binding")

    async def get_binding(self, request: Request) -> Response:
        return ApiJson(self._binding(request, self._status(request)))

    async def get_connections(self, request: Request) -> Response:
        return ApiJson(views.connection_views(self._status(request)))

    async def get_connection(self, request: Request) -> Response:
        name = _param(request, "name")
        for c in views.connection_views(self._status(request)):
            if c["name"] == name:
                return ApiJson(c)
        raise _not_found("connection")

    async def delete_connection(self, request: Request) -> Response:
        """Close a client connection (code 320, the reason from ``X-Reason``)."""
        name = _param(request, "name")
        require_tag(self._user(request), "administrator", "closing a connection")
        status = self.node.status()
        for conn in list(self.node.connections):
            info = conn.info()
            if info is None:
                continue
            (view,) = views.connection_views({**status, "connections": [info]})
            if view["name"] == name:
                reason = request.headers.get("x-reason", "closed via the management API")
                conn.close_from_server(ReplyCode.CONNECTION_FORCED, reason)
                return Response(status_code=204)
        raise _not_found("connection")

    # --- RabbitMQ's health checks (/api/health/checks/...): 200 ok, 503 failed -------

    @staticmethod
    def _check(problem: str | None) -> Response:
        if problem is None:
            return ApiJson({"status": "ok"})
        return ApiJson({"status": "failed", "reason": problem}, status_code=503)

    async def check_alarms(self, request: Request) -> Response:
        raised = sorted(r.value for r in self.node.alarms_raised)
        return self._check(f"alarms in effect: {', '.join(raised)}" if raised else None)

    async def check_vhosts(self, request: Request) -> Response:
        return self._check(None)  # a vhost runs while the node does: nothing can stop one

    async def check_port(self, request: Request) -> Response:
        port = _param(request, "port")
        listeners = views.listeners(self.node_status())
        found = any(str(listener["port"]) == port for listener in listeners)
        return self._check(None if found else f"no listener on port {port}")

    async def check_protocol(self, request: Request) -> Response:
        protocol = _param(request, "protocol").lower()
        aliases = {"amqp091": "amqp", "amqp0-9-1": "amqp", "management": "http"}
        wanted = aliases.get(protocol, protocol)
        listeners = views.listeners(self.node_status())
        found = any(listener["protocol"] == wanted for listener in listeners)
        return self._check(None if found else f"no listener for protocol {protocol!r}")

    async def check_serving(self, request: Request) -> Response:
        state = self.node.state
        serving = state in SERVING_STATES
        return self._check(None if serving else f"node {self.node.node_id} is {state}")

    async def get_ha(self, request: Request) -> Response:
        status = self._monitoring(request, "the HA pair's state")
        return ApiJson(status.get("ha") or {"role": "standalone", "state": status["state"]})

    async def get_links(self, request: Request) -> Response:
        return ApiJson(self._monitoring(request, "the peering links").get("links", []))

    async def get_journal(self, request: Request) -> Response:
        return ApiJson(self._monitoring(request, "the journal").get("storage", {}))

    # --- changes ---------------------------------------------------------------------

    def _actor(self, request: Request, vhost: str) -> AuthenticatedUser:
        """The user with ``vhost``'s permissions; 403 without ``administrator``."""
        user = self._user(request)
        require_tag(user, "administrator", f"{request.method} {request.url.path}")
        if vhost not in self.node.config.server.vhosts:
            raise _not_found(f"vhost {vhost!r}")
        result = self.node.authenticator.authorize(user.name, vhost)
        if isinstance(result, AuthRefused):
            raise ApiError(403, "access_refused", result.text)
        return result

    async def _run(self, session: ActionSession, event: ev.Event) -> ev.Event | None:
        reply = await session.request(event)
        refusal = _refusal(reply)
        if refusal is not None:
            raise refusal
        return reply

    async def put_exchange(self, request: Request) -> Response:
        vhost, name = _param(request, "vhost"), _short("an exchange name", _exchange_name(request))
        user = self._actor(request, vhost)
        body = await _json_body(request)
        kind = _field(body, "type", str, "")
        if not kind:
            raise ApiError(400, "bad_request", "type is required (direct, fanout, topic, headers)")
        async with open_action_session(self.node, user, vhost) as session:
            exists = await session.request(
                ev.ExchangeDeclare(session.next_id(), name, passive=True)
            )
            await self._run(
                session,
                ev.ExchangeDeclare(
                    session.next_id(),
                    name,
                    kind,
                    durable=_field(body, "durable", bool, True),
                    auto_delete=_field(body, "auto_delete", bool, False),
                    internal=_field(body, "internal", bool, False),
                    arguments=_field(body, "arguments", dict, {}),
                ),
            )
        return Response(status_code=204 if isinstance(exists, ev.Ok) else 201)

    async def delete_exchange(self, request: Request) -> Response:
        vhost, name = _param(request, "vhost"), _exchange_name(request)
        user = self._actor(request, vhost)
        async with open_action_session(self.node, user, vhost) as session:
            await self._run(session, ev.ExchangeDeclare(session.next_id(), name, passive=True))
            await self._run(
                session,
                ev.ExchangeDelete(session.next_id(), name, if_unused=_flag(request, "if-unused")),
            )
        return Response(status_code=204)

    async def put_queue(self, request: Request) -> Response:
        vhost, name = _param(request, "vhost"), _short("a queue name", _param(request, "name"))
        user = self._actor(request, vhost)
        body = await _json_body(request)
        async with open_action_session(self.node, user, vhost) as session:
            exists = await session.request(ev.QueueDeclare(session.next_id(), name, passive=True))
            await self._run(
                session,
                ev.QueueDeclare(
                    session.next_id(),
                    name,
                    durable=_field(body, "durable", bool, True),
                    auto_delete=_field(body, "auto_delete", bool, False),
                    arguments=_field(body, "arguments", dict, {}),
                ),
            )
        return Response(status_code=204 if isinstance(exists, ev.Ok) else 201)

    async def delete_queue(self, request: Request) -> Response:
        vhost, name = _param(request, "vhost"), _param(request, "name")
        user = self._actor(request, vhost)
        async with open_action_session(self.node, user, vhost) as session:
            await self._run(session, ev.QueueDeclare(session.next_id(), name, passive=True))
            await self._run(
                session,
                ev.QueueDelete(
                    session.next_id(),
                    name,
                    if_unused=_flag(request, "if-unused"),
                    if_empty=_flag(request, "if-empty"),
                ),
            )
        return Response(status_code=204)

    async def purge_queue(self, request: Request) -> Response:
        vhost, name = _param(request, "vhost"), _param(request, "name")
        user = self._actor(request, vhost)
        async with open_action_session(self.node, user, vhost) as session:
            await self._run(session, ev.QueuePurge(session.next_id(), name))
        return Response(status_code=204)

    async def post_binding(self, request: Request) -> Response:
        vhost = _param(request, "vhost")
        source = _param(request, "source")
        source = "" if source == views.DEFAULT_EXCHANGE else source
        destination = _param(request, "destination")
        user = self._actor(request, vhost)
        body = await _json_body(request)
        key = _short("routing_key", _field(body, "routing_key", str, ""))
        arguments = _field(body, "arguments", dict, {})
        if not source:
            raise ApiError(403, "access_refused", "the default exchange cannot be bound to")
        async with open_action_session(self.node, user, vhost) as session:
            await self._run(
                session, ev.QueueBind(session.next_id(), destination, source, key, arguments)
            )
        location = quote(views.properties_key(key, arguments), safe="")
        return Response(status_code=201, headers={"location": location})

    async def delete_binding(self, request: Request) -> Response:
        vhost = _param(request, "vhost")
        user = self._actor(request, vhost)
        binding = self._binding(request, self.node_status())
        if not binding["source"]:
            raise ApiError(403, "access_refused", "the default exchange's bindings are implicit")
        async with open_action_session(self.node, user, vhost) as session:
            await self._run(
                session,
                ev.QueueUnbind(
                    session.next_id(),
                    binding["destination"],
                    binding["source"],
                    binding["routing_key"],
                    binding["arguments"],
                ),
            )
        return Response(status_code=204)

    async def publish(self, request: Request) -> Response:
        """RabbitMQ's debugging publish: mandatory, confirmed; ``{"routed": bool}``."""
        vhost, name = _param(request, "vhost"), _exchange_name(request)
        user = self._actor(request, vhost)
        body = await _json_body(request)
        try:
            key, payload, headers, props = publish_fields(body)
        except BadMessage as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        if self.node.alarms_raised:
            raised = ", ".join(sorted(r.value for r in self.node.alarms_raised))
            raise ApiError(503, "blocked", f"publishers are blocked by an alarm: {raised}")
        async with open_action_session(self.node, user, vhost) as session:
            reply = await self._run(
                session,
                ev.Publish(
                    session.next_id(),
                    name,
                    key,
                    payload,
                    headers,
                    props,
                    mandatory=True,
                    confirm=True,
                ),
            )
        return ApiJson({"routed": isinstance(reply, ev.Ok)})

    async def get_messages(self, request: Request) -> Response:
        """RabbitMQ's ``get``: up to ``count`` messages; ``ackmode`` says whether
        they go back to the queue (``*_requeue_true``, flagged redelivered) or not."""
        vhost, name = _param(request, "vhost"), _param(request, "name")
        user = self._actor(request, vhost)
        body = await _json_body(request)
        count = _field(body, "count", int, 1)
        ackmode = _field(body, "ackmode", str, "ack_requeue_true")
        encoding = _field(body, "encoding", str, "auto")
        truncate = body.get("truncate")
        if ackmode not in _ACK_MODES:
            raise ApiError(400, "bad_request", f"ackmode must be one of {', '.join(_ACK_MODES)}")
        if encoding not in ("auto", "base64"):
            raise ApiError(400, "bad_request", "encoding must be 'auto' or 'base64'")
        if not 1 <= count <= _MAX_GET:
            raise ApiError(400, "bad_request", f"count must be 1 to {_MAX_GET}")
        if truncate is not None and (not isinstance(truncate, int) or truncate < 0):
            raise ApiError(400, "bad_request", "truncate must be a non-negative integer")
        out = []
        async with open_action_session(self.node, user, vhost) as session:
            for _ in range(count):
                reply = await self._run(session, ev.Get(session.next_id(), name))
                if not isinstance(reply, ev.GetOk):
                    break
                out.append(
                    message_json(
                        exchange=reply.exchange,
                        routing_key=reply.key,
                        body=reply.body,
                        headers=reply.headers,
                        props=reply.props,
                        redelivered=reply.redelivered,
                        remaining=reply.remaining,
                        encoding=encoding,
                        truncate=truncate,
                    )
                )
                if ackmode == "ack_requeue_false":
                    await self._run(session, ev.Ack(session.next_id(), reply.dtag))
                elif ackmode == "reject_requeue_false":
                    await self._run(session, ev.Nack(session.next_id(), reply.dtag, requeue=False))
            # *_requeue_true: closing the session requeues them, flagged redelivered
        return ApiJson(out)
