"""Policies over HTTP, as RabbitMQ 3.10's management API has them, on core's policies
(:meth:`~leveret.core.broker.BrokerCore.set_policy`, persisted):

- ``GET /api/policies[/{vhost}]``, ``GET|PUT|DELETE /api/policies/{vhost}/{name}``: PUT
  ``{"pattern", "definition", "priority"?, "apply-to"?}`` → 201 created, 204 replaced;
  400 ``Validation failed`` for a bad pattern, apply-to, priority or definition value.
  Like RabbitMQ's ``set_policy``, a policy applies to queues declared from then on.

Changing policies needs the ``policymaker`` or ``administrator`` tag and access to the
vhost (401 ``User not authorised to access object``); other users list none.

Vhost limits (``max-connections``, ``max-queues``): ``GET /api/vhost-limits[/{vhost}]``,
``PUT|DELETE /api/vhost-limits/{vhost}/{name}`` (``administrator``), persisted; they
apply to connections and queues made from then on, with RabbitMQ's refusals.

Operator policies, ``/api/operator-policies[/{vhost}[/{name}]]``, the same way (same
tags), limited to RabbitMQ's keys (:data:`~leveret.core.policy.OPERATOR_KEYS`; others
are RabbitMQ's 400 ``... are not recognised policy settings``); for each of their keys
the lower of their value and the queue's own wins. Global parameters,
``/api/global-parameters[/{name}]`` (``administrator`` to change): ``cluster_name``
names the broker in the overview. Runtime parameters (shovels): see :mod:`.parameters`.
"""

from __future__ import annotations

import json
import re
from html import escape

from aiohttp import web

from ..core.broker import BrokerCore
from ..core.errors import BrokerError
from ..core.policy import Policy, check_definition, erlang_term, not_operator_keys
from .common import json_body, json_error, object_not_found, works_in
from .listing import list_response

POLICY_TAGS = frozenset(("administrator", "policymaker"))


def policy_row(policy: Policy) -> dict:
    return {
        "vhost": policy.vhost,
        "name": policy.name,
        "pattern": policy.pattern,
        "apply-to": policy.apply_to,
        "definition": policy.definition,
        "priority": policy.priority,
    }


def invalid(text: str) -> web.HTTPException:
    """RabbitMQ's 400 ``Validation failed`` for a policy or a parameter it refuses (its
    text is HTML-escaped)."""
    return json_error(400, "bad_request", f"Validation failed\n\n{escape(text, quote=False)}\n")


class Policies:
    """The handlers, on ``core``."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/policies", self.policies),
            web.get("/api/policies/{vhost}", self.policies),
            web.get("/api/policies/{vhost}/{name}", self.policy),
            web.put("/api/policies/{vhost}/{name}", self.put_policy),
            web.delete("/api/policies/{vhost}/{name}", self.delete_policy),
            web.get("/api/operator-policies", self.policies),
            web.get("/api/operator-policies/{vhost}", self.policies),
            web.get("/api/operator-policies/{vhost}/{name}", self.policy),
            web.put("/api/operator-policies/{vhost}/{name}", self.put_policy),
            web.delete("/api/operator-policies/{vhost}/{name}", self.delete_policy),
            web.get("/api/global-parameters", self.global_parameters),
            web.get("/api/global-parameters/{name}", self.global_parameter),
            web.put("/api/global-parameters/{name}", self.put_global_parameter),
            web.delete("/api/global-parameters/{name}", self.delete_global_parameter),
            web.get("/api/vhost-limits", self.vhost_limits),
            web.get("/api/vhost-limits/{vhost}", self.vhost_limits),
            web.put("/api/vhost-limits/{vhost}/{name}", self.put_vhost_limit),
            web.delete("/api/vhost-limits/{vhost}/{name}", self.delete_vhost_limit),
        ]

    def _may_see(self, request: web.Request, vhost: str) -> bool:
        """Policies: policymakers and administrators of the vhost (others list none);
        operator policies: every user of the vhost (RabbitMQ 3.10's rules)."""
        user = request["user"]
        tagged = self._list(request)[1] or bool(POLICY_TAGS.intersection(user.tags))
        return tagged and works_in(self.core, user, vhost)

    def _may_change(self, request: web.Request) -> str:
        """The route's vhost, if the user may change its policies (RabbitMQ's 401, then
        404 for a missing vhost)."""
        vhost = request.match_info["vhost"]
        if not self._may_see(request, vhost):
            raise json_error(401, "not_authorised", "User not authorised to access object")
        if vhost not in self.core.vhosts:
            raise json_error(404, "not_found", "vhost_not_found")
        return vhost

    def _list(self, request: web.Request) -> tuple[list[Policy], bool]:
        """The policies the route is about: (the list, whether operator policies)."""
        operator = request.path.startswith("/api/operator-policies")
        return (self.core.operator_policies if operator else self.core.policies), operator

    async def policies(self, request: web.Request) -> web.Response:
        wanted = request.match_info.get("vhost")
        if wanted is not None and wanted not in self.core.vhosts:
            raise object_not_found()
        rows = [
            policy_row(p)
            for p in sorted(self._list(request)[0], key=lambda p: (p.vhost, p.name))
            if wanted in (None, p.vhost) and self._may_see(request, p.vhost)
        ]
        return list_response(request, rows)

    def _find(self, request: web.Request) -> Policy:
        vhost, name = request.match_info["vhost"], request.match_info["name"]
        for policy in self._list(request)[0]:
            if (policy.vhost, policy.name) == (vhost, name) and self._may_see(request, vhost):
                return policy
        raise object_not_found()

    async def policy(self, request: web.Request) -> web.Response:
        return web.json_response(policy_row(self._find(request)))

    async def put_policy(self, request: web.Request) -> web.Response:
        vhost = self._may_change(request)
        body = await json_body(request)
        missing = [k for k in ("pattern", "definition") if k not in body]
        if missing:
            raise json_error(
                400, "bad_request", "[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]"
            )
        pattern, definition = body["pattern"], body["definition"]
        priority, apply_to = body.get("priority", 0), body.get("apply-to", "all")
        if not isinstance(pattern, str):
            raise invalid(f"pattern should be a string, actually was {pattern!r}")
        if not isinstance(definition, dict) or not definition:
            raise invalid("no policy provided")
        policies, operator = self._list(request)
        refused = not_operator_keys(definition) if operator else []
        if refused:
            terms = ",".join(f"{{<<{json.dumps(k)}>>,{erlang_term(definition[k])}}}" for k in refused)
            # (this text RabbitMQ does not HTML-escape)
            reason = f"Validation failed\n\n[{terms}] are not recognised policy settings\n"
            raise json_error(400, "bad_request", reason)
        if isinstance(priority, str) and priority.lstrip("-").isdigit():
            priority = int(priority)  # rabbitmqadmin sends it as JSON text
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise invalid(f'priority should be a number, actually was <<"{priority}">>')
        if apply_to not in ("queues", "exchanges", "all"):
            raise invalid(f"apply-to '{apply_to}' unrecognised; should be 'queues', 'exchanges' or 'all'")
        try:
            policy = Policy(request.match_info["name"], pattern, definition, apply_to, priority, vhost)
        except re.error as exc:
            raise invalid(f"pattern should be regular expression but is invalid: {exc}") from None
        try:
            check_definition(definition, f" in policy '{policy.name}'")
        except BrokerError as exc:
            raise invalid(exc.text) from None
        created = all((p.vhost, p.name) != (vhost, policy.name) for p in policies)
        self.core.set_policy(policy, operator)
        self.core.audit.record(
            "operator_policy.put" if operator else "policy.put",
            request["user"].name,
            request.remote or "",
            vhost=vhost,
            policy=policy.name,
            pattern=pattern,
        )
        return web.Response(status=201 if created else 204)

    async def delete_policy(self, request: web.Request) -> web.Response:
        vhost = self._may_change(request)
        name = request.match_info["name"]
        operator = self._list(request)[1]
        if not self.core.clear_policy(vhost, name, operator):
            raise object_not_found()
        self.core.audit.record(
            "operator_policy.delete" if operator else "policy.delete",
            request["user"].name,
            request.remote or "",
            vhost=vhost,
            policy=name,
        )
        return web.Response(status=204)

    # -- vhost limits -----------------------------------------------------------------
    async def vhost_limits(self, request: web.Request) -> web.Response:
        """``GET /api/vhost-limits[/{vhost}]``: ``[{"vhost", "value": {limit: n}}]`` for
        the vhosts that have limits (and the user works in)."""
        wanted = request.match_info.get("vhost")
        if wanted is not None and wanted not in self.core.vhosts:
            raise object_not_found()
        rows = [
            {"vhost": name, "value": dict(sorted(vhost.limits.items()))}
            for name, vhost in sorted(self.core.vhosts.items())
            if vhost.limits and wanted in (None, name) and works_in(self.core, request["user"], name)
        ]
        return list_response(request, rows)

    def _limit(self, request: web.Request) -> tuple[str, str]:
        vhost, name = request.match_info["vhost"], request.match_info["name"]
        if vhost not in self.core.vhosts:
            raise json_error(404, "not_found", "vhost_not_found")
        return vhost, name

    async def put_vhost_limit(self, request: web.Request) -> web.Response:
        """``PUT /api/vhost-limits/{vhost}/{name}`` ``{"value": n}``: 204 (RabbitMQ
        answers 204 whether or not it existed); a negative value means no limit."""
        vhost, name = self._limit(request)
        body = await json_body(request)
        if "value" not in body:
            raise json_error(400, "bad_request", "[{key_missing,value}]")
        value = body["value"]
        # (RabbitMQ escapes no HTML in these texts, unlike a policy's)
        if name not in BrokerCore.VHOST_LIMITS:
            reason = f'Unrecognised terms [{{<<"{name}">>,{json.dumps(value)}}}] in limits'
            raise json_error(400, "bad_request", f"Validation failed\n\n{reason}\n")
        if not isinstance(value, int) or isinstance(value, bool):
            reason = f'{name} should be a number, actually was <<"{value}">>'
            raise json_error(400, "bad_request", f"Validation failed\n\n{reason}\n")
        self.core.set_vhost_limit(vhost, name, value)
        self.core.audit.record(
            "vhost_limit.put",
            request["user"].name,
            request.remote or "",
            vhost=vhost,
            limit=name,
            value=value,
        )
        return web.Response(status=204)

    async def delete_vhost_limit(self, request: web.Request) -> web.Response:
        vhost, name = self._limit(request)
        self.core.set_vhost_limit(vhost, name, None)
        self.core.audit.record(
            "vhost_limit.delete", request["user"].name, request.remote or "", vhost=vhost, limit=name
        )
        return web.Response(status=204)

    # -- global and runtime parameters --------------------------------------------------
    async def global_parameters(self, request: web.Request) -> web.Response:
        """``GET /api/global-parameters``: ``[{"name", "value"}]``."""
        rows = [{"name": k, "value": v} for k, v in sorted(self.core.global_parameters.items())]
        return list_response(request, rows)

    async def global_parameter(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.core.global_parameters:
            raise object_not_found()
        return web.json_response({"value": self.core.global_parameters[name], "name": name})

    def _administrator(self, request: web.Request) -> str:
        if "administrator" not in request["user"].tags:
            raise json_error(401, "not_authorised", "Not administrator user")
        return request.match_info["name"]

    async def put_global_parameter(self, request: web.Request) -> web.Response:
        """``PUT /api/global-parameters/{name}`` ``{"value": ...}``: 201 created, 204
        replaced (``administrator``)."""
        name = self._administrator(request)
        body = await json_body(request)
        if "value" not in body:
            raise json_error(400, "bad_request", "[{key_missing,value}]")
        created = name not in self.core.global_parameters
        self.core.set_global_parameter(name, body["value"])
        self.core.audit.record("global_parameter.put", request["user"].name, request.remote or "", name=name)
        return web.Response(status=201 if created else 204)

    async def delete_global_parameter(self, request: web.Request) -> web.Response:
        name = self._administrator(request)
        if not self.core.clear_global_parameter(name):
            raise object_not_found()
        self.core.audit.record(
            "global_parameter.delete", request["user"].name, request.remote or "", name=name
        )
        return web.Response(status=204)
