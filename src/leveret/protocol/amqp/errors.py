"""Core's protocol-neutral errors as AMQP reply codes (AMQP 0-9-1 §1.1, RabbitMQ 3.10).

A soft error closes the channel (403, 404, 405, 406); a hard one the connection (5xx).
"""

from __future__ import annotations

from ...amqp.errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    AMQPConnectionError,
    AMQPError,
    ChannelError,
)
from ...core.errors import BrokerError

#: condition -> (reply code, closes the connection)
_REPLY_CODES = {
    "not_found": (NOT_FOUND, False),
    "access_refused": (ACCESS_REFUSED, False),
    "resource_locked": (RESOURCE_LOCKED, False),
    "precondition_failed": (PRECONDITION_FAILED, False),
    "command_invalid": (COMMAND_INVALID, True),
    "not_allowed": (NOT_ALLOWED, True),
    "not_implemented": (NOT_IMPLEMENTED, True),
    "internal_error": (INTERNAL_ERROR, True),
}


def to_amqp(exc: BrokerError) -> AMQPError:
    """The ChannelError or AMQPConnectionError that reports ``exc`` to an AMQP client, with
    RabbitMQ's text (``NOT_FOUND - no queue 'q' in vhost '/'``)."""
    code, hard = _REPLY_CODES[exc.condition]
    return (AMQPConnectionError if hard else ChannelError)(code, exc.text)
