"""An upstream URI's query keys, as RabbitMQ's Erlang client reads them (``amqp_uri``:
the keys federation and shovel URIs take), turned into what a link's AMQP client
(aiormq) needs, so an upstream definition written for RabbitMQ works unchanged.

TLS keys (``amqps://`` only; ignored on ``amqp://``, as RabbitMQ does):

- ``cacertfile``: the CAs that sign the upstream's certificate (PEM file); without it,
  the system's CA store (RabbitMQ: OTP's defaults);
- ``certfile``, ``keyfile``, ``password``: a client certificate, its key, and the key's
  password, presented to the upstream (for ``verify_peer`` upstreams and ``EXTERNAL``);
- ``verify``: ``verify_peer`` (the default, as RabbitMQ's ``amqp_ssl``: check the
  upstream's certificate chain and host name) or ``verify_none``;
- ``server_name_indication``: the host name sent in SNI and checked against the
  certificate (default: the URI's host; none for an IP address), or ``disable``: no SNI
  and no host-name check (the chain is still checked with ``verify_peer``);
- ``fail_if_no_peer_cert``, ``depth``, ``customize_hostname_check=https``: accepted and
  validated; the first is a server's option (no effect on a client, as in Erlang), the
  others are what Python's TLS does anyway (a chain depth of OpenSSL's default, 100;
  RFC 6125 host names).

Connection keys: ``heartbeat`` (seconds), ``connection_timeout`` (milliseconds, to
connect, log in and open the vhost), ``auth_mechanism`` (``plain``, ``external``, also
``amqp_auth_mechanisms:NAME``; may repeat: the first the upstream offers is used),
``channel_max`` and ``frame_max`` (validated; the client keeps the upstream's limits,
a link uses at most three channels). aiormq's own spellings keep working: ``cafile``
for ``cacertfile``, ``no_verify_ssl=1`` for ``verify=verify_none``. Other keys are
ignored, as RabbitMQ ignores keys it does not know.

A value RabbitMQ's parser refuses (``verify=maybe``, ``heartbeat=x``, an unknown
mechanism) raises :class:`URIError`, whose text names the key and value.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from yarl import URL

#: Keys this module reads; they are taken out of the URI handed to aiormq.
TLS_KEYS = (
    "cacertfile",
    "certfile",
    "keyfile",
    "password",
    "verify",
    "server_name_indication",
    "fail_if_no_peer_cert",
    "depth",
    "customize_hostname_check",
    "cafile",
    "capath",
    "cadata",
    "no_verify_ssl",
)
CONNECTION_KEYS = ("connection_timeout", "auth_mechanism", "auth", "channel_max", "frame_max")
#: The SASL mechanisms the link's client can use (aiormq's).
MECHANISMS = ("PLAIN", "EXTERNAL")


class URIError(ValueError):
    """A query value RabbitMQ's URI parser would refuse too."""


@dataclass(frozen=True)
class ConnectOptions:
    """How to open one upstream connection."""

    uri: str  #: for aiormq: the RabbitMQ keys taken out, ``heartbeat`` and ``auth`` kept
    mechanisms: tuple[str, ...]  #: SASL mechanisms to try in turn (``PLAIN``, ``EXTERNAL``)
    timeout: float | None  #: seconds (``connection_timeout``), None: the link's default
    tls: TLSSettings | None  #: for ``amqps://``


@dataclass(frozen=True)
class TLSSettings:
    cacertfile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    password: str | None = None
    verify: bool = True
    server_name: str | None = None  #: None: the URI's host; "": SNI and host check off

    def context(self) -> ssl.SSLContext:
        """The client context (reads the files: call it off the event loop). URIError
        naming the file when one cannot be loaded."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        try:
            if self.cacertfile:
                context.load_verify_locations(self.cacertfile)
            if self.certfile:
                context.load_cert_chain(self.certfile, self.keyfile or None, self.password)
        except (OSError, ssl.SSLError) as exc:
            raise URIError(f"cannot load the TLS files of the URI: {exc}") from exc
        if not self.verify or self.server_name == "":
            context.check_hostname = False
        if not self.verify:
            context.verify_mode = ssl.CERT_NONE
        return context


def connect_options(uri: str) -> ConnectOptions:
    """Read ``uri``'s query (see the module doc); URIError for a refused value."""
    url = URL(uri)
    query = url.query

    def integer(key: str) -> int | None:
        value = query.get(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise URIError(f"URI query key {key}: not an integer: {value!r}") from None

    for key in ("channel_max", "frame_max", "depth"):
        integer(key)
    timeout_ms = integer("connection_timeout")
    heartbeat = integer("heartbeat")
    mechanisms = _mechanisms(query.getall("auth_mechanism", []), query.get("auth"))
    tls = _tls(query) if url.scheme == "amqps" else None
    kept = [(k, v) for k, v in query.items() if k not in TLS_KEYS and k not in CONNECTION_KEYS]
    if heartbeat is not None:
        kept = [(k, v) for k, v in kept if k != "heartbeat"] + [("heartbeat", str(heartbeat))]
    cleaned = str(url.with_query(kept)) if kept else str(url.with_query(None))
    return ConnectOptions(cleaned, mechanisms, timeout_ms / 1000 if timeout_ms is not None else None, tls)


def _mechanisms(given: list[str], aiormq_auth: str | None) -> tuple[str, ...]:
    names = []
    for value in given or ([aiormq_auth] if aiormq_auth else ["plain", "amqplain"]):
        name = value.split(":", 1)[1] if value.startswith("amqp_auth_mechanisms:") else value
        upper = name.upper()
        if upper not in ("PLAIN", "AMQPLAIN", "EXTERNAL", "CRDEMO"):
            raise URIError(f"URI query key auth_mechanism: unknown mechanism {value!r}")
        if upper in MECHANISMS and upper not in names:
            names.append(upper)
    if not names:  # amqplain or crdemo only
        wanted = ", ".join(given)
        raise URIError(f"URI query key auth_mechanism: {wanted} not supported (use plain or external)")
    return tuple(names)


def _tls(query: Any) -> TLSSettings:
    verify_value = query.get("verify")
    if verify_value is None:
        verify = query.get("no_verify_ssl", "0") == "0"
    elif verify_value in ("verify_peer", "verify_none"):
        verify = verify_value == "verify_peer"
    else:
        raise URIError(f"URI query key verify: {verify_value!r} is not verify_peer or verify_none")
    failing = query.get("fail_if_no_peer_cert")
    if failing is not None and failing not in ("true", "false"):
        raise URIError(f"URI query key fail_if_no_peer_cert: {failing!r} is not true or false")
    check = query.get("customize_hostname_check")
    if check is not None and check != "https":
        raise URIError(f"URI query key customize_hostname_check: {check!r} is not supported (https is)")
    sni = query.get("server_name_indication")
    if sni == "disable":
        server_name: str | None = ""
    elif sni:
        server_name = sni
    else:
        server_name = None
    return TLSSettings(
        cacertfile=query.get("cacertfile") or query.get("cafile"),
        certfile=query.get("certfile"),
        keyfile=query.get("keyfile"),
        password=query.get("password"),
        verify=verify,
        server_name=server_name,
    )
