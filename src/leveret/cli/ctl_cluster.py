"""``leveret ctl``'s cluster commands (docs/cluster.md): ``cluster_status`` (rabbitmqctl's
text, or its JSON with ``--formatter json``), ``forget_cluster_node NODE`` and
``move_queue VHOST QUEUE NODE`` (leveret's own: :mod:`leveret.server.control_cluster`)."""

from __future__ import annotations

import json
from typing import Any

import click

from .ctl import Context, _show, ctl, pass_ctx, request


def status_text(document: dict[str, Any]) -> str:
    """rabbitmqctl 3.10 cluster_status's text (its sections, without the bold)."""
    lines = ["Basics", "", f"Cluster name: {document['cluster_name']}", ""]
    lines += ["Disk Nodes", "", *document["disk_nodes"], ""]
    lines += ["Running Nodes", "", *document["running_nodes"], ""]
    lines += ["Versions", ""]
    for node, version in sorted(document["versions"].items()):
        name, number = version["rabbitmq_name"], version["rabbitmq_version"]
        lines.append(f"{node}: {name} {number} on Python {version['erlang_version']}")
    lines += ["", "Maintenance status", ""]
    maintenance = sorted(document["maintenance_status"].items())
    lines += [f"Node: {node}, status: {status}" for node, status in maintenance]
    lines += ["", "Alarms", ""]
    alarms = [f"{alarm['resource']} alarm on node {alarm['node']}" for alarm in document["alarms"]]
    lines += alarms or ["(none)"]
    lines += ["", "Network Partitions", "", "(none)", "", "Listeners", ""]
    for node, listeners in sorted(document["listeners"].items()):
        lines += [
            f"Node: {node}, interface: {x['interface']}, port: {x['port']}, protocol: {x['protocol']}, "
            f"purpose: {x['purpose']}"
            for x in listeners
        ]
    return "\n".join(lines)


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


__all__ = ["status_text"]
