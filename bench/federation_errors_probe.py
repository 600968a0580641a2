"""Probe: the ``error`` text of ``/api/federation-links`` rows for each way a link fails
(refused, wrong password, missing vhost, no permission, missing upstream exchange, an
upstream queue with other arguments, a TLS failure, plain AMQP to a TLS port), on a
leveret downstream federating from a leveret upstream. Prints one line per link.

    PYTHONPATH=src python3 bench/federation_errors_probe.py        # this tree
    PYTHONPATH=/work/main/src python3 bench/federation_errors_probe.py   # another tree

Takes about 10 s (reconnect-delay 1 s)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from brokers import free_port as closed_port  # a port nothing listens on
from certificates import pem_files
from targets import Target, put

from leveret import BlockingBroker
from leveret.server.tls import TLSOptions


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    good, other = pem_files(tmp / "a"), pem_files(tmp / "b")
    tls = TLSOptions(good["server"], good["server_key"], good["ca"], verify="verify_peer")
    with (
        BlockingBroker(amqp_port=0, amqps_port=0, http_port=0, ssl_options=tls) as up,
        BlockingBroker(amqp_port=0, http_port=0) as down,
    ):
        upstream, downstream = Target.of(up), Target.of(down)
        port, tls_port = up.amqp_port, up.broker.amqps_port

        put(upstream, "/api/vhosts/limited", {})
        put(upstream, "/api/permissions/limited/guest", {"configure": "^$", "write": "^$", "read": "^$"})
        put(upstream, "/api/queues/%2F/up.q", {"arguments": {"x-max-length": 5}})
        put(downstream, "/api/exchanges/%2F/fx", {"type": "topic"})
        put(downstream, "/api/queues/%2F/fq", {})
        upstreams = {
            "refused": {"uri": f"amqp://guest:guest@127.0.0.1:{closed_port()}"},
            "password": {"uri": f"amqp://guest:wrong@127.0.0.1:{port}"},
            "vhost": {"uri": f"amqp://guest:guest@127.0.0.1:{port}/nosuch"},
            "permission": {"uri": f"amqp://guest:guest@127.0.0.1:{port}/limited"},
            "exchange": {"uri": f"amqp://guest:guest@127.0.0.1:{port}", "exchange": "missing.x"},
            "tls-ca": {
                "uri": f"amqps://guest:guest@localhost:{tls_port}?cacertfile={other['ca']}&verify=verify_peer"
            },
            "plain-to-tls": {"uri": f"amqp://guest:guest@127.0.0.1:{tls_port}"},
        }
        for name, value in upstreams.items():
            put(
                downstream,
                f"/api/parameters/federation-upstream/%2F/{name}",
                {"value": {**value, "reconnect-delay": 1}},
            )
        queue_upstream = {
            "uri": f"amqp://guest:guest@127.0.0.1:{port}",
            "queue": "up.q",
            "reconnect-delay": 1,
        }
        put(downstream, "/api/parameters/federation-upstream/%2F/queue-args", {"value": queue_upstream})
        exchanges = {"federation-upstream-set": "all"}
        put(
            downstream,
            "/api/policies/%2F/fx",
            {"pattern": "^fx$", "apply-to": "exchanges", "definition": exchanges},
        )
        queues = {"federation-upstream": "queue-args"}
        put(
            downstream,
            "/api/policies/%2F/fq",
            {"pattern": "^fq$", "apply-to": "queues", "definition": queues},
        )
        time.sleep(8)
        for row in sorted(downstream.http("GET", "/api/federation-links")[1], key=lambda r: r["upstream"]):
            print(f"{row['upstream']:14} {row['type']:8} {row['status']:8} {row.get('error')!r}")


if __name__ == "__main__":
    main()
