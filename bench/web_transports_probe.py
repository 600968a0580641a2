"""Probe: messages per second and the broker's CPU per message over its WebSocket
transports, Web STOMP and Web MQTT, beside MQTT over TCP, so a change to the WebSocket
server (server/websocket.py) can be measured before and after.

Starts ``python -m leveret server`` from ``--src`` (default: this checkout's src/; give
another checkout's to measure it), then per transport one client on one connection
subscribes, publishes ``--messages`` messages of 100 bytes (STOMP: SEND to a
``/topic/``; MQTT: QoS 0 PUBLISH), one per WebSocket message, and reads them back. The
broker's CPU time comes from /proc (user + system), not wall time. A transport the
broker does not serve (Web MQTT before it existed) is reported as absent.

    python bench/web_transports_probe.py [--src DIR] [--messages 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

CLK_TCK = os.sysconf("SC_CLK_TCK")
BODY = b"x" * 100


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid``, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def mqtt_packet(first: int, body: bytes) -> bytes:
    length, head = len(body), bytearray([first])
    while True:
        length, digit = divmod(length, 128)
        head.append(digit | (0x80 if length else 0))
        if not length:
            return bytes(head) + body


def mqtt_string(text: str) -> bytes:
    return struct.pack(">H", len(text)) + text.encode()


MQTT_CONNECT = mqtt_packet(0x10, mqtt_string("MQTT") + b"\x04\x02\x00\x00" + mqtt_string("probe"))
MQTT_SUBSCRIBE = mqtt_packet(0x82, b"\x00\x01" + mqtt_string("probe/t") + b"\x00")
MQTT_PUBLISH = mqtt_packet(0x30, mqtt_string("probe/t") + BODY)


async def web_stomp(url: str, count: int) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(url, protocols=["v12.stomp"]) as ws:
        await ws.send_str("CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
        assert str((await ws.receive()).data).startswith("CONNECTED")
        await ws.send_str("SUBSCRIBE\nid:0\ndestination:/topic/probe\nack:auto\nreceipt:s\n\n\0")
        assert "RECEIPT" in str((await ws.receive()).data)
        frame = "SEND\ndestination:/topic/probe\n\n" + BODY.decode() + "\0"

        async def send() -> None:
            for _ in range(count):
                await ws.send_str(frame)

        sender = asyncio.ensure_future(send())
        received = 0
        while received < count:
            message = await ws.receive(timeout=30)
            received += str(message.data).count("MESSAGE\n")
        await sender


async def web_mqtt(url: str, count: int) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(url, protocols=["mqtt"]) as ws:
        await ws.send_bytes(MQTT_CONNECT)
        await ws.receive()
        await ws.send_bytes(MQTT_SUBSCRIBE)
        await ws.receive()

        async def send() -> None:
            for _ in range(count):
                await ws.send_bytes(MQTT_PUBLISH)

        sender = asyncio.ensure_future(send())
        received = 0  # bytes: every delivery is a PUBLISH as sent (QoS 0, 3.1.1)
        while received < count * len(MQTT_PUBLISH):
            received += len((await ws.receive(timeout=30)).data)
        await sender


async def mqtt_tcp(port: int, count: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(MQTT_CONNECT + MQTT_SUBSCRIBE)
    await reader.readexactly(4 + 5)  # CONNACK, SUBACK

    async def send() -> None:
        for i in range(count):
            writer.write(MQTT_PUBLISH)
            if i % 100 == 99:
                await writer.drain()

    sender = asyncio.ensure_future(send())
    received = 0  # bytes, as over WebSocket
    while received < count * len(MQTT_PUBLISH):
        received += len(await asyncio.wait_for(reader.read(65536), 30))
    await sender
    writer.close()


def start(src: str, data_dir: str) -> tuple[subprocess.Popen, dict[str, str]]:
    """The broker and its addresses: ``mqtt`` (a port), ``web-stomp``, ``web-mqtt``."""
    env = dict(os.environ, PYTHONPATH=src, LEVERET_PURE_PYTHON=os.environ.get("LEVERET_PURE_PYTHON", "1"))
    help_text = subprocess.run([sys.executable, "-m", "leveret", "server", "--help"], env=env,
                               capture_output=True, text=True).stdout
    command = [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "-1",
               "--mqtt-port", "0", "--web-stomp-port", "0", "--prometheus-port", "-1", "--data-dir", data_dir,
               "--log-level", "warning"]
    if "--web-mqtt-port" in help_text:
        command += ["--web-mqtt-port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    found: dict[str, str] = {}
    assert process.stdout is not None
    for line in process.stdout:  # the broker prints its addresses at once
        if match := re.search(r"mqtt://[\d.]+:(\d+)", line):
            found["mqtt"] = match.group(1)
        if match := re.match(r"leveret (web-stomp|web-mqtt): (\S+)", line):
            found[match.group(1)] = match.group(2)
        if "web-stomp" in found and ("web-mqtt" in found or "--web-mqtt-port" not in help_text):
            break
    return process, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=str(Path(__file__).resolve().parent.parent / "src"))
    parser.add_argument("--messages", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        process, found = start(args.src, data_dir)
        try:
            runs = (
                ("Web STOMP", "web-stomp", lambda: web_stomp(found["web-stomp"], args.messages)),
                ("Web MQTT", "web-mqtt", lambda: web_mqtt(found["web-mqtt"], args.messages)),
                ("MQTT over TCP", "mqtt", lambda: mqtt_tcp(int(found["mqtt"]), args.messages)),
            )
            print(f"{args.src}: {args.messages} messages of {len(BODY)} B, one connection each")
            for name, key, run in runs:
                if key not in found:
                    print(f"  {name:14} absent")
                    continue
                cpu, wall = cpu_seconds(process.pid), time.perf_counter()
                asyncio.run(run())
                wall, cpu = time.perf_counter() - wall, cpu_seconds(process.pid) - cpu
                rate, per_message = args.messages / wall, cpu / args.messages * 1e6
                print(f"  {name:14} {rate:9.0f} msg/s  broker CPU {per_message:6.1f} µs/msg")
        finally:
            process.terminate()
            process.wait(10)


if __name__ == "__main__":
    main()
