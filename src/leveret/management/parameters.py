"""Runtime parameters and shovel status over HTTP, as RabbitMQ 3.10's management API
(with ``rabbitmq_shovel_management``) has them:

- ``GET /api/parameters[/{component}[/{vhost}[/{name}]]]``: ``{"component", "vhost",
  "name", "value"}`` rows;
- ``PUT /api/parameters/shovel/{vhost}/{name}`` ``{"value": {...}}``: 201 created, 204
  replaced; 400 ``Validation failed`` for a definition RabbitMQ would refuse
  (:class:`~leveret.shovel.spec.ShovelSpec`); the same for ``federation-upstream`` and
  ``federation-upstream-set`` (:mod:`leveret.federation.upstream`), and RabbitMQ's 400
  ``component ... not found`` for other components;
- ``DELETE /api/parameters/{component}/{vhost}/{name}``: 204, 404 if missing;
- ``GET /api/shovels[/{vhost}]``: every shovel's status (``state`` starting, running or
  terminated, ``src_uri``/``dest_uri`` without passwords, ``messages_forwarded``).

Changing parameters takes the ``policymaker`` or ``administrator`` tag and access to
the vhost, as in RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..core.broker import BrokerCore
from ..federation.upstream import UPSTREAM, UPSTREAM_SET, Upstream, check_upstream_set
from ..shovel.spec import ShovelSpec
from .common import json_body, json_error, object_not_found, works_in
from .listing import list_response
from .policies import POLICY_TAGS, invalid

#: Components leveret knows, each with the check of a value (raising ValueError with
#: RabbitMQ's reason).
COMPONENTS: dict[str, Callable[[Any, str], object]] = {
    "shovel": lambda value, name: ShovelSpec.from_parameter(value),
    UPSTREAM: lambda value, name: Upstream.from_parameter("", name, value),
    UPSTREAM_SET: check_upstream_set,
}

ShovelStatus = Callable[[str | None], list[dict]]


class Parameters:
    """The handlers, on ``core``; ``shovel_status(vhost)`` gives ``/api/shovels``'s
    rows (None: every vhost's)."""

    def __init__(self, core: BrokerCore, shovel_status: ShovelStatus | None = None) -> None:
        self.core = core
        self.shovel_status = shovel_status

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/parameters", self.parameters),
            web.get("/api/parameters/{component}", self.parameters),
            web.get("/api/parameters/{component}/{vhost}", self.parameters),
            web.get("/api/parameters/{component}/{vhost}/{name}", self.parameter),
            web.put("/api/parameters/{component}/{vhost}/{name}", self.put_parameter),
            web.delete("/api/parameters/{component}/{vhost}/{name}", self.delete_parameter),
            web.get("/api/shovels", self.shovels),
            web.get("/api/shovels/{vhost}", self.shovels),
        ]

    def _visible(self, request: web.Request, vhost: str) -> bool:
        return works_in(self.core, request["user"], vhost)

    async def parameters(self, request: web.Request) -> web.Response:
        """Rows by component, vhost, name; only the user's vhosts."""
        component = request.match_info.get("component")
        vhost = request.match_info.get("vhost")
        if vhost is not None and vhost not in self.core.vhosts:
            raise json_error(404, "not_found", "vhost_not_found")
        rows = [
            {"component": c, "vhost": v, "name": n, "value": value}
            for (c, v, n), value in sorted(self.core.parameters.items())
            if component in (None, c) and vhost in (None, v) and self._visible(request, v)
        ]
        return list_response(request, rows)

    async def parameter(self, request: web.Request) -> web.Response:
        key = self._key(request)
        if key not in self.core.parameters or not self._visible(request, key[1]):
            raise object_not_found()
        component, vhost, name = key
        value = self.core.parameters[key]
        return web.json_response({"component": component, "vhost": vhost, "name": name, "value": value})

    def _key(self, request: web.Request) -> tuple[str, str, str]:
        info = request.match_info
        return info["component"], info["vhost"], info["name"]

    def _may_change(self, request: web.Request) -> tuple[str, str, str]:
        """The route's (component, vhost, name), if the user may change parameters
        there (RabbitMQ's 401, then 404 for a missing vhost)."""
        key = self._key(request)
        user = request["user"]
        if not POLICY_TAGS.intersection(user.tags) or not self._visible(request, key[1]):
            raise json_error(401, "not_authorised", "User not authorised to access object")
        if key[1] not in self.core.vhosts:
            raise json_error(404, "not_found", "vhost_not_found")
        return key

    async def put_parameter(self, request: web.Request) -> web.Response:
        """``{"value": ...}`` (RabbitMQ's body; ``component``/``vhost``/``name`` in it
        are ignored, the path's win)."""
        component, vhost, name = self._may_change(request)
        check = COMPONENTS.get(component)
        if check is None:
            raise invalid(f"component {component} not found")
        body = await json_body(request)
        if "value" not in body:
            raise invalid("value: not found")
        try:
            check(body["value"], name)
        except ValueError as exc:  # ShovelError, FederationError
            raise invalid(str(exc)) from None
        created = (component, vhost, name) not in self.core.parameters
        self.core.set_parameter(component, vhost, name, body["value"])
        self.core.audit.record(
            "parameter.put",
            request["user"].name,
            request.remote or "",
            component=component,
            vhost=vhost,
            name=name,
        )
        return web.Response(status=201 if created else 204)

    async def delete_parameter(self, request: web.Request) -> web.Response:
        component, vhost, name = self._may_change(request)
        if not self.core.clear_parameter(component, vhost, name):
            raise object_not_found()
        self.core.audit.record(
            "parameter.delete",
            request["user"].name,
            request.remote or "",
            component=component,
            vhost=vhost,
            name=name,
        )
        return web.Response(status=204)

    async def shovels(self, request: web.Request) -> web.Response:
        vhost = request.match_info.get("vhost")
        if vhost is not None and vhost not in self.core.vhosts:
            raise json_error(404, "not_found", "vhost_not_found")
        rows = self.shovel_status(vhost) if self.shovel_status is not None else []
        return list_response(request, [r for r in rows if self._visible(request, r["vhost"])])
