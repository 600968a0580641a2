"""``leveret ctl``: daily administration of a running broker, as ``rabbitmqctl`` does it,
over the control socket in its data directory (see :mod:`leveret.server.control`).

Same command names, arguments and column names as rabbitmqctl; ``-p VHOST`` picks the
vhost (default ``/``). Listings print a tab-separated header and rows (``-q``: without
the "Listing ..." line); a refused command prints ``Error: ...`` on stderr and exits 1,
a broker that is not running (no socket) exits 69, as rabbitmqctl's "unavailable".
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import click

from ..control_socket import SOCKET_NAME
from .ctl_cluster import status_text

UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE, rabbitmqctl's code when the node is down


def request(data_dir: str, command: str, args: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Send one request to the broker using ``data_dir``; its answer. Raises
    click.ClickException (exit 69) when no broker answers there."""
    path = Path(data_dir) / SOCKET_NAME
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps({"command": command, "args": args}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        error = click.ClickException(f"cannot reach the broker of {data_dir} ({path}): {exc}")
        error.exit_code = UNAVAILABLE
        raise error from None
    return json.loads(data)


def _show(answer: dict[str, Any], info: str | None, quiet: bool) -> None:
    if not answer.get("ok"):
        click.echo(f"Error: {answer.get('error')}", err=True)
        sys.exit(1)
    if "columns" in answer:
        if info and not quiet:
            click.echo(info)
        click.echo("\t".join(answer["columns"]))
        for row in answer["rows"]:
            click.echo("\t".join(_cell(value) for value in row))
    elif "document" in answer:
        click.echo(json.dumps(answer["document"], indent=2))
    elif not quiet:
        click.echo(answer.get("message", ""))


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Context:
    def __init__(self, data_dir: str, quiet: bool) -> None:
        self.data_dir, self.quiet = data_dir, quiet

    def run(self, command: str, info: str | None = None, **args: Any) -> None:
        _show(
            request(self.data_dir, command, {k: v for k, v in args.items() if v is not None}),
            info,
            self.quiet,
        )


@click.group()
@click.option("--data-dir", default="./leveret-data", show_default=True, help="The broker's data directory.")
@click.option("-q", "--quiet", is_flag=True, help="No informational line before listings.")
@click.pass_context
def ctl(context: click.Context, data_dir: str, quiet: bool) -> None:
    """Administer a running broker (rabbitmqctl's commands), through the control socket
    in its data directory (readable by the broker's system user only)."""
    context.obj = Context(data_dir, quiet)


VHOST = click.option("-p", "--vhost", default="/", show_default=True, help="Virtual host.")
pass_ctx = click.make_pass_decorator(Context)


@ctl.command()
@pass_ctx
def status(ctx: Context) -> None:
    """Listeners, alarms, memory and disk limits, counts."""
    ctx.run("status", "Status of leveret ...")


@ctl.command("list_users")
@pass_ctx
def list_users(ctx: Context) -> None:
    """Users and their tags."""
    ctx.run("list_users", "Listing users ...")


@ctl.command("add_user")
@click.argument("user")
@click.argument("password")
@pass_ctx
def add_user(ctx: Context, user: str, password: str) -> None:
    """Create a user (no tags, no permissions)."""
    ctx.run("add_user", user=user, password=password)


@ctl.command("delete_user")
@click.argument("user")
@pass_ctx
def delete_user(ctx: Context, user: str) -> None:
    """Delete a user with its permissions."""
    ctx.run("delete_user", user=user)


@ctl.command("change_password")
@click.argument("user")
@click.argument("password")
@pass_ctx
def change_password(ctx: Context, user: str, password: str) -> None:
    """Set a user's password."""
    ctx.run("change_password", user=user, password=password)


@ctl.command("set_user_tags")
@click.argument("user")
@click.argument("tags", nargs=-1)
@pass_ctx
def set_user_tags(ctx: Context, user: str, tags: tuple[str, ...]) -> None:
    """Replace a user's tags (none: clear them)."""
    ctx.run("set_user_tags", user=user, tags=list(tags))


@ctl.command("list_vhosts")
@pass_ctx
def list_vhosts(ctx: Context) -> None:
    """Virtual hosts."""
    ctx.run("list_vhosts", "Listing vhosts ...")


@ctl.command("add_vhost")
@click.argument("vhost")
@pass_ctx
def add_vhost(ctx: Context, vhost: str) -> None:
    """Create a virtual host."""
    ctx.run("add_vhost", vhost=vhost)


@ctl.command("delete_vhost")
@click.argument("vhost")
@pass_ctx
def delete_vhost(ctx: Context, vhost: str) -> None:
    """Delete a virtual host with everything in it (its connections are closed)."""
    ctx.run("delete_vhost", vhost=vhost)


@ctl.command("set_permissions")
@VHOST
@click.argument("user")
@click.argument("configure")
@click.argument("write")
@click.argument("read")
@pass_ctx
def set_permissions(ctx: Context, vhost: str, user: str, configure: str, write: str, read: str) -> None:
    """Set a user's configure, write and read expressions in a vhost."""
    ctx.run("set_permissions", vhost=vhost, user=user, configure=configure, write=write, read=read)


@ctl.command("clear_permissions")
@VHOST
@click.argument("user")
@pass_ctx
def clear_permissions(ctx: Context, vhost: str, user: str) -> None:
    """Take a user's permissions in a vhost away."""
    ctx.run("clear_permissions", vhost=vhost, user=user)


@ctl.command("list_permissions")
@VHOST
@pass_ctx
def list_permissions(ctx: Context, vhost: str) -> None:
    """Permissions in a vhost."""
    ctx.run("list_permissions", f'Listing permissions for vhost "{vhost}" ...', vhost=vhost)


@ctl.command("list_user_permissions")
@click.argument("user")
@pass_ctx
def list_user_permissions(ctx: Context, user: str) -> None:
    """A user's permissions in every vhost."""
    ctx.run("list_user_permissions", f'Listing permissions for user "{user}" ...', user=user)


@ctl.command("set_topic_permissions")
@VHOST
@click.argument("user")
@click.argument("exchange")
@click.argument("write")
@click.argument("read")
@pass_ctx
def set_topic_permissions(ctx: Context, vhost: str, user: str, exchange: str, write: str, read: str) -> None:
    """Narrow a user's routing keys on a topic exchange."""
    ctx.run("set_topic_permissions", vhost=vhost, user=user, exchange=exchange, write=write, read=read)


@ctl.command("clear_topic_permissions")
@VHOST
@click.argument("user")
@click.argument("exchange", required=False)
@pass_ctx
def clear_topic_permissions(ctx: Context, vhost: str, user: str, exchange: str | None) -> None:
    """Remove a user's topic permissions (on one exchange, or all)."""
    ctx.run("clear_topic_permissions", vhost=vhost, user=user, exchange=exchange)


@ctl.command("list_topic_permissions")
@VHOST
@pass_ctx
def list_topic_permissions(ctx: Context, vhost: str) -> None:
    """Topic permissions in a vhost."""
    ctx.run("list_topic_permissions", f'Listing topic permissions for vhost "{vhost}" ...', vhost=vhost)


def _policy_commands(operator: bool) -> None:
    """``set_policy``, ``clear_policy``, ``list_policies`` and (``operator``) their
    ``*_operator_policy`` / ``list_operator_policies`` twins, as rabbitmqctl has them."""
    what, plural = ("an operator policy", "operator policies") if operator else ("a policy", "policies")
    suffix = "operator_policy" if operator else "policy"
    kinds = ["queues"] if operator else ["all", "queues", "exchanges"]

    @ctl.command(f"set_{suffix}")
    @VHOST
    @click.option("--priority", type=int, default=0, show_default=True)
    @click.option("--apply-to", default=kinds[0], show_default=True, type=click.Choice(kinds))
    @click.argument("name")
    @click.argument("pattern")
    @click.argument("definition")
    @pass_ctx
    def set_command(
        ctx: Context, vhost: str, priority: int, apply_to: str, name: str, pattern: str, definition: str
    ) -> None:
        ctx.run(
            "set_policy",
            vhost=vhost,
            priority=priority,
            apply_to=apply_to,
            name=name,
            pattern=pattern,
            definition=definition,
            operator=operator,
        )

    set_command.help = (
        f"Set {what} (DEFINITION is JSON, e.g. '{{\"max-length\": 1000}}'); it is stored and "
        "applies to queues declared from now on."
        + (
            " Only limits: expires, message-ttl, max-length(-bytes), max-in-memory-*, delivery-limit;"
            " the lower of it and the queue's own wins."
            if operator
            else ""
        )
    )

    @ctl.command(f"clear_{suffix}", help=f"Remove {what}.")
    @VHOST
    @click.argument("name")
    @pass_ctx
    def clear_command(ctx: Context, vhost: str, name: str) -> None:
        ctx.run("clear_policy", vhost=vhost, name=name, operator=operator)

    @ctl.command(f"list_{plural.replace(' ', '_')}", help=f"The {plural} of a vhost.")
    @VHOST
    @pass_ctx
    def list_command(ctx: Context, vhost: str) -> None:
        ctx.run("list_policies", f'Listing {plural} for vhost "{vhost}" ...', vhost=vhost, operator=operator)


_policy_commands(operator=False)
_policy_commands(operator=True)


@ctl.command("set_parameter")
@VHOST
@click.argument("component")
@click.argument("name")
@click.argument("value")
@pass_ctx
def set_parameter(ctx: Context, vhost: str, component: str, name: str, value: str) -> None:
    """Set a runtime parameter (component ``shovel``, ``federation-upstream`` or
    ``federation-upstream-set``: its JSON definition)."""
    ctx.run("set_parameter", vhost=vhost, component=component, name=name, value=value)


@ctl.command("clear_parameter")
@VHOST
@click.argument("component")
@click.argument("name")
@pass_ctx
def clear_parameter(ctx: Context, vhost: str, component: str, name: str) -> None:
    """Remove a runtime parameter (a shovel stops; an upstream's links stop)."""
    ctx.run("clear_parameter", vhost=vhost, component=component, name=name)


@ctl.command("list_parameters")
@VHOST
@pass_ctx
def list_parameters(ctx: Context, vhost: str) -> None:
    """The vhost's runtime parameters."""
    ctx.run("list_parameters", f'Listing runtime parameters for vhost "{vhost}" ...', vhost=vhost)


@ctl.command("shovel_status")
@pass_ctx
def shovel_status(ctx: Context) -> None:
    """Every shovel's state (RabbitMQ's rabbitmqctl shovel_status)."""
    ctx.run("shovel_status", "Shovel status on node leveret ...")


@ctl.command("federation_status")
@click.option("--only-down", is_flag=True, help="Only the links that failed or are not connected.")
@pass_ctx
def federation_status(ctx: Context, only_down: bool) -> None:
    """Every federation link's state (RabbitMQ's rabbitmqctl federation_status)."""
    info = "Listing federation links which are down ..." if only_down else "Listing federation links ..."
    ctx.run("federation_status", info, only_down=only_down or None)


@ctl.command("restart_federation_link")
@click.argument("link_id")
@pass_ctx
def restart_federation_link(ctx: Context, link_id: str) -> None:
    """Restart a federation link now (its id from federation_status)."""
    ctx.run("restart_federation_link", id=link_id)


def _listing(name: str, what: str, vhosted: bool = True) -> None:
    """A list_* command taking RabbitMQ's column names as arguments."""

    @click.argument("columns", nargs=-1)
    @pass_ctx
    def run(ctx: Context, columns: tuple[str, ...], vhost: str = "/") -> None:
        info = f"Listing {what} for vhost {vhost} ..." if vhosted else f"Listing {what} ..."
        ctx.run(name, info, vhost=vhost if vhosted else None, columns=list(columns) or None)

    run.__doc__ = f"{what.capitalize()}, with the columns named (RabbitMQ's names)."
    if vhosted:
        run = VHOST(run)
    ctl.command(name)(run)


@ctl.command("list_exchange_types")
@pass_ctx
def list_exchange_types(ctx: Context) -> None:
    """The exchange types this broker has (built in: no plugins to enable)."""
    ctx.run("list_exchange_types", "Listing exchange types ...")


@ctl.command("consistent_hash_exchange_ring_state")
@VHOST
@click.argument("exchange")
@pass_ctx
def consistent_hash_exchange_ring_state(ctx: Context, vhost: str, exchange: str) -> None:
    """An x-consistent-hash exchange's ring: each destination's buckets, in ring order
    (RabbitMQ's rabbitmq-diagnostics command of that name, one row per destination)."""
    info = f"Inspecting consistent hashing ring state for exchange {exchange} in virtual host '{vhost}'..."
    ctx.run("consistent_hash_exchange_ring_state", info, vhost=vhost, exchange=exchange)


_listing("list_queues", "queues")
_listing("list_exchanges", "exchanges")
_listing("list_bindings", "bindings")
_listing("list_consumers", "consumers")
_listing("list_connections", "connections", vhosted=False)


@ctl.command("close_connection")
@click.argument("name")
@click.argument("explanation", default="Closed via leveret ctl")
@pass_ctx
def close_connection(ctx: Context, name: str, explanation: str) -> None:
    """Close a connection (NAME from list_connections name) with 320 CONNECTION_FORCED."""
    ctx.run("close_connection", name=name, explanation=explanation)


@ctl.command("purge_queue")
@VHOST
@click.argument("queue")
@pass_ctx
def purge_queue(ctx: Context, vhost: str, queue: str) -> None:
    """Delete a queue's ready messages."""
    ctx.run("purge_queue", vhost=vhost, queue=queue)


@ctl.command("delete_queue")
@VHOST
@click.argument("queue")
@pass_ctx
def delete_queue(ctx: Context, vhost: str, queue: str) -> None:
    """Delete a queue (its consumers are cancelled)."""
    ctx.run("delete_queue", vhost=vhost, queue=queue)


@ctl.command("export_definitions")
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@pass_ctx
def export_definitions(ctx: Context, path: str) -> None:
    """Write RabbitMQ's definitions document to PATH (``-``: standard output)."""
    answer = request(ctx.data_dir, "export_definitions", {})
    text = json.dumps(answer["document"], indent=2)
    if path == "-":
        click.echo(text)
    else:
        Path(path).write_text(text)
        if not ctx.quiet:
            click.echo(f"Exported definitions to {path}")


@ctl.command("import_definitions")
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@pass_ctx
def import_definitions(ctx: Context, path: str) -> None:
    """Add what a definitions document (RabbitMQ's or leveret's) defines."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise click.ClickException(f"{path} is not JSON: {exc}") from None
    ctx.run("import_definitions", document=document)


@ctl.command("set_vm_memory_high_watermark")
@click.option("--absolute", is_flag=True, help="VALUE is in bytes, not a fraction of RAM.")
@click.argument("value")
@pass_ctx
def set_vm_memory_high_watermark(ctx: Context, absolute: bool, value: str) -> None:
    """Set the memory high watermark (a fraction of RAM, or bytes with --absolute)."""
    ctx.run("set_vm_memory_high_watermark", value=value, absolute=absolute or None)


@ctl.command("set_disk_free_limit")
@click.argument("value")
@pass_ctx
def set_disk_free_limit(ctx: Context, value: str) -> None:
    """Set the free disk space (bytes) below which publishers are blocked."""
    ctx.run("set_disk_free_limit", value=value)


# -- the cluster (docs/cluster.md) ------------------------------------------------------
@ctl.command("cluster_status")
@click.option("--formatter", type=click.Choice(["table", "json"]), default="table", show_default=True)
@pass_ctx
def cluster_status(ctx: Context, formatter: str) -> None:
    """The cluster's nodes (disk = registered, running = live), its name, listeners."""
    answer = request(ctx.data_dir, "cluster_status", {})
    if not answer.get("ok"):
        _show(answer, None, ctx.quiet)
    document = answer["document"]
    if formatter == "json":
        click.echo(json.dumps(document, separators=(",", ":"), sort_keys=True))
        return
    if not ctx.quiet:
        click.echo(f"Cluster status of node {answer.get('node')} ...")
    click.echo(status_text(document))


@ctl.command("forget_cluster_node")
@click.argument("node")
@pass_ctx
def forget_cluster_node(ctx: Context, node: str) -> None:
    """Remove a stopped node from the cluster (refused while it runs)."""
    ctx.run("forget_cluster_node", node=node)


@ctl.command("move_queue")
@click.argument("vhost")
@click.argument("queue")
@click.argument("node")
@pass_ctx
def move_queue(ctx: Context, vhost: str, queue: str, node: str) -> None:
    """Move a durable queue to another running node (leveret's own; RabbitMQ's classic
    queues never move)."""
    ctx.run("move_queue", vhost=vhost, queue=queue, node=node)
