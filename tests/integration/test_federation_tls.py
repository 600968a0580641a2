"""Federation over TLS (``amqps://``) with the URI query keys RabbitMQ's federation takes
(``cacertfile``, ``certfile``, ``keyfile``, ``verify``, ``server_name_indication``,
``auth_mechanism=external``): a leveret downstream federating exchanges from a leveret
upstream's AMQPS listener (``verify_peer``), certificates made by trustme; a wrong CA
or server name is an ``error`` row with the TLS failure, until the upstream is fixed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from certificates import CLIENT_DN, pem_files
from eventually import eventually
from targets import Target, put, rabbitmq_installed

from leveret import BlockingBroker
from leveret.core.auth import Permission, User
from leveret.server.tls import TLSOptions

TIMEOUT = 8.0


class Pair:
    def __init__(self, up: BlockingBroker, down: BlockingBroker, good: dict, other: dict) -> None:
        self.up, self.down = Target.of(up), Target.of(down)
        self.tls_port = up.broker.amqps_port
        self.good, self.other = good, other

    def uri(self, host: str = "localhost", user: str = "guest:guest@", **keys: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in keys.items())
        return f"amqps://{user}{host}:{self.tls_port}?{query}"

    def upstream(self, name: str, uri: str) -> None:
        """Upstream ``name`` at ``uri``, federating the downstream exchange ``x.NAME``."""
        value = {"uri": uri, "reconnect-delay": 0.2}
        put(self.down, f"/api/parameters/federation-upstream/%2F/{name}", {"value": value})
        put(self.down, f"/api/exchanges/%2F/x.{name}", {"type": "direct"})
        definition = {"federation-upstream": name}
        policy = {"pattern": f"^x\\.{name}$", "apply-to": "exchanges", "definition": definition}
        put(self.down, f"/api/policies/%2F/{name}", policy)

    def row(self, name: str, status: str) -> dict:
        seen: dict = {}

        def reached() -> bool:
            rows = [r for r in self.down.http("GET", "/api/federation-links")[1] if r["upstream"] == name]
            seen.update(rows[0] if rows else {})
            return seen.get("status") == status

        assert eventually(reached, TIMEOUT, 0.05), seen
        return seen


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("federation-tls")
    (root / "good").mkdir()
    (root / "other").mkdir()
    good, other = pem_files(Path(root / "good")), pem_files(Path(root / "other"))
    tls = TLSOptions(good["server"], good["server_key"], good["ca"], verify="verify_peer")
    with (
        BlockingBroker(amqp_port=0, amqps_port=0, http_port=0, ssl_options=tls) as up,
        BlockingBroker(amqp_port=0, http_port=0) as down,
    ):
        up.broker.core.add_user(User(CLIENT_DN))  # no password: the certificate is the credential
        up.broker.core.set_permission(CLIENT_DN, "/", Permission())
        yield Pair(up, down, good, other)


def test_an_exchange_federates_over_tls_with_rabbitmqs_uri_keys(pair):
    files = pair.good
    pair.upstream("tls", pair.uri(cacertfile=files["ca"], certfile=files["client"], keyfile=files["client"],
                                  verify="verify_peer", server_name_indication="localhost"))  # fmt: skip
    row = pair.row("tls", "running")
    assert row["uri"] == f"amqps://localhost:{pair.tls_port}"  # no credentials, no query (RabbitMQ's)
    down, up = pair.down.amqp(), pair.up.amqp()
    try:
        down.channel().queue_declare("tls.q")
        down.channel().queue_bind("tls.q", "x.tls", "k")
        channel = up.channel()

        def delivered() -> bool:
            channel.basic_publish("x.tls", "k", b"over TLS")
            time.sleep(0.05)
            return down.channel().queue_declare("tls.q", passive=True).method.message_count > 0

        assert eventually(delivered, TIMEOUT, 0.1)
    finally:
        down.close()
        up.close()
    connections = pair.up.http("GET", "/api/connections")[1]
    assert any(c["ssl"] and c["user"] == "guest" for c in connections), connections


def test_a_client_certificate_logs_in_with_external(pair):
    files = pair.good
    pair.upstream("external", pair.uri(user="", cacertfile=files["ca"], certfile=files["client"],
                                       keyfile=files["client"], auth_mechanism="external"))  # fmt: skip
    pair.row("external", "running")
    users = [c["user"] for c in pair.up.http("GET", "/api/connections")[1] if c["ssl"]]
    assert CLIENT_DN in users


def test_a_wrong_ca_is_a_tls_error_until_the_upstream_is_fixed(pair):
    pair.upstream("ca", pair.uri(cacertfile=pair.other["ca"], verify="verify_peer"))
    row = pair.row("ca", "error")
    assert row["error"].startswith("tls_alert: unknown_ca: certificate verify failed: "), row
    assert row["error"].endswith(f"(localhost:{pair.tls_port})")
    pair.upstream("ca", pair.uri(cacertfile=pair.good["ca"], verify="verify_peer"))
    pair.row("ca", "running")


def test_verify_none_accepts_an_unknown_ca(pair):
    pair.upstream("unverified", pair.uri(cacertfile=pair.other["ca"], verify="verify_none"))
    pair.row("unverified", "running")


def test_the_server_name_is_checked_unless_disabled(pair):
    ca = pair.good["ca"]
    pair.upstream("sni", pair.uri(cacertfile=ca, server_name_indication="wrong.example"))
    row = pair.row("sni", "error")
    assert row["error"].startswith("tls_alert: handshake_failure: hostname_check_failed: certificate verify "
                                   "failed: Hostname mismatch"), row  # fmt: skip
    pair.upstream("sni", pair.uri(cacertfile=ca, server_name_indication="disable"))
    pair.row("sni", "running")


def test_plain_amqp_to_the_tls_port_is_named(pair):
    pair.upstream("plain", f"amqp://guest:guest@127.0.0.1:{pair.tls_port}")
    row = pair.row("plain", "error")
    assert row["error"].startswith(f"connection_closed: 127.0.0.1:{pair.tls_port} closed the connection"), row


@pytest.mark.skipif(not rabbitmq_installed(), reason="rabbitmq-server is not installed")
def test_a_leveret_downstream_federates_from_a_rabbitmq_amqps_upstream(tmp_path):
    """The same URIs against RabbitMQ 3.10's AMQPS listener (``verify_peer``, EXTERNAL
    with ``ssl_cert_login_from = distinguished_name``): PLAIN and EXTERNAL links run and
    carry a message; a wrong CA is the same ``tls_alert: unknown_ca`` row."""
    from amqp10_tls_rabbitmq import TlsRabbitMQ

    (tmp_path / "good").mkdir()
    (tmp_path / "other").mkdir()
    files, other = pem_files(tmp_path / "good"), pem_files(tmp_path / "other")
    with TlsRabbitMQ(files, (CLIENT_DN,)) as node, BlockingBroker(amqp_port=0, http_port=0) as down:
        node.wait_tls()
        pair = Pair.__new__(Pair)
        pair.down, pair.tls_port = Target.of(down), node.amqps_port
        certificate = {"certfile": files["client"], "keyfile": files["client"]}
        pair.upstream("plain", pair.uri(cacertfile=files["ca"], verify="verify_peer", **certificate))
        external = pair.uri(user="", cacertfile=files["ca"], auth_mechanism="external", **certificate)
        pair.upstream("external", external)
        pair.upstream("ca", pair.uri(cacertfile=other["ca"]))
        pair.row("plain", "running")
        pair.row("external", "running")
        assert pair.row("ca", "error")["error"].startswith("tls_alert: unknown_ca: certificate verify failed")
        connection = pair.down.amqp()
        rabbit = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{node.port}/%2F"))
        try:
            connection.channel().queue_declare("from.rabbit")
            connection.channel().queue_bind("from.rabbit", "x.external", "k")
            channel = rabbit.channel()

            def delivered() -> bool:
                channel.basic_publish("x.external", "k", b"from RabbitMQ over TLS")
                time.sleep(0.1)
                declared = connection.channel().queue_declare("from.rabbit", passive=True)
                return declared.method.message_count > 0

            assert eventually(delivered, 20, 0.2)
        finally:
            connection.close()
            rabbit.close()
