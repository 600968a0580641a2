"""Another node's change of a shared definition, applied to this node's core.

Each change is a row of the ``changes`` table: ``kind``, ``vhost``, ``name`` as the
store keys the definition (:mod:`leveret.core.definitions`, :mod:`leveret.core.broker`),
``data`` the definition (None: deleted). It goes through core's public API, as a local
change would (users, permissions, policies, parameters and their listeners: federation,
shovels), while the node's store wrapper is replaying (nothing written again). Applying
is idempotent: a change already applied (from the start-up snapshot) changes nothing.
Queues are :class:`~.replication.Replication`'s (they need the owner node).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from ..core.auth import Permission, TopicPermission, User
from ..core.definitions import binding_name
from ..core.exchange import DEFAULT_EXCHANGE, Exchange
from ..core.policy import Policy
from ..core.queues import Queue

if TYPE_CHECKING:
    from ..core.broker import BrokerCore

log = logging.getLogger("leveret.cluster")


def apply_definition(core: BrokerCore, kind: str, vhost: str, name: str, data: dict | None) -> None:
    """Apply a change of any kind but ``queue``; an unknown kind is logged and skipped."""
    handler = _HANDLERS.get(kind)
    if handler is None:
        if kind not in _NOT_DEFINITIONS:
            log.warning("cluster: skipping a change of unknown kind %r", kind)
        return
    handler(core, vhost, name, data)


def _vhost(core: BrokerCore, vhost: str, name: str, data: dict | None) -> None:
    if data is None:
        core.delete_vhost(vhost)
        return
    host = core.add_vhost(vhost)
    limits = data.get("limits")
    host.limits = {str(k): int(v) for k, v in limits.items()} if isinstance(limits, dict) else {}


def _user(core: BrokerCore, vhost: str, name: str, data: dict | None) -> None:
    if data is None:
        core.delete_user(name)
        return
    core.add_user(
        User(name, str(data["password_hash"]), str(data["hashing_algorithm"]), [str(t) for t in data["tags"]])
    )


def _permission(core: BrokerCore, vhost: str, name: str, data: dict | None) -> None:
    if data is None:
        core.clear_permission(name, vhost)
    else:
        core.set_permission(
            name, vhost, Permission(str(data["configure"]), str(data["write"]), str(data["read"]))
        )


def _topic_permission(core: BrokerCore, vhost: str, name: str, data: dict | None) -> None:
    user, _, exchange = name.partition("\x00")
    if data is None:
        core.clear_topic_permissions(user, vhost, exchange)
    else:
        core.set_topic_permission(
            user, vhost, TopicPermission(str(data["exchange"]), str(data["write"]), str(data["read"]))
        )


def _policy(operator: bool):
    def apply(core: BrokerCore, vhost: str, name: str, data: dict | None) -> None:
        if data is None:
            core.clear_policy(vhost, name, operator)
            return
        core.set_policy(Policy.from_stored(vhost, name, data), operator)

    return apply


def _global_parameter(core: BrokerCore, vhost: str, name: str, data: dict | None) -> None:
    if data is None:
        core.clear_global_parameter(name)
    else:
        core.set_global_parameter(name, data["value"])


def _parameter(core: BrokerCore, vhost: str, name: str, data: dict | None) -> None:
    component, _, parameter = name.partition("\x00")
    if data is None:
        core.clear_parameter(component, vhost, parameter)
    else:
        core.set_parameter(component, vhost, parameter, json.loads(str(data["json"])))


def _exchange(core: BrokerCore, vhost: str, name: str, data: dict | None) -> None:
    host = core.vhosts.get(vhost)
    if host is None or name == DEFAULT_EXCHANGE or name.startswith("amq."):
        return
    if data is None:
        host.delete_exchange(name)
        return
    existing = host.exchanges.get(name)
    if existing is not None and existing.type == str(data["type"]):
        return  # (an equivalent one: declared again, or from the snapshot)
    if existing is not None:
        host.delete_exchange(name)
    host.declare_exchange(
        name,
        str(data["type"]),
        durable=bool(data.get("durable", True)),
        auto_delete=bool(data["auto_delete"]),
        internal=bool(data["internal"]),
        arguments=dict(data["arguments"]),
    )


def _binding(core: BrokerCore, vhost: str, name: str, data: dict | None) -> None:
    host = core.vhosts.get(vhost)
    if host is None:
        return
    if data is None:
        source = host.exchanges.get(name.split("\x00", 1)[0])
        if source is None:
            return
        for binding in list(source.bindings.values()):
            if binding_name(binding) == name:
                host.unbind(source.name, binding.destination, binding.routing_key, binding.arguments)
        return
    table: dict = host.queues if data["destination_type"] == "queue" else host.exchanges
    destination: Queue | Exchange | None = table.get(str(data["destination"]))
    if str(data["source"]) not in host.exchanges or destination is None:
        log.debug("cluster: binding %r in vhost %s: an end is missing, skipped", name, vhost)
        return
    host.bind(str(data["source"]), destination, str(data["routing_key"]), dict(data["arguments"]))


#: Changes that are not definitions: ``scheduled`` (a dead node's scheduled rows moved to
#: the node that took it over, which reads them itself)
_NOT_DEFINITIONS = frozenset({"scheduled"})

_HANDLERS = {
    "vhost": _vhost,
    "user": _user,
    "permission": _permission,
    "topic_permission": _topic_permission,
    "policy": _policy(False),
    "operator_policy": _policy(True),
    "global_parameter": _global_parameter,
    "parameter": _parameter,
    "exchange": _exchange,
    "binding": _binding,
}
