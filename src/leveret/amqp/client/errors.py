"""The client's own exceptions, beside the broker's reply codes in :mod:`leveret.amqp.errors`."""

from __future__ import annotations

from ..errors import AMQPConnectionError, AMQPError


class ClientError(AMQPError):
    """A failure on the client's side of the conversation (a bad URL, a timeout, a
    refused publish, an RPC error); ``reply_code`` is 0."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.reply_code, self.reply_text = 0, message


class ConnectionLost(AMQPConnectionError):
    """Cannot connect, or the socket closed without a connection.close; ``reply_code``
    is 0."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.reply_code, self.reply_text = 0, message


class Timeout(ClientError):
    """No answer from the broker in time."""


class PublishError(ClientError):
    """The broker nacked a publish (for example ``x-overflow: reject-publish``)."""


class RPCError(ClientError):
    """``amq.leveret.api`` answered ``{"ok": false}``, or not at all."""
