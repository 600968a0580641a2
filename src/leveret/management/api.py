"""A subset of RabbitMQ's management HTTP API (``/api/...``), JSON over aiohttp.

It reads and changes the broker only through core's public objects. Authentication
is HTTP basic with the broker's users (``guest`` from loopback only, as for AMQP); a
refused login is RabbitMQ's 401 ``Login failed`` (logged, throttled per address), a
user without a management tag gets 401 ``Not management user``, administration needs
``administrator``; a missing vhost or queue is 404. Requests must name an allowed
``Host``; answers carry :data:`SECURITY_HEADERS`. Field names follow RabbitMQ's API so
existing tools and scripts can read it:

- ``GET /api/overview``: product, version and object totals
- ``GET /api/vhosts``
- ``GET /api/queues``, ``/api/queues/{vhost}``, ``/api/queues/{vhost}/{name}``:
  name, vhost, durable, auto_delete, exclusive, arguments, policy, messages,
  messages_ready, messages_unacknowledged, consumers
- ``GET /api/exchanges/{vhost}``, ``GET /api/bindings/{vhost}``
- ``DELETE /api/queues/{vhost}/{name}/contents``: purge
- users, permissions, topic permissions, vhosts: see :mod:`.admin`
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
from dataclasses import asdict
from ssl import SSLContext
from typing import Any

from aiohttp import web

from ..core import audit
from ..core.access import Access
from ..core.auth import AuthenticationError, LoopbackOnly, User
from ..core.broker import BrokerCore
from ..core.definitions_document import jsonable
from ..core.errors import BrokerError
from ..core.policy import matching
from ..core.queues import Queue
from ..core.scheduler import JobInfo
from ..version import __version__
from .admin import NOT_FOUND, AdminAPI
from .dead_letters import DeadLetterAPI

#: Core's neutral errors as HTTP statuses (RabbitMQ's management API answers a
#: precondition failure with 400 bad_request).
_STATUS = {"not_found": 404, "access_refused": 403, "resource_locked": 405, "precondition_failed": 400}


@web.middleware
async def _broker_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """A request core refuses gets a JSON error with a 4xx status, never a 500."""
    try:
        return await handler(request)
    except BrokerError as exc:
        return web.json_response(
            {"error": exc.condition, "reason": exc.text}, status=_STATUS.get(exc.condition, 400)
        )


#: Any of these tags opens the management API (RabbitMQ's rule). ``administrator``
#: works in every vhost; the others in those they have a permission in, though
#: ``monitoring`` lists every vhost.
MANAGEMENT_TAGS = frozenset(("administrator", "monitoring", "policymaker", "management"))
SEES_ALL_TAGS = frozenset(("administrator", "monitoring"))
#: Routes that need the administrator tag (all methods, except GET on a vhost).
ADMIN_PATHS = frozenset(
    (
        "/api/users",
        "/api/users/{user}",
        "/api/users/{user}/permissions",
        "/api/users/{user}/topic-permissions",
        "/api/permissions",
        "/api/permissions/{vhost}/{user}",
        "/api/topic-permissions",
        "/api/topic-permissions/{vhost}/{user}",
        "/api/vhosts/{vhost}/permissions",
        "/api/definitions",
    )
)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: Sent with every answer: RabbitMQ's content security policy, and no sniffing,
#: framing or caching of what the API says.
SECURITY_HEADERS = {
    "Content-Security-Policy": "script-src 'self' 'unsafe-eval' 'unsafe-inline'; object-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
log = logging.getLogger("leveret.management")


def _unauthorised(reason: str) -> web.Response:
    return web.json_response(
        {"error": "not_authorised", "reason": reason},
        status=401,
        headers={"WWW-Authenticate": 'Basic realm="leveret"'},
    )


def host_name(header: str) -> str:
    """The host part of a ``Host`` header: ``name``, ``name:port``, ``[v6]:port``."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        return header.partition(":")[0]
    return header


class ManagementAPI:
    """Serves the API for ``core`` on ``host:port`` (0 picks a free port), and over TLS
    on ``https_port`` with the ``tls`` context.
    ``allowed_hosts``: the names a request's ``Host`` header may carry (against DNS
    rebinding); by default the loopback names and ``host`` itself."""

    def __init__(
        self,
        core: BrokerCore,
        host: str,
        port: int | None,
        allowed_hosts: list[str] | None = None,
        https_port: int | None = None,
        tls: SSLContext | None = None,
    ) -> None:
        self.core = core
        self.host = host
        self.port = port  # plain HTTP (None: off)
        self.https_port = https_port  # HTTPS with ``tls`` (None: off)
        self._tls = tls
        defaults = [*LOOPBACK_HOSTS, host] if host not in ("", "0.0.0.0", "::") else list(LOOPBACK_HOSTS)
        self.allowed_hosts = {h.lower() for h in (allowed_hosts or defaults)}
        self._runner: web.AppRunner | None = None
        app = web.Application(middlewares=[self._guard, self._authenticate, _broker_errors])
        app.add_routes(
            [
                web.get("/api/overview", self.overview),
                web.get("/api/vhosts", self.vhosts),
                web.get("/api/queues", self.queues),
                web.get("/api/queues/{vhost}", self.queues),
                web.get("/api/queues/{vhost}/{name}", self.queue),
                web.delete("/api/queues/{vhost}/{name}/contents", self.purge),
                web.get("/api/exchanges/{vhost}", self.exchanges),
                web.get("/api/bindings/{vhost}", self.bindings),
                web.get("/api/scheduled-jobs", self.scheduled_jobs),
                web.get("/api/scheduled-jobs/{vhost}", self.scheduled_jobs),
                web.get("/api/scheduled-jobs/{vhost}/{id}", self.scheduled_job),
                web.delete("/api/scheduled-jobs/{vhost}/{id}", self.cancel_scheduled_job),
                *AdminAPI(core).routes(),
                *DeadLetterAPI(core, self._vhost, self._visible_vhosts).routes(),
            ]
        )
        self.app = app

    async def start(self) -> None:
        """Listen on the running loop; :attr:`port` is then the port bound (OSError if it
        cannot be bound)."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        if self.port is not None:
            await web.TCPSite(self._runner, self.host, self.port).start()
            self.port = self._runner.addresses[-1][1]
        if self.https_port is not None:
            await web.TCPSite(self._runner, self.host, self.https_port, ssl_context=self._tls).start()
            self.https_port = self._runner.addresses[-1][1]

    async def stop(self) -> None:
        """Stop listening and close open HTTP connections."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Refuse a ``Host`` not in :attr:`allowed_hosts` (400; a browser page on
        another site cannot reach the API through DNS rebinding), and send
        :data:`SECURITY_HEADERS` with every answer."""
        host = host_name(request.headers.get("Host", "")).lower()
        if host not in self.allowed_hosts:
            log.warning("HTTP request from %s refused: Host '%s' not allowed", request.remote, host)
            response: web.StreamResponse = web.json_response(
                {"error": "bad_request", "reason": f"Host '{host}' is not allowed (http_allowed_hosts)"},
                status=400,
            )
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                response = exc
        response.headers.update(SECURITY_HEADERS)
        if isinstance(response, web.HTTPException):
            raise response
        return response

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """HTTP basic login with the broker's users: a refused login is RabbitMQ's 401
        ``Login failed`` (logged without the secret, slowed down per address); then
        the tags must allow the route (401 ``Not management user`` / ``Not
        administrator user``)."""
        header = request.headers.get("Authorization", "")
        peer = request.remote or ""
        username = "?"
        delay = self.core.login_throttle.delay(peer)
        if delay:  # this address failed too often: every answer waits, a right one too
            await asyncio.sleep(delay)
        try:
            scheme, _, encoded = header.partition(" ")
            if scheme.lower() != "basic":
                raise AuthenticationError("basic authentication required")
            username, _, password = base64.b64decode(encoded).decode().partition(":")
            loopback = peer in ("", "localhost") or ipaddress.ip_address(peer).is_loopback
            user = self.core.users.authenticate(username, password, loopback)
        except (AuthenticationError, ValueError, UnicodeDecodeError) as exc:
            log.warning("HTTP access denied: user '%s' from %s - %s", username, peer, exc)
            audit.record("login.refused", username, peer, protocol="http")
            self.core.login_throttle.failed(peer)
            if isinstance(exc, LoopbackOnly):
                return _unauthorised("User can only log in via localhost")
            return web.json_response(
                {"error": "not_authorized", "reason": "Login failed"},
                status=401,
                headers={"WWW-Authenticate": 'Basic realm="leveret"'},
            )
        self.core.login_throttle.succeeded(peer)
        tags = set(user.tags)
        if not tags & MANAGEMENT_TAGS:
            return _unauthorised("Not management user")
        resource = request.match_info.route.resource
        path = resource.canonical if resource is not None else ""
        admin = path in ADMIN_PATHS or (path == "/api/vhosts/{vhost}" and request.method != "GET")
        if admin and "administrator" not in tags:
            return _unauthorised("Not administrator user")
        request["user"] = user
        return await handler(request)

    # -- helpers --------------------------------------------------------------------
    def _works_in(self, user: User, vhost: str) -> bool:
        """Whether ``user``'s lists and requests reach into ``vhost``: an administrator
        everywhere, anyone else where they have a permission (RabbitMQ 3.10)."""
        return "administrator" in user.tags or self.core.users.may_access(user, vhost)

    def _vhost(self, request: web.Request) -> Any:
        """The route's vhost: RabbitMQ's 401 if the user has no permission there, 404 if
        there is none."""
        name = request.match_info["vhost"]
        if not self._works_in(request["user"], name):
            raise web.HTTPUnauthorized(
                text=json.dumps(
                    {"error": "not_authorised", "reason": "User not authorised to access virtual host"}
                ),
                content_type="application/json",
            )
        vhost = self.core.vhosts.get(name)
        if vhost is None:
            raise web.HTTPNotFound(text=json.dumps(NOT_FOUND), content_type="application/json")
        return vhost

    def _visible_vhosts(self, request: web.Request) -> list:
        """The vhosts whose queues, exchanges and bindings the user's lists show."""
        return [v for name, v in self.core.vhosts.items() if self._works_in(request["user"], name)]

    def _queue_info(self, queue: Queue) -> dict:
        policy = matching(self.core.policies, queue.vhost.name, queue.name, "queues")
        info = {
            "name": queue.name,
            "vhost": queue.vhost.name,
            "durable": queue.durable,
            "auto_delete": queue.auto_delete,
            "exclusive": queue.exclusive_owner is not None,
            "type": queue.type_name,
            "arguments": jsonable(queue.arguments),
            "policy": policy.name if policy else None,
            "messages_ready": queue.message_count,
            "messages_unacknowledged": queue.unacked_count,
            "messages": queue.message_count + queue.unacked_count,
            "consumers": len(queue.consumers),
        }
        if queue.config.single_active_consumer:  # RabbitMQ shows it for such queues only
            active = queue.single_active_consumer
            info["single_active_consumer_tag"] = active.tag if active is not None else None
        return info

    # -- handlers -------------------------------------------------------------------
    async def overview(self, request: web.Request) -> web.Response:
        """``GET /api/overview``: product, version, object and message totals over the
        vhosts the user may open."""
        vhosts = self._visible_vhosts(request)
        queues = [q for v in vhosts for q in v.queues.values()]
        return web.json_response(
            {
                "product_name": "leveret",
                "product_version": __version__,
                "management_version": __version__,
                "object_totals": {
                    "vhosts": len(vhosts),
                    "queues": len(queues),
                    "exchanges": sum(len(v.exchanges) for v in vhosts),
                },
                "queue_totals": {
                    "messages_ready": sum(q.message_count for q in queues),
                    "messages_unacknowledged": sum(q.unacked_count for q in queues),
                },
            }
        )

    async def vhosts(self, request: web.Request) -> web.Response:
        """``GET /api/vhosts``: ``[{"name"}]``, every vhost for administrators and
        monitoring users, else those the user has a permission in (RabbitMQ 3.10)."""
        user = request["user"]
        sees_all = bool(SEES_ALL_TAGS.intersection(user.tags))
        names = [n for n in self.core.vhosts if sees_all or self.core.users.may_access(user, n)]
        return web.json_response([{"name": n} for n in names])

    async def queues(self, request: web.Request) -> web.Response:
        """``GET /api/queues[/{vhost}]``: queues by vhost, then name (404 for a vhost
        the user may not open)."""
        vhosts = [self._vhost(request)] if "vhost" in request.match_info else self._visible_vhosts(request)
        return web.json_response(
            [self._queue_info(q) for v in vhosts for q in sorted(v.queues.values(), key=lambda q: q.name)]
        )

    async def queue(self, request: web.Request) -> web.Response:
        """``GET /api/queues/{vhost}/{name}``: one queue; 404 if missing."""
        queue = self._vhost(request).queues.get(request.match_info["name"])
        if queue is None:
            raise web.HTTPNotFound(
                text='{"error": "Object Not Found", "reason": "queue"}', content_type="application/json"
            )
        return web.json_response(self._queue_info(queue))

    # -- scheduled messages (leveret's; ActiveMQ's scheduler and delayed messages) ------------
    async def scheduled_jobs(self, request: web.Request) -> web.Response:
        """``GET /api/scheduled-jobs[/{vhost}]``: waiting jobs, the soonest due first
        (``?limit=``, 100 by default), of the vhosts the user works in; fields as
        ``leveret scheduler list`` (``next_due`` in epoch ms)."""
        vhosts = [self._vhost(request)] if "vhost" in request.match_info else self._visible_vhosts(request)
        limit = _int_param(request, "limit", 100)
        jobs = [job for vhost in vhosts for job in self.core.scheduler.jobs(vhost.name, limit)]
        jobs.sort(key=lambda job: job.next_due)
        return web.json_response([_job_json(job) for job in jobs[:limit]])

    def _scheduled(self, request: web.Request) -> JobInfo:
        vhost = self._vhost(request)
        job = self.core.scheduler.job(request.match_info["id"])
        if job is None or job.vhost != vhost.name:
            raise web.HTTPNotFound(
                text='{"error": "Object Not Found", "reason": "scheduled job"}',
                content_type="application/json",
            )
        return job

    async def scheduled_job(self, request: web.Request) -> web.Response:
        """``GET /api/scheduled-jobs/{vhost}/{id}``: one job; 404 if there is none."""
        return web.json_response(_job_json(self._scheduled(request)))

    async def cancel_scheduled_job(self, request: web.Request) -> web.Response:
        """``DELETE /api/scheduled-jobs/{vhost}/{id}``: cancel a job (204); 401 ``Access
        refused.`` without write permission on its exchange (who may publish there may
        take back what was published), 404 if there is none."""
        job = self._scheduled(request)
        try:
            Access(self.core.users, request["user"], job.vhost).publish(job.exchange)
        except BrokerError:
            return _unauthorised("Access refused.")
        self.core.scheduler.cancel(job.job_id, job.vhost)
        audit.record(
            "scheduled.cancel", request["user"].name, request.remote or "", vhost=job.vhost, job=job.job_id
        )
        return web.Response(status=204)

    async def purge(self, request: web.Request) -> web.Response:
        """``DELETE /api/queues/{vhost}/{name}/contents``: purge ready messages (204); 401
        ``Access refused.`` without read permission on the queue (RabbitMQ's answer),
        404 if missing, 400 for a stream (which cannot be purged)."""
        vhost = self._vhost(request)
        name = request.match_info["name"]
        # RabbitMQ's API purges through AMQP as the user: read on the queue, or its 401.
        try:
            Access(self.core.users, request["user"], vhost.name).read("queue", name)
        except BrokerError:
            return _unauthorised("Access refused.")
        queue = vhost.queues.get(name)
        if queue is None:
            raise web.HTTPNotFound(
                text='{"error": "Object Not Found", "reason": "queue"}', content_type="application/json"
            )
        count = queue.purge()
        audit.record(
            "queue.purge",
            request["user"].name,
            request.remote or "",
            vhost=queue.vhost.name,
            queue=queue.name,
            messages=count,
        )
        return web.Response(status=204)

    async def exchanges(self, request: web.Request) -> web.Response:
        """``GET /api/exchanges/{vhost}``: by name; the default exchange's is ``""``."""
        vhost = self._vhost(request)
        return web.json_response(
            [
                {
                    "name": e.name,
                    "vhost": vhost.name,
                    "type": e.type,
                    "durable": e.durable,
                    "auto_delete": e.auto_delete,
                    "internal": e.internal,
                    "arguments": jsonable(e.arguments),
                }
                for e in sorted(vhost.exchanges.values(), key=lambda e: e.name)
            ]
        )

    async def bindings(self, request: web.Request) -> web.Response:
        """``GET /api/bindings/{vhost}``: every binding, by source exchange (RabbitMQ's
        implicit default-exchange bindings are not listed)."""
        vhost = self._vhost(request)
        rows = []
        for exchange in vhost.exchanges.values():
            for binding in exchange.bindings.values():
                rows.append(
                    {
                        "source": exchange.name,
                        "vhost": vhost.name,
                        "destination": binding.destination.name,
                        "destination_type": "queue" if isinstance(binding.destination, Queue) else "exchange",
                        "routing_key": binding.routing_key,
                        "arguments": jsonable(binding.arguments),
                    }
                )
        return web.json_response(rows)


def _job_json(job: JobInfo) -> dict[str, Any]:
    return {**asdict(job), "next_due": int(job.next_due * 1000)}


def _int_param(request: web.Request, name: str, default: int) -> int:
    """A positive integer query parameter (400 for anything else)."""
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit() or int(text) == 0:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "bad_request", "reason": f"{name} must be a positive integer"}),
            content_type="application/json",
        )
    return int(text)
