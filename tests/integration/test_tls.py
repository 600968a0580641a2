"""TLS as RabbitMQ configures it (``ssl_options``): AMQP over TLS (pika), the management
API over HTTPS, client certificates (``verify_peer``, ``fail_if_no_peer_cert``) and the
EXTERNAL mechanism, with certificates the tests make (trustme)."""

from __future__ import annotations

import json
import ssl
import urllib.request

import pika
import pytest
from certificates import CLIENT_DN, pem_files
from pika.credentials import ExternalCredentials

from leveret import BlockingBroker
from leveret.core.auth import Permission, User
from leveret.server.tls import TLSOptions


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """PEM files of a new CA: the CA, the server's chain and key, a client's chain-and-key."""
    return pem_files(tmp_path)


def options(files, **overrides) -> TLSOptions:
    return TLSOptions(files["server"], files["server_key"], files["ca"], **overrides)


def client_context(files, certificate: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=files["ca"])
    if certificate:
        context.load_cert_chain(files["client"])
    return context


def connect(broker, files, certificate: bool = False, credentials=None) -> pika.BlockingConnection:
    parameters = pika.ConnectionParameters(
        "localhost", broker.broker.amqps_port, ssl_options=pika.SSLOptions(client_context(files, certificate),
                                                                           "localhost"),
        credentials=credentials or pika.PlainCredentials("guest", "guest"))
    return pika.BlockingConnection(parameters)


def test_amqp_over_tls_carries_messages_and_the_plain_port_stays(files):
    with BlockingBroker(amqp_port=0, amqps_port=0, ssl_options=options(files)) as broker:
        connection = connect(broker, files)
        channel = connection.channel()
        channel.queue_declare("q")
        channel.confirm_delivery()
        channel.basic_publish("", "q", b"over TLS")
        assert channel.basic_get("q", auto_ack=True)[2] == b"over TLS"
        connection.close()
        plain = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        assert plain.channel().queue_declare("q", passive=True).method.message_count == 0
        plain.close()
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):  # TLS to the plain port
            pika.BlockingConnection(pika.ConnectionParameters(
                "localhost", broker.amqp_port,
                ssl_options=pika.SSLOptions(client_context(files), "localhost"),
                connection_attempts=1, socket_timeout=3))


@pytest.mark.parametrize("login_from, name", [("distinguished_name", CLIENT_DN), ("common_name", "alice")])
def test_a_client_certificate_logs_in_with_external(files, login_from, name):
    with BlockingBroker(amqp_port=0, amqps_port=0, ssl_options=options(files, verify="verify_peer"),
                        ssl_cert_login_from=login_from) as broker:
        broker.broker.core.add_user(User(name))  # no password: the certificate is the credential
        broker.broker.core.set_permission(name, "/", Permission())
        connection = connect(broker, files, certificate=True, credentials=ExternalCredentials())
        connection.channel().queue_declare("mine")
        connection.close()
        # without a certificate EXTERNAL is not offered, and PLAIN still works
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            connect(broker, files, credentials=ExternalCredentials())
        connect(broker, files).close()


def test_external_with_a_certificate_naming_no_user_is_refused(files):
    with (
        BlockingBroker(amqp_port=0, amqps_port=0, ssl_options=options(files, verify="verify_peer")) as broker,
        pytest.raises(pika.exceptions.ProbableAuthenticationError, match="EXTERNAL"),
    ):
        connect(broker, files, certificate=True, credentials=ExternalCredentials())


def test_fail_if_no_peer_cert_refuses_clients_without_one(files):
    tls = options(files, verify="verify_peer", fail_if_no_peer_cert=True)
    with BlockingBroker(amqp_port=0, amqps_port=0, ssl_options=tls) as broker:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            connect(broker, files)
        connect(broker, files, certificate=True).close()  # guest/guest, with a certificate


def test_the_management_api_over_https(files):
    with BlockingBroker(amqp_port=0, https_port=0, ssl_options=options(files)) as broker:
        assert broker.http_url.startswith("https://")
        request = urllib.request.Request(f"https://localhost:{broker.broker.management.https_port}/api/whoami",
                                         headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
        with urllib.request.urlopen(request, context=client_context(files), timeout=10) as response:
            assert json.loads(response.read()) == {"name": "guest", "tags": ["administrator"]}


def test_unusable_certificates_stop_the_start_with_a_clear_error(files, tmp_path):
    from leveret.server.tls import TLSError

    broken = TLSOptions(str(tmp_path / "missing.pem"), files["server_key"])
    with pytest.raises(TLSError, match="cannot load certificates"):
        BlockingBroker(amqp_port=0, amqps_port=0, ssl_options=broken).start()
