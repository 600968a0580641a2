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

- ``GET /api/leveret/dead-letters/{vhost}/{queue}/timeline?bucket=60``: the deaths of
  the messages now in the queue (up to 10,000 looked at) by time of their latest death,
  ``bucket`` seconds a point → ``{"bucket", "points": [{"time", "count", "by_reason"}]}``
- ``POST /api/leveret/dead-letters/{vhost}/{queue}/preview`` ``{"seqs": [...]}`` or
  ``{"filter": {...}}`` (the filters above as JSON; ``header`` a list of ``name:value``)
  → ``{"matching": n, "complete": bool}``
- ``POST /api/leveret/dead-letters/{vhost}/{queue}/actions`` ``{"action": "retry" |
  "move" | "copy" | "delete", "seqs" | "filter", "target": {"queue"} | {"exchange",
  "routing_key"?}}`` (a target for move and copy only) → 202 with the job, ``Location:
  /api/leveret/jobs/{id}`` (see :mod:`leveret.core.dead_letter_actions`)
- ``GET /api/leveret/jobs``, ``GET /api/leveret/jobs/{id}`` → ``{"id", "vhost",
  "queue", "action", "user", "target", "state": "running" | "done" | "cancelled" |
  "failed", "matched", "done", "failed", "error", "started", "finished"}``;
  ``DELETE /api/leveret/jobs/{id}`` cancels (202 with the job)
- ``GET /api/leveret/audit?limit=100`` → the audit trail, newest first: ``[{"time",
  "action", "user", "source", "details"}]`` (an administrator's: everyone's; another
  user's: their own)

Browsing, previews and actions need read permission on the queue (401 ``Access
refused.``, as RabbitMQ's get answers), an action also write permission on each exchange
it publishes to; a bad parameter is a 400 naming it, a missing vhost, queue, target or
job a 404. A user sees the jobs of the vhosts they work in.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..core.access import Access
from ..core.audit import TRAIL_LENGTH
from ..core.broker import BrokerCore
from ..core.dead_letter_actions import ACTIONS, DeadLetterJobs, Job, Selection, Target
from ..core.dead_letter_browser import (
    COUNT_LIMIT,
    DeadLetterFilter,
    dead_letter_queues,
    latest_death,
    page,
    summarize,
)
from ..core.definitions_document import jsonable
from ..core.errors import BrokerError
from ..core.exchange import DEFAULT_EXCHANGE
from ..core.message import PROPERTY_NAMES
from ..core.queues import QueuedMessage
from .admin import bad_request
from .common import amqp, json_body, json_error, route_vhost, session, visible_vhosts, works_in
from .resources import DEFAULT_EXCHANGE_PATH

if TYPE_CHECKING:
    from ..core.queues import Queue
    from ..core.vhost import VirtualHost

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


def _message_info(position: int, entry: QueuedMessage) -> dict[str, Any]:
    message = entry.message
    death = latest_death(message)
    properties = message.properties
    headers = properties.headers or {}
    return {
        "seq": entry.seq,
        "position": position,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "redelivered": entry.redelivered,
        "payload_bytes": len(message.body),
        "properties": jsonable({k: v for k in PROPERTY_NAMES if (v := getattr(properties, k)) is not None}),
        "death": None
        if death is None
        else {"queue": death.queue, "reason": death.reason, "time": death.time},
        "deaths": jsonable(headers.get("x-death") or []),
        "body": render_body(message.body),
    }


def _bad(reason: str) -> web.HTTPException:
    return json_error(400, "bad_request", reason)


def _number(
    values: Mapping[str, Any], name: str, default: float | None, low: float, high: float
) -> float | None:
    """The number ``values[name]`` (a query's text or JSON), between ``low`` and ``high``."""
    raw = values.get(name)
    if raw is None or raw == "":
        return default
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = float(raw)
    except (TypeError, ValueError):
        raise _bad(f"{name} must be a number") from None
    if not low <= value <= high:
        raise _bad(f"{name} must be between {low:g} and {high:g}")
    return value


def _filter(values: Mapping[str, Any], header_items: list[Any]) -> DeadLetterFilter:
    """A filter from a query or a JSON object (see the module doc); 400 names a bad part."""
    headers = []
    for item in header_items:
        name, colon, value = item.partition(":") if isinstance(item, str) else ("", "", "")
        if not colon or not name:
            raise _bad("header must be name:value")
        headers.append((name, value))
    texts: dict[str, str | None] = {}
    for key in ("reason", "source_queue", "body"):
        given = values.get(key)
        if given is not None and not isinstance(given, str):
            raise _bad(f"{key} must be a string")
        texts[key] = given or None
    return DeadLetterFilter(
        reason=texts["reason"],
        source_queue=texts["source_queue"],
        headers=tuple(headers),
        min_age=_number(values, "min_age", None, 0, 1e12),
        max_age=_number(values, "max_age", None, 0, 1e12),
        body=texts["body"].encode() if texts["body"] else None,
    )


def parse_filter(request: web.Request) -> DeadLetterFilter:
    """The filters of a messages request's query (see the module doc)."""
    return _filter(request.query, request.query.getall("header", []))


def parse_selection(body: dict) -> Selection:
    """``{"seqs": [...]}`` or ``{"filter": {...}}`` (neither: every message)."""
    seqs = body.get("seqs")
    if seqs is not None:
        if not isinstance(seqs, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in seqs
        ):
            raise _bad("seqs must be a list of integers")
        return Selection(seqs=frozenset(seqs))
    where = body.get("filter") or {}
    if not isinstance(where, dict):
        raise _bad("filter must be a JSON object")
    header = where.get("header") or []
    return Selection(filter=_filter(where, header if isinstance(header, list) else [header]))


def parse_target(body: dict, action: str) -> Target | None:
    """The ``target`` of a move or copy: ``{"queue"}`` or ``{"exchange", "routing_key"?}``."""
    if action not in ("move", "copy"):
        return None
    target = body.get("target")
    if not isinstance(target, dict):
        raise _bad(f'{action} needs a target: {{"queue": name}} or {{"exchange": name}}')
    queue, exchange, key = target.get("queue"), target.get("exchange"), target.get("routing_key")
    if (queue is None) == (exchange is None):
        raise _bad("target must name a queue or an exchange")
    for name, value in (("queue", queue), ("exchange", exchange), ("routing_key", key)):
        if value is not None and not isinstance(value, str):
            raise _bad(f"target {name} must be a string")
    if exchange == DEFAULT_EXCHANGE_PATH:
        exchange = DEFAULT_EXCHANGE
    return Target(queue=queue, exchange=exchange, routing_key=key)


def timeline(entries: list[QueuedMessage], bucket: int) -> list[dict[str, Any]]:
    """The latest deaths of ``entries`` counted by ``bucket``-second interval (epoch
    seconds of its start), by reason, oldest first; messages without a death time are
    left out."""
    points: dict[int, Counter[str]] = {}
    for entry in entries:
        death = latest_death(entry.message)
        if death is not None and death.time is not None:
            start = int(death.time // bucket * bucket)
            points.setdefault(start, Counter())[death.reason] += 1
    return [
        {"time": start, "count": sum(counts.values()), "by_reason": dict(counts)}
        for start, counts in sorted(points.items())
    ]


class DeadLetterAPI:
    """The routes above for ``core`` (behind the management API's login and tags)."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/leveret/dead-letters", self.queues),
            web.get("/api/leveret/dead-letters/{vhost}", self.queues),
            web.get("/api/leveret/dead-letters/{vhost}/{queue}/messages", self.messages),
            web.get("/api/leveret/dead-letters/{vhost}/{queue}/timeline", self.timeline),
            web.post("/api/leveret/dead-letters/{vhost}/{queue}/preview", self.preview),
            web.post("/api/leveret/dead-letters/{vhost}/{queue}/actions", self.start),
            web.get("/api/leveret/jobs", self.jobs),
            web.get("/api/leveret/jobs/{id}", self.job),
            web.delete("/api/leveret/jobs/{id}", self.cancel),
            web.get("/api/leveret/audit", self.audit),
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

    def _queue(self, request: web.Request) -> tuple[VirtualHost, Queue]:
        """The route's queue, which the user may read (401, 404 otherwise)."""
        vhost = route_vhost(self.core, request)
        name = request.match_info["queue"]
        try:
            Access(self.core.users, request["user"], vhost.name).read("queue", name)
        except BrokerError:
            raise json_error(401, "not_authorised", "Access refused.") from None
        queue = vhost.queues.get(name)
        if queue is None:
            raise json_error(404, "Object Not Found", "queue")
        return vhost, queue

    async def messages(self, request: web.Request) -> web.Response:
        vhost, queue = self._queue(request)
        number = int(_number(request.query, "page", 1, 1, 1_000_000) or 1)
        size = int(_number(request.query, "page_size", PAGE_SIZE, 1, MAX_PAGE_SIZE) or PAGE_SIZE)
        where = parse_filter(request)
        try:
            entries, more = page(queue, where, vhost.clock.time(), number, size)
        except BrokerError as exc:
            return bad_request(exc.text)
        first = (number - 1) * size + 1
        items = [_message_info(first + i, entry) for i, entry in enumerate(entries)]
        return web.json_response({"page": number, "page_size": size, "more": more, "items": items})

    async def timeline(self, request: web.Request) -> web.Response:
        _, queue = self._queue(request)
        bucket = int(_number(request.query, "bucket", 60, 1, 86400 * 365) or 60)
        try:
            entries = queue.browse(COUNT_LIMIT)
        except BrokerError as exc:
            return bad_request(exc.text)
        return web.json_response({"bucket": bucket, "points": timeline(entries, bucket)})

    async def preview(self, request: web.Request) -> web.Response:
        vhost, queue = self._queue(request)
        selection = parse_selection(await json_body(request))
        try:
            matching, complete = DeadLetterJobs.preview(queue, selection, vhost.clock.time())
        except BrokerError as exc:
            return bad_request(exc.text)
        return web.json_response({"matching": matching, "complete": complete})

    async def start(self, request: web.Request) -> web.Response:
        vhost, queue = self._queue(request)
        body = await json_body(request)
        action = body.get("action")
        if action not in ACTIONS:
            raise _bad(f"action must be one of {', '.join(ACTIONS)}")
        selection = parse_selection(body)
        target = parse_target(body, action)
        user_session = session(self.core, request, vhost)
        job = amqp(
            lambda: self.core.dead_letter_jobs.start(
                user_session, queue, action, selection, target, request.remote or ""
            )
        )
        return web.json_response(
            job.as_json(), status=202, headers={"Location": f"/api/leveret/jobs/{job.id}"}
        )

    def _job(self, request: web.Request) -> Job:
        job = self.core.dead_letter_jobs.jobs.get(request.match_info["id"])
        if job is None or not works_in(self.core, request["user"], job.vhost):
            raise json_error(404, "Object Not Found", "job")
        return job

    async def jobs(self, request: web.Request) -> web.Response:
        user = request["user"]
        jobs = [
            job.as_json()
            for job in self.core.dead_letter_jobs.jobs.values()
            if works_in(self.core, user, job.vhost)
        ]
        return web.json_response(sorted(jobs, key=lambda job: -job["started"]))

    async def job(self, request: web.Request) -> web.Response:
        return web.json_response(self._job(request).as_json())

    async def cancel(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job.user != request["user"].name and "administrator" not in request["user"].tags:
            raise json_error(401, "not_authorised", "Access refused.")
        self.core.dead_letter_jobs.cancel(job.id)
        return web.json_response(job.as_json(), status=202)

    async def audit(self, request: web.Request) -> web.Response:
        user = request["user"]
        limit = int(_number(request.query, "limit", 100, 1, TRAIL_LENGTH) or 100)
        entries = self.core.audit.latest(limit, None if "administrator" in user.tags else user.name)
        return web.json_response(
            [
                {
                    "time": e.time,
                    "action": e.action,
                    "user": e.user,
                    "source": e.source,
                    "details": jsonable(e.details),
                }
                for e in entries
            ]
        )
