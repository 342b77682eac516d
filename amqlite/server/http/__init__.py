"""The node's web side: the management API (RabbitMQ's paths and field names),
``/metrics`` for Prometheus and health checks, on one HTTP listener (docs/http.md).

Modules: :mod:`.service` (the listener: hypercorn's trio worker, the app),
:mod:`.api` (the route table), :mod:`.login` (basic auth with the broker's
users), :mod:`.actions` (changes through a broker session, as a client's),
:mod:`.channels` (the browser channels ``/ws`` and ``/poll``),
:mod:`.views` (status -> RabbitMQ's JSON, pure), :mod:`.messages` (message
JSON), :mod:`.metrics` (the Prometheus collector), :mod:`.rates` (pure).
"""

from .channels import BrowserConnection
from .service import HttpService, build_app

__all__ = ["BrowserConnection", "HttpService", "build_app"]
