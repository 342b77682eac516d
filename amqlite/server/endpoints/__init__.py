"""Role endpoints: what a native connection becomes after its handshake.

``client`` (:class:`ClientEndpoint`: a broker session), ``ha-peer``
(:class:`HaPeerEndpoint`), ``peer-link`` (:class:`PeeringEndpoint`) and
``monitor`` (:class:`MonitorEndpoint`). A second client protocol plugs in as one
more endpoint over the same broker sessions: a browser page's session over a
WebSocket or long polling is :class:`BrowserEndpoint`.
"""

from .base import Endpoint, Link
from .browser import BrowserEndpoint
from .client import ClientEndpoint
from .roles import HaPeerEndpoint, MonitorEndpoint, PeeringEndpoint

__all__ = [
    "BrowserEndpoint",
    "ClientEndpoint",
    "Endpoint",
    "HaPeerEndpoint",
    "Link",
    "MonitorEndpoint",
    "PeeringEndpoint",
]
