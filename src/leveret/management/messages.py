"""Publish and get over HTTP, as RabbitMQ 3.10's management API does them.

- ``POST /api/exchanges/{vhost}/{exchange}/publish`` ``{"properties", "routing_key",
  "payload", "payload_encoding": "string"|"base64"}`` → ``{"routed": bool}``: published
  as the user (write permission), mandatory and confirmed (``amq.default`` is the
  default exchange); the answer waits until the message is safe (on disk for a
  persistent message in a durable queue).
- ``POST /api/queues/{vhost}/{queue}/get`` ``{"count", "ackmode", "encoding",
  "truncate"?}``: basic.get ``count`` times as the user (read permission), then per
  ``ackmode``: ``ack_requeue_true``/``reject_requeue_true`` put the messages back
  (marked redelivered, as RabbitMQ), ``ack_requeue_false`` removes them,
  ``reject_requeue_false`` rejects them (dead-lettered where the queue says so). Items:
  ``payload_bytes, redelivered, exchange, routing_key, message_count, properties,
  payload, payload_encoding``; ``encoding: auto`` gives text when the (truncated)
  payload is UTF-8, else base64.

Error bodies are RabbitMQ's (checked against a node): a refused publish is a 400
``403 ACCESS_REFUSED - ...``, a refused get a 401 ``ACCESS_REFUSED - ...``; except that an unknown
``ackmode`` is a 400 here where RabbitMQ 3.10 answers 500.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
from typing import Any

from aiohttp import web

from ..core.broker import BrokerCore
from ..core.definitions_document import jsonable
from ..core.errors import BrokerError
from ..core.exchange import DEFAULT_EXCHANGE
from ..core.message import Message, Properties
from ..core.publish import Publisher
from ..core.queues import QueuedMessage
from .common import json_body, json_error, route_vhost, session
from .resources import DEFAULT_EXCHANGE_PATH

ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
_INT_PROPERTIES = ("delivery_mode", "priority", "timestamp")
_STRING_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
)


def _missing(body: dict, keys: tuple[str, ...]) -> None:
    absent = [k for k in keys if k not in body]
    if absent:
        raise json_error(400, "bad_request", "[" + ",".join(f"{{key_missing,{k}}}" for k in absent) + "]")


def _integer(body: dict, key: str) -> int:
    """A non-negative integer field, or its decimal text (rabbitmqadmin sends
    ``"count": "1"``); 400 ``["not_int", key]`` otherwise."""
    value = body[key]
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise json_error(400, "bad_request", ["not_int", key])
    return value


def _properties(value: Any) -> Properties:
    """RabbitMQ's ``properties`` object as core's Properties (400 ``not_int`` /
    ``not_string`` as RabbitMQ for a wrong type)."""
    if value in (None, []):
        return Properties()
    if not isinstance(value, dict):
        raise json_error(400, "bad_request", "properties must be a JSON object")
    properties = Properties()
    for key in _INT_PROPERTIES:
        if key in value:
            if not isinstance(value[key], int) or isinstance(value[key], bool):
                raise json_error(400, "bad_request", ["not_int", key])
            if key == "timestamp":
                properties.timestamp = datetime.datetime.fromtimestamp(value[key], datetime.UTC)
            else:
                setattr(properties, key, value[key])
    for key in _STRING_PROPERTIES:
        if key in value:
            if not isinstance(value[key], str):
                raise json_error(400, "bad_request", ["not_string", key])
            setattr(properties, key, value[key])
    headers = value.get("headers")
    if headers is not None:
        if not isinstance(headers, dict):
            raise json_error(400, "bad_request", ["not_table", "headers"])
        properties.headers = headers
    return properties


def properties_json(properties: Properties) -> Any:
    """A message's properties as RabbitMQ's get shows them: only those set (an empty
    list when none, RabbitMQ's own quirk)."""
    shown = {
        name: jsonable(getattr(properties, name))
        for name in ("content_type", "content_encoding", "headers", *_INT_PROPERTIES, *_STRING_PROPERTIES)
        if getattr(properties, name) is not None
    }
    return shown or []


class _Confirm:
    """PublisherEvents for one HTTP publish: returned or not, then confirmed or not."""

    def __init__(self) -> None:
        self.routed = True
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def confirms_ready(self) -> None:
        if not self.done.done():
            self.done.set_result(True)

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        if not self.done.done():
            self.done.set_result(False)

    def returned(self, exchange: str, message: Message) -> None:
        self.routed = False


class Messages:
    """The handlers, on ``core``."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/api/exchanges/{vhost}/{name}/publish", self.publish),
            web.post("/api/queues/{vhost}/{name}/get", self.get),
        ]

    async def publish(self, request: web.Request) -> web.Response:
        vhost = route_vhost(self.core, request)
        body = await json_body(request)
        _missing(body, ("routing_key", "properties", "payload", "payload_encoding"))
        routing_key, payload, encoding = body["routing_key"], body["payload"], body["payload_encoding"]
        if not isinstance(routing_key, str) or not isinstance(payload, str):
            raise json_error(400, "bad_request", "routing_key and payload must be strings")
        if encoding == "string":
            data = payload.encode()
        elif encoding == "base64":
            try:
                data = base64.b64decode(payload, validate=True)
            except ValueError:
                raise json_error(400, "bad_request", ["not_base64", payload]) from None
        else:
            raise json_error(400, "bad_request", ["unsupported_encoding", encoding])
        properties = _properties(body["properties"])
        name = request.match_info["name"]
        name = DEFAULT_EXCHANGE if name == DEFAULT_EXCHANGE_PATH else name
        events = _Confirm()
        publisher = Publisher(session(self.core, request, vhost), events)
        publisher.select_confirms()
        try:
            exchange = publisher.exchange(name, routing_key)
            publisher.publish(exchange, Message.build(name, routing_key, data, properties), mandatory=True)
        except BrokerError as exc:  # RabbitMQ's 400, with the AMQP code and text
            code = {
                "access_refused": "403 ACCESS_REFUSED",
                "not_found": "404 NOT_FOUND",
                "precondition_failed": "406 PRECONDITION_FAILED",
            }
            raise json_error(
                400, "bad_request", f"{code.get(exc.condition, exc.condition.upper())} - {exc.text}"
            ) from None
        try:
            confirmed = await events.done
        finally:
            publisher.close()
        return web.json_response({"routed": events.routed and confirmed})

    async def get(self, request: web.Request) -> web.Response:
        vhost = route_vhost(self.core, request)
        body = await json_body(request)
        _missing(body, ("count", "ackmode", "encoding"))
        count, ackmode, encoding = _integer(body, "count"), body["ackmode"], body["encoding"]
        truncate = _integer(body, "truncate") if body.get("truncate") is not None else None
        if count < 1:
            raise json_error(400, "bad_request", ["not_int", "count"])
        if ackmode not in ACK_MODES:
            raise json_error(400, "bad_request", f"Unsupported ackmode '{ackmode}'")
        if encoding not in ("auto", "base64"):
            raise json_error(400, "bad_request", "Unsupported encoding. Please use auto or base64.")
        user_session = session(self.core, request, vhost)
        try:
            queue = user_session.readable_queue(request.match_info["name"])
        except BrokerError as exc:
            if exc.condition == "access_refused":
                raise json_error(401, "not_authorised", f"ACCESS_REFUSED - {exc.text}") from None
            if exc.condition == "not_found":
                raise json_error(404, "not_found", f"NOT_FOUND - {exc.text}") from None
            code = {"resource_locked": "405 ", "precondition_failed": "406 "}.get(exc.condition, "")
            raise json_error(400, "bad_request", f"{code}{exc.condition.upper()} - {exc.text}") from None
        taken: list[QueuedMessage] = []
        items = []
        try:
            for _ in range(count):
                entry = queue.get()
                if entry is None:
                    break
                taken.append(entry)
                items.append(self._item(entry, queue.message_count, encoding, truncate))
        except BrokerError as exc:
            queue.requeue(taken)
            raise json_error(400, "bad_request", exc.text) from None
        if ackmode.endswith("requeue_true"):
            # RabbitMQ 4.3's management settles ack_requeue_true with basic.nack (a
            # return) and reject_requeue_true with basic.reject (a failed delivery)
            queue.requeue(taken, failed=ackmode == "reject_requeue_true")
        elif ackmode == "ack_requeue_false":
            for entry in taken:
                queue.ack(entry)
        else:
            for entry in taken:
                queue.discard(entry, "rejected")
        if taken and ackmode.endswith("requeue_false"):
            self.core.audit.record(
                "queue.get",
                request["user"].name,
                request.remote or "",
                vhost=vhost.name,
                queue=queue.name,
                messages=len(taken),
                ackmode=ackmode,
            )
        return web.json_response(items)

    @staticmethod
    def _item(entry: QueuedMessage, remaining: int, encoding: str, truncate: int | None) -> dict:
        message = entry.message
        payload = message.body if truncate is None else message.body[:truncate]
        text: str | None = None
        if encoding == "auto":
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        return {
            "payload_bytes": len(message.body),
            "redelivered": entry.redelivered,
            "exchange": message.exchange,
            "routing_key": message.routing_key,
            "message_count": remaining,
            "properties": properties_json(message.properties),
            "payload": text if text is not None else base64.b64encode(payload).decode(),
            "payload_encoding": "string" if text is not None else "base64",
        }
