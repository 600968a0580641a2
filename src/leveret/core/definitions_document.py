"""RabbitMQ's definitions document (``GET``/``POST /api/definitions``, ``rabbitmqctl
export_definitions``): users with their password hashes, vhosts, permissions, topic
permissions, policies, exchanges, queues and bindings, as JSON-ready dicts with
RabbitMQ 3.10's keys. A document exported by RabbitMQ imports here with working
passwords, and one exported here imports into RabbitMQ.

Export leaves out what RabbitMQ 3.10 leaves out: exclusive queues, the default and
``amq.*`` exchanges and the implicit default-exchange bindings; transient queues and
exchanges are in it, marked ``"durable": false``, as RabbitMQ writes them. Import
adds and replaces, never deletes; a malformed document raises PreconditionFailed
naming the offending entry, before anything is changed.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

from . import passwords
from .auth import Permission, TopicPermission, User, check_pattern
from .broker import BrokerCore
from .errors import BrokerError, precondition_failed
from .exchange import DEFAULT_EXCHANGE
from .policy import Policy, check_definition
from .queues import Queue

#: The runtime parameter components an import sets (``vhost-limits`` and
#: ``operator_policy`` are read apart; RabbitMQ's other plugins' are not leveret's).
IMPORTED_COMPONENTS = ("shovel", "federation-upstream", "federation-upstream-set")


def export(core: BrokerCore, version: str) -> dict[str, Any]:
    """The whole broker's definitions (``version``: leveret's, written where RabbitMQ
    writes its own)."""
    users = core.users
    document: dict[str, Any] = {
        "rabbit_version": version,
        "rabbitmq_version": version,
        "product_name": "leveret",
        "product_version": version,
        "users": [{**user.definition(), "limits": {}} for _, user in sorted(users.users.items())],
        "vhosts": [
            {"name": name, "limits": [], "metadata": {"description": "", "tags": []}} for name in core.vhosts
        ],
        "permissions": [
            {"user": user, "vhost": vhost, **vars(permission)}
            for (vhost, user), permission in users.permissions.items()
        ],
        "topic_permissions": [
            {"user": user, "vhost": vhost, **vars(topic)}
            for (vhost, user, _), topic in users.topic_permissions.items()
        ],
        # vhost limits and operator policies are runtime parameters in RabbitMQ's document
        "parameters": [
            {"value": dict(vhost.limits), "vhost": name, "component": "vhost-limits", "name": "limits"}
            for name, vhost in core.vhosts.items()
            if vhost.limits
        ]
        + [
            {
                "value": {
                    "pattern": p.pattern,
                    "definition": p.definition,
                    "priority": p.priority,
                    "apply-to": p.apply_to,
                },
                "vhost": p.vhost,
                "component": "operator_policy",
                "name": p.name,
            }
            for p in core.operator_policies
        ]
        + [
            {"value": value, "vhost": vhost, "component": component, "name": name}
            for (component, vhost, name), value in sorted(core.parameters.items())
        ],
        "global_parameters": [{"name": k, "value": v} for k, v in sorted(core.global_parameters.items())],
        "policies": [
            {
                "vhost": p.vhost,
                "name": p.name,
                "pattern": p.pattern,
                "apply-to": p.apply_to,
                "definition": p.definition,
                "priority": p.priority,
            }
            for p in core.policies
        ],
        "queues": [],
        "exchanges": [],
        "bindings": [],
    }
    for vhost in core.vhosts.values():
        for queue in vhost.queues.values():
            if queue.exclusive_owner is None:
                document["queues"].append(
                    {
                        "name": queue.name,
                        "vhost": vhost.name,
                        "durable": queue.durable,
                        "auto_delete": queue.auto_delete,
                        "arguments": jsonable(queue.arguments),
                    }
                )
        for exchange in vhost.exchanges.values():
            if (
                exchange.durable
                and exchange.name != DEFAULT_EXCHANGE
                and not exchange.name.startswith("amq.")
            ):
                document["exchanges"].append(
                    {
                        "name": exchange.name,
                        "vhost": vhost.name,
                        "type": exchange.type,
                        "durable": True,
                        "auto_delete": exchange.auto_delete,
                        "internal": exchange.internal,
                        "arguments": jsonable(exchange.arguments),
                    }
                )
            for binding in exchange.bindings.values():
                destination = binding.destination
                if isinstance(destination, Queue) and destination.exclusive_owner is not None:
                    continue
                document["bindings"].append(
                    {
                        "source": exchange.name,
                        "vhost": vhost.name,
                        "destination": destination.name,
                        "destination_type": "queue" if isinstance(destination, Queue) else "exchange",
                        "routing_key": binding.routing_key,
                        "arguments": jsonable(binding.arguments),
                    }
                )
    return document


def import_document(core: BrokerCore, document: Any, owner: object = None) -> None:
    """Add (or replace) everything ``document`` defines. PreconditionFailed for a
    malformed one, checked whole before any change; errors of the objects themselves
    (an inequivalent queue, say) are core's usual ones."""
    if not isinstance(document, dict):
        raise precondition_failed("definitions must be a JSON object")
    users = [_user(entry) for entry in _entries(document, "users", ("name",))]
    vhosts = [str(entry["name"]) for entry in _entries(document, "vhosts", ("name",))]
    permissions = [
        (str(e["user"]), str(e["vhost"]), Permission(*_patterns(e, ("configure", "write", "read"))))
        for e in _entries(document, "permissions", ("user", "vhost", "configure", "write", "read"))
    ]
    topics = [
        (
            str(e["user"]),
            str(e["vhost"]),
            TopicPermission(str(e["exchange"]), *_patterns(e, ("write", "read"))),
        )
        for e in _entries(document, "topic_permissions", ("user", "vhost", "exchange", "write", "read"))
    ]
    policies = [
        _policy(e) for e in _entries(document, "policies", ("vhost", "name", "pattern", "definition"))
    ]
    exchanges = _entries(document, "exchanges", ("name", "vhost", "type"))
    queues = _entries(document, "queues", ("name", "vhost"))
    bindings = _entries(document, "bindings", ("source", "vhost", "destination", "destination_type"))
    parameters = _entries(document, "parameters", ("vhost", "component", "value"))
    limits = [(str(e["vhost"]), _limits(e["value"])) for e in parameters if e["component"] == "vhost-limits"]
    components = [  # shovels (their manager checks them) and federation upstreams
        (str(e["component"]), str(e["vhost"]), str(e.get("name")), e["value"])
        for e in parameters
        if e["component"] in IMPORTED_COMPONENTS
    ]
    for component, _, name, value in components:
        _check_federation(component, name, value)
    operator_policies = [
        _policy({**e["value"], "vhost": e["vhost"], "name": e.get("name")})
        for e in parameters
        if e["component"] == "operator_policy" and isinstance(e["value"], dict)
    ]
    global_parameters = [
        (str(e["name"]), e["value"]) for e in _entries(document, "global_parameters", ("name", "value"))
    ]
    for user in users:
        core.add_user(user)
    for name in vhosts:
        core.add_vhost(name)
    for user_name, vhost, permission in permissions:
        core.set_permission(user_name, vhost, permission)
    for user_name, vhost, topic in topics:
        core.set_topic_permission(user_name, vhost, topic)
    for policy in policies:
        core.set_policy(policy)
    for policy in operator_policies:
        core.set_policy(policy, operator=True)
    for name, value in global_parameters:
        core.set_global_parameter(name, value)
    for component, vhost_name, name, value in components:
        core.add_vhost(vhost_name)
        core.set_parameter(component, vhost_name, name, value)
    for vhost_name, values in limits:
        core.add_vhost(vhost_name)
        for key, value in values.items():
            core.set_vhost_limit(vhost_name, key, value)
    for e in exchanges:
        core.add_vhost(str(e["vhost"])).declare_exchange(
            str(e["name"]),
            str(e["type"]),
            False,
            bool(e.get("durable", True)),
            bool(e.get("auto_delete", False)),
            bool(e.get("internal", False)),
            dict(e.get("arguments") or {}),
        )
    for e in queues:
        core.add_vhost(str(e["vhost"])).declare_queue(
            str(e["name"]),
            owner,
            False,
            bool(e.get("durable", True)),
            False,
            bool(e.get("auto_delete", False)),
            dict(e.get("arguments") or {}),
        )
    for e in bindings:
        target = core.add_vhost(str(e["vhost"]))
        name = str(e["destination"])
        destination = (
            target.get_queue(name) if e["destination_type"] == "queue" else target.get_exchange(name)
        )
        target.bind(
            str(e["source"]), destination, str(e.get("routing_key", "")), dict(e.get("arguments") or {})
        )


def _entries(document: dict, key: str, required: tuple[str, ...]) -> list[dict]:
    entries = document.get(key, [])
    if not isinstance(entries, list):
        raise precondition_failed(f"definitions: '{key}' must be a list")
    for entry in entries:
        if not isinstance(entry, dict) or any(k not in entry for k in required):
            raise precondition_failed(
                f"definitions: every entry of '{key}' needs {', '.join(required)}: {entry!r}"
            )
    return entries


def _limits(value: Any) -> dict[str, int]:
    """A ``vhost-limits`` parameter's value: known limits with integer values."""
    if not isinstance(value, dict) or not all(
        k in ("max-connections", "max-queues") and isinstance(v, int) and not isinstance(v, bool)
        for k, v in value.items()
    ):
        raise precondition_failed(
            f"definitions: vhost limits must be max-connections/max-queues integers: {value!r}"
        )
    return value


def _patterns(entry: dict, keys: tuple[str, ...]) -> list[str]:
    values = []
    for key in keys:
        value = entry[key]
        problem = check_pattern(value) if isinstance(value, str) else "not a string"
        if problem is not None:
            raise precondition_failed(f"definitions: {key} {value!r} of {entry!r}: {problem}")
        values.append(value)
    return values


def _user(entry: dict) -> User:
    tags = entry.get("tags", [])
    if isinstance(tags, str):  # RabbitMQ before 3.9 wrote "a,b"
        tags = [t for t in tags.split(",") if t]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise precondition_failed(f"definitions: tags of user {entry['name']!r} must be a list of strings")
    if isinstance(entry.get("password"), str):
        return User.with_password(str(entry["name"]), entry["password"], tags)
    password_hash = entry.get("password_hash", "")
    algorithm = entry.get("hashing_algorithm", passwords.DEFAULT_ALGORITHM)
    try:
        passwords.validate(str(password_hash), str(algorithm))
    except passwords.HashError as exc:
        raise precondition_failed(f"definitions: user {entry['name']!r}: {exc}") from None
    return User(str(entry["name"]), str(password_hash), str(algorithm), tags)


def _check_federation(component: str, name: str, value: Any) -> None:
    """A ``federation-upstream`` or ``federation-upstream-set`` parameter checked as
    ``PUT /api/parameters`` checks it (RabbitMQ's import validates each parameter and
    fails as a whole): PreconditionFailed naming it, before anything is imported."""
    from ..federation.upstream import UPSTREAM, UPSTREAM_SET, FederationError, Upstream, check_upstream_set

    try:
        if component == UPSTREAM:
            Upstream.from_parameter("", name, value)
        elif component == UPSTREAM_SET:
            check_upstream_set(value, name)
    except FederationError as exc:
        raise precondition_failed(f"definitions: {component} {name!r}: {exc}") from None


def _policy(entry: dict) -> Policy:
    try:
        policy = Policy(
            name=str(entry["name"]),
            pattern=str(entry["pattern"]),
            definition=dict(entry["definition"]),
            apply_to=str(entry.get("apply-to", "all")),
            priority=int(entry.get("priority", 0)),
            vhost=str(entry["vhost"]),
        )
    except (TypeError, ValueError) as exc:  # re.error is a ValueError
        raise precondition_failed(f"definitions: policy {entry.get('name')!r}: {exc}") from None
    try:  # its values, as a queue would take them (PUT /api/policies checks the same)
        check_definition(policy.definition, f" in policy '{policy.name}'")
    except BrokerError as exc:
        raise precondition_failed(f"definitions: policy {policy.name!r}: {exc.text}") from None
    return policy


def jsonable(value: Any) -> Any:
    """Field-table values as JSON can hold them: bytes as text, timestamps as epoch
    seconds, decimals as floats (definitions, the HTTP API, ``leveret ctl``)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, decimal.Decimal):
        return float(value)
    return value
