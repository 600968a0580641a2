"""A small synchronous AMQP 0-9-1 client (on pamqp) for the Spark connector.

Spark runs the connector's callbacks in several processes (the driver's source runner,
reused Python workers), so each process opens its own :class:`Client`; a client is
never pickled. pika's BlockingConnection waits for each publisher confirm in turn; this
client keeps a window of unconfirmed publishes in flight and writes frames in batches,
which is what makes the sink fast. It also reads the broker's ranged consumers (stream
``x-stream-offset-end`` and ``x-lease-*`` ranges) and calls the ``amq.leveret.api`` RPC
exchange with direct reply-to.

One channel is used at a time; if the broker closes it (404, 406, ...) the operation
raises :class:`ChannelError` and the next operation opens a fresh channel.
"""

from __future__ import annotations

import collections
import json
import socket
import struct
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pamqp import commands, frame, header, heartbeat
from pamqp.body import ContentBody

from ..amqp.delivery import Delivery, decode_frame, take_delivery
from ..amqp.field_table import Long
from ..amqp.frames import encode_publish
from ..amqp.properties import PROPERTY_NAMES, encode_properties

__all__ = ["AMQPError", "ChannelError", "Client", "ConnectionError_", "Delivery", "Long",
           "PublishError", "RPCError", "decode_frame", "encode_publish", "safe_url",
           "take_delivery", "encode_properties"]

_SEND_CHUNK = 256 * 1024
_PROPERTY_NAMES = PROPERTY_NAMES


class AMQPError(RuntimeError):
    """Any failure talking to the broker; the message names the URL (password hidden)."""


class ConnectionError_(AMQPError):
    """Cannot connect, refused login, or the connection was lost."""


class ChannelError(AMQPError):
    """The broker closed the channel (missing queue or exchange, bad argument, ...)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class PublishError(AMQPError):
    """The broker nacked a publish (for example ``x-overflow: reject-publish``)."""


class RPCError(AMQPError):
    """``amq.leveret.api`` answered ``{"ok": false}``."""


def safe_url(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


@dataclass
class URLParams:
    host: str
    port: int
    user: str
    password: str
    vhost: str


def parse_url(url: str) -> URLParams:
    """``amqp://user:pass@host:port/vhost`` (vhost percent-encoded; empty path means ``/``)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise AMQPError(f"invalid AMQP URL {safe_url(url)!r}: {exc}") from None
    if parts.scheme != "amqp":
        raise AMQPError(f"invalid AMQP URL {safe_url(url)!r}: the scheme must be amqp://")
    if not parts.hostname:
        raise AMQPError(f"invalid AMQP URL {safe_url(url)!r}: no host")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    vhost = urllib.parse.unquote(path) if path else "/"
    return URLParams(parts.hostname, port or 5672,
                     urllib.parse.unquote(parts.username or "guest"),
                     urllib.parse.unquote(parts.password or "guest"), vhost)


class Client:
    """A blocking AMQP connection with one channel. Use as a context manager."""

    def __init__(self, url: str, timeout: float = 10.0, name: str = "leveret.spark") -> None:
        self.url = url
        self.timeout = timeout
        params = parse_url(url)
        self._params = params
        self._buf = bytearray()
        self._out = bytearray()
        self._channel = 0
        self._channel_open = False
        self._frame_max = 131072
        self._closed = False
        try:
            self._sock = socket.create_connection((params.host, params.port), timeout=timeout)
        except OSError as exc:
            raise ConnectionError_(f"cannot connect to {safe_url(url)}: {exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(timeout)
        try:
            self._handshake(name)
        except BaseException:
            self._sock.close()
            raise
        # publisher confirms
        self._confirming = False
        self._next_seq = 1
        self._pending: collections.deque[int] = collections.deque()
        self._early: set[int] = set()
        self._nacked = 0
        self._reply_consumer: str | None = None

    # -- connection ------------------------------------------------------------
    def _handshake(self, name: str) -> None:
        url = safe_url(self.url)
        self._send(frame.marshal(header.ProtocolHeader(), 0))
        try:
            start = self._expect(0, commands.Connection.Start)
        except ConnectionError_ as exc:
            raise ConnectionError_(f"cannot connect to {url}: {exc.args[0]}") from None
        mechanisms = start.mechanisms.split() if isinstance(start.mechanisms, str) else []
        if mechanisms and "PLAIN" not in mechanisms:
            raise ConnectionError_(f"cannot connect to {url}: PLAIN login not offered")
        p = self._params
        self._write(0, commands.Connection.StartOk(
            client_properties={"product": name, "capabilities": {
                "publisher_confirms": True, "consumer_cancel_notify": True,
                "basic.nack": True, "connection.blocked": False}},
            mechanism="PLAIN", response=f"\0{p.user}\0{p.password}"))
        self._flush()
        try:
            tune = self._expect(0, commands.Connection.Tune)
        except ConnectionError_ as exc:
            raise ConnectionError_(f"login to {url} refused for user {p.user!r}: "
                                   f"{exc.args[0]}") from None
        self._frame_max = min(tune.frame_max or 131072, 131072)
        self._write(0, commands.Connection.TuneOk(channel_max=tune.channel_max or 2047,
                                                  frame_max=self._frame_max, heartbeat=0))
        self._write(0, commands.Connection.Open(virtual_host=p.vhost))
        self._flush()
        try:
            self._expect(0, commands.Connection.OpenOk)
        except ConnectionError_ as exc:
            raise ConnectionError_(f"cannot open vhost {p.vhost!r} on {url}: "
                                   f"{exc.args[0]}") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._write(0, commands.Connection.Close(reply_code=200, reply_text="bye",
                                                     class_id=0, method_id=0))
            self._flush()
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                _, f = self._read_frame()
                if isinstance(f, commands.Connection.CloseOk):
                    break
        except (AMQPError, OSError):
            pass
        finally:
            self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> None:
        raise TypeError("leveret.spark.amqp.Client cannot be pickled: open one per process")

    # -- frames ------------------------------------------------------------------
    def _write(self, channel: int, value: Any) -> None:
        self._out += frame.marshal(value, channel)

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise self._lost(exc) from None

    def _flush(self) -> None:
        if self._out:
            data, self._out = bytes(self._out), bytearray()
            self._send(data)

    def _lost(self, exc: BaseException | str) -> ConnectionError_:
        self._closed = True
        return ConnectionError_(f"connection to {safe_url(self.url)} lost: {exc}")

    def _read_frame(self, timeout: float | None = None) -> tuple[int, Any]:
        buf = self._buf
        while True:
            if len(buf) >= 7:
                size = struct.unpack_from(">I", buf, 3)[0]
                if len(buf) >= size + 8:
                    try:
                        return decode_frame(buf)
                    finally:
                        del buf[:size + 8]
            self._flush()
            try:
                self._sock.settimeout(self.timeout if timeout is None else timeout)
                data = self._sock.recv(262144)
            except TimeoutError:
                raise
            except OSError as exc:
                raise self._lost(exc) from None
            if not data:
                raise self._lost("closed by the broker")
            buf += data

    def _handle_async(self, channel: int, value: Any) -> bool:
        """Frames that may arrive at any time. True when consumed here."""
        if isinstance(value, heartbeat.Heartbeat):
            return True
        if isinstance(value, commands.Connection.Close):
            try:
                self._write(0, commands.Connection.CloseOk())
                self._flush()
            except AMQPError:
                pass
            self._closed = True
            self._sock.close()
            raise ConnectionError_(f"{safe_url(self.url)} closed the connection: "
                                   f"{value.reply_code} {value.reply_text}")
        if isinstance(value, commands.Channel.Close):
            self._write(channel, commands.Channel.CloseOk())
            self._flush()
            if channel == self._channel:
                self._channel_open = False
                self._confirming = False
                self._reply_consumer = None
            raise ChannelError(f"{value.reply_code} {value.reply_text}", value.reply_code)
        if isinstance(value, (commands.Connection.Blocked, commands.Connection.Unblocked)):
            return True
        if isinstance(value, (commands.Basic.Ack, commands.Basic.Nack)) and self._confirming:
            self._on_confirm(value)
            return True
        if isinstance(value, commands.Basic.Return):
            self._read_content()  # unroutable: confirmed anyway, like RabbitMQ
            return True
        return False

    def _expect(self, channel: int, kind: type) -> Any:
        while True:
            try:
                ch, value = self._read_frame()
            except TimeoutError:
                raise AMQPError(f"{safe_url(self.url)}: no {kind.__name__} within "
                                f"{self.timeout:g}s") from None
            if isinstance(value, kind) and ch == channel:
                return value
            if self._handle_async(ch, value):
                continue
            if isinstance(value, header.ProtocolHeader):
                raise ConnectionError_("the server does not speak AMQP 0-9-1")
            # anything else (a late delivery of a finished consumer): ignore

    def _read_content(self) -> tuple[dict[str, Any], bytes]:
        """The content header and body frames after a basic.deliver/get-ok/return:
        (the properties present by pamqp attribute name, body)."""
        _, head = self._read_frame()
        if not isinstance(head, header.ContentHeader):
            raise AMQPError(f"expected a content header, got {head!r}")
        size = head.body_size
        parts = []
        got = 0
        while got < size:
            _, body = self._read_frame()
            if not isinstance(body, ContentBody):
                raise AMQPError(f"expected a content body, got {body!r}")
            parts.append(body.value)
            got += len(body.value)
        p = head.properties
        props = {name: value for name in _PROPERTY_NAMES
                 if (value := getattr(p, name)) is not None}
        if props.get("cluster_id") == "":  # pamqp's default: not on the wire
            del props["cluster_id"]
        return props, b"".join(parts)

    # -- channel -----------------------------------------------------------------
    def channel(self) -> int:
        """The open channel's number, opening a new one if needed."""
        if self._closed:
            raise ConnectionError_(f"connection to {safe_url(self.url)} is closed")
        if not self._channel_open:
            self._channel += 1
            self._write(self._channel, commands.Channel.Open())
            self._flush()
            self._expect(self._channel, commands.Channel.OpenOk)
            self._channel_open = True
        return self._channel

    def _call(self, method: Any, reply: type) -> Any:
        ch = self.channel()
        self._write(ch, method)
        self._flush()
        return self._expect(ch, reply)

    def queue_declare(self, queue: str, passive: bool = False, durable: bool = True,
                      arguments: dict | None = None) -> commands.Queue.DeclareOk:
        return self._call(commands.Queue.Declare(queue=queue, passive=passive, durable=durable,
                                                 arguments=arguments),
                          commands.Queue.DeclareOk)

    def exchange_exists(self, exchange: str) -> bool:
        try:
            self._call(commands.Exchange.Declare(exchange=exchange, passive=True),
                       commands.Exchange.DeclareOk)
        except ChannelError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    def queue_exists(self, queue: str) -> commands.Queue.DeclareOk | None:
        try:
            return self.queue_declare(queue, passive=True)
        except ChannelError as exc:
            if exc.code == 404:
                return None
            raise

    # -- publishing --------------------------------------------------------------
    def confirm_select(self) -> None:
        if not self._confirming:
            self._call(commands.Confirm.Select(), commands.Confirm.SelectOk)
            self._confirming = True
            self._next_seq = 1
            self._pending.clear()
            self._early.clear()

    def _on_confirm(self, value: Any) -> None:
        tag = value.delivery_tag
        if isinstance(value, commands.Basic.Nack):
            self._nacked += 1
            raise PublishError(f"{safe_url(self.url)} refused (nacked) a published message "
                               f"(delivery tag {tag}): a queue may be full (x-overflow "
                               "reject-publish) or the broker failed to store it")
        pending = self._pending
        if value.multiple:
            while pending and pending[0] <= tag:
                pending.popleft()
        elif pending and pending[0] == tag:
            pending.popleft()
        else:
            self._early.add(tag)
        while pending and pending[0] in self._early:
            self._early.discard(pending.popleft())

    @property
    def unconfirmed(self) -> int:
        return len(self._pending) - len(self._early)

    def publish(self, exchange: str, routing_key: str, body: bytes,
                properties: dict[str, Any] | commands.Basic.Properties | None = None,
                mandatory: bool = False) -> None:
        """Queue one message for sending (sent when the buffer fills, or on a read).
        ``properties`` by pamqp attribute name (``message_type`` for ``type``), or a
        ``Basic.Properties``."""
        if isinstance(properties, commands.Basic.Properties):
            properties = {name: getattr(properties, name) for name in _PROPERTY_NAMES}
        out = self._out
        out += encode_publish(self.channel(), exchange, routing_key, body, properties or {},
                              self._frame_max, mandatory)
        if self._confirming:
            self._pending.append(self._next_seq)
            self._next_seq += 1
        if len(out) >= _SEND_CHUNK:
            self._flush()

    def wait_confirms(self, below: int = 0, timeout: float | None = None) -> None:
        """Block until at most ``below`` publishes are unconfirmed. Raises PublishError on
        a nack, ChannelError/ConnectionError_ if the channel or connection goes."""
        self._flush()
        deadline = time.monotonic() + (timeout or max(self.timeout, 30.0))
        while self.unconfirmed > below:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AMQPError(f"{safe_url(self.url)}: {self.unconfirmed} publish(es) not "
                                "confirmed in time")
            try:
                ch, value = self._read_frame(timeout=remaining)
            except TimeoutError:
                continue
            self._handle_async(ch, value)

    # -- consuming ---------------------------------------------------------------
    def qos(self, prefetch: int) -> None:
        self._call(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self._write(self.channel(), commands.Basic.Ack(delivery_tag=delivery_tag,
                                                       multiple=multiple))

    def consume(self, queue: str, arguments: dict | None = None, no_ack: bool = False,
                idle_timeout: float | None = None) -> Iterator[Delivery]:
        """Deliveries of a new consumer until the broker cancels it (basic.cancel), or, with
        ``idle_timeout``, until no delivery arrives for that long (then it is cancelled)."""
        ch = self.channel()
        tag = f"spark-{uuid.uuid4().hex[:12]}"
        self._write(ch, commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack,
                                               arguments=arguments))
        self._flush()
        self._expect(ch, commands.Basic.ConsumeOk)
        buf = self._buf
        while True:
            taken = take_delivery(buf)
            if taken is not None:  # the common case, decoded straight from the buffer
                size, delivery = taken
                del buf[:size]
                if delivery.consumer_tag == tag:
                    yield delivery
                continue
            try:
                c, value = self._read_frame(timeout=idle_timeout)
            except TimeoutError:
                if idle_timeout is None:
                    raise AMQPError(f"{safe_url(self.url)}: no delivery from {queue!r} "
                                    f"within {self.timeout:g}s") from None
                self._write(ch, commands.Basic.Cancel(consumer_tag=tag))
                self._flush()
                return
            if isinstance(value, commands.Basic.Deliver) and value.consumer_tag == tag:
                props, body = self._read_content()
                yield Delivery(value.delivery_tag, value.redelivered, value.exchange,
                               value.routing_key, props, body, tag)
            elif isinstance(value, commands.Basic.Deliver):
                self._read_content()  # another consumer's (an old RPC reply): drop
            elif isinstance(value, commands.Basic.Cancel) and value.consumer_tag == tag:
                if not value.nowait:
                    self._write(ch, commands.Basic.CancelOk(consumer_tag=tag))
                return
            elif not self._handle_async(c, value):
                continue

    def get(self, queue: str, no_ack: bool = False) -> Delivery | None:
        ch = self.channel()
        self._write(ch, commands.Basic.Get(queue=queue, no_ack=no_ack))
        self._flush()
        while True:
            c, value = self._read_frame()
            if isinstance(value, commands.Basic.GetEmpty):
                return None
            if isinstance(value, commands.Basic.GetOk):
                props, body = self._read_content()
                return Delivery(value.delivery_tag, value.redelivered, value.exchange,
                                value.routing_key, props, body)
            self._handle_async(c, value)

    # -- amq.leveret.api ---------------------------------------------------------
    def rpc(self, operation: str, payload: dict, timeout: float | None = None) -> dict:
        """Call ``amq.leveret.api``; the reply's fields, or RPCError with its error."""
        ch = self.channel()
        if self._reply_consumer is None:
            tag = f"rpc-{uuid.uuid4().hex[:12]}"
            self._write(ch, commands.Basic.Consume(queue="amq.rabbitmq.reply-to",
                                                   consumer_tag=tag, no_ack=True))
            self._flush()
            self._expect(ch, commands.Basic.ConsumeOk)
            self._reply_consumer = tag
        correlation = uuid.uuid4().hex
        self.publish("amq.leveret.api", operation, json.dumps(payload).encode(),
                     commands.Basic.Properties(reply_to="amq.rabbitmq.reply-to",
                                               correlation_id=correlation,
                                               content_type="application/json"))
        self._flush()
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                c, value = self._read_frame(timeout=remaining)
            except TimeoutError:
                raise RPCError(f"{safe_url(self.url)}: no reply to amq.leveret.api "
                               f"{operation!r} within {timeout or self.timeout:g}s "
                               "(is this a leveret broker with the API?)") from None
            if isinstance(value, commands.Basic.Deliver):
                props, body = self._read_content()
                if value.consumer_tag != self._reply_consumer or \
                        props.get("correlation_id") != correlation:
                    continue
                try:
                    reply = json.loads(body)
                except ValueError:
                    raise RPCError(f"amq.leveret.api {operation}: bad reply {body[:200]!r}") \
                        from None
                if not reply.get("ok"):
                    raise RPCError(f"amq.leveret.api {operation} {json.dumps(payload)}: "
                                   f"{reply.get('error', 'failed')}")
                return reply
            self._handle_async(c, value)
