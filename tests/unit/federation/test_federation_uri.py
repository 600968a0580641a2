"""RabbitMQ's URI query keys read for a link's connection (federation/uri.py), and the
error texts of federation/errors.py for failures no integration test makes."""

from __future__ import annotations

import ssl

import aiormq
import pytest

from leveret.federation.errors import describe
from leveret.federation.uri import URIError, connect_options


def test_rabbitmq_tls_keys_become_a_context_and_leave_the_uri():
    options = connect_options(
        "amqps://u:p@dc1.example:5671/%2F?cacertfile=/ca.pem&certfile=/c.pem&keyfile=/k.pem"
        "&verify=verify_peer&server_name_indication=broker.example&heartbeat=5&connection_timeout=2500"
        "&fail_if_no_peer_cert=true&depth=3&channel_max=10&name=link"
    )
    assert options.uri == "amqps://u:p@dc1.example:5671/%2F?name=link&heartbeat=5"
    assert options.timeout == 2.5 and options.mechanisms == ("PLAIN",)
    tls = options.tls
    assert tls is not None
    assert (tls.cacertfile, tls.certfile, tls.keyfile, tls.verify, tls.server_name) == (
        "/ca.pem", "/c.pem", "/k.pem", True, "broker.example")  # fmt: skip


def test_defaults_follow_rabbitmqs_client():
    tls = connect_options("amqps://h").tls
    assert tls is not None and tls.verify is True and tls.server_name is None  # verify_peer, SNI = host
    context = tls.context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert connect_options("amqp://h?cacertfile=/x.pem").tls is None  # TLS keys ignored on amqp://


def test_verify_none_and_disabled_sni_turn_the_checks_off():
    none = connect_options("amqps://h?verify=verify_none").tls
    assert none is not None and none.context().verify_mode == ssl.CERT_NONE
    disabled = connect_options("amqps://h?server_name_indication=disable").tls
    assert disabled is not None and disabled.server_name == ""
    context = disabled.context()
    assert context.verify_mode == ssl.CERT_REQUIRED and not context.check_hostname
    legacy = connect_options("amqps://h?cafile=/a.pem&no_verify_ssl=1").tls  # aiormq's spellings
    assert legacy is not None and (legacy.cacertfile, legacy.verify) == ("/a.pem", False)


def test_auth_mechanisms_in_order_with_rabbitmqs_prefix():
    uri = "amqps://h?auth_mechanism=amqp_auth_mechanisms:external&auth_mechanism=plain"
    assert connect_options(uri).mechanisms == ("EXTERNAL", "PLAIN")
    assert connect_options("amqp://h?auth_mechanism=amqplain&auth_mechanism=plain").mechanisms == ("PLAIN",)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("verify=maybe", "verify"),
        ("heartbeat=x", "heartbeat"),
        ("connection_timeout=1.5", "connection_timeout"),
        ("auth_mechanism=kerberos", "auth_mechanism"),
        ("auth_mechanism=amqplain", "auth_mechanism"),
        ("fail_if_no_peer_cert=yes", "fail_if_no_peer_cert"),
    ],
)
def test_values_rabbitmq_refuses_are_named(query, named):
    with pytest.raises(URIError, match=named):
        connect_options(f"amqps://h?{query}")


def test_unreadable_tls_files_name_the_problem(tmp_path):
    tls = connect_options(f"amqps://h?cacertfile={tmp_path}/missing.pem").tls
    assert tls is not None
    with pytest.raises(URIError, match="cannot load the TLS files"):
        tls.context()
    assert describe(URIError("x"), "amqps://h").startswith("invalid_uri: ")


def test_error_texts_without_a_network():
    assert describe(TimeoutError(), "amqp://u:p@h:1") == "timeout: no AMQP connection to h:1 in time"
    closed = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - shutdown")
    assert describe(closed) == "server_initiated_close: 320 CONNECTION_FORCED - shutdown"
    lost = ConnectionError("NOT_FOUND - no queue 'q' in vhost '/'")  # a link's pass-on of a channel close
    assert describe(lost) == "server_initiated_close: 404 NOT_FOUND - no queue 'q' in vhost '/'"
    offered = aiormq.exceptions.AuthenticationError("PLAIN AMQPLAIN", ["PLAIN", "EXTERNAL"])
    assert describe(offered).startswith("auth_failure: the upstream offers none of the URI's mechanisms")
    assert describe(ConnectionError("a connection or channel was closed")) == (
        "ConnectionError: a connection or channel was closed")  # fmt: skip
