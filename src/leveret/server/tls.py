"""TLS for the AMQP (``amqps``) and HTTP listeners, configured with RabbitMQ's
``ssl_options`` words, and the identity a client certificate gives (the ``EXTERNAL``
mechanism, RabbitMQ's ``rabbitmq_auth_mechanism_ssl``).

``ssl_options``: ``cacertfile`` (CAs that sign client certificates), ``certfile`` and
``keyfile`` (the server's; required), ``password`` (of the key), ``verify``
(``verify_none``, the default, or ``verify_peer``: ask for a client certificate and
check it), ``fail_if_no_peer_cert`` (with ``verify_peer``: refuse clients without
one). TLS 1.2 or later.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

VERIFY_MODES = ("verify_none", "verify_peer")
LOGIN_FROM = ("distinguished_name", "common_name")

# RabbitMQ's short names for the attributes of a distinguished name.
_SHORT_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "domainComponent": "DC",
    "emailAddress": "emailAddress",
    "userId": "UID",
}


class TLSError(ValueError):
    """Unusable ssl_options (a missing file, a key that does not match, a bad value)."""


@dataclass
class TLSOptions:
    """RabbitMQ's ``ssl_options``; see the module doc."""

    certfile: str
    keyfile: str
    cacertfile: str | None = None
    password: str | None = None
    verify: str = "verify_none"
    fail_if_no_peer_cert: bool = False

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> TLSOptions:
        """From the config file's ``[ssl_options]`` table; TLSError naming the problem."""
        unknown = set(options) - {
            "certfile",
            "keyfile",
            "cacertfile",
            "password",
            "verify",
            "fail_if_no_peer_cert",
        }
        if unknown:
            raise TLSError(f"unknown ssl_options: {', '.join(sorted(unknown))}")
        for key in ("certfile", "keyfile"):
            if not isinstance(options.get(key), str):
                raise TLSError(f"ssl_options.{key} is required (a file name)")
        if options.get("verify", "verify_none") not in VERIFY_MODES:
            raise TLSError(f"ssl_options.verify must be one of {', '.join(VERIFY_MODES)}")
        if not isinstance(options.get("fail_if_no_peer_cert", False), bool):
            raise TLSError("ssl_options.fail_if_no_peer_cert must be true or false")
        return cls(**options)

    def server_context(self) -> ssl.SSLContext:
        """A server-side context; TLSError (naming the file) if one cannot be read."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.certfile, self.keyfile, self.password)
            if self.cacertfile:
                context.load_verify_locations(self.cacertfile)
        except (OSError, ssl.SSLError) as exc:
            raise TLSError(f"ssl_options: cannot load certificates: {exc}") from None
        if self.verify == "verify_peer":
            context.verify_mode = ssl.CERT_REQUIRED if self.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
        return context


def certificate_identity(certificate: dict | None, login_from: str = "distinguished_name") -> str | None:
    """The user name a verified client certificate stands for (Python's
    ``getpeercert()`` form): its subject as ``CN=alice,O=example`` (RabbitMQ's
    ``ssl_cert_login_from = distinguished_name``, the default) or its common name
    (``common_name``); None without a certificate or the attribute."""
    if not certificate:
        return None
    attributes = [pair for rdn in certificate.get("subject", ()) for pair in rdn]
    if login_from == "common_name":
        return next((value for name, value in attributes if name == "commonName"), None)
    # RabbitMQ writes the RDNs most specific first, as RFC 4514 does.
    return ",".join(f"{_SHORT_NAMES.get(name, name)}={value}" for name, value in reversed(attributes)) or None
