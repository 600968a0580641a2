"""AMQP 1.0 error conditions (§2.8.15-2.8.18) and how a failure reaches the peer.

A handler raises :class:`ConnectionFault` (the connection is closed with a ``close``
carrying the condition), :class:`SessionFault` (the session ends: ``end`` with it) or
:class:`LinkFault` (the link is detached, closed, with it). Core's refusals
(:class:`~leveret.core.errors.BrokerError`) map to the conditions RabbitMQ 4 sends
(:func:`condition_of`): ``amqp:not-found`` for a missing queue or exchange,
``amqp:unauthorized-access`` for a refused permission, ``amqp:precondition-failed``
(RabbitMQ's own condition) for an inequivalent declaration, ``amqp:resource-locked``
for another connection's exclusive queue.
"""

from __future__ import annotations

from ...core.errors import BrokerError
from . import performatives as perf

# connection and general conditions (§2.8.15, §2.8.16)
INTERNAL_ERROR = "amqp:internal-error"
NOT_FOUND = "amqp:not-found"
UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
DECODE_ERROR = "amqp:decode-error"
RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
NOT_ALLOWED = "amqp:not-allowed"
INVALID_FIELD = "amqp:invalid-field"
NOT_IMPLEMENTED = "amqp:not-implemented"
RESOURCE_LOCKED = "amqp:resource-locked"
PRECONDITION_FAILED = "amqp:precondition-failed"
RESOURCE_DELETED = "amqp:resource-deleted"
ILLEGAL_STATE = "amqp:illegal-state"
FRAME_SIZE_TOO_SMALL = "amqp:frame-size-too-small"
CONNECTION_FORCED = "amqp:connection:forced"
FRAMING_ERROR = "amqp:connection:framing-error"
# session (§2.8.17)
WINDOW_VIOLATION = "amqp:session:window-violation"
ERRANT_LINK = "amqp:session:errant-link"
HANDLE_IN_USE = "amqp:session:handle-in-use"
UNATTACHED_HANDLE = "amqp:session:unattached-handle"
# link (§2.8.18)
DETACH_FORCED = "amqp:link:detach-forced"
TRANSFER_LIMIT_EXCEEDED = "amqp:link:transfer-limit-exceeded"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"

_CONDITIONS = {
    "not_found": NOT_FOUND,
    "access_refused": UNAUTHORIZED_ACCESS,
    "precondition_failed": PRECONDITION_FAILED,
    "resource_locked": RESOURCE_LOCKED,
    "not_allowed": NOT_ALLOWED,
    "not_implemented": NOT_IMPLEMENTED,
    "resource_error": RESOURCE_LIMIT_EXCEEDED,
    "command_invalid": ILLEGAL_STATE,
    "syntax_error": INVALID_FIELD,
}


def condition_of(exc: BrokerError) -> str:
    """The AMQP 1.0 condition for one of core's refusals (RabbitMQ 4's choices)."""
    return _CONDITIONS.get(exc.condition, INTERNAL_ERROR)


class Fault(Exception):
    """Something the peer did wrong, or something refused: ``condition`` (a symbol)
    and ``text`` (the error's description, at most 1,000 characters are sent)."""

    def __init__(self, condition: str, text: str) -> None:
        super().__init__(text)
        self.condition = condition
        self.text = text

    @classmethod
    def of(cls, exc: BrokerError) -> Fault:
        return cls(condition_of(exc), exc.text)

    def error(self) -> perf.Error:
        return perf.Error(self.condition, self.text[:1000])


class ConnectionFault(Fault):
    """Close the connection (``close`` with this error)."""


class SessionFault(Fault):
    """End the session (``end`` with this error)."""


class LinkFault(Fault):
    """Detach the link, closed, with this error."""
