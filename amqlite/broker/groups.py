"""Message groups (JMS ``JMSXGroupID``, amqlite's ``group_id`` property).

The messages of one group on one queue go to one consumer at a time, in order. A
group is given to a consumer with its first message (that delivery carries the
header :data:`FIRST_FOR_CONSUMER` = TRUE) and stays with it until the consumer goes
(cancel, close, lost connection). It then moves, with its next message (flagged
again), to another consumer, but only once every delivery of the group made so far
is settled: two consumers never hold messages of one group at once.

:class:`Group` is the queue's record of one group; the queue keeps one only while
it has an owner or unsettled deliveries, or is kept for a consumer of a previous
life of the broker.

**Across a restart or an HA failover.** On a recorded (durable) queue every change
of owner is journaled (``group.owner``, naming the consumer by its client's
``hello.instance`` and its consumer tag, which a reconnecting client keeps). A node
that recovers or takes over does not know whether that consumer is still working
on a message of the group it received before (the client cannot ack it any more),
so it keeps the group **reserved** for it: only a consumer with the same identity
(the client resuming its consumer) may take it, which it does with the group's
oldest message, flagged again; once a consumer of the queue has waited for the
group for the broker's ``group_resume_timeout``, the reservation lapses and the
group goes to any consumer. An owner that cannot come back (no instance: AMQP
clients) is ``"-"``, whose reservation only lapses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .message import INF, Message

if TYPE_CHECKING:
    from .queue import Consumer

#: the header on the first message of a group a consumer receives
FIRST_FOR_CONSUMER = "JMSXGroupFirstForConsumer"
#: the message property naming a message's group
GROUP_PROPERTY = "group_id"


#: the owner of a group whose consumer cannot be recognised after a reconnect
NO_RESUME = "-"


def identity(instance: str, tag: str) -> str:
    """How a group's owner is journaled: recognisable after its client reconnects
    when the client gave a ``hello.instance``."""
    return f"i:{instance}/{tag}" if instance else NO_RESUME


class Group:
    """``owner``: the consumer the group is with (None: none); ``unsettled``, once
    it has no owner: its last owner's deliveries (to an acknowledging consumer) not
    yet acked, nacked or requeued, counted when that consumer went (while a group
    has an owner it is not kept: nothing reads it);
    ``reserved``: the identity of the consumer of a previous life of the broker
    the group waits for (None: none), until ``until`` (``INF``: the wait has not
    started: it starts when a consumer first wants the group)."""

    __slots__ = ("owner", "reserved", "unsettled", "until")

    def __init__(self) -> None:
        self.owner: Consumer | None = None
        self.unsettled = 0
        self.reserved: str | None = None
        self.until = INF


class GroupFirstMessage(Message):
    """The copy of a message delivered as the first of its group for a consumer: the
    same message plus the header :data:`FIRST_FOR_CONSUMER`. ``original`` is what
    goes back into the queue if it is requeued (the flag belongs to one delivery)."""

    __slots__ = ("original", "position")

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
        #: the journal position of the ``group.owner`` record of this assignment
        #: (0: none): on an HA pair the push waits until the passive node holds it
        self.position = 0


def group_record_position(message: Message) -> int:
    """The journal position a push of ``message`` waits for on an HA pair: its
    group's ``group.owner`` record when it gives the group to a consumer, else 0."""
    return message.position if type(message) is GroupFirstMessage else 0


def original_of(message: Message) -> Message:
    """``message`` as the queue holds it (without a first-for-consumer flag)."""
    return message.original if isinstance(message, GroupFirstMessage) else message
