"""The dead-letter console's HTTP API, under leveret's own prefix (RabbitMQ has none):

- ``GET /api/leveret/dead-letters[/{vhost}]``: the dead-letter queues (see
  :func:`leveret.core.dead_letter_browser.dead_letter_queues`) with their counts by
  reason and source queue → ``[{"vhost", "name", "messages", "counted", "by_reason",
  "by_source", "oldest_death", "newest_death"}]`` (times in epoch seconds)
- ``GET /api/leveret/dead-letters/{vhost}/{queue}/messages``: a page of any queue's
  waiting messages, read without side effects. Query: ``page`` (from 1), ``page_size``
  (default 50, at most 500), filters ``reason``, ``source_queue``, ``header`` (repeated,
  ``name:value``), ``min_age``/``max_age`` (seconds since the latest death), ``body``
  (text the body contains) → ``{"page", "page_size", "more", "items": [{"position",
  "exchange", "routing_key", "redelivered", "payload_bytes", "properties", "death",
  "deaths", "body": {"kind": "json"|"text"|"hex", "text"}}]}``

Browsing needs read permission on the queue (401 ``Access refused.``, as RabbitMQ's
get answers); a bad parameter is a 400 naming it, a missing vhost or queue a 404.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..core.access import Access
from ..core.broker import BrokerCore
from ..core.dead_letter_browser import DeadLetterFilter, dead_letter_queues, latest_death, page, summarize
from ..core.definitions_document import jsonable
from ..core.errors import BrokerError
from ..core.message import PROPERTY_NAMES, Message
from .admin import bad_request
from .common import route_vhost, visible_vhosts

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
TEXT_PREVIEW = 64 * 1024  # body bytes shown, at most


def render_body(body: bytes) -> dict[str, str]:
    """How a body is shown: JSON pretty-printed, UTF-8 text as is, anything else as
    hex (the first :data:`TEXT_PREVIEW` bytes)."""
    shown = body[:TEXT_PREVIEW]
    try:
        text = shown.decode()
    except UnicodeDecodeError:
        return {"kind": "hex", "text": shown.hex(" ")}
    try:
        return {"kind": "json", "text": json.dumps(json.loads(body), indent=2, ensure_ascii=False)}
    except ValueError:
        return {"kind": "text", "text": text}


def _message_info(position: int, message: Message, redelivered: bool) -> dict[str, Any]:
    death = latest_death(message)
    properties = message.properties
    headers = properties.headers or {}
    return {
        "position": position,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "redelivered": redelivered,
        "payload_bytes": len(message.body),
        "properties": jsonable({k: v for k in PROPERTY_NAMES if (v := getattr(properties, k)) is not None}),
        "death": None
        if death is None
        else {"queue": death.queue, "reason": death.reason, "time": death.time},
        "deaths": jsonable(headers.get("x-death") or []),
        "body": render_body(message.body),
    }


def _number(request: web.Request, name: str, default: float | None, low: float, high: float) -> float | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "bad_request", "reason": f"{name} must be a number"}),
            content_type="application/json",
        ) from None
    if not low <= value <= high:
        raise web.HTTPBadRequest(
            text=json.dumps(
                {"error": "bad_request", "reason": f"{name} must be between {low:g} and {high:g}"}
            ),
            content_type="application/json",
        )
    return value


def parse_filter(request: web.Request) -> DeadLetterFilter:
    """The filters of a messages request (see the module doc); HTTPBadRequest names a
    bad one."""
    headers = []
    for item in request.query.getall("header", []):
        name, colon, value = item.partition(":")
        if not colon or not name:
            raise web.HTTPBadRequest(
                text=json.dumps({"error": "bad_request", "reason": "header must be name:value"}),
                content_type="application/json",
            )
        headers.append((name, value))
    body = request.query.get("body")
    return DeadLetterFilter(
        reason=request.query.get("reason") or None,
        source_queue=request.query.get("source_queue") or None,
        headers=tuple(headers),
        min_age=_number(request, "min_age", None, 0, 1e12),
        max_age=_number(request, "max_age", None, 0, 1e12),
        body=body.encode() if body else None,
    )


class DeadLetterAPI:
    """The routes above for ``core`` (behind the management API's login and tags)."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/leveret/dead-letters", self.queues),
            web.get("/api/leveret/dead-letters/{vhost}", self.queues),
            web.get("/api/leveret/dead-letters/{vhost}/{queue}/messages", self.messages),
        ]

    async def queues(self, request: web.Request) -> web.Response:
        vhosts = visible_vhosts(self.core, request)  # (the route's, or the user's)
        answer = []
        for vhost in vhosts:
            for queue in dead_letter_queues(vhost):
                try:
                    summary = summarize(queue)
                except BrokerError:  # a queue type that cannot be browsed: counted as a whole
                    answer.append({"vhost": vhost.name, "name": queue.name, "messages": queue.message_count})
                    continue
                answer.append(
                    {
                        "vhost": vhost.name,
                        "name": queue.name,
                        "messages": summary.messages,
                        "counted": summary.counted,
                        "by_reason": dict(summary.by_reason),
                        "by_source": dict(summary.by_source),
                        "oldest_death": summary.oldest,
                        "newest_death": summary.newest,
                    }
                )
        return web.json_response(answer)

    async def messages(self, request: web.Request) -> web.Response:
        vhost = route_vhost(self.core, request)
        name = request.match_info["queue"]
        try:
            Access(self.core.users, request["user"], vhost.name).read("queue", name)
        except BrokerError:
            return web.json_response({"error": "not_authorised", "reason": "Access refused."}, status=401)
        queue = vhost.queues.get(name)
        if queue is None:
            return web.json_response({"error": "Object Not Found", "reason": "queue"}, status=404)
        number = int(_number(request, "page", 1, 1, 1_000_000) or 1)
        size = int(_number(request, "page_size", PAGE_SIZE, 1, MAX_PAGE_SIZE) or PAGE_SIZE)
        where = parse_filter(request)
        try:
            entries, more = page(queue, where, vhost.clock.time(), number, size)
        except BrokerError as exc:
            return bad_request(exc.text)
        first = (number - 1) * size + 1
        items = [_message_info(first + i, e.message, e.redelivered) for i, e in enumerate(entries)]
        return web.json_response({"page": number, "page_size": size, "more": more, "items": items})
