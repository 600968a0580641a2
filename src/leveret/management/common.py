"""What the management handlers share: the vhost of a route (with RabbitMQ's 401 and
404), JSON bodies, and core's errors as RabbitMQ's management API answers them when it
carries out an AMQP operation for the user (401 ``Access refused.``, 404 ``not_found``,
400 ``bad_request`` with core's text, checked against RabbitMQ 3.10)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from ..core.access import Access
from ..core.auth import User
from ..core.broker import BrokerCore
from ..core.errors import BrokerError
from ..core.session import Session
from ..core.vhost import VirtualHost

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
T = TypeVar("T")


def json_error(status: int, error: str, reason: Any) -> web.HTTPException:
    """An HTTP error with RabbitMQ's JSON body, to raise."""
    cls = {400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 404: web.HTTPNotFound}.get(status)
    body = json.dumps({"error": error, "reason": reason})
    if cls is None:
        return web.HTTPException(text=body, content_type="application/json")
    return cls(text=body, content_type="application/json")


def object_not_found() -> web.HTTPException:
    """RabbitMQ's 404 for a missing object named by the path."""
    return web.HTTPNotFound(text=json.dumps(NOT_FOUND), content_type="application/json")


def works_in(core: BrokerCore, user: User, vhost: str) -> bool:
    """Whether ``user``'s lists and requests reach into ``vhost``: an administrator
    everywhere, anyone else where they have a permission (RabbitMQ 3.10)."""
    return "administrator" in user.tags or core.users.may_access(user, vhost)


def route_vhost(core: BrokerCore, request: web.Request) -> VirtualHost:
    """The route's vhost: RabbitMQ's 401 if the user has no permission there, 404 if
    there is none."""
    name = request.match_info["vhost"]
    if not works_in(core, request["user"], name):
        raise json_error(401, "not_authorised", "User not authorised to access virtual host")
    vhost = core.vhosts.get(name)
    if vhost is None:
        raise object_not_found()
    return vhost


def visible_vhosts(core: BrokerCore, request: web.Request) -> list[VirtualHost]:
    """The vhosts whose objects the user's lists show (all of them, or the route's)."""
    if "vhost" in request.match_info:
        return [route_vhost(core, request)]
    return [v for name, v in core.vhosts.items() if works_in(core, request["user"], name)]


def session(core: BrokerCore, request: web.Request, vhost: VirtualHost) -> Session:
    """The user's operations in ``vhost``, checked as an AMQP client's are, as a
    connection of its own: another connection's exclusive queue is locked to it (as
    RabbitMQ's API, which goes through an AMQP connection)."""
    return Session(vhost, Access(core.users, request["user"], vhost.name), object())


def amqp(operation: Callable[[], T]) -> T:
    """Carry out ``operation`` (a core call made for the user) and answer a refusal
    as RabbitMQ's management API does."""
    try:
        return operation()
    except BrokerError as exc:
        if exc.condition == "access_refused":
            raise json_error(401, "not_authorised", "Access refused.") from None
        if exc.condition == "not_found":
            raise json_error(404, "not_found", exc.text) from None
        raise json_error(400, "bad_request", exc.text) from None


async def json_body(request: web.Request) -> dict:
    """The JSON object sent (an empty body is ``{}``); 400 for anything else."""
    try:
        body = json.loads(await request.read() or b"{}")
    except (ValueError, RecursionError) as exc:
        raise json_error(400, "bad_request", f"invalid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise json_error(400, "bad_request", "the body must be a JSON object")
    return body


def boolean(body: dict, key: str, default: bool) -> bool:
    """A boolean field (RabbitMQ also takes ``"true"``/``"false"``); its 400
    ``["not_boolean", value]`` otherwise."""
    value = body.get(key, default)
    if value in ("true", "false"):
        return value == "true"
    if not isinstance(value, bool):
        raise json_error(400, "bad_request", ["not_boolean", value])
    return value


def flag(request: web.Request, name: str) -> bool:
    """A query flag such as ``?if-unused=true``."""
    return request.query.get(name, "").lower() == "true"


def arguments(body: dict) -> dict:
    """The ``arguments`` object of a body (400 if it is not one)."""
    value = body.get("arguments") or {}
    if not isinstance(value, dict):
        raise json_error(400, "bad_request", "arguments must be a JSON object")
    return value
