"""The ``error`` text of a failing link (``/api/federation-links`` rows, ``leveret ctl
federation_status``, the log): RabbitMQ 3.10's word for the failure first, so the same
search finds both brokers' links, then what an operator needs in words, with the AMQP
reply code and text when the upstream sent one:

==========================  =========================================================
RabbitMQ 3.10 shows          leveret shows
==========================  =========================================================
``econnrefused``             ``econnrefused: connection refused by HOST:PORT``
``{auth_failure,"ACCESS_     ``auth_failure: 403 ACCESS_REFUSED - Login was refused
REFUSED - Login was ..."}``  ...``
``not_allowed``              ``not_allowed: 530 NOT_ALLOWED - vhost x not found``
``{server_initiated_close,   ``server_initiated_close: 406 PRECONDITION_FAILED -
406,<<"PRECONDITION_...">>}``  inequivalent arg ...`` (403, 404 alike)
``{tls_alert,{unknown_ca,    ``tls_alert: unknown_ca: certificate verify failed:
"...Unknown CA"}}``            self-signed certificate in certificate chain``
==========================  =========================================================

A link's own ``ConnectionError("basic_cancel: ...")`` (RabbitMQ's term first) is kept as
it is; anything else keeps the exception's class and text (``ConnectionError: ...``).
"""

from __future__ import annotations

import asyncio
import errno
import re
import socket
import ssl
from urllib.parse import urlsplit

import aiormq

from .uri import URIError

#: AMQP 0-9-1 reply codes by the name RabbitMQ and leveret start a reply text with.
REPLY_CODES = {
    "CONNECTION_FORCED": 320,
    "INVALID_PATH": 402,
    "ACCESS_REFUSED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_LOCKED": 405,
    "PRECONDITION_FAILED": 406,
    "FRAME_ERROR": 501,
    "SYNTAX_ERROR": 502,
    "COMMAND_INVALID": 503,
    "CHANNEL_ERROR": 504,
    "UNEXPECTED_FRAME": 505,
    "RESOURCE_ERROR": 506,
    "NOT_ALLOWED": 530,
    "NOT_IMPLEMENTED": 540,
    "INTERNAL_ERROR": 541,
}
_TERM = re.compile(r"^[a-z_]+: ")  # ``basic_cancel: ...``
_REPLY = re.compile(r"\b(" + "|".join(REPLY_CODES) + r") - ")
#: OpenSSL's verify codes as the TLS alert RabbitMQ's (Erlang's) client reports.
_VERIFY_ALERTS = {
    2: "unknown_ca",
    18: "unknown_ca",  # self-signed certificate
    19: "unknown_ca",  # self-signed certificate in chain
    20: "unknown_ca",  # unable to get local issuer certificate
    21: "unknown_ca",
    9: "certificate_expired",  # not yet valid
    10: "certificate_expired",
    23: "certificate_revoked",
    62: "handshake_failure: hostname_check_failed",  # host name mismatch
    64: "handshake_failure: hostname_check_failed",  # IP address mismatch
}


def describe(exc: BaseException, uri: str = "") -> str:
    """``exc``, a link's failure connecting to ``uri`` or while running, as a row's
    ``error`` (see the module doc)."""
    where = _host_port(uri)
    cause = exc.__cause__
    if isinstance(exc, aiormq.exceptions.AMQPConnectionError) and isinstance(cause, OSError):
        exc = cause  # aiormq wraps the socket's or TLS's error
    if isinstance(exc, URIError):
        return f"invalid_uri: {exc}"
    if isinstance(exc, asyncio.TimeoutError):
        return f"timeout: no AMQP connection to {where} in time"
    if isinstance(exc, ssl.SSLCertVerificationError):
        alert = _VERIFY_ALERTS.get(exc.verify_code, "bad_certificate")
        return f"tls_alert: {alert}: certificate verify failed: {exc.verify_message} ({where})"
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or "").lower()
        text = exc.args[1] if len(exc.args) > 1 else str(exc)
        text = re.sub(r" \(_ssl\.c:\d+\)$", "", str(text))
        if reason.startswith(("tlsv1_alert_", "sslv3_alert_", "tlsv13_alert_")):
            return f"tls_alert: {reason.split('_alert_', 1)[1]}: {text} ({where})"
        return f"tls_error: {reason or 'ssl'}: {text} ({where})"
    if isinstance(exc, aiormq.exceptions.ProbableAuthenticationError):
        return "auth_failure: " + _reply(exc, 403)
    if isinstance(exc, aiormq.exceptions.AuthenticationError):
        offered = exc.args[0] if exc.args else ""
        return f"auth_failure: the upstream offers none of the URI's mechanisms (it offers {offered})"
    if isinstance(exc, aiormq.exceptions.IncompatibleProtocolError):
        return f"server_sent_malformed_header: {where} does not speak AMQP 0-9-1 (a TLS port?)"
    if isinstance(exc, (aiormq.exceptions.ConnectionClosed, aiormq.exceptions.ChannelClosed)):
        reply = _reply(exc, None)
        if reply.startswith("530 "):
            return "not_allowed: " + reply
        if reply.startswith("403 ") and "Login was refused" in reply:
            return "auth_failure: " + reply
        return "server_initiated_close: " + reply
    if isinstance(exc, OSError) and not isinstance(exc, aiormq.exceptions.AMQPError) and exc.errno:
        return _os_error(exc, where)
    if isinstance(exc, aiormq.exceptions.AMQPConnectionError) and exc.args and isinstance(exc.args[0], int):
        return _os_error(OSError(*exc.args), where)  # aiormq's wrap of the socket's error
    text = str(exc)
    if not text:  # aiormq's end of a connection that missed its heartbeats, say
        return f"{type(exc).__name__}: the connection was lost (no frame within the heartbeat timeout?)"
    if type(exc) is ConnectionError and _TERM.match(text):  # a link's own, in RabbitMQ's words
        return text
    match = _REPLY.search(text)
    if match is not None:  # a reply text passed on by a link (ConnectionError(str(...)))
        reply = f"{REPLY_CODES[match.group(1)]} {text[match.start() :]}"
        return ("not_allowed: " if match.group(1) == "NOT_ALLOWED" else "server_initiated_close: ") + reply
    if isinstance(exc, aiormq.exceptions.AMQPConnectionError) and "unexpectedly closed" in text:
        return f"connection_closed: {where} closed the connection ({text}; a TLS port reached with amqp://?)"
    return f"{type(exc).__name__}: {text}".strip()


def _reply(exc: BaseException, default_code: int | None) -> str:
    """``CODE TEXT`` from an aiormq error's arguments (``(code, text)`` or ``(text,)``)."""
    args = [a for a in exc.args if a is not None]
    code = next((a for a in args if isinstance(a, int)), None)
    text = next((str(a) for a in args if isinstance(a, str | bytes)), "")
    if code is None:
        match = _REPLY.search(text)
        code = REPLY_CODES[match.group(1)] if match else default_code
    return f"{code} {text}" if code is not None else text


def _os_error(exc: OSError, where: str) -> str:
    if isinstance(exc, socket.gaierror):
        return f"nxdomain: cannot resolve the host of {where} ({exc.strerror or exc})"
    name = errno.errorcode.get(exc.errno or 0, "").lower()
    text = exc.strerror or str(exc)
    if name == "econnrefused":
        return f"econnrefused: connection refused by {where}"
    if name:
        return f"{name}: {text} ({where})"
    return f"{type(exc).__name__}: {text} ({where})"


def _host_port(uri: str) -> str:
    try:
        parts = urlsplit(uri)
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    except ValueError:
        return "the upstream"
    host = parts.hostname or "localhost"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
