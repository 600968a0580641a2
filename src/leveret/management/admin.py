"""Users, permissions, topic permissions and vhosts over HTTP, as RabbitMQ 3.10's
management API has them (same paths, bodies, statuses and error bodies, checked against
a RabbitMQ node by the integration tests). All but ``/api/whoami`` and the vhost list
need the ``administrator`` tag (the caller checks, see :mod:`.api`).

- ``GET /api/whoami`` → ``{"name", "tags"}``
- ``GET /api/users``; ``GET|PUT|DELETE /api/users/{user}``: PUT ``{"password"}`` or
  ``{"password_hash", "hashing_algorithm"?}`` (neither, or an empty one: no password
  logs in) and ``"tags"``
  (a comma-separated string or a list; required) → 201 created, 204 replaced
- ``GET /api/users/{user}/permissions``, ``/api/users/{user}/topic-permissions``
- ``GET /api/permissions``; ``GET|PUT|DELETE /api/permissions/{vhost}/{user}``: PUT
  ``{"configure", "write", "read"}``
- ``GET /api/topic-permissions``; ``GET|PUT|DELETE /api/topic-permissions/{vhost}/{user}``:
  PUT ``{"exchange", "write", "read"}``
- ``GET|PUT|DELETE /api/vhosts/{vhost}``, ``GET /api/vhosts/{vhost}/permissions``: a
  new vhost gives its creator full permissions there, as RabbitMQ does
- ``GET /api/definitions`` (export), ``POST /api/definitions`` (import, 204): see
  :mod:`leveret.core.definitions_document`; ``GET|POST /api/definitions/{vhost}``: one
  vhost's policies, queues, exchanges and bindings, without their ``vhost`` fields (as
  RabbitMQ 3.10), imported into that vhost
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from aiohttp import web

from ..core import definitions_document, passwords
from ..core.auth import Permission, TopicPermission, User, check_pattern
from ..core.broker import BrokerCore
from ..version import __version__
from .listing import list_response
from .rates import RateSampler
from .resources import vhost_info

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


def not_found() -> web.Response:
    """RabbitMQ's 404 body."""
    return web.json_response(NOT_FOUND, status=404)


def bad_request(reason: Any) -> web.Response:
    """RabbitMQ's 400 body; ``reason`` as RabbitMQ words it (a string or a list)."""
    return web.json_response({"error": "bad_request", "reason": reason}, status=400)


async def _body(request: web.Request) -> dict | web.Response:
    """The JSON object sent, or the 400 to answer."""
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError as exc:
        return bad_request(f"invalid JSON: {exc}")
    if not isinstance(body, dict):
        return bad_request("the body must be a JSON object")
    return body


def _missing(body: dict, keys: tuple[str, ...]) -> web.Response | None:
    """RabbitMQ's 400 for required keys that are absent, e.g.
    ``[{key_missing,write},{key_missing,read}]``."""
    missing = [k for k in keys if k not in body]
    if not missing:
        return None
    return bad_request("[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]")


def _patterns(body: dict, keys: tuple[str, ...]) -> web.Response | None:
    for key in keys:
        value = body[key]
        if not isinstance(value, str):
            return bad_request(f"{key} must be a string")
        problem = check_pattern(value)
        if problem is not None:
            return bad_request(["invalid_regexp", value, problem])
    return None


def _tags(value: Any) -> list[str] | None:
    """RabbitMQ's ``tags``: ``"a,b"`` or ``["a", "b"]`` (None if neither)."""
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return list(value)
    return None


def _permission_row(user: str, vhost: str, permission: Permission) -> dict:
    return {"user": user, "vhost": vhost, **vars(permission)}


def _topic_row(user: str, vhost: str, topic: TopicPermission) -> dict:
    return {"user": user, "vhost": vhost, **vars(topic)}


class AdminAPI:
    """The handlers, on ``core``; every change is recorded in the audit log."""

    def __init__(self, core: BrokerCore, rates: RateSampler | None = None) -> None:
        self.core = core
        self.rates = rates or RateSampler(core)

    def _audit(self, request: web.Request, action: str, /, **details: object) -> None:
        self.core.audit.record(action, request["user"].name, request.remote or "", **details)

    def routes(self) -> list[web.RouteDef]:
        """Every route of this module."""
        return [
            web.get("/api/whoami", self.whoami),
            web.get("/api/users", self.users),
            web.get("/api/users/{user}", self.user),
            web.put("/api/users/{user}", self.put_user),
            web.delete("/api/users/{user}", self.delete_user),
            web.get("/api/users/{user}/permissions", self.user_permissions),
            web.get("/api/users/{user}/topic-permissions", self.user_topic_permissions),
            web.get("/api/permissions", self.permissions),
            web.get("/api/permissions/{vhost}/{user}", self.permission),
            web.put("/api/permissions/{vhost}/{user}", self.put_permission),
            web.delete("/api/permissions/{vhost}/{user}", self.delete_permission),
            web.get("/api/topic-permissions", self.topic_permissions),
            web.get("/api/topic-permissions/{vhost}/{user}", self.topic_permission),
            web.put("/api/topic-permissions/{vhost}/{user}", self.put_topic_permission),
            web.delete("/api/topic-permissions/{vhost}/{user}", self.delete_topic_permission),
            web.get("/api/vhosts/{vhost}", self.vhost),
            web.put("/api/vhosts/{vhost}", self.put_vhost),
            web.delete("/api/vhosts/{vhost}", self.delete_vhost),
            web.get("/api/vhosts/{vhost}/permissions", self.vhost_permissions),
            web.get("/api/definitions", self.definitions),
            web.post("/api/definitions", self.import_definitions),
            web.get("/api/definitions/{vhost}", self.vhost_definitions),
            web.post("/api/definitions/{vhost}", self.import_vhost_definitions),
        ]

    # -- users ----------------------------------------------------------------------
    async def whoami(self, request: web.Request) -> web.Response:
        user: User = request["user"]
        return web.json_response({"name": user.name, "tags": user.tags})

    @staticmethod
    def _user_row(user: User) -> dict:
        return {**user.definition(), "limits": {}}

    async def users(self, request: web.Request) -> web.Response:
        return list_response(request, [self._user_row(u) for _, u in sorted(self.core.users.users.items())])

    async def user(self, request: web.Request) -> web.Response:
        user = self.core.users.users.get(request.match_info["user"])
        return not_found() if user is None else web.json_response(self._user_row(user))

    async def put_user(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        name = request.match_info["user"]
        if "tags" not in body:
            return bad_request("tags_not_present")
        tags = _tags(body["tags"])
        if tags is None:
            return bad_request("tags must be a string or a list of strings")
        if isinstance(body.get("password"), str):
            user = User.with_password(name, body["password"], tags)
        elif "password_hash" not in body:  # neither: no password works (RabbitMQ hashes a random one)
            user = User.with_password(name, secrets.token_urlsafe(32), tags)
        else:
            password_hash = body.get("password_hash", "")
            algorithm = body.get("hashing_algorithm", passwords.DEFAULT_ALGORITHM)
            if not isinstance(password_hash, str) or not isinstance(algorithm, str):
                return bad_request("password_hash and hashing_algorithm must be strings")
            try:
                passwords.validate(password_hash, algorithm)
            except passwords.HashError:
                return bad_request(["not_base64", password_hash])
            user = User(name, password_hash, algorithm, tags)
        created = name not in self.core.users.users
        self.core.add_user(user)
        self._audit(request, "user.put", user=name, tags=",".join(tags))
        return web.Response(status=201 if created else 204)

    async def delete_user(self, request: web.Request) -> web.Response:
        if not self.core.delete_user(request.match_info["user"]):
            return not_found()
        self._audit(request, "user.delete", user=request.match_info["user"])
        return web.Response(status=204)

    async def user_permissions(self, request: web.Request) -> web.Response:
        name = request.match_info["user"]
        if name not in self.core.users.users:
            return not_found()
        rows = [_permission_row(u, v, p) for (v, u), p in self.core.users.permissions.items() if u == name]
        return list_response(request, rows)

    async def user_topic_permissions(self, request: web.Request) -> web.Response:
        name = request.match_info["user"]
        if name not in self.core.users.users:
            return not_found()
        topics = self.core.users.topic_permissions.items()
        return list_response(request, [_topic_row(u, v, t) for (v, u, _), t in topics if u == name])

    # -- permissions ----------------------------------------------------------------
    def _exists(self, request: web.Request) -> bool:
        info = request.match_info
        return info["vhost"] in self.core.vhosts and info["user"] in self.core.users.users

    async def permissions(self, request: web.Request) -> web.Response:
        rows = [_permission_row(u, v, p) for (v, u), p in self.core.users.permissions.items()]
        return list_response(request, rows)

    async def permission(self, request: web.Request) -> web.Response:
        vhost, user = request.match_info["vhost"], request.match_info["user"]
        permission = self.core.users.permission(user, vhost)
        return (
            not_found() if permission is None else web.json_response(_permission_row(user, vhost, permission))
        )

    async def put_permission(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        keys = ("configure", "write", "read")
        problem = _missing(body, keys) or _patterns(body, keys)
        if problem is not None:
            return problem
        if not self._exists(request):
            return bad_request("vhost_or_user_not_found")
        vhost, user = request.match_info["vhost"], request.match_info["user"]
        created = self.core.users.permission(user, vhost) is None
        self.core.set_permission(user, vhost, Permission(body["configure"], body["write"], body["read"]))
        self._audit(request, "permission.put", user=user, vhost=vhost, **{k: body[k] for k in keys})
        return web.Response(status=201 if created else 204)

    async def delete_permission(self, request: web.Request) -> web.Response:
        user, vhost = request.match_info["user"], request.match_info["vhost"]
        if not self.core.clear_permission(user, vhost):
            return not_found()
        self._audit(request, "permission.delete", user=user, vhost=vhost)
        return web.Response(status=204)

    # -- topic permissions ----------------------------------------------------------
    async def topic_permissions(self, request: web.Request) -> web.Response:
        topics = self.core.users.topic_permissions.items()
        return list_response(request, [_topic_row(u, v, t) for (v, u, _), t in topics])

    async def topic_permission(self, request: web.Request) -> web.Response:
        vhost, user = request.match_info["vhost"], request.match_info["user"]
        topics = self.core.users.topic_permissions.items()
        rows = [_topic_row(u, v, t) for (v, u, _), t in topics if (v, u) == (vhost, user)]
        return web.json_response(rows) if rows else not_found()

    async def put_topic_permission(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        problem = _missing(body, ("exchange", "write", "read")) or _patterns(body, ("write", "read"))
        if problem is not None:
            return problem
        if not isinstance(body["exchange"], str):
            return bad_request("exchange must be a string")
        if not self._exists(request):
            return bad_request("vhost_or_user_not_found")
        vhost, user = request.match_info["vhost"], request.match_info["user"]
        topic = TopicPermission(body["exchange"], body["write"], body["read"])
        created = self.core.users.topic_permission(user, vhost, topic.exchange) is None
        self.core.set_topic_permission(user, vhost, topic)
        self._audit(request, "topic_permission.put", user=user, vhost=vhost, **vars(topic))
        return web.Response(status=201 if created else 204)

    async def delete_topic_permission(self, request: web.Request) -> web.Response:
        user, vhost = request.match_info["user"], request.match_info["vhost"]
        if not self.core.clear_topic_permissions(user, vhost):
            return not_found()
        self._audit(request, "topic_permission.delete", user=user, vhost=vhost)
        return web.Response(status=204)

    # -- vhosts ---------------------------------------------------------------------
    async def vhost(self, request: web.Request) -> web.Response:
        vhost = self.core.vhosts.get(request.match_info["vhost"])
        if vhost is None:
            return not_found()
        return web.json_response(await vhost_info(vhost, self.rates, request.query))

    async def put_vhost(self, request: web.Request) -> web.Response:
        name = request.match_info["vhost"]
        if name in self.core.vhosts:
            return web.Response(status=204)
        self.core.add_vhost(name)
        self.core.set_permission(request["user"].name, name, Permission())
        self._audit(request, "vhost.put", vhost=name)
        return web.Response(status=201)

    async def delete_vhost(self, request: web.Request) -> web.Response:
        if not self.core.delete_vhost(request.match_info["vhost"]):
            return not_found()
        self._audit(request, "vhost.delete", vhost=request.match_info["vhost"])
        return web.Response(status=204)

    async def vhost_permissions(self, request: web.Request) -> web.Response:
        name = request.match_info["vhost"]
        if name not in self.core.vhosts:
            return not_found()
        rows = [_permission_row(u, v, p) for (v, u), p in self.core.users.permissions.items() if v == name]
        return list_response(request, rows)

    # -- definitions ----------------------------------------------------------------
    async def definitions(self, request: web.Request) -> web.Response:
        """Everything, as RabbitMQ's definitions document (users with hashes)."""
        return web.json_response(definitions_document.export(self.core, __version__))

    async def import_definitions(self, request: web.Request) -> web.Response:
        """Add what a definitions document (RabbitMQ's or ours) defines; 400 with the
        reason for a malformed one, nothing changed then."""
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        definitions_document.import_document(self.core, body)
        self._audit(
            request,
            "definitions.import",
            users=len(body.get("users", [])),
            queues=len(body.get("queues", [])),
        )
        return web.Response(status=204)

    # -- one vhost's definitions ----------------------------------------------------
    async def vhost_definitions(self, request: web.Request) -> web.Response:
        """One vhost's definitions, in RabbitMQ's per-vhost shape."""
        name = request.match_info["vhost"]
        if name not in self.core.vhosts:
            return not_found()
        whole = definitions_document.export(self.core, __version__)
        document: dict[str, Any] = {k: whole[k] for k in _DOCUMENT_HEADER}
        for key in _VHOST_KEYS:
            document[key] = [
                {k: v for k, v in entry.items() if k != "vhost"}
                for entry in whole[key]
                if entry["vhost"] == name
            ]
        return web.json_response(document)

    async def import_vhost_definitions(self, request: web.Request) -> web.Response:
        """Import a per-vhost document (or a whole one's objects) into the vhost: 204;
        400 with the reason for a malformed one, nothing changed then."""
        name = request.match_info["vhost"]
        if name not in self.core.vhosts:
            return not_found()
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        document: dict[str, Any] = {}
        for key in _VHOST_KEYS:
            entries = body.get(key, [])
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                return bad_request(f"{key} must be a list of objects")
            document[key] = [{**entry, "vhost": name} for entry in entries]
        definitions_document.import_document(self.core, document)
        self._audit(request, "definitions.import", vhost=name, queues=len(document["queues"]))
        return web.Response(status=204)


_DOCUMENT_HEADER = ("rabbit_version", "rabbitmq_version", "product_name", "product_version")
_VHOST_KEYS = ("parameters", "policies", "queues", "exchanges", "bindings")
