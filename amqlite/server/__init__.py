"""The trio shell around the broker: listeners, connections, the node."""

from .node import BrokerNode, serve

__all__ = ["BrokerNode", "serve"]
