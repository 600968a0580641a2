"""AMQP 1.0's transports besides the plain AMQP port: WebSocket (``ws://HOST:PORT/ws``,
subprotocol ``amqp``, as Tanzu RabbitMQ 4.1's Web AMQP) and TLS (the AMQPS port, which
AMQP 0-9-1 shares, as RabbitMQ 4's 5671), with SASL PLAIN and EXTERNAL (a verified client
certificate names the user, as RabbitMQ's rabbitmq_auth_mechanism_ssl). With rhea (npm,
under node) over WebSocket, python-qpid-proton over TLS, aiohttp's WebSocket client and
raw TLS sockets for the bytes a client library will not send (docs/amqp10.md,
"Transports")."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pika
import pytest
from amqp10_raw import plain_init
from amqp10_tls_rabbitmq import TlsRabbitMQ, rabbitmq_installed
from certificates import CLIENT_DN, pem_files
from proton import Message, SSLDomain
from proton.utils import BlockingConnection
from websocket_raw import frame_head, read_until_closed, upgraded
from websocket_upgrade import upgrade_status

from leveret import BlockingBroker
from leveret.config import Settings, load
from leveret.core.auth import Permission, User
from leveret.protocol.amqp10 import performatives as perf
from leveret.protocol.amqp10.frames import (
    AMQP_HEADER,
    SASL_HEADER,
    TYPE_SASL,
    Frame,
    FrameReader,
    ProtocolHeader,
    encode_frame,
)
from leveret.server.http_limits import HttpLimits
from leveret.server.tls import TLSOptions

JS = Path(__file__).resolve().parent.parent / "js"
#: proton's login as guest with SASL PLAIN.
GUEST_PLAIN = {"user": "guest", "password": "guest", "allowed_mechs": "PLAIN"}
LISTED_TIMEOUT = 5.0  # seconds to wait for a connection to show (or go) in the broker


def ws_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def amqp10_connections(broker) -> list[tuple[str, object]]:
    """(name, facts) of the broker's AMQP 1.0 connections, read on its loop."""

    def read() -> list[tuple[str, object]]:
        return [
            (name, c.facts()) for name, c in broker.broker.connections() if c.facts().protocol == "AMQP 1.0"
        ]

    return broker.call(read)


def wait_listed(broker, count: int) -> list[tuple[str, object]]:
    deadline = time.monotonic() + LISTED_TIMEOUT
    while len(found := amqp10_connections(broker)) != count:
        assert time.monotonic() < deadline, found
        time.sleep(0.02)
    return found


# -- WebSocket --------------------------------------------------------------------------
@pytest.fixture
def broker():
    with BlockingBroker(amqp_port=0, web_amqp_port=0) as running:
        yield running


class WebAmqp:
    """An AMQP 1.0 client written by hand on aiohttp's WebSocket: frames in, frames out."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.reader = FrameReader(1 << 20)
        self.kinds: set[aiohttp.WSMsgType] = set()
        self._got: list[ProtocolHeader | Frame] = []

    async def next(self) -> ProtocolHeader | Frame:
        while not self._got:
            message = await self.ws.receive(timeout=5)
            self.kinds.add(message.type)
            assert message.type == aiohttp.WSMsgType.BINARY, message
            self._got += self.reader.feed(message.data)
        return self._got.pop(0)

    async def body(self) -> object:
        frame = await self.next()
        assert isinstance(frame, Frame), frame
        return frame.body


@pytest.mark.skipif(
    shutil.which("node") is None or not (JS / "node_modules" / "rhea").exists(),
    reason="node or tests/js/node_modules (npm ci --prefix tests/js) is missing",
)
def test_rhea_in_node_sends_and_receives_over_websocket(broker):
    """rhea as a web page uses it: SASL PLAIN, senders and a receiver on /queues/...,
    an amqp-value string with properties and application properties, data sections;
    a message AMQP 0-9-1 put in the queue first arrives byte for byte, and what rhea sent
    to the other queue reaches AMQP 0-9-1 byte for byte."""
    assert broker.web_amqp_url and broker.web_amqp_url.endswith("/ws")
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        channel = connection.channel()
        channel.queue_declare("web-in")
        channel.queue_declare("web-other")
        channel.basic_publish("", "web-in", b"\x00from pika\xff")
        result = subprocess.run(
            ["node", str(JS / "amqp10_roundtrip.mjs"), broker.web_amqp_url, "web-in", "web-other", "4"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=JS,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["errors"] == []
        assert sorted((o["outcome"], o["target"]) for o in report["outcomes"]) == [
            ("accepted", "/queues/web-in"),
            ("accepted", "/queues/web-in"),
            ("accepted", "/queues/web-in"),
            ("accepted", "/queues/web-other"),
        ]
        first, text, binary, large = report["received"]
        assert bytes(first["body"]["bytes"]) == b"\x00from pika\xff"
        assert text["message_id"] == "m1" and text["subject"] == "greeting"
        assert text["content_type"] == "text/plain"
        assert text["application_properties"] == {"color": "red", "n": 7}
        assert text["body"] == {"kind": "string", "text": "text from rhea"}
        assert binary["message_id"] == "m2"
        assert (
            binary["body"]["kind"] in ("data", "binary")
            and bytes(binary["body"]["bytes"]) == b"\x00\x01\x02\xff"
        )
        sent = bytes(i % 251 for i in range(300_000))  # over 128 KiB: several frames each way
        assert large["message_id"] == "m3" and large["body"]["length"] == len(sent)
        assert large["body"]["sha256"] == hashlib.sha256(sent).hexdigest()
        assert channel.basic_get("web-other", auto_ack=True)[2] == b"for pika"
        # every message was accepted: none is left
        assert channel.queue_declare("web-in", passive=True).method.message_count == 0
    assert ("http/web-amqp", "127.0.0.1", ws_port(broker.web_amqp_url)) in broker.broker.node_info()[
        "listeners"
    ]


def test_sasl_and_open_split_over_messages_and_pipelined_in_one(broker):
    """The SASL header in two messages; then sasl-init, the AMQP header and open in one:
    every frame is read, the answers come in binary messages. A WebSocket has no client
    certificate, so EXTERNAL is not offered. The connection is listed as AMQP 1.0,
    named ``... (Web AMQP)``."""

    async def run(url: str) -> tuple[list, set, list]:
        async with aiohttp.ClientSession() as session, session.ws_connect(url, protocols=["amqp"]) as ws:
            assert ws.protocol == "amqp"
            client = WebAmqp(ws)
            await ws.send_bytes(SASL_HEADER[:3])
            await ws.send_bytes(SASL_HEADER[3:])
            seen: list = [await client.next(), await client.body()]
            init = plain_init()
            opening = encode_frame(perf.Open(container_id="raw-ws", hostname="localhost"))
            await ws.send_bytes(init + AMQP_HEADER + opening)
            seen += [await client.body(), await client.next(), await client.body()]
            listed = await asyncio.get_running_loop().run_in_executor(None, wait_listed, broker, 1)
            await ws.send_bytes(encode_frame(perf.Close()))
            seen.append(await client.body())
            return seen, client.kinds, listed

    seen, kinds, listed = asyncio.run(run(broker.web_amqp_url))
    header, mechanisms, outcome, amqp_header, opened, closed = seen
    assert header == ProtocolHeader(3) and amqp_header == ProtocolHeader(0)
    assert isinstance(mechanisms, perf.SaslMechanisms)
    assert "PLAIN" in mechanisms.sasl_server_mechanisms
    assert "EXTERNAL" not in mechanisms.sasl_server_mechanisms
    assert outcome == perf.SaslOutcome(perf.SASL_OK)
    assert isinstance(opened, perf.Open) and isinstance(closed, perf.Close) and closed.error is None
    assert kinds == {aiohttp.WSMsgType.BINARY}
    [(name, facts)] = listed
    assert name.endswith(f"127.0.0.1:{ws_port(broker.web_amqp_url)} (Web AMQP)")
    assert facts.user == "guest" and facts.vhost == "/" and not facts.ssl
    wait_listed(broker, 0)


async def open_web_amqp(ws: aiohttp.ClientWebSocketResponse) -> WebAmqp:
    """SASL PLAIN as guest and open, pipelined in one message; the answers read."""
    client = WebAmqp(ws)
    init = plain_init()
    await ws.send_bytes(SASL_HEADER + init + AMQP_HEADER + encode_frame(perf.Open(container_id="ws")))
    for _ in range(5):  # SASL header, mechanisms, outcome, AMQP header, open
        await client.next()
    return client


def test_an_operator_closing_the_connection_reaches_the_websocket_client(broker):
    """``leveret ctl close_connection`` (close_by_operator): the client gets close with
    ``amqp:connection:forced`` and the reason, then the WebSocket closes normally."""

    def close_all() -> None:
        for _, connection in broker.broker.connections():
            connection.close_by_operator("maintenance")

    async def run(url: str) -> tuple[object, aiohttp.WSMessage]:
        async with aiohttp.ClientSession() as session, session.ws_connect(url, protocols=["amqp"]) as ws:
            client = await open_web_amqp(ws)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, wait_listed, broker, 1)
            await loop.run_in_executor(None, broker.call, close_all)
            closed = await client.body()
            return closed, await ws.receive(timeout=5)

    closed, end = asyncio.run(run(broker.web_amqp_url))
    assert isinstance(closed, perf.Close) and closed.error is not None
    assert closed.error.condition == "amqp:connection:forced" and closed.error.description == "maintenance"
    assert end.type == aiohttp.WSMsgType.CLOSE and end.data == 1000
    wait_listed(broker, 0)


def test_the_http_port_cap_holds_web_amqp_connections():
    with BlockingBroker(amqp_port=0, web_amqp_port=0, http=HttpLimits(max_connections=2)) as broker:
        assert broker.web_amqp_url
        assert upgrade_status(broker.web_amqp_url, ["amqp"], held=2) == 503


@pytest.mark.parametrize("asked", [["mqtt"], [], ["AMQPWSB10", "binary"]])
def test_an_upgrade_without_the_amqp_subprotocol_is_refused_with_400(broker, asked):
    assert upgrade_status(broker.web_amqp_url, asked) == 400


def test_a_text_message_closes_the_websocket_with_1003(broker):
    async def run(url: str) -> aiohttp.WSMessage:
        async with aiohttp.ClientSession() as session, session.ws_connect(url, protocols=["amqp"]) as ws:
            await ws.send_str(SASL_HEADER.decode("latin-1"))  # WSB: binary messages only
            return await ws.receive(timeout=5)

    answer = asyncio.run(run(broker.web_amqp_url))
    assert answer.type == aiohttp.WSMsgType.CLOSE and answer.data == 1003  # unsupported data


@pytest.mark.parametrize("after_sasl", [False, True], ids=["before-sasl", "after-sasl"])
def test_a_websocket_message_growing_past_the_prelogin_limit_is_refused_unread(broker, after_sasl):
    """Until the connection is open (SASL done or not) the bytes are counted as they
    come: a 10 MB message (within the port's 16 MB message limit) is cut off after
    64 KiB, not waited for."""
    ok = encode_frame(perf.SaslOutcome(perf.SASL_OK), type=TYPE_SASL)
    with upgraded(broker.web_amqp_url, "amqp") as sock:
        init = plain_init()
        if after_sasl:  # one whole message (the mask key is zero: the payload as it is)
            sock.sendall(frame_head(0x2, len(SASL_HEADER + init)) + SASL_HEADER + init)
            got = b""
            while ok not in got:
                got += sock.recv(65536)
            sock.sendall(frame_head(0x2, 10_000_000) + AMQP_HEADER)
        else:
            sock.sendall(frame_head(0x2, 10_000_000) + SASL_HEADER + init)
        sock.sendall(b"z" * 200_000)
        closed, answer = read_until_closed(sock)
    assert closed, "the connection was kept, waiting for the rest of the message"
    assert ok not in answer and AMQP_HEADER not in answer


# -- TLS --------------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """PEM files of a new CA: the CA, the server's chain and key, a client's chain-and-key."""
    return pem_files(tmp_path)


def tls_broker(files, **settings) -> BlockingBroker:
    options = TLSOptions(files["server"], files["server_key"], files["ca"], verify="verify_peer")
    return BlockingBroker(amqp_port=0, amqps_port=0, ssl_options=options, **settings)


def ssl_domain(files, certificate: bool) -> SSLDomain:
    """proton's TLS settings: the test CA, the server's name checked; with the client's
    certificate (its key in the same file) when ``certificate``."""
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(files["ca"])
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if certificate:
        domain.set_credentials(files["client"], files["client"], None)
    return domain


def proton_round_trip(port: int, domain: SSLDomain, queue: str, **login) -> None:
    """Over amqps://localhost:PORT with proton's blocking API: send two messages to
    /queues/QUEUE (settled once accepted), receive them, accept them."""
    connection = BlockingConnection(f"amqps://localhost:{port}", ssl_domain=domain, timeout=10, **login)
    try:
        sender = connection.create_sender(f"/queues/{queue}")
        sender.send(Message(body=b"\x00over TLS\xff"))
        sender.send(Message(body="text over TLS", properties={"k": 1}))
        receiver = connection.create_receiver(f"/queues/{queue}", credit=10)
        first = receiver.receive(5)
        receiver.accept()  # (each received message is accepted on its own)
        second = receiver.receive(5)
        receiver.accept()
        assert first.body == b"\x00over TLS\xff"
        assert second.body == "text over TLS" and second.properties == {"k": 1}
    finally:
        connection.close()


def declare(broker, queue: str) -> None:
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        connection.channel().queue_declare(queue)


def tls_login_facts(broker, domain: SSLDomain, **login) -> Any:
    """Connect over amqps://localhost:PORT with proton's blocking API and ``login``; the
    broker's facts of that connection (the one listed, named ``... (TLS)``)."""
    connection = BlockingConnection(
        f"amqps://localhost:{broker.amqps_port}", ssl_domain=domain, timeout=10, **login
    )
    try:
        [(name, facts)] = wait_listed(broker, 1)
    finally:
        connection.close()
    assert name.endswith(f"127.0.0.1:{broker.amqps_port} (TLS)")
    return facts


def test_proton_over_tls_with_plain_and_amqp_0_9_1_on_the_same_port(files):
    with tls_broker(files) as broker:
        declare(broker, "tls")
        facts = tls_login_facts(broker, ssl_domain(files, False), **GUEST_PLAIN)
        assert facts.ssl and facts.user == "guest" and facts.auth_mechanism == "PLAIN"
        proton_round_trip(broker.amqps_port, ssl_domain(files, False), "tls", **GUEST_PLAIN)
        # AMQP 0-9-1 still speaks there (the protocol headers tell them apart)
        context = ssl.create_default_context(cafile=files["ca"])
        parameters = pika.ConnectionParameters(
            "localhost", broker.amqps_port, ssl_options=pika.SSLOptions(context, "localhost")
        )
        with pika.BlockingConnection(parameters) as pika_connection:
            assert pika_connection.channel().queue_declare("tls", passive=True).method.message_count == 0


@pytest.mark.parametrize("login_from, name", [("distinguished_name", CLIENT_DN), ("common_name", "alice")])
def test_a_client_certificate_logs_in_with_external(files, login_from, name):
    with tls_broker(files, ssl_cert_login_from=login_from) as broker:
        broker.call(broker.broker.core.add_user, User(name))  # no password: the certificate is it
        broker.call(broker.broker.core.set_permission, name, "/", Permission())
        declare(broker, "cert")
        facts = tls_login_facts(broker, ssl_domain(files, True), allowed_mechs="EXTERNAL")
        assert facts.user == name and facts.auth_mechanism == "EXTERNAL" and facts.ssl
        proton_round_trip(broker.amqps_port, ssl_domain(files, True), "cert", allowed_mechs="EXTERNAL")
        # with a certificate, PLAIN still logs in as the user it names
        proton_round_trip(broker.amqps_port, ssl_domain(files, True), "cert", **GUEST_PLAIN)


def sasl_exchange(files, port: int, certificate: bool, mechanism: str | None) -> list:
    """Over TLS by hand: the SASL header, then (with ``mechanism``) sasl-init; what the
    broker answered until it closed or went quiet (headers and SASL frames)."""
    context = ssl.create_default_context(cafile=files["ca"])
    if certificate:
        context.load_cert_chain(files["client"])
    reader, got = FrameReader(1 << 16), []
    with (
        socket.create_connection(("localhost", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        sock.sendall(SASL_HEADER)
        if mechanism is not None:
            sock.sendall(encode_frame(perf.SaslInit(mechanism, b""), type=TYPE_SASL))
        try:
            while len(got) < (3 if mechanism else 2):
                data = sock.recv(65536)
                if not data:
                    break
                got += [item if isinstance(item, ProtocolHeader) else item.body for item in reader.feed(data)]
        except (TimeoutError, ConnectionResetError, ssl.SSLError):
            pass
    return got


def test_external_is_offered_only_with_a_verified_certificate(files):
    with tls_broker(files) as broker:
        header, offered = sasl_exchange(files, broker.amqps_port, True, None)
        assert header == ProtocolHeader(3) and "EXTERNAL" in offered.sasl_server_mechanisms
        header, offered = sasl_exchange(files, broker.amqps_port, False, None)
        assert "EXTERNAL" not in offered.sasl_server_mechanisms
        assert "PLAIN" in offered.sasl_server_mechanisms
        # asked for all the same without a certificate: refused (sasl-outcome auth)
        got = sasl_exchange(files, broker.amqps_port, False, "EXTERNAL")
        assert isinstance(got[-1], perf.SaslOutcome) and got[-1].code != perf.SASL_OK


def test_external_with_a_certificate_naming_no_user_is_refused(files):
    with tls_broker(files) as broker:  # no user CN=alice,...: the certificate names no one
        got = sasl_exchange(files, broker.amqps_port, True, "EXTERNAL")
        assert isinstance(got[-1], perf.SaslOutcome) and got[-1].code == perf.SASL_AUTH
        with pytest.raises(Exception, match=r"(?i)auth"):
            proton_round_trip(broker.amqps_port, ssl_domain(files, True), "none", allowed_mechs="EXTERNAL")
        assert all(facts.user == "" for _, facts in amqp10_connections(broker))  # none logged in
        wait_listed(broker, 0)  # and the refused ones are gone once their sockets close


# -- beside RabbitMQ 3.10 ---------------------------------------------------------------
@pytest.fixture(scope="module")
def rabbitmq_tls(tmp_path_factory):
    """A private RabbitMQ 3.10 with AMQP 1.0 over TLS and EXTERNAL, its certificates
    and its user named by the client certificate (skipped when RabbitMQ is absent)."""
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed")
    files = pem_files(tmp_path_factory.mktemp("rabbitmq-tls"))
    with TlsRabbitMQ(files, (CLIENT_DN,)) as node:
        node.wait_tls()
        yield node


@pytest.mark.parametrize("target", ["leveret", "rabbitmq"])
def test_tls_plain_and_external_as_rabbitmq_3_10_does(target, request, tmp_path):
    """The same client against leveret's AMQPS port and RabbitMQ 3.10's: PLAIN and
    EXTERNAL round trips with proton (a v1 address both take), EXTERNAL without a
    certificate refused with sasl-outcome code 1. (3.10 offers EXTERNAL even then;
    leveret offers it only with a certificate, as RabbitMQ 4.)"""
    if target == "rabbitmq":
        node = request.getfixturevalue("rabbitmq_tls")
        files, port, amqp_port, broker = node.files, node.amqps_port, node.port, None
    else:
        files = pem_files(tmp_path)
        broker = tls_broker(files).start()
        broker.call(broker.broker.core.add_user, User(CLIENT_DN))
        broker.call(broker.broker.core.set_permission, CLIENT_DN, "/", Permission())
        port, amqp_port = broker.amqps_port, broker.amqp_port
    try:
        url = f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F"
        with pika.BlockingConnection(pika.URLParameters(url)) as connection:
            connection.channel().queue_declare("cmp-tls")
        address = "/amq/queue/cmp-tls"  # RabbitMQ 3.10's v1 address (RabbitMQ 4 still takes it)
        for certificate, login in (
            (False, {"user": "guest", "password": "guest", "allowed_mechs": "PLAIN"}),
            (True, {"allowed_mechs": "EXTERNAL"}),
        ):
            connection = BlockingConnection(
                f"amqps://localhost:{port}", ssl_domain=ssl_domain(files, certificate), timeout=10, **login
            )
            try:
                connection.create_sender(address).send(Message(body=b"\x00tls\xff"))
                receiver = connection.create_receiver(address, credit=1)
                assert receiver.receive(5).body == b"\x00tls\xff"
                receiver.accept()
            finally:
                connection.close()
        _, offered = sasl_exchange(files, port, True, None)
        assert {"PLAIN", "EXTERNAL"} <= set(offered.sasl_server_mechanisms)
        got = sasl_exchange(files, port, False, "EXTERNAL")
        assert isinstance(got[-1], perf.SaslOutcome) and got[-1].code == perf.SASL_AUTH
        got = sasl_exchange(files, port, True, "EXTERNAL")
        assert isinstance(got[-1], perf.SaslOutcome) and got[-1].code == perf.SASL_OK
    finally:
        if broker is not None:
            broker.stop()


# -- leveret server ---------------------------------------------------------------------
def test_leveret_server_prints_the_web_amqp_url_and_management_lists_it(tmp_path):
    command = [
        sys.executable,
        "-m",
        "leveret",
        "server",
        "--amqp-port",
        "0",
        "--stomp-port",
        "-1",
        "--mqtt-port",
        "-1",
        "--web-stomp-port",
        "-1",
        "--web-mqtt-port",
        "-1",
        "--web-amqp-port",
        "0",
        "--prometheus-port",
        "-1",
        "--http-port",
        "0",
        "--data-dir",
        str(tmp_path / "data"),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = [process.stdout.readline() for _ in range(3)]
        assert re.fullmatch(r"leveret ready: amqp://127\.0\.0\.1:\d+\n", lines[0]), lines
        assert lines[1].startswith("leveret management: http://127.0.0.1:")
        match = re.fullmatch(r"leveret web-amqp: ws://127\.0\.0\.1:(\d+)/ws\n", lines[2])
        assert match, lines
        request = urllib.request.Request(
            lines[1].split(": ", 1)[1].strip() + "overview",
            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            listeners = json.loads(response.read())["listeners"]
        assert {"protocol": "http/web-amqp", "port": int(match.group(1))}.items() <= next(
            entry for entry in listeners if entry["protocol"] == "http/web-amqp"
        ).items()
    finally:
        process.terminate()
        process.wait(10)


def test_the_config_file_sets_the_web_amqp_port_which_is_off_by_default(tmp_path):
    assert Settings().web_amqp_port is None
    config = tmp_path / "leveret.toml"
    config.write_text("[server]\nweb_amqp_port = 0\n")
    settings = load(config, Settings())
    assert settings.web_amqp_port == 0
    with BlockingBroker(settings, amqp_port=0) as broker:
        assert broker.web_amqp_url and broker.web_amqp_url.startswith("ws://127.0.0.1:")
    with BlockingBroker(amqp_port=0) as broker:
        assert broker.web_amqp_url is None
        assert not any(p == "http/web-amqp" for p, _, _ in broker.broker.node_info()["listeners"])
