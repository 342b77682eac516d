"""The sans-IO messaging model: virtual hosts, exchanges, queues, bindings, routing.

No I/O, no clock, no logging: time comes in as ``now`` and results come back as
return values, deliveries and cancellations. See docs/CONTRACTS.md, "Broker core".
"""

from .arguments import Overflow, QueueSettings, parse_queue_arguments
from .broker import Broker
from .groups import group_record_position
from .headers import HeadersRule
from .message import PEERING_QUEUE_PREFIX, Delivery, Message, PublishOutcome, QueueInfo
from .recording import ALL_APPENDED
from .session import Session
from .topic import TopicMatcher

__all__ = [
    "ALL_APPENDED",
    "PEERING_QUEUE_PREFIX",
    "Broker",
    "Delivery",
    "HeadersRule",
    "Message",
    "Overflow",
    "PublishOutcome",
    "QueueInfo",
    "QueueSettings",
    "Session",
    "TopicMatcher",
    "group_record_position",
    "parse_queue_arguments",
]
