"""Message groups (JMS ``JMSXGroupID``, amqlite's ``group_id`` property).

The messages of one group on one queue go to one consumer at a time, in order. A
group is given to a consumer with its first message (that delivery carries the
header :data:`FIRST_FOR_CONSUMER` = TRUE) and stays with it until the consumer goes
(cancel, close, lost connection). It then moves, with its next message (flagged
again), to another consumer, but only once every delivery of the group made so far
is settled: two consumers never hold messages of one group at once.

:class:`Group` is the queue's record of one group; the queue keeps one only while
it has an owner or unsettled deliveries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .message import Message

if TYPE_CHECKING:
    from .queue import Consumer

#: the header on the first message of a group a consumer receives
FIRST_FOR_CONSUMER = "JMSXGroupFirstForConsumer"
#: the message property naming a message's group
GROUP_PROPERTY = "group_id"


class Group:
    """``owner``: the consumer the group is with (None: none); ``unsettled``: its
    deliveries to consumers (acknowledging ones) not yet acked, nacked or requeued."""

    __slots__ = ("owner", "unsettled")

    def __init__(self) -> None:
        self.owner: Consumer | None = None
        self.unsettled = 0


class GroupFirstMessage(Message):
    """The copy of a message delivered as the first of its group for a consumer: the
    same message plus the header :data:`FIRST_FOR_CONSUMER`. ``original`` is what
    goes back into the queue if it is requeued (the flag belongs to one delivery)."""

    __slots__ = ("original",)

    def __init__(self, original: Message) -> None:
        super().__init__(
            original.exchange,
            original.routing_key,
            original.body,
            {**original.headers, FIRST_FOR_CONSUMER: True},
            original.properties,
        )
        self.journal_id = original.journal_id
        self.publish_key = original.publish_key
        self.mesh = original.mesh
        self.deaths = original.deaths
        self.original = original


def original_of(message: Message) -> Message:
    """``message`` as the queue holds it (without a first-for-consumer flag)."""
    return message.original if isinstance(message, GroupFirstMessage) else message
