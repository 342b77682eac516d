"""Role endpoints: what a native connection becomes after its handshake.

``client`` (:class:`ClientEndpoint`: a broker session), ``ha-peer``
(:class:`HaPeerEndpoint`), ``peer-link`` (:class:`PeeringEndpoint`) and
``monitor`` (:class:`MonitorEndpoint`). A second client protocol plugs in as one
more endpoint over the same broker sessions.
"""

from .base import Endpoint, Link
from .client import ClientEndpoint
from .roles import HaPeerEndpoint, MonitorEndpoint, PeeringEndpoint

__all__ = [
    "ClientEndpoint",
    "Endpoint",
    "HaPeerEndpoint",
    "Link",
    "MonitorEndpoint",
    "PeeringEndpoint",
]
