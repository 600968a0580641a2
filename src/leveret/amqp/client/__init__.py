"""The one AMQP 0-9-1 client of this repo: asyncio, with a blocking façade.

:class:`Connection` is an :class:`asyncio.Protocol`: received bytes are decoded in
``data_received``, deliveries straight out of the receive buffer
(:func:`.delivery.take_delivery`, a whole batch per read) into each consumer's deque, so a
reader pays no task, future or coroutine per message. Writes are buffered and sent once
per event-loop turn (or when 256 KiB are waiting), so many publishes go out in one write.

- URL ``amqp://user:pass@host:port/vhost``, PLAIN login, heartbeats off unless asked for;
- channels (:meth:`Connection.channel`), exchange/queue declare, bind, qos, publish;
- publisher confirms with a window (:meth:`Channel.confirm_select`,
  :meth:`Channel.wait_confirms`): a nack raises :class:`PublishError` or is recorded;
- consumers (:meth:`Channel.consume`) with server-sent basic.cancel, basic.get, ack/nack;
- the broker's ``amq.leveret.api`` RPC over direct reply-to (:meth:`Channel.rpc`).

A channel.close from the broker fails the channel's pending and next operations with
:class:`.errors.ChannelError` (``reply_code``, ``reply_text``);
:meth:`Connection.default_channel` then opens a fresh one. A connection.close fails
everything with :class:`.errors.AMQPConnectionError`, a lost socket with
:class:`ConnectionLost`.

:class:`BlockingClient` runs the same coroutines on a private event loop, for code that
is not async (Spark's Python workers, the CLI tools): no thread, and the loop runs only
while a call waits.
"""

from __future__ import annotations

from ..delivery import Delivery
from ..errors import AMQPConnectionError, AMQPError, ChannelError
from .blocking import BlockingClient
from .channel import Channel
from .connection import Connection
from .consumer import Consumer
from .errors import ClientError, ConnectionLost, PublishError, RPCError, Timeout
from .url import URLParams, parse_url, safe_url

__all__ = [
    "AMQPConnectionError",
    "AMQPError",
    "BlockingClient",
    "Channel",
    "ChannelError",
    "ClientError",
    "Connection",
    "ConnectionLost",
    "Consumer",
    "Delivery",
    "PublishError",
    "RPCError",
    "Timeout",
    "URLParams",
    "parse_url",
    "safe_url",
]
