"""The errors core raises, protocol-neutral.

Each names a condition, as RabbitMQ's core does (``rabbit_misc:protocol_error``); every
protocol adapter maps the condition to its own form: the AMQP adapter to a reply code
that closes the channel or the connection (:mod:`leveret.protocol.amqp.errors`), a STOMP
adapter to an ERROR frame. ``text`` is the human-readable part, without any prefix
(RabbitMQ's AMQP texts, e.g. ``no queue 'q' in vhost '/'``).
"""

from __future__ import annotations


class BrokerError(Exception):
    """A request core cannot carry out. ``condition`` names the kind (``not_found`` …);
    ``text`` says what was wrong."""

    condition = "internal_error"

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text!r})"


class NotFound(BrokerError):
    """No such exchange, queue or virtual host (AMQP 404, soft)."""

    condition = "not_found"


class AccessRefused(BrokerError):
    """A reserved name or an operation the user may not perform (AMQP 403, soft)."""

    condition = "access_refused"


class ResourceLocked(BrokerError):
    """Another connection's exclusive queue (AMQP 405, soft)."""

    condition = "resource_locked"


class PreconditionFailed(BrokerError):
    """An inequivalent redeclaration, an invalid argument, a queue in use or not empty,
    an unknown delivery tag, a message too large (AMQP 406, soft)."""

    condition = "precondition_failed"


class CommandInvalid(BrokerError):
    """A request that is invalid in itself, e.g. an unknown exchange type (AMQP 503,
    which closes the connection)."""

    condition = "command_invalid"


class NotAllowed(BrokerError):
    """An operation refused outright, e.g. a vhost the user may not open (AMQP 530,
    which closes the connection)."""

    condition = "not_allowed"


class NotImplementedFeature(BrokerError):
    """A feature leveret does not implement (AMQP 540, which closes the connection)."""

    condition = "not_implemented"


def not_found(text: str) -> NotFound:
    """A :class:`NotFound` to raise."""
    return NotFound(text)


def access_refused(text: str) -> AccessRefused:
    """An :class:`AccessRefused` to raise."""
    return AccessRefused(text)


def precondition_failed(text: str) -> PreconditionFailed:
    """A :class:`PreconditionFailed` to raise."""
    return PreconditionFailed(text)


def resource_locked(text: str) -> ResourceLocked:
    """A :class:`ResourceLocked` to raise."""
    return ResourceLocked(text)
