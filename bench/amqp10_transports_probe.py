"""Probe: messages per second and the broker's CPU per message for AMQP 1.0 over each
of its transports, the AMQP port (TCP), the AMQPS port (TLS) and Web AMQP (WebSocket),
beside AMQP 0-9-1 over TLS on the same AMQPS port, so a change to the listeners or to
server/websocket.py can be measured before and after.

Starts ``python -m leveret server`` from ``--src`` (default: this checkout's src/; give
another checkout's to measure it) with an AMQPS port (certificates made by trustme) and
``--web-amqp-port 0`` where the broker has it. Per transport, one client on one
connection sends ``--messages`` messages of ``--size`` bytes to a queue (unsettled,
each accepted) and receives them back: rhea under node for AMQP 1.0
(bench/amqp10_transports_probe.mjs, rhea from tests/js/node_modules), pika for AMQP
0-9-1. The broker's CPU time comes from /proc (user + system), not wall time. A
transport the broker does not serve (AMQP 1.0 before it existed) is reported as absent.

    python bench/amqp10_transports_probe.py [--src DIR] [--messages 20000] [--size 100]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pika
import trustme
from brokers import proc_cpu_seconds

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "amqp10_transports_probe.mjs"


def certificates(directory: Path) -> dict[str, str]:
    """A new CA's PEM file and a server certificate for localhost with its key."""
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    paths = {name: str(directory / f"{name}.pem") for name in ("ca", "server", "server_key")}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["server"])
    server.private_key_pem.write_to_path(paths["server_key"])
    return paths


def start(src: str, directory: Path, files: dict[str, str]) -> tuple[subprocess.Popen, dict[str, str]]:
    """The broker and its addresses: ``amqp`` and ``amqps`` (ports), ``web-amqp`` (a URL)."""
    env = dict(os.environ, PYTHONPATH=src, LEVERET_PURE_PYTHON=os.environ.get("LEVERET_PURE_PYTHON", "1"))
    help_text = subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--help"], env=env, capture_output=True, text=True
    ).stdout
    config = directory / "leveret.toml"
    config.write_text(
        "[server]\namqps_port = 0\n[ssl_options]\n"
        f'certfile = "{files["server"]}"\nkeyfile = "{files["server_key"]}"\ncacertfile = "{files["ca"]}"\n'
    )
    command = [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--config", str(config)]
    for option in ("--stomp-port", "--web-stomp-port", "--mqtt-port", "--web-mqtt-port", "--prometheus-port"):
        if option in help_text:
            command += [option, "-1"]
    web_amqp = "--web-amqp-port" in help_text
    if web_amqp:
        command += ["--web-amqp-port", "0"]
    command += ["--data-dir", str(directory / "data"), "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    found: dict[str, str] = {}
    assert process.stdout is not None
    for line in process.stdout:  # the broker prints its addresses at once
        if match := re.match(r"leveret ready: amqp://[\d.]+:(\d+)", line):
            found["amqp"] = match.group(1)
        if match := re.match(r"leveret amqps: amqps://[\d.]+:(\d+)", line):
            found["amqps"] = match.group(1)
        if match := re.match(r"leveret web-amqp: (\S+)", line):
            found["web-amqp"] = match.group(1)
        if "amqps" in found and ("web-amqp" in found or not web_amqp):
            break
    return process, found


def rhea(transport: str, address: str, queue: str, count: int, size: int, ca: str) -> str | None:
    """Run the node client; None when it finished, else why it did not."""
    result = subprocess.run(
        ["node", str(CLIENT), transport, address, queue, str(count), str(size), ca],
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = result.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines else {"error": result.stderr.strip()[-200:]}
    return report.get("error")


def pika_tls(port: int, queue: str, count: int, size: int, ca: str) -> str | None:
    """AMQP 0-9-1 over TLS: publish ``count`` messages (no confirms), consume them with
    a prefetch of 500, acknowledging each."""
    context = ssl.create_default_context(cafile=ca)
    parameters = pika.ConnectionParameters(
        "localhost", port, ssl_options=pika.SSLOptions(context, "localhost"), heartbeat=0
    )
    body = b"x" * size
    with pika.BlockingConnection(parameters) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=500)
        for _ in range(count):
            channel.basic_publish("", queue, body)
        for received, (method, _, _) in enumerate(channel.consume(queue, inactivity_timeout=30), 1):
            if method is None:
                return f"{received - 1} of {count} received"
            channel.basic_ack(method.delivery_tag)
            if received == count:
                break
        channel.cancel()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=str(HERE.parent / "src"))
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=100, help="bytes in each message body")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        files = certificates(directory)
        process, found = start(args.src, directory, files)
        try:
            amqp_url = f"amqp://guest:guest@127.0.0.1:{found['amqp']}/"
            with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
                channel = connection.channel()
                for queue in ("probe-tcp", "probe-tls", "probe-ws", "probe-091"):
                    channel.queue_declare(queue)
            count, size, ca = args.messages, args.size, files["ca"]
            addresses = {
                "amqp": f"127.0.0.1:{found.get('amqp')}",
                "amqps": f"localhost:{found.get('amqps')}",
                "web-amqp": found.get("web-amqp", ""),
            }
            runs = (  # name, the address it needs, client transport, queue
                ("AMQP 1.0 over TCP", "amqp", "tcp", "probe-tcp"),
                ("AMQP 1.0 over TLS", "amqps", "tls", "probe-tls"),
                ("Web AMQP", "web-amqp", "ws", "probe-ws"),
                ("AMQP 0-9-1 over TLS", "amqps", "pika", "probe-091"),
            )
            print(f"{args.src}: {count} messages of {size} B, one connection each")
            for name, key, transport, queue in runs:
                if key not in found:
                    print(f"  {name:20} absent")
                    continue
                cpu, wall = proc_cpu_seconds(process.pid), time.perf_counter()
                if transport == "pika":
                    error = pika_tls(int(found["amqps"]), queue, count, size, ca)
                else:
                    error = rhea(transport, addresses[key], queue, count, size, ca)
                wall, cpu = time.perf_counter() - wall, proc_cpu_seconds(process.pid) - cpu
                if error is not None:
                    print(f"  {name:20} absent ({error[:80]})")
                    continue
                rate, per_message = count / wall, cpu / count * 1e6
                print(f"  {name:20} {rate:9.0f} msg/s  broker CPU {per_message:6.1f} µs/msg")
        finally:
            process.terminate()
            process.wait(10)


if __name__ == "__main__":
    main()
