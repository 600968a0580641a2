"""``leveret ctl cluster_status``'s text: rabbitmqctl 3.10's sections, from the JSON
document the node answers (:mod:`leveret.server.control_cluster`, docs/cluster.md)."""

from __future__ import annotations

from typing import Any


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


__all__ = ["status_text"]
