"""The node's HTTP listener: hypercorn's trio worker serving one Starlette app.

``HttpService(node).run(task_status=)`` binds ``[http]``'s address (port 0 picks
one), reports the bound port with ``task_status.started(port)`` and serves until
cancelled; a bind failure raises ``OSError`` before ``started``. With ``[http]
tls = true`` it serves HTTPS only, with ``[tls]``'s certificate (and client
certificates required with ``verify = "mutual"``). Beside the server it runs the
rate sampler (:mod:`.rates`), every ``RATE_INTERVAL`` seconds.

Routes: the management page at ``/`` (:mod:`amqlite.web`: static files, read
once), the management API under ``/api/`` (:mod:`.api`, behind basic auth,
:mod:`.login`), the browser channels ``/ws`` and ``/poll/*`` and the JS client
``/js/amqlite.js`` (:mod:`.channels`), ``/metrics`` (:mod:`.metrics`), ``/health/live`` (the process
answers) and ``/health/ready`` (200 while the node serves clients: standalone or
the active node of an HA pair, its journal recovered; 503 with the reason
otherwise, for load balancers and systemd).
"""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING

import structlog
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from amqlite.web import STATIC_DIR

from .actions import SERVING_STATES
from .api import ManagementApi, RawPath, ReadTheBody
from .channels import BrowserChannels
from .login import ApiAuth
from .metrics import CONTENT_TYPE, NodeMetrics
from .rates import RATE_INTERVAL, RateSampler
from .views import rate_sample

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from ..context import NodeView

__all__ = ["HttpService", "build_app"]

log = structlog.get_logger("amqlite.http")


def build_app(
    node: NodeView, rates: RateSampler, channels: BrowserChannels | None = None
) -> ASGIApp:
    """The whole HTTP application for ``node`` (no server: tests may drive it)."""
    api = ManagementApi(node, rates)
    if channels is None:
        channels = BrowserChannels(node)
    metrics = NodeMetrics(node)

    async def get_metrics(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    async def live(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        if node.state in SERVING_STATES:
            return JSONResponse({"status": "ok", "state": node.state})
        reason = f"node {node.node_id} is {node.state}: it serves no clients"
        return JSONResponse(
            {"status": "failed", "state": node.state, "reason": reason}, status_code=503
        )

    page = _page_routes()
    routes = [
        *page,
        *api.routes(),
        *channels.routes(),
        Route("/metrics", get_metrics),
        Route("/health/live", live),
        Route("/health/ready", ready),
    ]
    app = Starlette(
        routes=routes, exception_handlers={404: _json_http_error, 405: _json_http_error}
    )
    return ReadTheBody(RawPath(ApiAuth(app, node.authenticator)))


#: the page's files: name -> media type (nothing else in the package is served)
_PAGE_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_PAGE_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}


def _page_routes() -> list[Route]:
    """``/`` (the management page) and ``/static/{app.js,style.css}``, read once."""
    files = {name: (STATIC_DIR / name).read_bytes() for name in _PAGE_FILES}

    def serve_file(name: str) -> Response:
        return Response(files[name], media_type=_PAGE_FILES[name], headers=_PAGE_HEADERS)

    async def index(request: Request) -> Response:
        return serve_file("index.html")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in files or name == "index.html":
            return await _json_http_error(request, HTTPException(404))
        return serve_file(name)

    return [Route("/", index), Route("/static/{name}", static)]


async def _json_http_error(request: Request, exc: Exception) -> Response:
    """An unknown path (404) or method (405) in RabbitMQ's error JSON."""
    status = getattr(exc, "status_code", 500)
    error = "Object Not Found" if status == 404 else "bad_method"
    reason = "Not Found" if status == 404 else f"{request.method} is not allowed here"
    return JSONResponse({"error": error, "reason": reason}, status_code=status)


class HttpService:
    """The listener of one node (off unless ``[http] port`` is set)."""

    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.rates = RateSampler()
        self.channels = BrowserChannels(node)
        self.port: int | None = None
        self.url: str | None = None

    def _hypercorn_config(self, host: str, port: int) -> HypercornConfig:
        config = HypercornConfig()
        config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        config.accesslog = None
        quiet = logging.getLogger("amqlite.http.hypercorn")
        quiet.setLevel(logging.WARNING)  # not its "Running on ..." lines: we log our own
        config.errorlog = quiet
        config.include_server_header = False
        config.graceful_timeout = 1.0
        # a browser channel's frame is JSON (a body in base64 grows by a third)
        config.websocket_max_message_size = 2 * self.node.config.server.max_frame_bytes
        settings = self.node.config
        if settings.http.tls:
            tls = settings.tls
            config.certfile = tls.cert
            config.keyfile = tls.key or tls.cert
            config.ca_certs = tls.ca or None
            if tls.verify == "mutual":
                config.verify_mode = ssl.CERT_REQUIRED
        return config

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        settings = self.node.config
        host = settings.http.listen_host(settings.server)
        port = settings.http.port or 0
        config = self._hypercorn_config(host, port)
        app = build_app(self.node, self.rates, self.channels)
        started = False
        try:
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(_serve, app, config)
                self.url = binds[0]
                self.port = int(self.url.rpartition(":")[2])
                nursery.start_soon(self._sample_rates)
                nursery.start_soon(self.channels.run)
                log.info("http_listening", url=self.url, tls=settings.http.tls)
                started = True
                task_status.started(self.port)
        except BaseExceptionGroup as group:  # a bind fails inside hypercorn's nurseries
            failed = None if started else _first_os_error(group)
            if failed is None:
                raise
            raise failed from None

    async def _sample_rates(self) -> None:
        while True:
            self.rates.observe(trio.current_time(), rate_sample(self.node.broker.status()))
            await trio.sleep(RATE_INTERVAL)


def _first_os_error(group: BaseExceptionGroup[BaseException]) -> OSError | None:
    for exc in group.exceptions:
        if isinstance(exc, OSError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first_os_error(exc)
            if found is not None:
                return found
    return None


async def _serve(
    app: ASGIApp,
    config: HypercornConfig,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    await serve(app, config, task_status=task_status)  # type: ignore[arg-type]
