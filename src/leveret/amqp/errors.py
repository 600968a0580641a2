"""AMQP reply codes and the exceptions that carry them.

:class:`ChannelError` is a soft error (only the channel is closed) and
:class:`AMQPConnectionError` a hard one (the connection is closed). The broker's AMQP adapter
adds the class and method id of the method that failed, as ``channel.close`` /
``connection.close`` carry them (AMQP 0-9-1 §1.5.2.9, §1.4.2.9). Reply codes and texts
follow AMQP 0-9-1 §1.1 and what RabbitMQ 3.10 sends.
"""

from __future__ import annotations

# Reply codes, AMQP 0-9-1 constants.
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_NAMES = {
    REPLY_SUCCESS: "OK",
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


class AMQPError(Exception):
    """An error with an AMQP reply code.

    ``reply_text`` is prefixed with the code's name, as RabbitMQ does
    (``NOT_FOUND - no queue 'q' in vhost '/'``); with no text, the name alone (as
    RabbitMQ's ``INTERNAL_ERROR`` after a crash).
    """

    def __init__(self, reply_code: int, text: str) -> None:
        self.reply_code = reply_code
        name = REPLY_NAMES.get(reply_code, "ERROR")
        self.reply_text = f"{name} - {text}" if text else name  # RabbitMQ's crashes: the name alone
        super().__init__(self.reply_text)


class ChannelError(AMQPError):
    """A soft error: only the channel is closed (codes 403, 404, 405, 406)."""


class AMQPConnectionError(AMQPError):
    """A hard error: the whole connection is closed (codes 320, 5xx)."""


def from_reply(cls: type[AMQPError], reply_code: int, reply_text: str) -> AMQPError:
    """An exception of ``cls`` for a channel.close / connection.close received from a
    peer: ``reply_text`` is kept as sent (it already starts with the code's name)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, reply_text)
    exc.reply_code, exc.reply_text = reply_code, reply_text
    return exc


class FrameError(AMQPConnectionError):
    """A malformed frame (501 FRAME_ERROR, §4.2.3): bad end marker, unknown frame type,
    a frame over frame-max. Raised by both twins of the frame reader."""

    def __init__(self, text: str) -> None:
        super().__init__(FRAME_ERROR, text)
