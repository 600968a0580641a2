"""The control socket that ``leveret ctl`` talks to, as ``rabbitmqctl`` talks to a node.

A Unix socket ``leveret.ctl`` in the data directory, readable and writable by the
broker's own user only (mode 0600): its file permissions are the guard, as the Erlang
cookie's are for rabbitmqctl. One JSON object a line each way: a request
``{"command": NAME, "args": {...}}``, an answer ``{"ok": true, "columns": [...],
"rows": [[...]]}`` (a listing), ``{"ok": true, "message": "..."}`` or ``{"ok": false,
"error": "..."}``. Changes are recorded in the audit log under the caller's system
user name (from the socket's peer credentials).

The commands and their RabbitMQ column names are in :data:`COMMANDS`; see
``leveret ctl --help``.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import json
import logging
import os
import pwd
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import audit, definitions_document
from ..core.auth import Permission, TopicPermission, User, check_pattern
from ..core.connections import ClientConnection, ConnectionFacts
from ..core.errors import BrokerError
from ..core.policy import Policy, check_definition, not_operator_keys
from ..core.queues import Queue
from ..core.scheduler import JobInfo
from ..version import __version__
from .control_cluster import CLUSTER_COMMANDS

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger("leveret.control")
MAX_REQUEST = 64 * 1024 * 1024  # bytes: an imported definitions document fits


class CommandError(Exception):
    """A request that cannot be carried out; its text goes back to ``leveret ctl``."""


#: a command: its answer, or an awaitable of it (a command that waits: the cluster's,
#: :mod:`.control_cluster`)
Handler = Callable[["Broker", dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]]]
COMMANDS: dict[str, Handler] = {}
CHANGES: set[str] = set()  # commands that change the broker: audited


def command(name: str, changes: bool = False) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        COMMANDS[name] = handler
        if changes:
            CHANGES.add(name)
        return handler

    return register


def _table(columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"columns": columns, "rows": rows}


def _done(message: str) -> dict[str, Any]:
    return {"message": message}


def _vhost(broker: Broker, args: dict[str, Any]) -> Any:
    name = args.get("vhost", "/")
    vhost = broker.core.vhosts.get(name)
    if vhost is None:
        raise CommandError(f"virtual host '{name}' does not exist")
    return vhost


def _user(broker: Broker, name: str) -> User:
    user = broker.core.users.users.get(name)
    if user is None:
        raise CommandError(f"user '{name}' does not exist")
    return user


def _patterns(*patterns: str) -> None:
    for pattern in patterns:
        problem = check_pattern(pattern)
        if problem is not None:
            raise CommandError(f"invalid regular expression '{pattern}': {problem}")


# -- status ---------------------------------------------------------------------------
@command("status")
def _status(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    core, settings = broker.core, broker.settings
    rows: list[list[Any]] = [
        ["product", "leveret"],
        ["version", __version__],
        ["pid", os.getpid()],
        ["data_dir", settings.data_dir],
        ["amqp_listener", f"{broker.host}:{broker.amqp_port}"],
        ["amqps_listener", f"{broker.host}:{broker.amqps_port}" if broker.amqps_port else ""],
        ["http_api", broker.http_url or ""],
        ["alarms", ",".join(sorted(core.alarm_sources))],
        ["memory_pressure", core.memory_pressure],
        ["queue_memory_bytes", core.queue_memory.held],
        ["queue_memory_budget", core.queue_memory.budget],
        ["vm_memory_high_watermark_bytes", settings.memory_limit()],
        ["disk_free_limit", settings.disk_free_limit],
        ["vhosts", len(core.vhosts)],
        ["queues", sum(len(v.queues) for v in core.vhosts.values())],
        ["connections", len(_connections(broker))],
    ]
    return _table(["key", "value"], rows)


@command("set_vm_memory_high_watermark", changes=True)
def _set_memory(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    value = str(args["value"])
    settings = broker.settings
    try:
        if args.get("absolute"):
            settings.vm_memory_high_watermark_absolute = int(value)
        else:
            fraction = float(value)
            if not 0 < fraction <= 1:
                raise ValueError("a fraction of RAM from 0 to 1")
            settings.vm_memory_high_watermark, settings.vm_memory_high_watermark_absolute = fraction, None
    except ValueError as exc:
        raise CommandError(f"invalid watermark '{value}': {exc}") from None
    return _done(f"memory high watermark: {settings.memory_limit()} bytes")


@command("set_disk_free_limit", changes=True)
def _set_disk(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    try:
        limit = int(args["value"])
    except ValueError:
        raise CommandError(f"invalid disk free limit '{args['value']}' (bytes)") from None
    broker.settings.disk_free_limit = limit
    return _done(f"disk free limit: {limit} bytes")


# -- users, vhosts, permissions -------------------------------------------------------
@command("list_users")
def _list_users(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    users = sorted(broker.core.users.users.values(), key=lambda u: u.name)
    return _table(["user", "tags"], [[u.name, "[" + ", ".join(u.tags) + "]"] for u in users])


@command("add_user", changes=True)
def _add_user(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    name = args["user"]
    if name in broker.core.users.users:
        raise CommandError(f"user '{name}' already exists")
    broker.core.add_user(User.with_password(name, args["password"]))
    return _done(f'Adding user "{name}" ...')


@command("change_password", changes=True)
def _change_password(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    user = _user(broker, args["user"])
    broker.core.add_user(User.with_password(user.name, args["password"], user.tags))
    return _done(f'Changing password for user "{user.name}" ...')


@command("set_user_tags", changes=True)
def _set_tags(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    user = _user(broker, args["user"])
    broker.core.add_user(User(user.name, user.password_hash, user.hashing_algorithm, list(args["tags"])))
    return _done(f'Setting tags for user "{user.name}" to [{", ".join(args["tags"])}] ...')


@command("delete_user", changes=True)
def _delete_user(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    if not broker.core.delete_user(args["user"]):
        raise CommandError(f"user '{args['user']}' does not exist")
    return _done(f'Deleting user "{args["user"]}" ...')


@command("list_vhosts")
def _list_vhosts(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    return _table(["name"], [[name] for name in sorted(broker.core.vhosts)])


@command("add_vhost", changes=True)
def _add_vhost(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    broker.core.add_vhost(args["vhost"])
    return _done(f'Adding vhost "{args["vhost"]}" ...')


@command("delete_vhost", changes=True)
def _delete_vhost(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    if not broker.core.delete_vhost(args["vhost"]):
        raise CommandError(f"virtual host '{args['vhost']}' does not exist")
    return _done(f'Deleting vhost "{args["vhost"]}" ...')


@command("set_permissions", changes=True)
def _set_permissions(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost, user = _vhost(broker, args), _user(broker, args["user"])
    _patterns(args["configure"], args["write"], args["read"])
    broker.core.set_permission(
        user.name, vhost.name, Permission(args["configure"], args["write"], args["read"])
    )
    return _done(f'Setting permissions for user "{user.name}" in vhost "{vhost.name}" ...')


@command("clear_permissions", changes=True)
def _clear_permissions(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    broker.core.clear_permission(args["user"], vhost.name)
    return _done(f'Clearing permissions for user "{args["user"]}" in vhost "{vhost.name}" ...')


@command("list_permissions")
def _list_permissions(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    rows = [
        [user, p.configure, p.write, p.read]
        for (name, user), p in sorted(broker.core.users.permissions.items())
        if name == vhost.name
    ]
    return _table(["user", "configure", "write", "read"], rows)


@command("list_user_permissions")
def _list_user_permissions(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    user = _user(broker, args["user"])
    rows = [
        [vhost, p.configure, p.write, p.read]
        for (vhost, name), p in sorted(broker.core.users.permissions.items())
        if name == user.name
    ]
    return _table(["vhost", "configure", "write", "read"], rows)


@command("set_topic_permissions", changes=True)
def _set_topic(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost, user = _vhost(broker, args), _user(broker, args["user"])
    _patterns(args["write"], args["read"])
    broker.core.set_topic_permission(
        user.name, vhost.name, TopicPermission(args["exchange"], args["write"], args["read"])
    )
    return _done(f'Setting topic permissions on "{args["exchange"]}" for user "{user.name}" ...')


@command("clear_topic_permissions", changes=True)
def _clear_topic(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    broker.core.clear_topic_permissions(args["user"], vhost.name, args.get("exchange"))
    return _done(f'Clearing topic permissions for user "{args["user"]}" ...')


@command("list_topic_permissions")
def _list_topic(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    topics = broker.core.users.topic_permissions.items()
    rows = [
        [user, t.exchange, t.write, t.read] for (name, user, _), t in sorted(topics) if name == vhost.name
    ]
    return _table(["user", "exchange", "write", "read"], rows)


# -- policies and operator policies (``operator``: rabbitmqctl's *_operator_policy) --------
@command("set_policy", changes=True)
def _set_policy(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    operator = bool(args.get("operator"))
    try:
        definition = json.loads(args["definition"])
        if not isinstance(definition, dict):
            raise ValueError("not a JSON object")
        refused = not_operator_keys(definition) if operator else []
        if refused:
            raise ValueError(f"{', '.join(refused)}: not keys an operator policy may set")
        policy = Policy(
            args["name"],
            args["pattern"],
            definition,
            args.get("apply_to", "all"),
            int(args.get("priority", 0)),
            vhost.name,
        )
    except ValueError as exc:
        raise CommandError(f"invalid policy: {exc}") from None
    try:  # its values, as a queue would take them (the management API checks the same)
        check_definition(definition, f" in policy '{policy.name}'")
    except BrokerError as exc:
        raise CommandError(f"invalid policy: {exc.text}") from None
    broker.core.set_policy(policy, operator)
    what = "operator policy" if operator else "policy"
    return _done(f'Setting {what} "{policy.name}" for pattern "{policy.pattern}" ...')


@command("clear_policy", changes=True)
def _clear_policy(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    operator = bool(args.get("operator"))
    what = "operator policy" if operator else "policy"
    if not broker.core.clear_policy(vhost.name, args["name"], operator):
        raise CommandError(f"{what} '{args['name']}' does not exist in vhost '{vhost.name}'")
    return _done(f'Clearing {what} "{args["name"]}" ...')


@command("list_policies")
def _list_policies(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    policies = broker.core.operator_policies if args.get("operator") else broker.core.policies
    rows = [
        [p.vhost, p.name, p.pattern, p.apply_to, json.dumps(p.definition), p.priority]
        for p in policies
        if p.vhost == vhost.name
    ]
    return _table(["vhost", "name", "pattern", "apply-to", "definition", "priority"], rows)


# -- runtime parameters and shovels (rabbitmqctl's set_parameter, shovel_status) ------------
@command("set_parameter", changes=True)
def _set_parameter(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    from ..management.parameters import COMPONENTS

    vhost = _vhost(broker, args)
    component, name = args["component"], args["name"]
    check = COMPONENTS.get(component)
    if check is None:
        raise CommandError(f"component {component} not found")
    try:
        value = json.loads(args["value"])
        check(value, name)
    except ValueError as exc:  # bad JSON, ShovelError, FederationError
        raise CommandError(f"invalid {component} parameter: {exc}") from None
    broker.core.set_parameter(component, vhost.name, name, value)
    return _done(f'Setting runtime parameter "{name}" for component "{component}" to "{args["value"]}" ...')


@command("clear_parameter", changes=True)
def _clear_parameter(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    if not broker.core.clear_parameter(args["component"], vhost.name, args["name"]):
        raise CommandError(f"parameter '{args['name']}' of component '{args['component']}' does not exist")
    return _done(f'Clearing runtime parameter "{args["name"]}" for component "{args["component"]}" ...')


@command("list_parameters")
def _list_parameters(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    rows = [
        [component, name, json.dumps(value)]
        for (component, v, name), value in sorted(broker.core.parameters.items())
        if v == vhost.name
    ]
    return _table(["component", "name", "value"], rows)


@command("shovel_status")
def _shovel_status(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    columns = ["name", "vhost", "type", "state", "src_uri", "dest_uri", "messages_forwarded"]
    rows = [[row.get(c, "") for c in columns] for row in broker.shovels.status()]
    return _table(columns, rows)


# -- federation (rabbitmqctl's federation_status, restart_federation_link) ----------------
#: ``federation_status``'s columns: the keys of ``rabbitmqctl federation_status
#: --formatter json`` (RabbitMQ 3.10), every one on every row ("" where a link has none).
FEDERATION_COLUMNS = [
    "type",
    "vhost",
    "exchange",
    "queue",
    "upstream",
    "upstream_exchange",
    "upstream_queue",
    "consumer_tag",
    "id",
    "status",
    "local_connection",
    "error",
    "uri",
    "last_changed",
]


@command("federation_status")
def _federation_status(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    """Every federation link (``only_down``: those neither running nor starting, as
    ``--only-down``), with the management API's fields and ``last_changed``."""
    from ..management.federation import ctl_timestamp, is_down, link_rows

    links = broker.federation.links()
    rows = []
    for link, row in zip(links, link_rows(broker.core, links), strict=True):
        if args.get("only_down") and not is_down(row):
            continue
        row["last_changed"] = ctl_timestamp(link.since)
        rows.append([row.get(c, "") for c in FEDERATION_COLUMNS])
    return _table(FEDERATION_COLUMNS, rows)


@command("restart_federation_link", changes=True)
def _restart_federation_link(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    """Drop the link's connections and start it over at once (its id from
    ``federation_status``, in any vhost)."""
    link_id = args["id"]
    link = next((link for link in broker.federation.links() if link.id == link_id), None)
    if link is None:
        raise CommandError("Link with the given ID was not found")
    broker.federation.restart(link.vhost, link_id)
    return _done(f"Restarting federation link {link_id} on node {broker.federation_node()}")


# -- listings -------------------------------------------------------------------------
def _columns(
    args: dict[str, Any], available: dict[str, Callable[[Any], Any]], default: list[str]
) -> list[str]:
    columns = args.get("columns") or default
    unknown = [c for c in columns if c not in available]
    if unknown:
        raise CommandError(f"unknown column(s) {', '.join(unknown)}; known: {', '.join(available)}")
    return columns


QUEUE_INFO: dict[str, Callable[[Queue], Any]] = {
    "name": lambda q: q.name,
    "durable": lambda q: q.durable,
    "auto_delete": lambda q: q.auto_delete,
    "exclusive": lambda q: q.exclusive_owner is not None,
    "arguments": lambda q: json.dumps(definitions_document.jsonable(q.arguments)),
    "messages": lambda q: q.message_count + q.unacked_count,
    "messages_ready": lambda q: q.message_count,
    "messages_unacknowledged": lambda q: q.unacked_count,
    "consumers": lambda q: len(q.consumers),
    "type": lambda q: q.type_name,
}


@command("list_queues")
def _list_queues(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    columns = _columns(args, QUEUE_INFO, ["name", "messages"])
    queues = sorted(vhost.queues.values(), key=lambda q: q.name)
    return _table(columns, [[QUEUE_INFO[c](q) for c in columns] for q in queues])


@command("list_exchanges")
def _list_exchanges(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    info: dict[str, Callable[[Any], Any]] = {
        "name": lambda e: e.name,
        "type": lambda e: e.type,
        "durable": lambda e: e.durable,
        "auto_delete": lambda e: e.auto_delete,
        "internal": lambda e: e.internal,
        "arguments": lambda e: json.dumps(definitions_document.jsonable(e.arguments)),
    }
    columns = _columns(args, info, ["name", "type"])
    exchanges = sorted(vhost.exchanges.values(), key=lambda e: e.name)
    return _table(columns, [[info[c](e) for c in columns] for e in exchanges])


@command("list_exchange_types")
def _list_exchange_types(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    from ..core.exchange import EXCHANGE_TYPES

    return _table(
        ["name", "description"], [[n, EXCHANGE_TYPES[n].description] for n in sorted(EXCHANGE_TYPES)]
    )


@command("consistent_hash_exchange_ring_state")
def _consistent_hash_exchange_ring_state(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    from ..core.exchange_types import ConsistentHashExchange

    vhost = _vhost(broker, args)
    exchange = vhost.exchanges.get(args["exchange"])
    if not isinstance(exchange, ConsistentHashExchange):
        raise CommandError("Exchange does not exist or is of a different type")
    rows, first = [], 0
    for destination, weight in exchange.ring():
        rows.append([first, first + weight - 1, destination.name])
        first += weight
    return _table(["first_bucket", "last_bucket", "destination"], rows)


@command("list_bindings")
def _list_bindings(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    rows = []
    for exchange in sorted(vhost.exchanges.values(), key=lambda e: e.name):
        for binding in exchange.bindings.values():
            kind = "queue" if isinstance(binding.destination, Queue) else "exchange"
            arguments = json.dumps(definitions_document.jsonable(binding.arguments))
            rows.append(
                ["exchange", exchange.name, kind, binding.destination.name, binding.routing_key, arguments]
            )
    columns = [
        "source_kind",
        "source_name",
        "destination_kind",
        "destination_name",
        "routing_key",
        "arguments",
    ]
    return _table(columns, rows)


#: A client connection as ctl lists it: its name, its facts, and itself (to close it).
ConnectionRow = tuple[str, ConnectionFacts, ClientConnection]


def _connections(broker: Broker) -> list[ConnectionRow]:
    """Every client connection, by name: the listeners' (also those still logging in),
    named as :meth:`Broker.connections` does, then those of any other adapter that
    opened through core's lifecycle (:attr:`BrokerCore.connections`), by their facts'
    name."""
    found: list[ConnectionRow] = [
        (name, connection.facts(), connection) for name, connection in broker.connections()
    ]
    listed = {id(connection) for _, _, connection in found}
    for facts, connection in broker.core.connections.facts():
        if id(connection) not in listed:
            found.append((facts.name, facts, connection))
    return found


CONNECTION_INFO: dict[str, Callable[[ConnectionRow], Any]] = {
    "name": lambda c: c[0],
    "user": lambda c: c[1].user,
    "vhost": lambda c: c[1].vhost,
    "peer_host": lambda c: c[1].peer_host,
    "peer_port": lambda c: c[1].peer_port,
    "state": lambda c: c[1].state,
    # a STOMP connection is one channel, as RabbitMQ's STOMP plugin counts it
    "channels": lambda c: len(c[1].channels),
    "protocol": lambda c: c[1].protocol,
    "ssl": lambda c: c[1].ssl,
    # heartbeat (AMQP, STOMP) or keep alive (MQTT), seconds
    "timeout": lambda c: c[1].heartbeat,
    "auth_mechanism": lambda c: c[1].auth_mechanism,
    # MQTT: client_id, keep_alive, session_expiry_interval, clean_session
    "client_properties": lambda c: json.dumps(definitions_document.jsonable(c[1].client_properties)),
}


@command("list_connections")
def _list_connections(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    columns = _columns(args, CONNECTION_INFO, ["user", "peer_host", "peer_port", "state"])
    return _table(columns, [[CONNECTION_INFO[c](item) for c in columns] for item in _connections(broker)])


@command("list_consumers")
def _list_consumers(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    rows = []
    for name, facts, _ in _connections(broker):
        if facts.vhost != vhost.name:
            continue
        for channel in facts.channels:
            for consumer in channel.consumers:
                arguments = json.dumps(definitions_document.jsonable(consumer.arguments))
                rows.append(
                    [
                        consumer.queue,
                        f"{name} ({channel.number})",
                        consumer.tag,
                        consumer.ack_required,
                        consumer.prefetch_count,
                        arguments,
                    ]
                )
    columns = ["queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "arguments"]
    return _table(columns, rows)


# -- actions --------------------------------------------------------------------------
@command("close_connection", changes=True)
def _close_connection(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    for name, _, connection in _connections(broker):
        if name == args["name"]:
            connection.close_by_operator(args.get("explanation") or "Closed via leveret ctl")
            return _done(f"Closing connection {name}, reason: {args.get('explanation', '')} ...")
    raise CommandError(f"no connection named '{args['name']}' (see list_connections name)")


@command("purge_queue", changes=True)
def _purge_queue(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    queue = _vhost(broker, args).queues.get(args["queue"])
    if queue is None:
        raise CommandError(f"queue '{args['queue']}' does not exist")
    count = queue.purge()
    return _done(f"Purging queue '{queue.name}' in vhost '{queue.host.name}': {count} messages ...")


@command("delete_queue", changes=True)
def _delete_queue(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    vhost = _vhost(broker, args)
    if args["queue"] not in vhost.queues:
        raise CommandError(f"queue '{args['queue']}' does not exist")
    count = vhost.delete_queue(args["queue"])
    return _done(
        f"Deleting queue '{args['queue']}' on vhost '{vhost.name}' ...\nQueue was successfully deleted "
        f"with {count} ready messages"
    )


# -- scheduled messages (leveret scheduler) -------------------------------------------------
JOB_COLUMNS = [
    "job_id",
    "vhost",
    "exchange",
    "routing_key",
    "next_due",
    "delay",
    "period",
    "repeat",
    "cron",
    "body_size",
    "persistent",
]


def _job_row(job: JobInfo) -> list[Any]:
    due = datetime.datetime.fromtimestamp(job.next_due, datetime.UTC).isoformat(timespec="milliseconds")
    return [
        job.job_id,
        job.vhost,
        job.exchange,
        job.routing_key,
        due,
        job.delay,
        job.period,
        job.repeat,
        job.cron or "",
        job.body_size,
        job.persistent,
    ]


@command("list_scheduled")
def _list_scheduled(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    jobs = broker.core.scheduler.jobs(args.get("vhost"), int(args.get("limit", 100)))
    return _table(JOB_COLUMNS, [_job_row(job) for job in jobs])


@command("show_scheduled")
def _show_scheduled(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    job = broker.core.scheduler.job(args["job_id"])
    if job is None:
        raise CommandError(f"no scheduled job '{args['job_id']}'")
    return _table(["field", "value"], [list(pair) for pair in zip(JOB_COLUMNS, _job_row(job), strict=True)])


@command("cancel_scheduled", changes=True)
def _cancel_scheduled(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    if not broker.core.scheduler.cancel(args["job_id"], args.get("vhost")):
        raise CommandError(f"no scheduled job '{args['job_id']}'")
    return _done(f"Cancelled scheduled job '{args['job_id']}'")


@command("export_definitions")
def _export(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    return {"document": definitions_document.export(broker.core, __version__)}


@command("import_definitions", changes=True)
def _import(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    definitions_document.import_document(broker.core, args["document"])
    return _done("Importing definitions ...")


# -- the socket -----------------------------------------------------------------------
def _peer_user(writer: asyncio.StreamWriter) -> str:
    """The system user on the other end of the socket (SO_PEERCRED), else '?'."""
    sock = writer.get_extra_info("socket")
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return pwd.getpwuid(struct.unpack("3i", creds)[1]).pw_name
    except (OSError, KeyError, AttributeError):
        return "?"


async def carry_out(broker: Broker, request: Any, who: str) -> dict[str, Any]:
    """Answer one request (see the module doc); never raises for bad input."""
    if not isinstance(request, dict) or request.get("command") not in COMMANDS:
        known = ", ".join(sorted(COMMANDS))
        return {"ok": False, "error": f"unknown command; known: {known}"}
    name, args = request["command"], request.get("args") or {}
    try:
        answer = COMMANDS[name](broker, args)
        result = await answer if inspect.isawaitable(answer) else answer
    except KeyError as exc:
        return {"ok": False, "error": f"{name}: missing argument {exc}"}
    except (CommandError, BrokerError) as exc:
        return {"ok": False, "error": str(exc)}
    if name in CHANGES:
        details = {k: v for k, v in args.items() if k not in ("password", "document")}
        audit.record(f"ctl.{name}", who, "local socket", **details)
    return {"ok": True, **result}


class ControlServer:
    """Serves the control socket of ``broker`` at ``path`` (mode 0600)."""

    def __init__(self, broker: Broker, path: Path) -> None:
        self.broker = broker
        self.path = path
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Listen (replacing a socket file a crashed broker left behind)."""
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        old_umask = os.umask(0o177)  # the socket is made 0600, never briefly wider
        try:
            self._server = await asyncio.start_unix_server(self._serve, str(self.path), limit=MAX_REQUEST)
        finally:
            os.umask(old_umask)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        who = _peer_user(writer)
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                except ValueError as exc:
                    answer: dict[str, Any] = {"ok": False, "error": f"not JSON: {exc}"}
                else:
                    answer = await carry_out(self.broker, request, who)
                writer.write(json.dumps(answer, default=str).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            log.warning("control socket: %s", exc)
        finally:
            writer.close()

    async def stop(self) -> None:
        """Stop listening and remove the socket file."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self.path.exists():
            self.path.unlink()


for _name, (_handler, _changes) in CLUSTER_COMMANDS.items():  # cluster_status … (docs/cluster.md)
    command(_name, _changes)(_handler)
