"""What enqueueing a message did, for its publisher's confirm: :class:`Enqueued`.

A publish reaches any number of queues; its confirm combines what each did. The
combination is ``|``: the members are two independent facts (bit 0: the confirm must
wait for the store's write; bit 1: a queue refused the message, so the confirm is
negative), and ``|`` of two members is the member meaning both, so it never leaves the
four. ``STORED | REJECTED`` is ``STORED_REJECTED``: a negative confirm that still keeps
its turn behind the store's write, as confirms go out in publish order (RabbitMQ's
``reject-publish`` overflow nacks a publish another queue took).

An ``IntEnum`` rather than ``enum.Flag``: the publish path combines the outcomes of every
queue a message reaches, and an ``IntEnum``'s ``|`` is the int's (``Flag.__or__`` is a
Python call). Use the module constants below on the hot path: reading a member through
the class (``Enqueued.STORED``) costs a descriptor call in Python 3.11.
"""

from __future__ import annotations

from enum import IntEnum


class Enqueued(IntEnum):
    """The outcome of :meth:`.Queue.enqueue` (and of a publish, combined with ``|``)."""

    #: Kept in memory, or dropped as the queue wants (a duplicate, a topic subscription's
    #: selector): the confirm may go out at once.
    ACCEPTED = 0
    #: Written to the store (durable, or paged out): the confirm waits for the write.
    STORED = 1
    #: Refused by a full queue (``x-overflow: reject-publish``): a negative confirm.
    REJECTED = 2
    #: Both: negative, after the write another queue of the same publish waits for.
    STORED_REJECTED = 3


ACCEPTED = Enqueued.ACCEPTED
STORED = Enqueued.STORED
REJECTED = Enqueued.REJECTED
STORED_REJECTED = Enqueued.STORED_REJECTED
