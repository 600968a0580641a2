"""RabbitMQ 3.10's management HTTP API (``/api/...``) and leveret's additions, JSON over
aiohttp.

It reads and changes the broker only through core's public objects. Authentication
is HTTP basic with the broker's users (``guest`` from loopback only, as for AMQP); a
refused login is RabbitMQ's 401 ``Login failed`` (logged, throttled per address and
user: :mod:`leveret.core.login_throttle`), a
user without a management tag gets 401 ``Not management user``, administration needs
``administrator``; a missing vhost or queue is 404. Requests must name an allowed
``Host``; answers carry :data:`SECURITY_HEADERS`. Field names follow RabbitMQ's API so
existing tools and scripts can read it:

- ``GET /api/vhosts``; users, permissions, topic permissions, vhosts, definitions:
  see :mod:`.admin`
- exchanges, queues, bindings, purge: :mod:`.resources`
- publish, get: :mod:`.messages`
- policies, operator policies, global parameters, vhost limits: :mod:`.policies`
- runtime parameters (shovels) and ``/api/shovels``: :mod:`.parameters`
- ``/api/federation-links`` (status and restart of federation links): :mod:`.federation`
- overview, nodes, connections, channels, consumers, aliveness test, health checks,
  version: :mod:`.runtime`
- dead letters (browse, preview, retry/move/copy/delete jobs) and the audit trail,
  under ``/api/leveret/``: :mod:`.dead_letters`
- here: ``GET /api/scheduled-jobs[/{vhost}[/{id}]]``, ``DELETE
  /api/scheduled-jobs/{vhost}/{id}`` (leveret's scheduled messages), and the console's
  session ``/api/leveret/session`` (POST logs in, GET, DELETE logs out; :mod:`.sessions`)

Every list takes RabbitMQ's ``sort``, ``sort_reverse`` and ``columns`` (and paging where
RabbitMQ pages): :mod:`.listing`. ``/api/nodes`` needs ``monitoring`` or
``administrator``; ``/api/version`` and the ``is-in-service`` and
``ready-to-serve-clients`` checks need no login.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import math
from dataclasses import asdict
from ssl import SSLContext
from typing import Any

from aiohttp import web

from ..core.access import Access
from ..core.auth import AuthenticationError, LoopbackOnly, User
from ..core.broker import BrokerCore
from ..core.errors import BrokerError
from ..core.scheduler import JobInfo
from ..server.http_guard import ConnectionGuard, GuardedSite
from ..server.http_limits import HttpLimits
from .admin import AdminAPI
from .common import route_vhost, visible_vhosts
from .console import CONSOLE_PREFIX, console_routes
from .dead_letters import DeadLetterAPI
from .federation import PATHS as FEDERATION_PATHS, FederationAPI, FederationLinks
from .listing import list_response
from .messages import Messages
from .parameters import Parameters, ShovelStatus
from .policies import Policies
from .rates import (
    DEFAULT_INTERVAL,
    RateSampler,
)
from .resources import Resources, vhost_info
from .runtime import NodeInfo, Runtime
from .sessions import COOKIE, Sessions, csrf_ok, set_cookie

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
        "/api/definitions/{vhost}",
        "/api/vhost-limits/{vhost}/{name}",
    )
)
#: Routes whose changes (not their GET) need the administrator tag.
ADMIN_CHANGE_PATHS = frozenset(("/api/vhosts/{vhost}", "/api/operator-policies/{vhost}/{name}"))
#: Routes that need the monitoring (or administrator) tag.
MONITOR_PATHS = frozenset(("/api/nodes", "/api/nodes/{node}", *FEDERATION_PATHS))
#: Routes that need no login (newer RabbitMQ's readiness checks and version).
OPEN_PATHS = frozenset(
    (
        "/api/version",
        "/api/health/checks/is-in-service",
        "/api/health/checks/ready-to-serve-clients",
    )
)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: The console's login (:mod:`.sessions`), which checks its credentials itself.
SESSION_PATH = "/api/leveret/session"
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
    on ``https_port`` with the ``tls`` context. ``node_info`` gives what only the
    server knows (listeners, memory and disk limits: see :mod:`.runtime`).
    ``allowed_hosts``: the names a request's ``Host`` header may carry (against DNS
    rebinding); by default the loopback names and ``host`` itself. ``limits`` and
    ``cap``: the header and keep-alive timeouts and the most connections each port
    holds (:mod:`..server.http_guard`). ``federation``: the broker's federation links
    (:mod:`.federation`)."""

    def __init__(
        self,
        core: BrokerCore,
        host: str,
        port: int | None,
        allowed_hosts: list[str] | None = None,
        https_port: int | None = None,
        tls: SSLContext | None = None,
        node_info: NodeInfo | None = None,
        stats_interval: float = DEFAULT_INTERVAL,
        shovel_status: ShovelStatus | None = None,
        limits: HttpLimits | None = None,
        cap: int | None = None,
        federation: FederationLinks | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.core = core
        self.reuse_port = reuse_port  # SO_REUSEPORT: the nodes of --nodes N share the ports
        #: the HTTP port's and the HTTPS port's guards (:mod:`..server.http_guard`):
        #: ``cap`` connections each at most, ``limits``' timeouts
        self.limits = limits or HttpLimits()
        self.guards = (
            ConnectionGuard("HTTP API", self.limits, cap),
            ConnectionGuard("HTTPS API", self.limits, cap),
        )
        self.host = host
        self.port = port  # plain HTTP (None: off)
        self.https_port = https_port  # HTTPS with ``tls`` (None: off)
        self._tls = tls
        defaults = [*LOOPBACK_HOSTS, host] if host not in ("", "0.0.0.0", "::") else list(LOOPBACK_HOSTS)
        self.allowed_hosts = {h.lower() for h in (allowed_hosts or defaults)}
        self._runner: web.AppRunner | None = None
        #: readings of the broker's counters for rates (see :mod:`.rates`)
        self.rates = RateSampler(core, stats_interval)
        #: the web console's logins (see :mod:`.sessions`)
        self.sessions = Sessions()
        app = web.Application(middlewares=[self._guard, self._authenticate, self._replicated, _broker_errors])
        app.add_routes(
            [
                web.get("/api/vhosts", self.vhosts),
                *Resources(core, self.rates).routes(),
                *Messages(core).routes(),
                *Policies(core).routes(),
                *Parameters(core, shovel_status).routes(),
                *FederationAPI(core, federation).routes(),
                *Runtime(core, node_info, self.rates).routes(),
                web.get("/api/scheduled-jobs", self.scheduled_jobs),
                web.get("/api/scheduled-jobs/{vhost}", self.scheduled_jobs),
                web.get("/api/scheduled-jobs/{vhost}/{id}", self.scheduled_job),
                web.delete("/api/scheduled-jobs/{vhost}/{id}", self.cancel_scheduled_job),
                *AdminAPI(core, self.rates).routes(),
                *DeadLetterAPI(core).routes(),
                web.post(SESSION_PATH, self.login),
                web.get(SESSION_PATH, self.current_session),
                web.delete(SESSION_PATH, self.logout),
                *console_routes(),
            ]
        )
        self.app = app

    async def start(self) -> None:
        """Listen on the running loop; :attr:`port` is then the port bound (OSError if it
        cannot be bound)."""
        self._runner = web.AppRunner(
            self.app, access_log=None, keepalive_timeout=self.limits.keepalive_timeout
        )
        await self._runner.setup()
        self.rates.start()
        if self.port is not None:
            await GuardedSite(
                self._runner, self.host, self.port, self.guards[0], reuse_port=self.reuse_port or None
            ).start()
            self.port = self._runner.addresses[-1][1]
        if self.https_port is not None:
            await GuardedSite(
                self._runner,
                self.host,
                self.https_port,
                self.guards[1],
                ssl_context=self._tls,
                reuse_port=self.reuse_port or None,
            ).start()
            self.https_port = self._runner.addresses[-1][1]

    async def stop(self) -> None:
        """Stop listening and close open HTTP connections."""
        await self.rates.stop()
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
    async def _replicated(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """On a cluster node (docs/cluster.md), a request that changed shared definitions
        is answered once they are stored and every live node applied them, as an AMQP
        -ok is; elsewhere nothing is waited for."""
        store = self.core.store
        if self.core.replicator is None or store is None or request.method in ("GET", "HEAD"):
            return await handler(request)
        before = store.definition_changes
        response = await handler(request)
        if store.definition_changes != before:
            done = asyncio.Event()
            store.when_durable(lambda ok: done.set())
            await done.wait()
        return response

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """HTTP basic login with the broker's users, or the console's session cookie
        (:mod:`.sessions`: a change needs its CSRF token, else 403): a refused login is
        RabbitMQ's 401 ``Login failed`` (logged without the secret, slowed down per
        address); then the tags must allow the route (401 ``Not management user`` /
        ``Not administrator user``)."""
        resource = request.match_info.route.resource
        path = resource.canonical if resource is not None else ""
        if path in OPEN_PATHS or path == SESSION_PATH or path == "/" or path.startswith(CONSOLE_PREFIX):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        if not header and COOKIE in request.cookies:  # the console
            session = self.sessions.find(request.cookies[COOKIE])
            user = self.core.users.users.get(session.user) if session is not None else None
            if session is None or user is None:
                return web.json_response({"error": "not_authorised", "reason": "Login failed"}, status=401)
            if not csrf_ok(request, session):
                return web.json_response(
                    {"error": "forbidden", "reason": "CSRF token missing or wrong"}, status=403
                )
        else:
            username: str | None = None
            try:
                scheme, _, encoded = header.partition(" ")
                if scheme.lower() != "basic":
                    raise AuthenticationError("basic authentication required")
                username, _, password = base64.b64decode(encoded).decode().partition(":")
            except (AuthenticationError, ValueError, UnicodeDecodeError) as exc:
                return await self._refuse(request, username, exc)
            found = await self._login(request, username, password)
            if isinstance(found, web.Response):
                return found
            user = found
        tags = set(user.tags)
        if not tags & MANAGEMENT_TAGS:
            return _unauthorised("Not management user")
        admin = path in ADMIN_PATHS or (path in ADMIN_CHANGE_PATHS and request.method != "GET")
        if admin and "administrator" not in tags:
            return _unauthorised("Not administrator user")
        if path in MONITOR_PATHS and not tags & SEES_ALL_TAGS:
            return _unauthorised("Not monitor user")
        request["user"] = user
        return await handler(request)

    async def _login(self, request: web.Request, username: str, password: str) -> User | web.Response:
        """The user these credentials name, at once; or the 401 to answer, once the login
        throttle allows (see :mod:`leveret.core.login_throttle`); or 429 Too Many
        Requests with ``Retry-After`` (seconds), unchecked, while the address has
        ``max_unauthenticated`` refusals not yet answered, or half the port's connection
        cap (each waiting refusal holds an HTTP connection: one guessing address must not
        fill the port, issue 27)."""
        peer = request.remote or ""
        throttle = self.core.login_throttle
        if not throttle.may_check(peer, max(1, self.guards[0].cap // 2)):
            return web.json_response(
                {"error": "too_many_requests", "reason": "Too many failed logins from this address"},
                status=429,
                headers={"Retry-After": str(max(1, math.ceil(throttle.room_in(peer))))},
            )
        try:
            loopback = peer in ("", "localhost") or ipaddress.ip_address(peer).is_loopback
            user = self.core.users.authenticate(username, password, loopback)
        except (AuthenticationError, ValueError) as exc:
            return await self._refuse(request, username, exc)
        return user

    async def _refuse(self, request: web.Request, username: str | None, exc: Exception) -> web.Response:
        """A refused login (``username`` None: the header could not be read): logged,
        audited, counted against the address and the user, and answered 401 when the
        login throttle allows."""
        peer = request.remote or ""
        name = "?" if username is None else username
        log.warning("HTTP access denied: user '%s' from %s - %s", name, peer, exc)
        self.core.audit.record("login.refused", name, peer, protocol="http")
        delay = self.core.login_throttle.failed(peer, username)
        if delay:
            await asyncio.sleep(delay)
        if isinstance(exc, LoopbackOnly):
            return _unauthorised("User can only log in via localhost")
        return web.json_response(
            {"error": "not_authorized", "reason": "Login failed"},
            status=401,
            headers={"WWW-Authenticate": 'Basic realm="leveret"'},
        )

    # -- the console's login (see :mod:`.sessions`) -------------------------------------
    def _session_answer(self, user: User, csrf_token: str) -> dict[str, Any]:
        return {"user": user.name, "tags": list(user.tags), "csrf_token": csrf_token}

    async def login(self, request: web.Request) -> web.StreamResponse:
        """``POST /api/leveret/session`` ``{"username", "password"}`` → the session
        (200, with the cookie); 401 as a basic login is refused, 400 for a bad body."""
        try:
            body = json.loads(await request.read() or b"{}")
            username, password = body["username"], body["password"]
            if not isinstance(username, str) or not isinstance(password, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return web.json_response(
                {"error": "bad_request", "reason": 'send {"username": ..., "password": ...}'}, status=400
            )
        found = await self._login(request, username, password)
        if isinstance(found, web.Response):
            found.headers.pop("WWW-Authenticate", None)  # no browser login box over the console
            return found
        if not MANAGEMENT_TAGS.intersection(found.tags):
            return _unauthorised("Not management user")
        key, session = self.sessions.create(found.name)
        response = web.json_response(self._session_answer(found, session.csrf_token))
        set_cookie(response, key, secure=request.secure)
        return response

    async def current_session(self, request: web.Request) -> web.Response:
        """``GET /api/leveret/session``: the cookie's session (401 without one)."""
        session = self.sessions.find(request.cookies.get(COOKIE))
        user = self.core.users.users.get(session.user) if session is not None else None
        if session is None or user is None:
            return web.json_response({"error": "not_authorised", "reason": "Not logged in"}, status=401)
        return web.json_response(self._session_answer(user, session.csrf_token))

    async def logout(self, request: web.Request) -> web.Response:
        """``DELETE /api/leveret/session``: the session ends (204), with its token
        (403 without it, so another site cannot log a user out)."""
        key = request.cookies.get(COOKIE)
        session = self.sessions.find(key)
        if session is not None and not csrf_ok(request, session):
            return web.json_response(
                {"error": "forbidden", "reason": "CSRF token missing or wrong"}, status=403
            )
        self.sessions.end(key)
        response = web.Response(status=204)
        response.del_cookie(COOKIE, path="/")
        return response

    # -- handlers -------------------------------------------------------------------
    async def vhosts(self, request: web.Request) -> web.Response:
        """``GET /api/vhosts``: name and message counts, every vhost for administrators and
        monitoring users, else those the user has a permission in (RabbitMQ 3.10)."""
        user = request["user"]
        sees_all = bool(SEES_ALL_TAGS.intersection(user.tags))
        names = [n for n in self.core.vhosts if sees_all or self.core.users.may_access(user, n)]
        rows = []
        rows = [await vhost_info(self.core.vhosts[name], self.rates, request.query) for name in names]
        return list_response(request, rows, pageable=True)

    # -- scheduled messages (leveret's; ActiveMQ's scheduler and delayed messages) ------------
    async def scheduled_jobs(self, request: web.Request) -> web.Response:
        """``GET /api/scheduled-jobs[/{vhost}]``: waiting jobs, the soonest due first
        (``?limit=``, 100 by default), of the vhosts the user works in; fields as
        ``leveret scheduler list`` (``next_due`` in epoch ms)."""
        vhosts = visible_vhosts(self.core, request)
        limit = _int_param(request, "limit", 100)
        jobs = [job for vhost in vhosts for job in self.core.scheduler.jobs(vhost.name, limit)]
        jobs.sort(key=lambda job: job.next_due)
        return list_response(request, [_job_json(job) for job in jobs[:limit]])

    def _scheduled(self, request: web.Request) -> JobInfo:
        vhost = route_vhost(self.core, request)
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
        self.core.audit.record(
            "scheduled.cancel", request["user"].name, request.remote or "", vhost=job.vhost, job=job.job_id
        )
        return web.Response(status=204)


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
